"""Record rules on the wire: Produce requests on the way in, Fetch responses on the way out.

`RecordsFilter` asks for a Produce or Fetch only when a record rule may apply to it
(a dict lookup in the record rules' own index), and then touches only the batches
of topics whose plan has stages; every other batch, partition and topic is
forwarded as its bytes.

Produce: each batch is run through its stages. A batch with a rejected record is
refused with INVALID_RECORD and `record_errors` naming each rejected record and its
rule (Produce v8+; older clients get the error alone); a failed interceptor refuses
it with UNKNOWN_SERVER_ERROR, one out of time (or whose service, a schema registry or a
KMS, is unavailable) with REQUEST_TIMED_OUT, which clients retry. Refused
partitions are taken out of the request and answered by the gateway, merged into
the broker's answer to the rest. Dropped records are removed and the batch
renumbered; for idempotent and transactional producers, later batches' sequence
numbers are shifted down by what was dropped before them (`SequenceLedger`), so the
broker sees no gap and the producer never gets OUT_OF_ORDER_SEQUENCE_NUMBER. A
partition whose every record was dropped is answered as written (offset -1).

Fetch: the broker's answer is rewritten in place: changed batches are re-encoded
with their codec and offsets; dropped records leave offset gaps (as compaction
does) and a batch with nothing left stays as an empty batch, so consumers still
move past it. Control batches (transaction markers) are never touched.

Vouched schema ids (keg's Kafka filter, docs/native.md): after a frame, a topic whose
every stage is a `vouchable` schema rule is reported with the schema ids those rules
currently pass for it (`Vouch`), so the filter can let the next batches of that topic
through itself while every record carries one of them, for as long as the rules'
own verdicts hold (a second at most, `interceptors.builtin.schema.MEMO_S`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Final

import kafka_wire
from ext_proc.connection import ConnectionInfo
from ext_proc.filters import REQUEST, Direction, RequestVerdict, TopicSelector, WhoScope
from ext_proc.filters.rules import (
    RuleDecision,
    RuleEngine,
    RuleSetJudge,
    rules_scope,
    rules_who,
    withhold_partitions,
)
from ext_proc.identity import IdentityTracker
from ext_proc.sequences import ProducerKey
from filter_rules import MatchContext
from filter_rules.compiled import RECORD_APIS, CompiledRule
from filter_rules.record_actions import SchemaSpec
from interceptors.builtin.schema import Passing
from interceptors.engine import (
    REFUSING,
    BatchOutcome,
    FrameBudget,
    OverBudget,
    RecordEngine,
    Stage,
)
from kafka_wire import ApiKey, ErrorCode
from kafka_wire.error_responses import expects_response
from kafka_wire.errors import KafkaWireError
from kafka_wire.records import BatchView, encode_batch, iter_batches, rewrite_records
from kafka_wire.records import with_base_sequence as _with_base_sequence
from kafka_wire.topic_ids import topic_name

log = logging.getLogger(__name__)


Body = dict[str, Any]
# Out of time, or a service the rule needs (a schema registry, a KMS) unavailable: the
# record could not be judged now, and the client may try again.
_RETRIABLE_EFFECTS: Final = frozenset({"timeout", "unavailable"})


# Ids reported per topic and frame (a topic's records carry a few schemas at a time).
MAX_VOUCHED_IDS: Final = 64


@dataclass(frozen=True, slots=True)
class Vouch:
    """Records of `topic` whose value carries one of `ids` (Confluent framing) pass every
    record rule that applies to the topic on this connection, for `ttl_ms`; those of an
    id in `json_schemas` when their payload is valid for that JSON Schema (text) too."""

    topic: str
    ids: tuple[int, ...]
    ttl_ms: int
    json_schemas: tuple[tuple[int, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"topic": self.topic, "ids": list(self.ids),
                                "ttl_ms": self.ttl_ms}
        if self.json_schemas:
            body["json_schemas"] = {str(i): text for i, text in self.json_schemas}
        return body


def vouchable(rule: CompiledRule) -> bool:
    """Whether the Kafka filter may apply `rule` itself from vouched ids: an enforced
    schema rule on values (with `validate_payload`, for ids whose JSON Schema the filter
    checks itself). Whether an id passes is still decided here, with the registry; the
    filter only remembers, and checks payloads as this service would."""
    spec = rule.action.spec
    if not isinstance(spec, SchemaSpec) or rule.dry_run:
        return False
    return spec.target == "value"


def vouch_for(topic: str, stages: tuple[Stage, ...]) -> Vouch | None:
    """The ids every stage of `topic` passes now (None: none, or a stage not vouchable).
    An id two stages pass with different schemas is left out."""
    if not stages or not all(vouchable(stage.rule) for stage in stages):
        return None
    now = time.monotonic()
    ids: dict[int, Passing] | None = None
    for stage in stages:
        passing: dict[int, Passing] = stage.interceptor.passing(topic, now)  # type: ignore[attr-defined]
        ids = dict(passing) if ids is None else {
            i: both for i, known in ids.items() if i in passing
            and (both := _both(known, passing[i])) is not None}
        if not ids:
            return None
    assert ids is not None
    chosen = sorted(ids, key=lambda i: ids[i].expiry, reverse=True)[:MAX_VOUCHED_IDS]
    ttl_ms = int((min(ids[i].expiry for i in chosen) - now) * 1000)
    schemas = tuple((i, text) for i in sorted(chosen) if (text := ids[i].json_schema))
    return Vouch(topic, tuple(sorted(chosen)), ttl_ms, schemas) if ttl_ms > 0 else None


def _both(one: Passing, other: Passing) -> Passing | None:
    """What two stages' passing of an id means together (None: no single schema)."""
    if one.json_schema and other.json_schema and one.json_schema != other.json_schema:
        return None
    return Passing(min(one.expiry, other.expiry), one.json_schema or other.json_schema)


