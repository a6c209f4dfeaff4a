"""Record-level actions (KIP-905 interceptors as rules) and virtual topics: the model.

A record-level rule acts on the records of Produce requests (its match's direction
`request`, the default), of Fetch responses (`response`) or both. Only the batches of
topics a record rule matches are decoded; everything else passes as its bytes. What
each action does to a record is implemented in the `interceptors` package; this module
only says what a rule file may write, checked on load.

Secrets never appear in rule files: a key is named by an environment variable or a
file, read when the rule set is compiled.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, Field, JsonValue, model_validator

from filter_rules._base import KindAction, PositiveInt, StringMatch, _Model, _OneOf
from filter_rules.json_schemas import schema_problem

# `$.a.b`, `$.items[*].sku`, `$.lines[0].price`, `$['odd key']`: the subset of JSONPath
# that names fields (no filters, no recursion), so a path is a fixed walk.
_SEGMENT = r"(?:\.[A-Za-z_$][A-Za-z0-9_$-]*|\[(?:\*|\d+|'[^']*')\])"
JSON_PATH_PATTERN: Final = rf"^\$(?:{_SEGMENT})+$"
_JSON_PATH = re.compile(JSON_PATH_PATTERN)
TOPIC_NAME_PATTERN: Final = r"^[a-zA-Z0-9._-]{1,249}$"
HEADER_ENCRYPTION_KEY_ID: Final = "keg.key-id"  # the record header naming the key used
HEADER_DATA_KEY: Final = "keg.dek"  # KMS mode: the wrapped data key (interceptors/kms.py)


def _check_json_path(value: str) -> str:
    if not _JSON_PATH.match(value):
        raise ValueError(
            f"invalid field path '{value}' (expected JSONPath like $.customer.email, "
            "$.items[*].sku, $.lines[0].price or $['odd key'])"
        )
    return value


JsonPath = Annotated[
    str,
    AfterValidator(_check_json_path),
    Field(description="A JSONPath naming fields: $.a.b, $.items[*].sku, $.lines[0].x."),
]
TopicName = Annotated[str, Field(pattern=TOPIC_NAME_PATTERN)]
RecordFormat = Literal["json", "avro"]


class SecretRef(_OneOf, one_of=("env", "file")):
    """Where a secret is read from: an environment variable or a file (never inline)."""

    env: str | None = None
    file: str | None = None


class EncryptionKey(_Model):
    """An AES-256 key: 32 bytes, given base64 or hex-encoded by `secret`."""

    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")] = Field(
        description="Written to the record header keg.key-id; decryption picks the key by it."
    )
    secret: SecretRef


# What a rule does when a service it needs (a schema registry, a KMS) does not answer
# in time: fail (the record cannot be judged: a retriable REQUEST_TIMED_OUT at produce,
# withheld at fetch) or pass it unchecked (counted and audited as `unchecked`).
OnUnavailable = Annotated[Literal["fail", "pass"], Field(description=(
    "The service did not answer in time (or is unreachable): fail (default; "
    "REQUEST_TIMED_OUT at produce, a retriable error, the partition withheld at fetch) or "
    "pass the record unchecked (audited)."))]
ServiceTimeoutMs = Annotated[int, Field(ge=10, le=10_000, description=(
    "The most a record waits for one answer of the service; keep it well under Envoy's "
    "message_timeout (2 s)."))]


class KmsAws(_Model):
    """The AWS KMS API (GenerateDataKey, Decrypt): AWS itself or a compatible server."""

    key_id: Annotated[str, Field(min_length=1, max_length=2048)] | None = Field(
        default=None, description=(
            "The key-encryption key (id, ARN or alias/...): needed to encrypt; decryption "
            "reads it from the wrapped data key."))
    region: Annotated[str, Field(pattern=r"^[a-z0-9-]{1,32}$")] = "us-east-1"
    endpoint: Annotated[str, Field(pattern=r"^https?://")] | None = Field(
        default=None, description="Another endpoint than AWS's (a local KMS, a VPC endpoint).")
    access_key_id: SecretRef | None = Field(
        default=None, description="With secret_access_key; left out: boto3's own chain "
                                  "(environment, profile, instance role).")
    secret_access_key: SecretRef | None = None
    ca_file: str | None = Field(default=None, description="PEM bundle to trust (TLS).")

    @model_validator(mode="after")
    def _pair(self) -> KmsAws:
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("give both access_key_id and secret_access_key, or neither")
        return self


class KmsKeyring(_Model):
    """A local keyring: a JSON file (or variable) of named, versioned AES-256 keys."""

    secret: SecretRef = Field(description="Where the keyring's JSON is (env or file).")
    key: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")] | None = Field(
        default=None, description="The key-encryption key's name: needed to encrypt (its "
                                  "primary version wraps new data keys).")


class DataKeyPolicy(_Model):
    """When `encrypt` asks the KMS for a new data key."""

    scope: Literal["topic", "rule"] = Field(
        default="topic", description="One data key per topic, or one for the whole rule.")
    rotate_after_s: Annotated[int, Field(ge=1, le=31_536_000)] = Field(
        default=3600, description="A new data key after this long.")
    max_records: Annotated[int, Field(ge=1, le=1 << 32)] = Field(
        default=1 << 24, description="A new data key after this many encryptions (AES-GCM "
                                     "with random nonces: stay far below 2^32).")


class KmsSpec(_OneOf, one_of=("aws", "keyring")):
    """Envelope encryption: data keys generated and wrapped by a key-encryption key held
    in a KMS; the wrapped data key travels with each record (header keg.dek)."""

    aws: KmsAws | None = None
    keyring: KmsKeyring | None = None
    data_key: DataKeyPolicy = Field(default_factory=DataKeyPolicy)
    timeout_ms: ServiceTimeoutMs = 1000
    cache_size: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=10_000, description="Unwrapped data keys kept in memory (decryption).")
    cache_ttl_s: Annotated[int, Field(ge=1, le=604_800)] = Field(
        default=3600, description="How long an unwrapped data key is kept.")
    on_unavailable: OnUnavailable = "fail"

    @property
    def kek(self) -> str | None:
        """The key-encryption key that wraps new data keys (None: decryption only)."""
        return self.aws.key_id if self.aws is not None else self.keyring.key  # type: ignore[union-attr]


class AvroSchemaRef(_OneOf, one_of=("schema_", "file")):
    """An Avro schema, inline (`schema`) or from a file (`file`, .avsc)."""

    schema_: dict[str, JsonValue] | str | None = Field(default=None, alias="schema")
    file: str | None = None
    framing: Literal["none", "confluent"] = Field(
        default="none",
        description=(
            "none: the value is the Avro body; confluent: magic byte 0 and a 4-byte "
            "schema id come first (kept as they are)."
        ),
    )


class RecordPredicate(_Model):
    """Which records: every condition given must hold (AND); an empty one matches all."""

    key: StringMatch | None = Field(default=None, description="The key, read as UTF-8.")
    headers: dict[str, StringMatch | None] | None = Field(
        default=None,
        description="Header name -> value match; null: the header is present.",
    )
    fields: dict[JsonPath, StringMatch] | None = Field(
        default=None,
        description="JSON value field -> match on its text (numbers as written).",
    )
    tombstone: bool | None = Field(default=None, description="The value is null.")


# --- specs -------------------------------------------------------------------------


# What a mask or a field encryption does with a value it must change but cannot read
# (not JSON, not the schema's Avro, nested past what a parser follows): refuse it (the
# record never passes: INVALID_RECORD at produce, withheld at fetch) or pass it as is.
Unreadable = Annotated[Literal["refuse", "pass"], Field(description=(
    "A value the rule must change but cannot read: refuse (default; INVALID_RECORD at "
    "produce, the record withheld at fetch) or pass it unchanged."))]


class MaskSpec(_Model):
    fields: Annotated[list[JsonPath], Field(min_length=1)]
    method: Literal["redact", "hash", "truncate", "null", "remove"] = Field(
        default="redact",
        description=(
            "redact: replace with `replacement`; hash: keyed HMAC-SHA256 (hex) with "
            "`hash_key`; truncate: keep the first `keep` characters; null: JSON null; "
            "remove: delete the field."
        ),
    )
    replacement: Annotated[str, Field(max_length=256)] = "****"
    keep: Annotated[int, Field(ge=0, le=4096)] = 4
    hash_key: SecretRef | None = None
    format: RecordFormat = "json"
    avro_schema: AvroSchemaRef | None = None
    when: RecordPredicate | None = None
    unreadable: Unreadable = "refuse"

    @model_validator(mode="after")
    def _consistent(self) -> MaskSpec:
        if self.method == "hash" and self.hash_key is None:
            raise ValueError("method hash needs hash_key (env or file)")
        _need_avro_schema(self.format, self.avro_schema)
        return self


class EncryptSpec(_OneOf, one_of=("key", "kms")):
    fields: Annotated[list[JsonPath], Field(min_length=1)] | None = Field(
        default=None, description="JSON fields to encrypt; left out: the whole value."
    )
    key: EncryptionKey | None = Field(default=None, description="A static key (or kms).")
    kms: KmsSpec | None = Field(default=None, description="Data keys from a KMS (or key).")
    format: RecordFormat = "json"
    avro_schema: AvroSchemaRef | None = None
    unreadable: Unreadable = "refuse"

    @model_validator(mode="after")
    def _consistent(self) -> EncryptSpec:
        if self.kms is not None and self.kms.kek is None:
            raise ValueError("encrypting needs the key-encryption key: kms.aws.key_id or "
                             "kms.keyring.key")
        if self.fields is not None:
            _need_avro_schema(self.format, self.avro_schema)
        return self


class DecryptSpec(_Model):
    fields: Annotated[list[JsonPath], Field(min_length=1)] | None = Field(
        default=None, description="JSON fields to decrypt; left out: the whole value."
    )
    keys: Annotated[list[EncryptionKey], Field(min_length=1)] | None = Field(
        default=None, description="Static keys, picked by the record's keg.key-id header.")
    kms: KmsSpec | None = Field(
        default=None, description="Unwrap the data key a record carries (header keg.dek).")
    format: RecordFormat = "json"
    avro_schema: AvroSchemaRef | None = None

    @model_validator(mode="after")
    def _some_keys(self) -> DecryptSpec:
        if self.keys is None and self.kms is None:
            raise ValueError("give keys, kms or both")
        return self


def _usable_json_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """An inline schema is checked where the rule is (keg validate, the API), not only
    when the gateway builds the rule."""
    problem = None if schema is None else schema_problem(schema)
    if problem is not None:
        raise ValueError(problem)
    return schema


class ValidateSpec(_OneOf, one_of=("json_schema", "json_schema_file", "avro_schema")):
    json_schema: Annotated[dict[str, JsonValue] | None,
                           AfterValidator(_usable_json_schema)] = None
    json_schema_file: str | None = None
    avro_schema: AvroSchemaRef | None = None
    target: Literal["value", "key"] = "value"
    allow_null: bool = Field(default=False, description="A null key/value passes.")


class RegistryBasicAuth(_Model):
    username: Annotated[str, Field(min_length=1, max_length=1024)]
    password: SecretRef


class RegistryAuth(_OneOf, one_of=("basic", "bearer")):
    """HTTP authentication: basic (user and password) or a bearer token."""

    basic: RegistryBasicAuth | None = None
    bearer: SecretRef | None = None


class SchemaRegistryRef(_Model):
    """A Confluent-compatible schema registry (Confluent, Apicurio's ccompat API, ...)."""

    url: Annotated[str, Field(pattern=r"^https?://[^\s]+$")] = Field(
        description="The API's base URL, e.g. http://registry:8081 or "
                    "http://apicurio:8080/apis/ccompat/v7.")
    auth: RegistryAuth | None = None
    ca_file: str | None = Field(default=None, description="PEM bundle to trust (https).")
    timeout_ms: ServiceTimeoutMs = 1000
    cache_ttl_s: Annotated[int, Field(ge=1, le=86_400)] = Field(
        default=300, description="How long which subjects an id is registered under is "
                                 "believed (schemas by id never change: kept while used).")
    cache_size: Annotated[int, Field(ge=16, le=1_000_000)] = Field(
        default=10_000, description="Schema ids remembered (least recently used go first).")


class SchemaSpec(_Model):
    registry: SchemaRegistryRef
    target: Literal["value", "key"] = "value"
    subject: Literal["topic_name", "record_name", "topic_record_name"] = Field(
        default="topic_name", description=(
            "The subject the id must be registered under (Confluent's subject name "
            "strategies): topic_name: <topic>-value / <topic>-key; record_name: the "
            "schema's fully-qualified record name; topic_record_name: <topic>-<record name>."))
    require_subject: bool = Field(
        default=True, description="false: any registered id passes (the id's schema is still "
                                  "looked up).")
    validate_payload: bool = Field(
        default=False, description="Also check the bytes against the id's schema (Avro, JSON "
                                   "Schema, Protobuf).")
    allow_null: bool = Field(default=False, description="A null key/value passes.")
    on_unavailable: OnUnavailable = "fail"


class HeadersSpec(_Model):
    set: dict[str, str] | None = Field(default=None, description="Add or overwrite.")
    remove: Annotated[list[str], Field(min_length=1)] | None = None
    rename: dict[str, str] | None = None

    @model_validator(mode="after")
    def _something(self) -> HeadersSpec:
        if not (self.set or self.remove or self.rename):
            raise ValueError("give at least one of set, remove, rename")
        return self


class DropSpec(_Model):
    when: RecordPredicate


class CopySpec(_OneOf, one_of=("topic", "http")):
    topic: TopicName | None = Field(default=None, description="Copy to this Kafka topic.")
    http: Annotated[str, Field(pattern=r"^https?://")] | None = Field(
        default=None, description="POST each record (JSON) to this URL."
    )
    when: RecordPredicate | None = None
    queue_size: Annotated[int, Field(ge=1, le=1_000_000)] = 10_000


class InterceptorSpec(_Model):
    class_: Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")] = Field(
        alias="class", description="module.path:ClassName of a KIP-905 interceptor."
    )
    config: dict[str, JsonValue] = Field(
        default_factory=dict, description="Passed once to the interceptor's configure()."
    )
    timeout_ms: Annotated[int, Field(ge=1, le=60_000)] = Field(
        default=200,
        description="Budget per batch (all of its records; a Produce carries one batch per "
                    "partition), per attempt.",
    )
    retries: Annotated[int, Field(ge=0, le=10)] = Field(
        default=1, description="Attempts after a timeout before REQUEST_TIMED_OUT."
    )


