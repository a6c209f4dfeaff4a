"""Dry runs: a rule set applied to sample requests and records, by the data path's code.

Requests go through the data path's own filters in its order: virtual topics first
(a tenant's `orders` becomes the broker's `tenant-a.orders`, so rules see broker
names, and answers are renamed back), then `ext_proc.filters.rules.RulesFilter` (what
a gateway does to a decoded request: forward, forward changed, answer from the
gateway). Records go through `interceptors.engine.RecordEngine` (mask, encrypt,
validate, drop, ...) under the broker's name of their topic, so a dry run decides
exactly what the data path would. Nothing leaves the process:
copies are collected, not sent, and `capture` writes nothing (both are reported as
side effects). Rate limits start empty for each dry run.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

import kafka_wire
from control_plane.api.problems import Problem
from ext_proc.chain import FilterChain
from ext_proc.connection import ConnectionInfo
from ext_proc.filters import REQUEST
from ext_proc.filters.order import rule_filters
from ext_proc.filters.rules import ENFORCED_KINDS, RuleDecision, RuleEngine
from ext_proc.filters.virtual_topics import VirtualTopicsFilter
from ext_proc.identity import IdentityTracker
from filter_rules import CompiledRuleSet, RuleSet, normalize_principal, resolve_api
from filter_rules.errors import error_name
from interceptors import BuildContext, InterceptedRecord, NoSideEffects
from interceptors.engine import PLAN_VERSIONS, RecordEngine, RecordOutcome, default_builders
from interceptors.side_effects import text_or_b64
from kafka_wire import ApiKey
from kafka_wire.entity_names import TOPIC


class _Sample(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SampleRequest(_Sample):
    """A Kafka request as a client would send it: `body` in the codec's JSON form
    (fields left out take their defaults; byte fields cannot be given this way), or
    the whole `frame` in base64 (header and body, without the 4-byte size)."""

    api: str | int | None = Field(default=None, description="API name ('Produce') or key.")
    version: int | None = Field(default=None, ge=0, le=32767)
    body: dict[str, Any] | None = None
    frame_b64: str | None = Field(default=None, description="A request frame, base64.")
    client_id: str | None = "keg-dry-run"
    principal: str | None = Field(default=None, description="'User:alice' or 'alice'; "
                                  "none: an unauthenticated client.")
    client_host: str = "127.0.0.1"
    listener: str | None = Field(default=None, description="The gateway listener, host:port.")
    broker_id: int | None = Field(default=None, ge=0)


class SampleHeader(_Sample):
    name: str
    value: str | None = None
    value_b64: str | None = None


class SampleRecord(_Sample):
    """A record as produced (or, with direction consume, as fetched): key and value as
    text, or as base64 in the `_b64` fields."""

    topic: str = Field(min_length=1)
    partition: int = Field(default=0, ge=0)
    key: str | None = None
    key_b64: str | None = None
    value: str | None = None
    value_b64: str | None = None
    headers: list[SampleHeader] = Field(default_factory=list)
    timestamp: int = -1
    offset: int | None = None
    principal: str | None = None
    direction: Literal["produce", "consume"] = "produce"
    client_id: str | None = None
    client_host: str | None = None


@dataclass
class DryRunResult:
    requests: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    side_effects: list[dict[str, Any]] = field(default_factory=list)


def dry_run(ruleset: RuleSet, requests: Sequence[SampleRequest],
            records: Sequence[SampleRecord]) -> DryRunResult:
    """Raises RuleSetInvalid when the rule set cannot be built, Problem(422) for a
    sample that cannot be read."""
    compiled = CompiledRuleSet(ruleset)
    result = DryRunResult()
    decisions: list[RuleDecision] = []
    # Request rules and virtual topics (record rules are built below, side effects kept).
    engine = RuleEngine(compiled.subset(ENFORCED_KINDS | {"virtual_topics"}), decisions.append)
    for index, sample in enumerate(requests):
        decisions.clear()
        result.requests.append(_run_request(engine, sample, index, decisions))
    if records:
        effects = _DryRunEffects()
        engine_r = record_engine(compiled, effects)
        try:
            for index, given in enumerate(records):
                record = _record(given, index)
                client_topic = record.topic
                broker_topic = record.topic = _broker_topic(engine, given, client_topic)
                outcome = engine_r.evaluate(record, given.client_id, given.client_host)
                if outcome.record is not None:
                    outcome.record.topic = client_topic  # the client's view, as it wrote it
                result.records.append(_record_outcome(index, outcome, broker_topic))
        finally:
            engine_r.close()
        result.side_effects = effects.reported
    return result


def record_engine(compiled: CompiledRuleSet, effects: _DryRunEffects | None = None) -> RecordEngine:
    """The data path's record engine, with side effects collected instead of done.

    Raises RuleSetInvalid (file:line of each rule) when a record rule cannot be built.
    """
    effects = effects or _DryRunEffects()
    builders = {**default_builders(), "capture": effects.capture_builder}
    return RecordEngine(compiled, BuildContext(side_effects=effects), builders=builders)


# --- requests ----------------------------------------------------------------------


class _GivenIdentity(IdentityTracker):
    """A connection whose principal the sample states (no SASL exchange to learn it)."""

    def __init__(self, principal: str | None) -> None:
        super().__init__()
        self._given = normalize_principal(principal) if principal else None

    @property
    def principal(self) -> str:
        return self._given or "User:ANONYMOUS"

    @property
    def principal_known(self) -> bool:
        return self._given is not None


def _run_request(engine: RuleEngine, sample: SampleRequest, index: int,
                 decisions: list[RuleDecision]) -> dict[str, Any]:
    header, body = _decode_sample(sample, index)
    conn = ConnectionInfo(client_host=sample.client_host, gateway_address=sample.listener or "",
                          connection_id=f"dry-run-{index}", broker_id=sample.broker_id)
    identity = _GivenIdentity(sample.principal)
    # The order of DataPath.session: virtual topics first, so rules see broker names.
    chain = FilterChain(rule_filters(engine, identity))
    out: dict[str, Any] = {
        "index": index, "api": kafka_wire.api_name(header.api_key), "api_key": header.api_key,
        "version": header.api_version,
    }
    if not chain.wants(header.api_key, header.api_version, REQUEST):
        return {**out, "verdict": "forward", "decisions": []}
    verdict = chain.on_request(header, body, conn)
    if verdict is None:
        out["verdict"] = "forward"
    elif verdict.answer is not None:
        out["verdict"] = "answer"
        out["answer"] = jsonable(verdict.answer)
        out["expects_response"] = verdict.expects_response
    else:
        out["verdict"] = "forward-changed" if verdict.changed else "forward"
        if verdict.changed:
            out["forwarded"] = jsonable(body)
        out["response_patched"] = verdict.patch is not None
    if verdict is not None and verdict.delay_s:
        out["delay_ms"] = round(verdict.delay_s * 1000)
    out["decisions"] = [_decision(d) for d in decisions]
    return out


def _decode_sample(sample: SampleRequest, index: int) -> tuple[kafka_wire.RequestHeader,
                                                              dict[str, Any]]:
    where = f"requests[{index}]"
    if sample.frame_b64 is not None:
        frame = _b64(sample.frame_b64, f"{where}.frame_b64")
        try:
            return kafka_wire.decode_request(frame)
        except Exception as err:  # untrusted bytes: any failure to read them is the sample's
            raise _bad(where, f"cannot read the frame: {err}") from None
    if sample.api is None or sample.version is None:
        raise _bad(where, "give api and version (and body), or frame_b64")
    try:
        api_key = resolve_api(sample.api)
        header = kafka_wire.RequestHeader(api_key, sample.version, index, sample.client_id, {})
        # Encoding fills in defaults and checks types; decoding gives the data path's form.
        data = kafka_wire.encode_body(api_key, sample.version, "request", sample.body or {})
        return header, kafka_wire.decode_body(api_key, sample.version, "request", data)[0]
    except Exception as err:
        raise _bad(where, f"cannot read the request: {err}") from None


def _broker_topic(engine: RuleEngine, sample: SampleRecord, topic: str) -> str:
    """The broker's name of a record's topic: what record rules see on the data path
    (renamed by the virtual-topics rule that matches the sample's connection, if any)."""
    api_key = ApiKey.PRODUCE if sample.direction == "produce" else ApiKey.FETCH
    header = kafka_wire.RequestHeader(api_key, PLAN_VERSIONS[sample.direction], 0,
                                      sample.client_id, {})
    conn = ConnectionInfo(client_host=sample.client_host or "127.0.0.1")
    namespace = VirtualTopicsFilter(engine, _GivenIdentity(sample.principal)).namespace(
        header, conn)
    renamed = None if namespace is None else namespace.to_broker[TOPIC](topic)
    return renamed or topic


def _decision(decision: RuleDecision) -> dict[str, Any]:
    code = decision.error_code
    return {
        "rule": decision.rule.id, "outcome": decision.outcome, "topic": decision.topic,
        "error_code": code, "error": error_name(code) if code is not None else None,
        "reason": decision.reason, "principal": decision.principal,
    }


# --- records -------------------------------------------------------------------------


class _Passthrough:
    def __init__(self, rule: str, reported: list[dict[str, Any]]) -> None:
        self.rule, self.reported = rule, reported

    def configure(self, config: Any) -> None:
        pass

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord:
        self.reported.append({"kind": "capture", "target": self.rule, "record": _record_json(
            record)})
        return record


class _DryRunEffects(NoSideEffects):
    """Copies and captures collected for the answer, none sent or written."""

    def __init__(self) -> None:
        super().__init__()
        self.reported: list[dict[str, Any]] = []

    def to_topic(self, topic: str, record: InterceptedRecord) -> bool:
        self.reported.append({"kind": "copy-to-topic", "target": topic,
                              "record": _record_json(record)})
        return True

    def to_http(self, url: str, record: InterceptedRecord, queue_size: int) -> bool:
        self.reported.append({"kind": "copy-to-http", "target": url,
                              "record": _record_json(record)})
        return True

    def capture_builder(self, spec: Any, ctx: BuildContext) -> _Passthrough:
        return _Passthrough(str(getattr(spec, "path", "capture")), self.reported)


def _record(sample: SampleRecord, index: int) -> InterceptedRecord:
    where = f"records[{index}]"
    headers = [(h.name, _bytes(h.value, h.value_b64, f"{where}.headers.{h.name}"))
               for h in sample.headers]
    return InterceptedRecord(
        topic=sample.topic, partition=sample.partition,
        key=_bytes(sample.key, sample.key_b64, f"{where}.key"),
        value=_bytes(sample.value, sample.value_b64, f"{where}.value"),
        headers=headers, timestamp=sample.timestamp, offset=sample.offset,
        principal=normalize_principal(sample.principal) if sample.principal else None,
        direction=sample.direction,
    )


def _record_outcome(index: int, outcome: RecordOutcome, broker_topic: str) -> dict[str, Any]:
    return {
        "index": index, "status": outcome.status, "reason": outcome.reason,
        "broker_topic": broker_topic,
        "record": _record_json(outcome.record) if outcome.record is not None else None,
        "steps": [{"rule": s.rule_id, "kind": s.kind, "effect": s.effect, "reason": s.reason,
                   "dry_run": s.dry_run} for s in outcome.steps],
    }


def _record_json(record: InterceptedRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"topic": record.topic, "partition": record.partition,
                           "timestamp": record.timestamp, "offset": record.offset}
    out.update(text_or_b64("key", record.key))
    out.update(text_or_b64("value", record.value))
    out["headers"] = [{"name": n, **text_or_b64("value", v)} for n, v in record.headers]
    return out


# --- JSON forms ----------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """A decoded Kafka body as JSON: bytes become {"b64": ...}."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return {"b64": base64.b64encode(bytes(value)).decode()}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)  # uuids and the like


def _bytes(text: str | None, b64: str | None, where: str) -> bytes | None:
    if text is not None and b64 is not None:
        raise _bad(where, "give the text or the base64 form, not both")
    if b64 is not None:
        return _b64(b64, where)
    return None if text is None else text.encode("utf-8", "surrogatepass")


def _b64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(where, "not valid base64") from None


def _bad(where: str, message: str) -> Problem:
    return Problem(422, "Invalid sample", f"{where}: {message}", kind="invalid-sample",
                   errors=[{"file": "request", "line": None, "column": None, "field": where,
                            "message": message}])