def _success(index: int) -> Body:
    return {"Index": index, "ErrorCode": 0, "BaseOffset": -1, "LogAppendTimeMs": -1,
            "LogStartOffset": -1, "RecordErrors": [], "ErrorMessage": None}


def _refusal_code(outcome: BatchOutcome) -> int:
    """The error a refused batch (or fetched partition) is answered with."""
    failure = outcome.failure
    if failure is None:
        return ErrorCode.INVALID_RECORD
    if failure.effect in _RETRIABLE_EFFECTS:
        return ErrorCode.REQUEST_TIMED_OUT
    return ErrorCode.UNKNOWN_SERVER_ERROR


def _fetch_refusal_code(outcome: BatchOutcome) -> int:
    """The error a fetched partition whose records a rule could not judge is answered
    with. A retriable failure (a service down, out of time) is NOT_LEADER_OR_FOLLOWER:
    every client refreshes its metadata and fetches again; Java's fetcher throws from
    poll() on REQUEST_TIMED_OUT (IllegalStateException: unexpected error code 7) and an
    application that does not catch it died."""
    failure = outcome.failure
    if failure is not None and failure.effect in _RETRIABLE_EFFECTS:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return _refusal_code(outcome)


def _before(records: Any, cut: int) -> bytes:
    """The entries of a fetched records field before the batch whose base offset is
    `cut` (the answer cut short there, as a broker cuts one at its size limit)."""
    kept = []
    for entry in iter_batches(records):
        if isinstance(entry, BatchView) and entry.base_offset >= cut:
            break
        kept.append(bytes(entry.raw))
    return b"".join(kept)


def _refusal(index: int, outcome: BatchOutcome) -> Body:
    entry = _success(index)
    entry["ErrorCode"] = _refusal_code(outcome)
    if outcome.failure is not None:
        failure = outcome.failure
        entry["ErrorMessage"] = f"keg rule {failure.rule_id}: {failure.reason}"[:1000]
        return entry
    first = outcome.rejections[0]
    entry["RecordErrors"] = [
        {"BatchIndex": r.index, "BatchIndexErrorMessage": f"keg rule {r.rule_id}: {r.reason}"}
        for r in outcome.rejections
    ]
    entry["ErrorMessage"] = (f"keg rule {first.rule_id} rejected record {first.index}: "
                             f"{first.reason}")[:1000]
    return entry