class CaptureSpec(_Model):
    path: str = Field(description="Directory of the Parquet capture (date/topic partitions).")
    sample: Annotated[float, Field(gt=0, le=1)] = 1.0
    max_bytes: PositiveInt = Field(default=1 << 30, description="Stop capturing beyond this.")
    rotate_bytes: PositiveInt = Field(default=64 << 20, description="Start a new file after.")
    include_values: bool = True


class VirtualTopicsSpec(_Model):
    prefix: Annotated[str, Field(pattern=r"^[a-zA-Z0-9._-]{1,200}$")] = Field(
        description="Broker-side prefix: the client's `orders` is the broker's `<prefix>orders`."
    )
    groups: bool = Field(default=True, description="Prefix consumer group ids too.")
    transactional_ids: bool = Field(default=True, description="Prefix transactional ids too.")


def _need_avro_schema(fmt: str, schema: AvroSchemaRef | None) -> None:
    if fmt == "avro" and schema is None:
        raise ValueError("format avro needs avro_schema (schema or file)")


# --- actions -----------------------------------------------------------------------


class MaskAction(KindAction[MaskSpec], kind="mask"):
    """Mask fields of JSON or Avro values: redact, keyed hash, truncate or null."""


class EncryptAction(KindAction[EncryptSpec], kind="encrypt"):
    """Encrypt fields or whole values with AES-256-GCM; the key id goes in a header."""


