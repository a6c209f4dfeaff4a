"""The rule language as pydantic models: what a rule file may say, checked on load.

Every model forbids unknown fields and is strict (a YAML `yes` is not a topic name,
`"10"` is not a number). Checks that JSON Schema cannot express run here as
validators: regular expressions compile with RE2, CIDRs parse, API and error names
resolve. The published schema (`filter_rules/rules.schema.json`) is generated from
these models.

`action` is a discriminated union keyed by its single field name (`deny: {...}`,
`observe: {...}`). A new kind of action is a new model with one field plus one line
in `Action`; no existing model changes.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import json
import re
from collections.abc import Iterator
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Discriminator,
    Field,
    PlainValidator,
    StringConstraints,
    Tag,
    WithJsonSchema,
    model_validator,
)

from filter_rules._base import KindAction, PositiveInt, StringMatch, _Model, _OneOf
from filter_rules.apis import MAX_API_KEY, api_keys_by_name, resolve_api
from filter_rules.errors import ERROR_CODES
from filter_rules.record_actions import (
    RECORD_KINDS,
    CaptureAction,
    CopyAction,
    DecryptAction,
    DropAction,
    EncryptAction,
    HeadersAction,
    InterceptorAction,
    MaskAction,
    SchemaAction,
    ValidateAction,
    VirtualTopicsAction,
)

API_VERSION: Final = "keg/v1"
KIND: Final = "RuleSet"
RULE_ID_PATTERN: Final = r"^[a-z0-9][a-z0-9._-]*$"
INT32_MAX: Final = 2**31 - 1


# --- Scalar types ------------------------------------------------------------------


def _check_cidr(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(
            f"invalid CIDR '{value}' (expected an IPv4 or IPv6 network such as "
            "10.0.0.0/8 or fd00::/8, or a single address)"
        ) from None
    return value


def _check_listener(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            host = ""
    elif ":" in host:
        host = ""  # an IPv6 address must be written in brackets: [::1]:19092
    if not (sep and host and port.isdigit() and port.isascii() and 0 < int(port) < 65536):
        raise ValueError(
            f"invalid listener '{value}' (expected host:port such as 127.0.0.1:19092 "
            "or [::1]:19092)"
        )
    return value


def _check_api(value: Any) -> str | int:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(
            f"an API is a name such as 'Produce' or a numeric key, not {value!r}"
        )
    resolve_api(value)
    return value


def _check_error_name(value: str) -> str:
    if value not in ERROR_CODES:
        close = difflib.get_close_matches(value.upper(), list(ERROR_CODES), n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"unknown Kafka error '{value}'{hint}")
    return value


API_REF_SCHEMA: Final[dict[str, Any]] = {
    "anyOf": [
        {"type": "string", "enum": list(api_keys_by_name())},
        {"type": "integer", "minimum": 0, "maximum": MAX_API_KEY},
    ],
    "description": "A Kafka API: its schema name ('Produce') or its numeric key (0).",
}
ERROR_NAME_SCHEMA: Final[dict[str, Any]] = {
    "type": "string",
    "enum": list(ERROR_CODES),
    "description": "A Kafka error name as in Kafka's Errors.java.",
}


RuleId = Annotated[str, StringConstraints(pattern=RULE_ID_PATTERN, min_length=1, max_length=128)]
Cidr = Annotated[
    str,
    AfterValidator(_check_cidr),
    Field(description="An IPv4 or IPv6 network (10.0.0.0/8) or a single address."),
]
Listener = Annotated[
    str,
    AfterValidator(_check_listener),
    Field(description="A gateway listener address, host:port ([v6]:port for IPv6)."),
]
ApiRef = Annotated[str | int, PlainValidator(_check_api), WithJsonSchema(API_REF_SCHEMA)]
ErrorName = Annotated[
    str,
    AfterValidator(_check_error_name),
    WithJsonSchema(ERROR_NAME_SCHEMA),
]
BrokerId = Annotated[int, Field(ge=0, le=INT32_MAX)]
ApiVersionNumber = Annotated[int, Field(ge=0, le=MAX_API_KEY)]
Codec = Literal["none", "gzip", "snappy", "lz4", "zstd"]
Mode = Literal["enforce", "dry-run", "disabled"]
Direction = Literal["request", "response", "both"]


# --- match -------------------------------------------------------------------------


# Kafka's legal topic names (org.apache.kafka.common.internals.Topic).
MAX_TOPIC_NAME: Final = 249
_TOPIC_CHARS: Final = re.compile(r"[a-zA-Z0-9._-]+")

class VersionRange(_Model):
    """API versions from `min` to `max`, both included; either may be left open."""

    min: ApiVersionNumber | None = None
    max: ApiVersionNumber | None = None

    @model_validator(mode="after")
    def _ordered(self) -> VersionRange:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is greater than max {self.max}")
        return self


class Match(_Model):
    """What a rule applies to. Every field given must match (AND); each list matches
    if any of its entries does (OR). An empty match matches everything."""

    apis: Annotated[list[ApiRef], Field(min_length=1)] | None = None
    versions: VersionRange | None = None
    direction: Direction | None = Field(
        default=None,
        description="request, response or both; a rule's match defaults to request.",
    )
    topics: StringMatch | None = None
    groups: StringMatch | None = None
    client_ids: StringMatch | None = None
    principals: StringMatch | None = Field(
        default=None,
        description=(
            "Kafka principals, 'User:alice'. In exact and prefix, a value without ':' "
            "means 'User:<value>'; regexes see the full 'Type:name'."
        ),
    )
    client_addresses: Annotated[list[Cidr], Field(min_length=1)] | None = None
    listeners: Annotated[list[Listener], Field(min_length=1)] | None = None
    brokers: Annotated[list[BrokerId], Field(min_length=1)] | None = None
    not_: Match | None = Field(
        default=None, alias="not", description="Matches when this nested match does not."
    )

    @model_validator(mode="after")
    def _kafka_topic_names(self) -> Match:
        """Topic names and prefixes a topic can have: Kafka allows ASCII letters, digits,
        '.', '_' and '-', at most 249 of them. A name it cannot have never matches (a
        typo: "café", " orders"), and an empty prefix matches every topic (leave
        `topics` out for that)."""
        topics = self.topics
        if topics is None:
            return self
        for kind, names in (("exact", topics.exact), ("prefix", topics.prefix)):
            for name in names:
                if not name:
                    raise ValueError(f"topics: an empty {kind} entry matches "
                                     f"{'no topic' if kind == 'exact' else 'every topic'}: "
                                     f"{'remove it' if kind == 'exact' else 'leave topics out'}")
                if len(name) > MAX_TOPIC_NAME or not _TOPIC_CHARS.fullmatch(name):
                    raise ValueError(f"topics: {kind} {name!r} is no Kafka topic name (ASCII "
                                     f"letters, digits, '.', '_' and '-', at most "
                                     f"{MAX_TOPIC_NAME}): it would never match")
        return self

    @model_validator(mode="after")
    def _no_anonymous(self) -> Match:
        """A principal matcher naming ANONYMOUS would match nothing: principal rules
        match authenticated clients only (a client that has not authenticated yet, or
        never will, is matched by none; docs/rules.md)."""
        principals = self.principals
        named = [*(principals.exact or ()), *(principals.prefix or ())] if principals else []
        if any(name.removeprefix("User:") == "ANONYMOUS" for name in named):
            raise ValueError(
                "principals: User:ANONYMOUS (a client without SASL or a client certificate) "
                "is never matched: principal rules match authenticated clients only; match "
                "the others with not: {principals: {regex: ['.*']}}")
        return self

    def walk(self) -> Iterator[Match]:
        """This match and every match nested under `not`."""
        match: Match | None = self
        while match is not None:
            yield match
            match = match.not_


# --- actions -----------------------------------------------------------------------


class ObserveSpec(_Model):
    audit: bool = Field(
        default=True, description="Write an audit event per match (false: count only)."
    )


class DenySpec(_Model):
    error: ErrorName | None = Field(
        default=None,
        description="Kafka error to answer with; default: the API's authorization error.",
    )
    message: Annotated[str, Field(max_length=1024)] | None = None


# librdkafka sends a batch uncompressed whenever compressing would not shrink it, which
# for typical payloads happens below a few hundred bytes; a batch this small saves at
# most a few hundred bytes by compression (and lz4/zstd frames add 10-20 of their own).
DEFAULT_UNCOMPRESSED_BELOW_BYTES: Final = 1024


class CompressionPolicy(_OneOf, one_of=("require", "forbid")):
    require: Annotated[list[Codec], Field(min_length=1)] | None = None
    forbid: Annotated[list[Codec], Field(min_length=1)] | None = None
    allow_uncompressed_below_bytes: Annotated[int, Field(ge=0, le=INT32_MAX)] = Field(
        default=DEFAULT_UNCOMPRESSED_BELOW_BYTES,
        description=(
            "An uncompressed batch smaller than this (bytes on the wire, batch header "
            "included) passes a policy that refuses uncompressed batches: librdkafka sends "
            "small batches uncompressed when compressing would not shrink them. "
            "0: every batch must be compressed."
        ),
    )

    @model_validator(mode="after")
    def _uncompressed_below(self) -> CompressionPolicy:
        # By value, not by whether it was written: a rule read back from its JSON (the
        # rule store, the xDS stream) carries every default, and a policy that allows
        # uncompressed batches (forbid: [gzip]) was refused there after it had loaded.
        if self.allow_uncompressed_below_bytes != DEFAULT_UNCOMPRESSED_BELOW_BYTES and \
                not self.refuses_uncompressed:
            raise ValueError("allow_uncompressed_below_bytes only applies when uncompressed "
                             "batches are refused (require without none, or forbid with none)")
        return self

    @property
    def refuses_uncompressed(self) -> bool:
        """Whether the policy refuses codec `none` (require without it, forbid with it)."""
        if self.require is not None:
            return "none" not in self.require
        return "none" in (self.forbid or ())

    def refuses(self, codec: str, batch_bytes: int) -> bool:
        """Whether a batch of `batch_bytes` written with `codec` breaks the policy."""
        if codec == "none" and batch_bytes < self.allow_uncompressed_below_bytes:
            return False
        if self.require is not None:
            return codec not in self.require
        return codec in (self.forbid or ())


class SafeguardSpec(_Model):
    forbid_acks_zero: bool = False
    require_idempotence: bool = False
    require_transactions: bool = False
    max_batch_bytes: PositiveInt | None = None
    max_record_bytes: PositiveInt | None = None
    compression: CompressionPolicy | None = None
    max_headers: Annotated[int, Field(ge=0)] | None = None
    require_headers: Annotated[list[str], Field(min_length=1)] | None = None
    max_fetch_bytes: PositiveInt | None = None
    read_only: bool = False
    error: ErrorName | None = Field(
        default=None, description="Override the error every check answers with."
    )

    @model_validator(mode="after")
    def _something(self) -> SafeguardSpec:
        if not self.checks():
            raise ValueError("a safeguard needs at least one check")
        return self

    def checks(self) -> tuple[str, ...]:
        """The names of the checks this safeguard turns on."""
        on = []
        for name in type(self).model_fields:
            if name == "error":
                continue
            value = getattr(self, name)
            if value is not None and value is not False:
                on.append(name)
        return tuple(on)


class RateSpec(_Model):
    per: Literal["principal", "client_id", "topic"] = "principal"
    bytes_per_second: PositiveInt | None = None
    requests_per_second: Annotated[float, Field(gt=0)] | None = None
    burst_seconds: Annotated[float, Field(gt=0, le=3600)] = 1.0

    @model_validator(mode="after")
    def _limit(self) -> RateSpec:
        if self.bytes_per_second is None and self.requests_per_second is None:
            raise ValueError("give bytes_per_second, requests_per_second or both")
        return self


ApiList = Annotated[list[ApiRef], Field(min_length=1)]


class ObserveAction(KindAction[ObserveSpec], kind="observe"):
    """Count and audit what matches; never changes traffic."""


class DenyAction(KindAction[DenySpec], kind="deny"):
    """Answer the request with a Kafka error; it never reaches the broker."""


class SafeguardAction(KindAction[SafeguardSpec], kind="safeguard"):
    """Refuse requests that break a producer/consumer hygiene check."""


class AllowApisAction(KindAction[ApiList], kind="allow_apis"):
    """Refuse every API not in the list."""


class DenyApisAction(KindAction[ApiList], kind="deny_apis"):
    """Refuse every API in the list."""


class RateAction(KindAction[RateSpec], kind="rate"):
    """Throttle bytes and/or requests per principal, client id or topic."""


ActionModel = (
    ObserveAction | DenyAction | SafeguardAction | AllowApisAction | DenyApisAction | RateAction
    | MaskAction | EncryptAction | DecryptAction | ValidateAction | SchemaAction | HeadersAction
    | DropAction | CopyAction | InterceptorAction | CaptureAction | VirtualTopicsAction
)
REQUEST_KINDS: Final = ("observe", "deny", "safeguard", "allow_apis", "deny_apis", "rate")
ACTION_KINDS: Final = (*REQUEST_KINDS, *sorted(RECORD_KINDS), "virtual_topics")


def _action_kind(value: Any) -> str | None:
    if isinstance(value, dict) and len(value) == 1:
        key = next(iter(value))
        return key if isinstance(key, str) else None
    if isinstance(value, BaseModel):
        return getattr(value, "kind", None)
    return None


def _action_shape(value: Any) -> Any:
    """Clear errors for an action that is not one mapping key naming a known kind."""
    if isinstance(value, BaseModel):
        return value
    expected = ", ".join(ACTION_KINDS)
    if not isinstance(value, dict):
        raise ValueError(f"an action is a mapping with exactly one of: {expected}")
    kinds = [str(k) for k in value]
    if not kinds:
        raise ValueError(f"an action needs exactly one of: {expected}")
    if len(kinds) > 1:
        raise ValueError(f"an action has exactly one kind, not {len(kinds)} ({', '.join(kinds)})")
    if kinds[0] not in ACTION_KINDS:
        close = difflib.get_close_matches(kinds[0], ACTION_KINDS, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ValueError(f"unknown action '{kinds[0]}'; {hint}expected one of: {expected}")
    return value


Action = Annotated[
    Annotated[ObserveAction, Tag("observe")]
    | Annotated[DenyAction, Tag("deny")]
    | Annotated[SafeguardAction, Tag("safeguard")]
    | Annotated[AllowApisAction, Tag("allow_apis")]
    | Annotated[DenyApisAction, Tag("deny_apis")]
    | Annotated[RateAction, Tag("rate")]
    | Annotated[MaskAction, Tag("mask")]
    | Annotated[EncryptAction, Tag("encrypt")]
    | Annotated[DecryptAction, Tag("decrypt")]
    | Annotated[ValidateAction, Tag("validate")]
    | Annotated[SchemaAction, Tag("schema")]
    | Annotated[HeadersAction, Tag("headers")]
    | Annotated[DropAction, Tag("drop")]
    | Annotated[CopyAction, Tag("copy")]
    | Annotated[InterceptorAction, Tag("interceptor")]
    | Annotated[CaptureAction, Tag("capture")]
    | Annotated[VirtualTopicsAction, Tag("virtual_topics")],
    Discriminator(_action_kind),
    BeforeValidator(_action_shape),
]


# --- rule, file, set ---------------------------------------------------------------


class AuditSpec(_Model):
    enabled: bool = True
    include_payload: bool = Field(
        default=False, description="Copy record keys and values into audit events."
    )


class Rule(_Model):
    id: RuleId = Field(description="Unique across the rule set: [a-z0-9][a-z0-9._-]*.")
    description: Annotated[str, Field(max_length=4096)] = ""
    order: Annotated[int, Field(ge=-INT32_MAX, le=INT32_MAX)] = Field(
        default=0, description="Lower runs first; ties keep file order, then position."
    )
    mode: Mode = Field(
        default="enforce",
        description="enforce: act; dry-run: only report what it would do; disabled: off.",
    )
    match: Match = Field(default_factory=Match)
    action: Action
    audit: AuditSpec = Field(default_factory=AuditSpec)

    @model_validator(mode="after")
    def _bytes_are_produced(self) -> Rule:
        """A byte rate counts the record bytes of Produce requests: on a rule that names
        APIs without Produce it would count nothing and never throttle (a consumer's
        Fetch carries no records; its answer's size is not known when it is judged)."""
        apis = self.match.apis
        if (isinstance(self.action, RateAction) and self.action.rate.bytes_per_second
                and apis is not None and not {"Produce", 0} & set(apis)):
            raise ValueError(
                "rate.bytes_per_second counts the record bytes of Produce requests, and "
                f"this rule names no Produce (apis: {', '.join(map(str, apis))}): it would "
                "never throttle; limit other requests with requests_per_second")
        return self

    @property
    def direction(self) -> Literal["request", "response", "both"]:
        """The directions the rule applies to (a match without one means request)."""
        return self.match.direction or "request"

    @property
    def audited(self) -> bool:
        """Whether a match writes an audit event."""
        if isinstance(self.action, ObserveAction) and not self.action.observe.audit:
            return False
        return self.audit.enabled


class RuleFile(_Model):
    """One YAML document of a rule file."""

    api_version: Literal["keg/v1"] = Field(default=API_VERSION, alias="apiVersion")
    kind: Literal["RuleSet"] = KIND
    rules: list[Rule] = Field(default_factory=list)


class RuleSource(_Model):
    """Where a rule was written: file and the line and column of its `id`."""

    file: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        if self.line is None:
            return self.file
        return f"{self.file}:{self.line}:{self.column or 1}"


class RuleSet(_Model):
    """Every rule of a rule directory, in load order (file name, then position).

    Evaluation order is `order` ascending; ties keep this order (see `ordered()`).
    """

    rules: list[Rule] = Field(default_factory=list)
    sources: dict[str, RuleSource] = Field(
        default_factory=dict, description="Rule id -> where it was written."
    )

    @model_validator(mode="after")
    def _unique_ids(self) -> RuleSet:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.id in seen:
                raise ValueError(f"duplicate rule id '{rule.id}'")
            seen.add(rule.id)
        return self

    def ordered(self) -> list[Rule]:
        """The rules in evaluation order: `order` ascending, stable on load order."""
        return sorted(self.rules, key=lambda rule: rule.order)

    def get(self, rule_id: str) -> Rule | None:
        return next((rule for rule in self.rules if rule.id == rule_id), None)

    @property
    def version(self) -> str:
        """A content hash of the rules (defaults filled in, sources left out).

        Equal rule sets have equal versions whichever files they came from; any change
        to a rule, its mode or its position changes it.
        """
        # The hash of json.dumps(<the rules' dumps>, sort_keys=True, separators=(",",
        # ":")), fed a rule at a time: one call over 100,000 rules would hold the GIL
        # for seconds, and other threads (an event loop) would wait that long.
        digest = hashlib.sha256(b"[")
        for position, rule in enumerate(self.rules):
            if position:
                digest.update(b",")
            digest.update(json.dumps(rule.model_dump(mode="json", by_alias=True),
                                     sort_keys=True, separators=(",", ":")).encode())
        digest.update(b"]")
        return digest.hexdigest()[:16]