def _corrupt(index: int, err: Exception) -> Body:
    entry = _success(index)
    entry["ErrorCode"] = ErrorCode.CORRUPT_MESSAGE
    entry["ErrorMessage"] = f"keg: the batch does not decode: {err}"[:1000]
    return entry


def _too_costly(index: int, err: OverBudget) -> Body:
    entry = _success(index)
    entry["ErrorCode"] = (ErrorCode.REQUEST_TIMED_OUT if err.retriable
                          else ErrorCode.MESSAGE_TOO_LARGE)
    entry["ErrorMessage"] = f"keg: {err}"[:1000]
    return entry


def _unknown_topic(index: int) -> Body:
    entry = _success(index)
    entry["ErrorCode"] = ErrorCode.UNKNOWN_TOPIC_ID
    entry["ErrorMessage"] = "keg: topic id not seen in a Metadata answer yet; refresh metadata"
    return entry


# A Produce topic entry's key in its answer: the name (v0-12) or the id (v13+).
TopicKey = tuple[str, Any]


def _topic_key(topic: Body) -> TopicKey:
    return ("TopicId", topic["TopicId"]) if "TopicId" in topic else ("Name", topic.get("Name"))


def _merge_partitions(response: Body, answered: dict[TopicKey, list[Body]]) -> bool:
    """Put the gateway's partition answers into the broker's Produce response."""
    topics = response.setdefault("Responses", [])
    by_key = {_topic_key(t): t for t in topics}
    for key, partitions in answered.items():
        topic = by_key.get(key)
        if topic is None:
            field, value = key
            topics.append({field: value, "PartitionResponses": list(partitions)})
        else:
            topic["PartitionResponses"] = [*(topic.get("PartitionResponses") or []),
                                           *partitions]
    return bool(answered)


