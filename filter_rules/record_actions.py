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

from filter_rules._base import KindAction, PositiveInt, StringMatch, _Model

# `$.a.b`, `$.items[*].sku`, `$.lines[0].price`, `$['odd key']`: the subset of JSONPath
# that names fields (no filters, no recursion), so a path is a fixed walk.
_SEGMENT = r"(?:\.[A-Za-z_$][A-Za-z0-9_$-]*|\[(?:\*|\d+|'[^']*')\])"
JSON_PATH_PATTERN: Final = rf"^\$(?:{_SEGMENT})+$"
_JSON_PATH = re.compile(JSON_PATH_PATTERN)
TOPIC_NAME_PATTERN: Final = r"^[a-zA-Z0-9._-]{1,249}$"
HEADER_ENCRYPTION_KEY_ID: Final = "keg.key-id"  # the record header naming the key used


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


class SecretRef(_Model):
    """Where a secret is read from: an environment variable or a file (never inline)."""

    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env, file")
        return self


class EncryptionKey(_Model):
    """An AES-256 key: 32 bytes, given base64 or hex-encoded by `secret`."""

    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")] = Field(
        description="Written to the record header keg.key-id; decryption picks the key by it."
    )
    secret: SecretRef


class AvroSchemaRef(_Model):
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

    @model_validator(mode="after")
    def _one(self) -> AvroSchemaRef:
        if (self.schema_ is None) == (self.file is None):
            raise ValueError("give exactly one of schema, file")
        return self


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


class EncryptSpec(_Model):
    fields: Annotated[list[JsonPath], Field(min_length=1)] | None = Field(
        default=None, description="JSON fields to encrypt; left out: the whole value."
    )
    key: EncryptionKey
    format: RecordFormat = "json"
    avro_schema: AvroSchemaRef | None = None
    unreadable: Unreadable = "refuse"

    @model_validator(mode="after")
    def _consistent(self) -> EncryptSpec:
        if self.fields is not None:
            _need_avro_schema(self.format, self.avro_schema)
        return self


class DecryptSpec(_Model):
    fields: Annotated[list[JsonPath], Field(min_length=1)] | None = Field(
        default=None, description="JSON fields to decrypt; left out: the whole value."
    )
    keys: Annotated[list[EncryptionKey], Field(min_length=1)]
    format: RecordFormat = "json"
    avro_schema: AvroSchemaRef | None = None


class ValidateSpec(_Model):
    json_schema: dict[str, JsonValue] | None = None
    json_schema_file: str | None = None
    avro_schema: AvroSchemaRef | None = None
    target: Literal["value", "key"] = "value"
    allow_null: bool = Field(default=False, description="A null key/value passes.")

    @model_validator(mode="after")
    def _one(self) -> ValidateSpec:
        given = [x for x in (self.json_schema, self.json_schema_file, self.avro_schema)
                 if x is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of json_schema, json_schema_file, avro_schema")
        return self


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


class CopySpec(_Model):
    topic: TopicName | None = Field(default=None, description="Copy to this Kafka topic.")
    http: Annotated[str, Field(pattern=r"^https?://")] | None = Field(
        default=None, description="POST each record (JSON) to this URL."
    )
    when: RecordPredicate | None = None
    queue_size: Annotated[int, Field(ge=1, le=1_000_000)] = 10_000

    @model_validator(mode="after")
    def _target(self) -> CopySpec:
        if (self.topic is None) == (self.http is None):
            raise ValueError("give exactly one of topic, http")
        return self


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
    MaskAction, EncryptAction, DecryptAction, ValidateAction, HeadersAction, DropAction,
    CopyAction, InterceptorAction, CaptureAction,
)
RECORD_KINDS: Final = frozenset(a.kind for a in RECORD_ACTIONS)


def record_spec(action: KindAction[Any]) -> Any:
    """The spec of a record action (`action.mask`, `action.validate`, ...)."""
    return action.spec
