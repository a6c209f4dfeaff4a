"""schema: records in the Confluent wire format, with an id a schema registry vouches for.

Every key or value (`target`) must be magic byte 0 and a 4-byte schema id, then the
payload (Protobuf: the message indexes, then the payload). The id must be registered
(`GET /schemas/ids/{id}`), under the subject its topic's strategy names
(`require_subject`; Confluent's subject name strategies):

- `topic_name` (default): `<topic>-value` or `<topic>-key`;
- `record_name`: the schema's record name (Avro: its full name; JSON Schema: its
  `title`; Protobuf: the full name of the message the indexes select);
- `topic_record_name`: `<topic>-<record name>`;

and with `validate_payload` the payload must be valid for that schema (Avro, JSON
Schema, Protobuf). A record that fails raises RecordRejected (INVALID_RECORD at
produce, withheld at fetch). The topic is the broker's name of it (after virtual topics).

Answers come from the registry client's caches (interceptors/registry.py), and per
(topic, id) from this rule's own memo for a second, so a batch costs a dictionary
lookup per record plus, with `validate_payload`, the payload check. A registry that does
not answer in time raises ServiceUnavailable: the batch is refused with a retriable
error (`on_unavailable: fail`, the default) or its records pass unchecked (`pass`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

from filter_rules.record_actions import SchemaSpec
from interceptors.contract import (
    BuildContext,
    InterceptedRecord,
    RecordRejected,
    ServiceUnavailable,
)
from interceptors.json_schema import short_reason
from interceptors.registry import (
    CONFLUENT_MAGIC,
    PREFIX,
    RegisteredSchema,
    RegistryClient,
    registry_client,
)

NOT_FRAMED: Final = "not in Confluent wire format (magic byte 0 + 4-byte schema id)"
MEMO_S: Final = 1.0  # how long this rule trusts its own verdict on a (topic, id)
_MEMO_ENTRIES: Final = 4096

# (schema or None, reason or None, subjects when the subject depends on each record,
#  expiry): this rule's verdict on a (topic, schema id).
Verdict = tuple[RegisteredSchema | None, str | None, frozenset[str] | None, float]


class Passing(NamedTuple):
    """Records of an id pass this rule until `expiry`; with `validate_payload`, those
    whose payload is valid for `json_schema` (a JSON Schema keg's Kafka filter checks
    itself, `RegisteredSchema.native_json`)."""

    expiry: float
    json_schema: str | None = None


class SchemaInterceptor:
    __slots__ = ("_fail_open", "_memo", "_passing", "_rechecked", "_registry",
                 "_require_subject", "_strategy", "_validate", "allow_null", "target")

    def __init__(self, spec: SchemaSpec, ctx: BuildContext) -> None:
        self.target = spec.target
        self.allow_null = spec.allow_null
        self._registry: RegistryClient = registry_client(spec.registry, ctx)
        self._strategy = spec.subject
        self._require_subject = spec.require_subject
        self._validate = spec.validate_payload
        self._fail_open = spec.on_unavailable == "pass"
        self._memo: dict[tuple[str, int], Verdict] = {}
        # topic -> id -> Passing: the memo's passing verdicts that hold for any record
        # with that id (and, validating, a payload keg's filter can check), `passing`.
        self._passing: dict[str, dict[int, Passing]] = {}
        self._rechecked: dict[tuple[int, str | None], float] = {}

    def configure(self, config: Mapping[str, Any]) -> None:
        """Built when the rule set is compiled; nothing to configure."""

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord | None:
        data = record.value if self.target == "value" else record.key
        reason = self._judge(record.topic, data, time.monotonic())
        if reason is not None:
            raise RecordRejected(reason)
        return record

    def passing(self, topic: str, now: float) -> dict[int, Passing]:
        """The ids whose records of `topic` this rule passes until their expiry (with
        `validate_payload`: only ids of JSON Schemas keg's filter checks itself, which
        a record's payload must then meet)."""
        known = self._passing.get(topic)
        if not known:
            return {}
        return {schema_id: p for schema_id, p in known.items() if p.expiry > now}

    def check_batch(self, topic: str, data: Sequence[bytes | memoryview | None]
                    ) -> list[tuple[int, str, str]]:
        now = time.monotonic()
        judge = self._judge
        memo = self._memo
        validate = self._validate
        # The common case, inline: the id of the previous record, or one this rule knows
        # passes (its subject holds for every record); then only the payload is checked.
        passing, schema = -1, None
        verdicts: list[tuple[int, str, str]] = []
        for position, item in enumerate(data):
            if item is not None and len(item) >= PREFIX and item[0] == 0:
                schema_id = int.from_bytes(item[1:PREFIX], "big")
                if schema_id != passing:
                    known = memo.get((topic, schema_id))
                    if known is not None and known[3] > now and known[1] is None and (
                            known[2] is None) and known[0] is not None:
                        passing, schema = schema_id, known[0]
                if schema_id == passing:
                    if validate:
                        assert schema is not None
                        problem = schema.check(item)
                        if problem is not None:
                            verdicts.append((position, "rejected", short_reason(
                                f"schema id {schema_id}: {problem}")))
                    continue
            try:
                reason = judge(topic, item, now)
            except ServiceUnavailable as err:
                if not err.fail_open:
                    raise
                verdicts.append((position, "unchecked", err.reason))
                continue
            if reason is not None:
                verdicts.append((position, "rejected", reason))
        return verdicts

    # -- judging one key or value ----------------------------------------------------

    def _judge(self, topic: str, data: bytes | memoryview | None, now: float) -> str | None:
        if data is None:
            return None if self.allow_null else f"{self.target} is null"
        if len(data) < PREFIX or data[0] != CONFLUENT_MAGIC:
            return NOT_FRAMED
        schema_id = int.from_bytes(data[1:PREFIX], "big")
        verdict = self._memo.get((topic, schema_id))
        if verdict is None or verdict[3] <= now:
            verdict = self._decide(topic, schema_id, now)
        schema, reason, subjects, _expiry = verdict
        if reason is not None:
            return reason
        if subjects is not None:  # Protobuf: the subject names the message of this record
            assert schema is not None
            name = schema.record_name_of(data)
            reason = self._subject_reason(topic, schema, name, subjects)
            if reason is not None and self._may_recheck((schema_id, name), now):
                subjects = self._registry.subjects(schema_id, self._fail_open, recheck=True)
                self._memo[(topic, schema_id)] = (schema, None, subjects, verdict[3])
                reason = self._subject_reason(topic, schema, name, subjects)
            if reason is not None:
                return reason
        if self._validate and schema is not None:
            problem = schema.check(data)
            if problem is not None:
                return short_reason(f"schema id {schema_id}: {problem}")
        return None

    def _decide(self, topic: str, schema_id: int, now: float) -> Verdict:
        """Ask the registry client (its caches, or the registry) about (topic, id)."""
        schema = self._registry.schema(schema_id, self._fail_open)
        subjects: frozenset[str] | None = None
        reason = None
        if schema is None:
            reason = f"schema id {schema_id} is not registered"
        elif self._require_subject:
            registered = self._registry.subjects(schema_id, self._fail_open)
            if schema.type == "PROTOBUF" and self._strategy != "topic_name":
                subjects = registered  # judged per record (its message indexes)
            else:
                reason = self._subject_reason(topic, schema, schema.record_name, registered)
                # Perhaps registered under it since the cached answer: ask again (at most
                # once per MEMO_S per topic and id, the verdict being remembered).
                if reason is not None:
                    registered = self._registry.subjects(schema_id, self._fail_open,
                                                         recheck=True)
                    reason = self._subject_reason(topic, schema, schema.record_name,
                                                  registered)
        verdict = (schema, reason, subjects, now + MEMO_S)
        if len(self._memo) >= _MEMO_ENTRIES:
            self._memo.clear()
            self._passing.clear()
        self._memo[(topic, schema_id)] = verdict
        passing = self._passing.setdefault(topic, {})
        # Passing for any record of the id: with payload validation, only where keg's
        # filter can check the payload itself (a usable JSON Schema of its subset).
        if schema is None or reason is not None or subjects is not None:
            passing.pop(schema_id, None)
        elif not self._validate:
            passing[schema_id] = Passing(verdict[3])
        elif schema.error is None and schema.native_json is not None:
            passing[schema_id] = Passing(verdict[3], schema.native_json)
        else:
            passing.pop(schema_id, None)
        return verdict

    def _may_recheck(self, key: tuple[int, str | None], now: float) -> bool:
        """Whether a subject found missing may be asked about again now (once per MEMO_S
        per id and record name: a batch of bad records costs one registry call)."""
        if self._rechecked.get(key, 0.0) > now:
            return False
        if len(self._rechecked) >= _MEMO_ENTRIES:
            self._rechecked.clear()
        self._rechecked[key] = now + MEMO_S
        return True

    def _subject_reason(self, topic: str, schema: RegisteredSchema, record_name: str | None,
                        registered: frozenset[str]) -> str | None:
        if self._strategy == "topic_name":
            subject = f"{topic}-{self.target}"
        elif record_name is None:
            what = "title" if schema.type == "JSON" else "record name"
            return f"schema id {schema.id} has no {what}, so no {self._strategy} subject"
        else:
            subject = record_name if self._strategy == "record_name" else f"{topic}-{record_name}"
        if subject in registered:
            return None
        under = ", ".join(sorted(registered)[:3]) or "no subject"
        return short_reason(f"schema id {schema.id} is not registered under subject {subject} "
                            f"(it is under {under})")


def build_schema(spec: SchemaSpec, ctx: BuildContext) -> SchemaInterceptor:
    return SchemaInterceptor(spec, ctx)