class DecryptAction(KindAction[DecryptSpec], kind="decrypt"):
    """Decrypt what `encrypt` wrote, for the consumers this rule matches."""


class ValidateAction(KindAction[ValidateSpec], kind="validate"):
    """Reject batches with records that fail a JSON Schema or Avro schema."""


class SchemaAction(KindAction[SchemaSpec], kind="schema"):
    """Require a Confluent-framed schema id registered for the topic (and a valid payload)."""


class HeadersAction(KindAction[HeadersSpec], kind="headers"):
    """Add, overwrite, remove or rename record headers."""


class DropAction(KindAction[DropSpec], kind="drop"):
    """Drop the records a predicate matches (counted and audited)."""


class CopyAction(KindAction[CopySpec], kind="copy"):
    """Copy matching records to another topic or an HTTP endpoint, asynchronously."""


class InterceptorAction(KindAction[InterceptorSpec], kind="interceptor"):
    """Run a user's Python interceptor (KIP-905 contract) on each record."""


class CaptureAction(KindAction[CaptureSpec], kind="capture"):
    """Write matching records, sampled, to Parquet for backtests (keg backtest)."""


class VirtualTopicsAction(KindAction[VirtualTopicsSpec], kind="virtual_topics"):
    """Give the matching clients their own namespace of topics (and groups)."""


RECORD_ACTIONS: Final[tuple[type[KindAction[Any]], ...]] = (
    MaskAction, EncryptAction, DecryptAction, ValidateAction, SchemaAction, HeadersAction,
    DropAction, CopyAction, InterceptorAction, CaptureAction,
)
RECORD_KINDS: Final = frozenset(a.kind for a in RECORD_ACTIONS)


def record_spec(action: KindAction[Any]) -> Any:
    """The spec of a record action (`action.mask`, `action.validate`, ...)."""
    return action.spec