class RecordsFilter(RuleSetJudge):
    def __init__(self, engine: RuleEngine, identity: IdentityTracker,
                 vouches: list[Vouch] | None = None) -> None:
        super().__init__(engine, identity)
        # Where this frame's vouches go (the native path's sessions; None: not reported).
        self._vouches = vouches

    def wants_request(self, api_key: int, api_version: int) -> bool:
        return api_key in RECORD_APIS and self._engine.records.interested(api_key, api_version)

    def misses_harmlessly(self, api_key: int, api_version: int) -> bool:
        """Dry-run record rules alone may act on the frame: they run on a copy that goes
        nowhere, so it may pass untouched when the service cannot take it."""
        return all(rule.dry_run for rule in self._candidates(api_key, api_version))

    def enforced_scope(self, api_key: int, api_version: int) -> TopicSelector | None:
        """The topics of the record rules that may act on the frame and are no dry runs."""
        return rules_scope(r for r in self._candidates(api_key, api_version) if not r.dry_run)

    def topic_scope(self, api_key: int, api_version: int,
                    direction: Direction) -> TopicSelector | None:
        """The topics a record rule may plan stages for (`RecordEngine.plan` matches
        each topic of a Produce request or Fetch/ShareFetch response against these)."""
        if direction != REQUEST or api_key not in RECORD_APIS:
            return None
        return rules_scope(self._candidates(api_key, api_version))

    def who_scope(self, api_key: int, api_version: int,
                  direction: Direction) -> WhoScope | None:
        """Who a record rule may act for."""
        if direction != REQUEST or api_key not in RECORD_APIS:
            return None
        return rules_who(self._candidates(api_key, api_version))

    def unvouchable_scope(self, api_key: int, api_version: int
                          ) -> tuple[bool, TopicSelector | None]:
        """Whether a `vouchable` rule may act on the frame (Produce, or Fetch's answer),
        and the topics the other record rules may act on."""
        candidates = self._candidates(api_key, api_version)
        others = [rule for rule in candidates if not vouchable(rule)]
        return len(others) < len(candidates), rules_scope(others)

    def _candidates(self, api_key: int, api_version: int) -> tuple[CompiledRule, ...]:
        frame = "request" if api_key == ApiKey.PRODUCE else "response"
        return self._engine.records.rules.candidates(api_key, api_version, frame)

    def _vouch(self, topic: str, stages: tuple[Stage, ...]) -> None:
        if self._vouches is not None:
            vouch = vouch_for(topic, stages)
            if vouch is not None:
                self._vouches.append(vouch)

    def judge(
        self, header: kafka_wire.RequestHeader, body: Body, conn: ConnectionInfo
    ) -> RequestVerdict | None:
        records = self._engine.records  # one version for the whole request
        ctx = self._match_context(header, conn, self._principal(), conn.client_host)
        if header.api_key == ApiKey.PRODUCE:
            return self._produce(records, header, body, conn, ctx)
        if self._answer_needs_no_stage(records, header, body, ctx):
            return None
        return self._fetch(records, header, conn, ctx)

    def _answer_needs_no_stage(self, records: RecordEngine, header: kafka_wire.RequestHeader,
                               body: Body, ctx: MatchContext) -> bool:
        """Whether a full Fetch names only topics no record rule plans stages for: its
        answer carries those topics alone, so it need not come back through the chain
        (it did for every Fetch, whatever its topics, once any consume-time rule existed:
        a deny rule on Fetch then brought every answer of its topics through Python).
        An incremental Fetch (KIP-227) is answered for its whole session, and a share
        fetch for its share session: both always come back; so does a topic id not yet
        named (the answer withholds it)."""
        if header.api_key != ApiKey.FETCH:
            return False
        if header.api_version >= 7 and body.get("SessionEpoch", -1) not in (0, -1):
            return False
        for topic in body.get("Topics") or ():
            name = topic_name(topic, self._engine.topic_ids)
            if name is None or records.plan("consume", name, ctx):
                return False
        return True

    # -- Produce -------------------------------------------------------------------------

    def _produce(self, records: RecordEngine, header: kafka_wire.RequestHeader, body: Body,
                 conn: ConnectionInfo, ctx: MatchContext) -> RequestVerdict | None:
        answered: dict[TopicKey, list[Body]] = {}
        changed = False
        kept_topics = []
        expects = expects_response(header.api_key, header.api_version, body)
        budget = FrameBudget(self._engine.limits)  # the work this one request may cause
        for topic in body.get("TopicData") or ():
            name = topic_name(topic, self._engine.topic_ids)
            if name is None:  # v13+: an id the gateway has not seen named yet
                answered[_topic_key(topic)] = [
                    _unknown_topic(p.get("Index", 0)) for p in topic.get("PartitionData") or ()]
                changed = True
                continue
            stages = records.plan("produce", name, ctx)
            if not stages:
                kept_topics.append(topic)
                continue
            kept_partitions = []
            for partition in topic.get("PartitionData") or ():
                index = partition.get("Index", 0)
                new, answer = self._produce_partition(records, stages, name, index,
                                                      partition.get("Records"), header, conn,
                                                      ctx.principal, budget, expects)
                if answer is not None:
                    answered.setdefault(_topic_key(topic), []).append(answer)
                    changed = True
                    continue
                if new is not partition.get("Records"):
                    partition["Records"] = new
                    changed = True
                kept_partitions.append(partition)
            if kept_partitions:
                topic["PartitionData"] = kept_partitions
                kept_topics.append(topic)
            self._vouch(name, stages)
        if not changed:
            return None
        body["TopicData"] = kept_topics
        if not kept_topics:
            whole: Body = {"Responses": [], "ThrottleTimeMs": 0}
            _merge_partitions(whole, answered)
            return RequestVerdict(answer=whole, expects_response=expects)
        if not answered:
            return RequestVerdict(changed=True, expects_response=expects)
        return RequestVerdict(changed=True, expects_response=expects,
                              patch=lambda response: _merge_partitions(response, answered))

    def _produce_partition(
        self, records: RecordEngine, stages: tuple[Stage, ...], topic: str, partition: int,
        data: Any, header: kafka_wire.RequestHeader, conn: ConnectionInfo,
        principal: str | None, budget: FrameBudget, expects_answer: bool = True,
    ) -> tuple[Any, Body | None]:
        """The partition's new records field, or the gateway's answer for it (which
        reaches no one when the producer asked for none: acks=0)."""
        if data is None:
            return data, None
        pieces: list[bytes | memoryview] = []
        changed = False
        ledger = self._engine.sequences
        try:
            entries = list(iter_batches(data))
        except KafkaWireError as err:  # a corrupt size or an unknown magic, as the broker says
            return None, _corrupt(partition, err)
        for entry in entries:
            if not isinstance(entry, BatchView) or entry.is_control:
                pieces.append(entry.raw)
                continue
            try:
                outcome = records.process_batch(entry, stages, topic=topic,
                                                partition=partition, direction="produce",
                                                principal=principal, budget=budget)
            except KafkaWireError as err:  # corrupt, or past the decompression limit
                return None, _corrupt(partition, err)
            except OverBudget as err:
                self._over_budget(topic, partition, err, conn)
                return None, _too_costly(partition, err)
            self._report(outcome, header, conn, topic, partition, answered=expects_answer)
            if outcome.refused:
                return None, _refusal(partition, outcome)
            shift = 0  # idempotent producers: what was dropped from earlier batches
            if entry.producer_id >= 0 and entry.base_sequence >= 0:
                key: ProducerKey = (entry.producer_id, entry.producer_epoch, topic, partition)
                shift = ledger.shift(key, entry.base_sequence)
                if outcome.dropped:
                    ledger.dropped(key, entry.base_sequence, outcome.dropped)
            if outcome.records is None:
                if shift:
                    pieces.append(_with_base_sequence(entry, entry.base_sequence - shift))
                    changed = True
                else:
                    pieces.append(entry.raw)
                continue
            changed = True
            if not outcome.records:
                continue  # every record dropped: nothing of this batch goes on
            batch_header = entry.header._replace(base_sequence=entry.base_sequence - shift,
                                                 last_offset_delta=len(outcome.records) - 1)
            pieces.append(encode_batch(batch_header, outcome.records, renumber=True,
                                       xerial=entry.is_xerial))
        if not changed:
            return data, None
        if not pieces:
            return None, _success(partition)
        return b"".join(pieces), None

    # -- Fetch ---------------------------------------------------------------------------

    def _fetch(self, records: RecordEngine, header: kafka_wire.RequestHeader,
               conn: ConnectionInfo, ctx: MatchContext) -> RequestVerdict | None:
        """A Fetch's or ShareFetch's answer, rewritten: both carry Responses[].Partitions[]
        with PartitionIndex, ErrorCode and Records. A share consumer acknowledges the
        acquired offsets a rewrite left out as gaps (KIP-932), so a dropped record is
        not delivered again; a withheld partition's acquired records go back to the
        group when their lock expires."""
        principal = ctx.principal

        def transform(response: Body) -> bool:
            changed = False
            budget = FrameBudget(self._engine.limits)
            for topic in response.get("Responses") or ():
                name = topic_name(topic, self._engine.topic_ids)
                if name is None:  # v13+: an id not seen named yet: hand out nothing
                    changed |= withhold_partitions(topic.get("Partitions") or (),
                                                   ErrorCode.UNKNOWN_TOPIC_ID)
                    continue
                stages = records.plan("consume", name, ctx)
                if not stages:
                    continue
                for partition in topic.get("Partitions") or ():
                    changed |= self._fetch_partition(records, stages, name, partition,
                                                     header, conn, principal, budget)
                self._vouch(name, stages)
            return changed

        return RequestVerdict(patch=transform)

    def _fetch_partition(self, records: RecordEngine, stages: tuple[Stage, ...], topic: str,
                         partition: Body, header: kafka_wire.RequestHeader,
                         conn: ConnectionInfo, principal: str | None,
                         budget: FrameBudget) -> bool:
        data = partition.get("Records")
        if not data or partition.get("ErrorCode"):
            return False
        index = partition.get("PartitionIndex", 0)
        refused: list[int] = []  # the error code the partition is answered with
        cut: list[int] = []  # the base offset from which its records wait for a next fetch
        # Not ShareFetch: a Fetch answer may go out cut short (a broker's does at its size
        # limit), a ShareFetch answer's acquired records would be acknowledged as gaps.
        fetch = header.api_key == ApiKey.FETCH

        def rewrite(batch: BatchView) -> Any:
            if refused or cut:
                return None
            try:
                outcome = records.process_batch(batch, stages, topic=topic, partition=index,
                                                direction="consume", principal=principal,
                                                budget=budget)
            except KafkaWireError as err:
                # Never hand out records a rule could not see (fail closed).
                log.warning("fetched batch of %s-%d does not decode: %s", topic, index, err)
                refused.append(ErrorCode.CORRUPT_MESSAGE)
                return None
            except OverBudget as err:
                if fetch and err.frame_level and budget.batches_done:
                    # The answer had too much for one frame's budget, not this batch:
                    # it goes out with what was done (a 400,000-record backlog answered
                    # CORRUPT_MESSAGE made Java's poll() throw, at every fetch).
                    cut.append(batch.base_offset)
                    log.debug("fetched %s-%d cut short at offset %d: %s", topic, index,
                              batch.base_offset, err)
                    return None
                self._over_budget(topic, index, err, conn)
                refused.append(ErrorCode.CORRUPT_MESSAGE)
                return None
            budget.batches_done += 1
            self._report(outcome, header, conn, topic, index)
            if outcome.failure is not None:
                refused.append(_fetch_refusal_code(outcome))
            return outcome.records

        try:
            # A Fetch batch a rule emptied goes out as an empty control batch: librdkafka
            # took answers of plain empty ones for messages too large to fetch.
            # Without the partial batch a Fetch answer may end with (at the broker's size
            # limit): clients skip it, but its complete records are readable, and no rule
            # read them (a consumer choosing its max_bytes read a topic unmasked).
            new = rewrite_records(data, rewrite, empty_as_control=fetch, drop_truncated=True)
        except KafkaWireError as err:  # a corrupt size or an unknown magic
            log.warning("fetched records of %s-%d do not decode: %s", topic, index, err)
            refused.append(ErrorCode.CORRUPT_MESSAGE)
        if refused:
            # Nothing of this partition reaches the consumer; it fetches it again.
            return withhold_partitions((partition,), refused[0])
        if cut:
            partition["Records"] = _before(new, cut[0])
            return True
        if new is data:
            return False
        partition["Records"] = new
        return True

    # -- what happened -------------------------------------------------------------------

    def _over_budget(self, topic: str, partition: int, err: OverBudget,
                     conn: ConnectionInfo) -> None:
        log.warning("record rules refused %s-%d: %s (%s)", topic, partition, err,
                     conn.describe())
        self._engine.over_budget(topic)

    def _report(self, outcome: BatchOutcome, header: kafka_wire.RequestHeader,
                conn: ConnectionInfo, topic: str, partition: int,
                answered: bool = True) -> None:
        """One decision per (rule, effect) of the batch; refusals carry the error code the
        client is answered with (`answered=False`: no answer reaches it, acks=0)."""
        if not outcome.counts:
            return
        produce = header.api_key == ApiKey.PRODUCE
        rejected = {r.rule_id: r.reason for r in outcome.rejections}
        for (rule_id, effect), count in outcome.counts.items():
            if effect == "unchanged":
                continue
            rule = self._engine.records.rules.get(rule_id)
            if rule is None:
                continue
            reason = (rejected.get(rule_id) if effect in REFUSING
                      else outcome.notes.get((rule_id, effect)))
            if outcome.failure is not None and outcome.failure.rule_id == rule_id:
                reason = outcome.failure.reason
            # A fetched record that fails validation is withheld, not refused: no error.
            refusing = effect in REFUSING and (produce or outcome.failure is not None)
            code = ((_refusal_code if produce else _fetch_refusal_code)(outcome)
                    if refusing else None)
            self._engine.sink(RuleDecision(
                rule, effect, header, conn, self._identity.principal,
                self._identity.security_protocol, topic, code, reason, partition=partition,
                records=count, answered=answered or code is None,
                volume=(outcome.sizes.get((rule_id, effect), 0), count),
                rule_version=self._engine.records.version))
