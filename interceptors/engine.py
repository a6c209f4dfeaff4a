"""The record engine: a rule set's record rules compiled to stages, run over records.

One `RecordEngine` per rule-set version. `plan(direction, topic, ctx)` picks the
stages (rules) that apply to a topic for a connection, in evaluation order; `run`
passes a list of records through them, stage by stage; `process_batch` does that
for one v2 record batch and says what became of it. The gateway (Produce requests,
Fetch responses) and backtests (`evaluate`, one record) run exactly this code.

Per stage and record: the interceptor returns the record (changed or not), None
(drop), or raises RecordRejected (the record is invalid), ServiceUnavailable (a
service it needs did not answer: `unavailable`, a retriable refusal, or `unchecked`, the
record passing as the rule allows) or anything else (the interceptor failed). A plan
whose every stage is a read-only `BatchCheck` (the `schema` rule) judges each batch's
keys or values at once, without a record object per record. A custom interceptor runs
in a worker thread under its time budget per batch; after `retries` timed-out attempts
the stage fails with a timeout. Dry-run rules run on a copy and only report what they
would have done: their copies go nowhere and a dry-run capture writes nothing (a custom
interceptor's own I/O is its author's business).

"Unchanged" is decided without comparing bytes: an interceptor that leaves a record
alone returns the same key and value objects and equal headers.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from filter_rules import CompiledRule, CompiledRuleSet, MatchContext, RuleError, RuleSetInvalid
from filter_rules.compiled import CONSUME_APIS
from filter_rules.record_actions import RECORD_KINDS, record_spec
from interceptors.contract import (
    BatchCheck,
    BuildContext,
    InterceptedRecord,
    Interceptor,
    InterceptorConfigError,
    RecordDirection,
    RecordRejected,
    ServiceUnavailable,
)
from interceptors.custom import build_custom
from kafka_wire import ApiKey
from kafka_wire.compression import MAX_DECOMPRESSED, declared_size
from kafka_wire.records import BatchView, Record, decode_field, decode_records

log = logging.getLogger(__name__)

# The versions a record is judged at outside the data path (backtests, dry runs): the
# newest a client speaks. Records do not change with versions; rules may restrict them.
PLAN_VERSIONS: Final = {"produce": 13, "consume": 18}

Effect = Literal["unchanged", "modified", "dropped", "rejected", "failed", "timeout",
                 "unavailable", "unchecked"]
# What refuses a record: it is invalid, or it could not be judged (failed, out of time,
# a service unavailable).
REFUSING: Final = frozenset({"rejected", "failed", "timeout", "unavailable"})
Status = Literal["unchanged", "modified", "dropped", "rejected", "failed"]

# Custom interceptors run here so a slow one costs its budget, not the event loop.
_WORKERS = concurrent.futures.ThreadPoolExecutor(max_workers=32,
                                                 thread_name_prefix="keg-interceptor")


MiB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class RecordLimits:
    """The most record rules do for one frame (a Produce request, a Fetch response).

    A gateway that decodes records must bound the work one client can cause: a few
    hundred bytes of zstd can hold a million records or gigabytes of zeros. Beyond a
    bound the frame's batches are refused (Produce: MESSAGE_TOO_LARGE with the reason;
    Fetch: withheld) before the work is done, never after. Defaults: far above what a
    producer's batch holds (librdkafka: 10,000 records; a 1 MiB batch of 10-byte
    records: 100,000), far below what stalls a core.
    """

    max_records_per_batch: int = 100_000
    max_decompressed_per_batch: int = 32 * MiB
    max_records_per_frame: int = 500_000
    max_decompressed_per_frame: int = 128 * MiB
    # Checked every few hundred records; below the hand-off timeout (`keg up
    # --message-timeout`, 2 s): at 4 s the module had answered the client a timeout
    # while the worker went on for 2 s more, and every other connection of that worker
    # waited for it (its threads share one GIL).
    max_frame_seconds: float = 1.5


DEFAULT_LIMITS: Final = RecordLimits()
_CHECK_EVERY: Final = 256  # records between two looks at the clock


class OverBudget(Exception):
    """A frame asks for more record work than `RecordLimits` allows. `retriable` when
    it ran out of time (a busy gateway may do it next time), not of records or bytes.
    `frame_level` when the frame as a whole had too much (its time, its records or
    bytes), not this batch: a fetched answer can then go out with the batches done so
    far, and the consumer fetches the rest next time."""

    def __init__(self, reason: str, retriable: bool = False, frame_level: bool = False) -> None:
        super().__init__(reason)
        self.retriable = retriable
        self.frame_level = frame_level or retriable


class FrameBudget:
    """What is left of one frame's `RecordLimits`, spent batch by batch."""

    __slots__ = ("batches_done", "bytes_left", "deadline", "limits", "records_left")

    def __init__(self, limits: RecordLimits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self.batches_done = 0  # batches judged whole (a fetched answer may go out with them)
        self.records_left = limits.max_records_per_frame
        self.bytes_left = limits.max_decompressed_per_frame
        self.deadline = time.monotonic() + limits.max_frame_seconds

    def admit(self, batch: BatchView) -> int:
        """Take a batch's records and declared size from the budget, before any work;
        returns the most it may decompress to."""
        limits = self.limits
        count = batch.records_count
        if count > limits.max_records_per_batch:
            raise OverBudget(f"a batch of {count} records exceeds the gateway's "
                             f"{limits.max_records_per_batch} per batch")
        if count > self.records_left:
            raise OverBudget(f"the request holds more than {limits.max_records_per_frame} "
                             "records for record rules", frame_level=True)
        self.records_left -= count
        declared = declared_size(batch.compression, batch.payload)
        allowed = min(limits.max_decompressed_per_batch, self.bytes_left)
        if declared is not None and declared > allowed:
            raise OverBudget(f"a batch that decompresses to {declared} bytes exceeds the "
                             f"gateway's {allowed} for record rules",
                             frame_level=declared <= limits.max_decompressed_per_batch)
        return allowed

    def spent(self, nbytes: int) -> None:
        self.bytes_left -= nbytes

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise OverBudget(f"record rules ran past the frame's "
                             f"{self.limits.max_frame_seconds:g} s budget", retriable=True)


@dataclass(frozen=True, slots=True)
class Stage:
    """One record rule, built: its interceptor and, for custom ones, the budget."""

    rule: CompiledRule
    interceptor: Interceptor
    timeout_s: float | None = None  # None: runs inline (built-ins)
    retries: int = 0
    checks_batches: bool = False  # a read-only BatchCheck: may judge whole batches

    @property
    def rule_id(self) -> str:
        return self.rule.id

    @property
    def kind(self) -> str:
        return self.rule.kind


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one stage did to one record."""

    rule_id: str
    kind: str
    effect: Effect
    reason: str | None = None
    dry_run: bool = False
    # Key, value and header bytes of the record as the rule got it and as it passed it
    # on (0: dropped, rejected, failed; a dry-run rule passes it on as it got it): set by
    # `RecordEngine.run(..., measure=True)` only (backtests), None otherwise.
    bytes_in: int | None = None
    bytes_out: int | None = None


@dataclass(slots=True)
class RecordOutcome:
    """What became of one record: its final form (None: dropped) and each step."""

    record: InterceptedRecord | None
    status: Status = "unchanged"
    reason: str | None = None
    steps: list[StepResult] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Rejection:
    index: int  # the record's position in its batch (Produce's record_errors BatchIndex)
    rule_id: str
    reason: str


@dataclass(slots=True)
class BatchOutcome:
    """What became of one batch.

    `records` is None when the batch passes as its bytes; otherwise the records to
    encode (each keeps its offset delta; [] when every record was dropped).
    `rejections` (invalid records) and `failure` (an interceptor error or timeout)
    mean the batch must not be forwarded.
    """

    records: list[Record] | None = None
    modified: int = 0
    dropped: int = 0
    rejections: list[Rejection] = field(default_factory=list)
    failure: StepResult | None = None
    # (rule id, effect) -> records, dry-run effects included: for metrics and audit.
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    # (rule id, effect) -> those records' bytes as they came (key, value, headers).
    sizes: dict[tuple[str, str], int] = field(default_factory=dict)
    # (rule id, effect) -> the first reason, for effects that refuse nothing (unchecked).
    notes: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def refused(self) -> bool:
        return bool(self.rejections) or self.failure is not None


Builders = Mapping[str, Callable[[Any, BuildContext], Interceptor]]


def default_builders() -> dict[str, Callable[[Any, BuildContext], Interceptor]]:
    """The built-in actions (interceptors.builtin) and capture."""
    from interceptors.builtin import BUILDERS
    from interceptors.capture import build_capture

    return {**BUILDERS, "capture": build_capture}


class RecordEngine:
    """The record rules of one compiled rule set, built and ready to run.

    Building reads keys and schemas and imports custom interceptors; any rule that
    cannot be built makes the constructor raise RuleSetInvalid (file:line of each such
    rule), so whoever installs rule sets keeps the last good one.
    """

    def __init__(self, compiled: CompiledRuleSet, context: BuildContext | None = None,
                 builders: Builders | None = None) -> None:
        self.context = context or BuildContext()
        self.version = compiled.version
        self.rules = compiled.subset(RECORD_KINDS)
        builders = default_builders() if builders is None else builders
        self._stages: dict[str, Stage] = {}
        errors = []
        for rule in self.rules.rules:
            try:
                self._stages[rule.id] = self._build(rule, builders)
            except InterceptorConfigError as err:
                source = rule.source
                errors.append(RuleError(source.file if source else "<rules>",
                                        source.line if source else None,
                                        source.column if source else None,
                                        f"{rule.id}.action.{rule.kind}", str(err)))
        if errors:
            self.close()
            raise RuleSetInvalid(errors)
        # A custom interceptor may block: the data path must call run() off its loop.
        self.blocking = any(s.timeout_s is not None for s in self._stages.values())
        self.active = bool(self._stages)  # some record rule may decode records
        self._plans: dict[tuple[Any, ...], tuple[Stage, ...]] = {}

    def _build(self, rule: CompiledRule, builders: Builders) -> Stage:
        spec = record_spec(rule.action)
        base_dir = self.context.base_dir
        if rule.source is not None and rule.source.file:
            base_dir = Path(rule.source.file).parent
        context = dataclasses.replace(self.context, base_dir=base_dir)
        if rule.dry_run:  # changes nothing outside the record either
            if rule.kind == "capture":
                return Stage(rule, _CapturesNothing())
            context = dataclasses.replace(context, side_effects=_DISCARDED)
        if rule.kind == "interceptor":
            return Stage(rule, build_custom(spec, context), spec.timeout_ms / 1000, spec.retries)
        builder = builders.get(rule.kind)
        if builder is None:
            raise InterceptorConfigError(f"no implementation of action '{rule.kind}'")
        interceptor = builder(spec, context)
        return Stage(rule, interceptor,
                     checks_batches=not rule.dry_run and isinstance(interceptor, BatchCheck))

    def close(self) -> None:
        """Release what built interceptors hold (capture files, sinks)."""
        for stage in self._stages.values():
            close = getattr(stage.interceptor, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    log.exception("closing %s failed", stage.rule_id)

    # -- which stages ----------------------------------------------------------------

    def interested(self, api_key: int, api_version: int) -> bool:
        """Whether any record rule may apply to this Produce (request), Fetch or
        ShareFetch (response): if not, the frame is never decoded for records."""
        direction = "request" if api_key == ApiKey.PRODUCE else "response"
        return self.rules.interested(api_key, api_version, direction)

    def plan(self, direction: RecordDirection, topic: str, ctx: MatchContext) -> tuple[Stage, ...]:
        """The stages for `topic`'s records on a connection described by `ctx`."""
        key = (direction, topic, ctx.principal, ctx.client_id, ctx.client_host, ctx.listener,
               ctx.broker_id, ctx.api_key, ctx.api_version)
        stages = self._plans.get(key)
        if stages is None:
            api: int
            if direction == "produce":
                api, frame = ApiKey.PRODUCE, "request"
            else:  # the answer to a Fetch or a ShareFetch
                api = ctx.api_key if ctx.api_key in CONSUME_APIS else ApiKey.FETCH
                frame = "response"
            frame_ctx = ctx.for_frame(api, ctx.api_version, frame)  # type: ignore[arg-type]
            stages = tuple(self._stages[r.id]
                           for r in self.rules.candidates(api, ctx.api_version, frame)
                           if r.matches(frame_ctx, topic))
            if len(self._plans) > 4096:
                self._plans.clear()
            self._plans[key] = stages
        return stages

    # -- running -----------------------------------------------------------------------

    def run(self, records: Sequence[InterceptedRecord], stages: Sequence[Stage],
            budget: FrameBudget | None = None, measure: bool = False) -> list[RecordOutcome]:
        """Pass `records` through `stages`; one outcome per record, in order.

        A rejected or failed record stops there (later stages do not see it). Raises
        OverBudget when the frame's time runs out. `measure`: each step says the bytes
        its rule got and passed on (a backtest's per-rule bytes; the data path does not
        weigh records it does not need to).
        """
        outcomes = [RecordOutcome(r) for r in records]
        for stage in stages:
            live = [o for o in outcomes if o.record is not None and o.status not in
                    ("rejected", "failed")]
            if not live:
                break
            before = [(len(o.steps), record_size(o.record)) for o in live] if measure else ()
            if stage.rule.dry_run:
                self._dry_run(stage, live, budget)
            elif stage.timeout_s is None:
                _apply(stage, live, budget)
            else:
                self._apply_budgeted(stage, live)
            for outcome, (steps, size) in zip(live, before, strict=False):
                if len(outcome.steps) > steps:  # the rule matched the record
                    step = outcome.steps[-1]
                    passed = outcome.status not in ("rejected", "failed")
                    out = size if step.dry_run else record_size(outcome.record) if passed else 0
                    outcome.steps[-1] = dataclasses.replace(step, bytes_in=size, bytes_out=out)
        return outcomes

    def _dry_run(self, stage: Stage, live: list[RecordOutcome],
                 budget: FrameBudget | None) -> None:
        probes = [RecordOutcome(_copy(o.record)) for o in live]  # type: ignore[arg-type]
        if stage.timeout_s is None:
            _apply(stage, probes, budget)
        else:
            self._apply_budgeted(stage, probes)
        for outcome, probe in zip(live, probes, strict=True):
            step = probe.steps[-1]
            outcome.steps.append(StepResult(step.rule_id, step.kind, step.effect, step.reason,
                                            dry_run=True))

    def _apply_budgeted(self, stage: Stage, live: list[RecordOutcome]) -> None:
        assert stage.timeout_s is not None
        for _attempt in range(stage.retries + 1):
            # Each attempt gets copies: a timed-out worker may still be changing its own.
            attempt = [RecordOutcome(_copy(o.record)) for o in live]  # type: ignore[arg-type]
            future = _WORKERS.submit(_apply, stage, attempt)
            try:
                future.result(timeout=stage.timeout_s)
            except concurrent.futures.TimeoutError:
                log.warning("interceptor %s ran past its %.0f ms budget", stage.rule_id,
                            stage.timeout_s * 1000)
                continue
            for outcome, done in zip(live, attempt, strict=True):
                outcome.record, outcome.steps = done.record, outcome.steps + done.steps
                _settle(outcome, done.steps[-1])
            return
        reason = (f"interceptor timed out ({stage.retries + 1} attempts of "
                  f"{stage.timeout_s * 1000:.0f} ms)")
        for outcome in live:
            step = StepResult(stage.rule_id, stage.kind, "timeout", reason)
            outcome.steps.append(step)
            outcome.status, outcome.reason = "failed", reason

    def evaluate(self, record: InterceptedRecord, client_id: str | None = None,
                 client_host: str | None = None, measure: bool = False) -> RecordOutcome:
        """One record as the gateway would treat it (backtests, dry runs); `measure` as
        for `run`."""
        api_version = PLAN_VERSIONS[record.direction]
        api_key = ApiKey.PRODUCE if record.direction == "produce" else ApiKey.FETCH
        ctx = MatchContext(api_key=api_key, api_version=api_version, principal=record.principal,
                           client_id=client_id, client_host=client_host)
        stages = self.plan(record.direction, record.topic, ctx)
        return self.run([record], stages, measure=measure)[0]

    def process_batch(self, batch: BatchView, stages: Sequence[Stage], *, topic: str,
                      partition: int, direction: RecordDirection,
                      principal: str | None,
                      budget: FrameBudget | None = None) -> BatchOutcome:
        """Run `stages` over one batch's records (see BatchOutcome); OverBudget when the
        batch exceeds what is left of its frame's `budget`."""
        if stages and all(stage.checks_batches for stage in stages):
            checked = self._check_batch(batch, stages, topic, direction, budget)
            if checked is not None:
                return checked
            budget = None  # (already charged for this batch)
        # A produced batch's CRC is checked before its records are read: the broker has
        # not seen it yet, and a batch a rule changes is written again with a CRC of its
        # own, which would make a batch corrupted on its way in look sound to the broker.
        verify = direction == "produce"
        if budget is None:
            records = decode_records(batch, verify=verify)
        else:
            records = decode_records(batch, verify=verify, max_decompressed=budget.admit(batch))
            budget.spent(sum(len(r.value or b"") + len(r.key or b"") for r in records))
        base_ts = batch.base_timestamp
        base_offset = batch.base_offset if direction == "consume" else None
        intercepted = [
            InterceptedRecord(topic, partition, r.key, r.value, r.headers,
                              base_ts + r.timestamp_delta,
                              None if base_offset is None else base_offset + r.offset_delta,
                              principal, direction)
            for r in records
        ]
        outcomes = self.run(intercepted, stages, budget)
        result = BatchOutcome()
        counts, sizes = result.counts, result.sizes
        for index, outcome in enumerate(outcomes):
            if outcome.status == "rejected" and direction == "consume":
                # A fetched record was accepted long ago: withhold it, refuse nothing.
                outcome.record, outcome.status = None, "dropped"
            size = record_size(records[index])
            for step in outcome.steps:
                key = (step.rule_id, f"would-{step.effect}" if step.dry_run else step.effect)
                counts[key] = counts.get(key, 0) + 1
                sizes[key] = sizes.get(key, 0) + size
                if step.reason and step.effect not in REFUSING:
                    result.notes.setdefault(key, step.reason)
            if outcome.status == "rejected":
                step = outcome.steps[-1]
                result.rejections.append(Rejection(index, step.rule_id, step.reason or ""))
            elif outcome.status == "failed" and result.failure is None:
                result.failure = outcome.steps[-1]
            elif outcome.status == "dropped":
                result.dropped += 1
            elif outcome.status == "modified":
                result.modified += 1
        if result.refused or not (result.modified or result.dropped):
            return result
        kept = []
        for original, outcome in zip(records, outcomes, strict=True):
            final = outcome.record
            if final is None:
                continue
            if outcome.status == "unchanged":
                kept.append(original)
                continue
            kept.append(Record(original.offset_delta, final.timestamp - base_ts
                               if final.timestamp >= 0 else original.timestamp_delta,
                               final.key, final.value, list(final.headers)))
        result.records = kept
        return result

    def _check_batch(self, batch: BatchView, stages: Sequence[Stage], topic: str,
                     direction: RecordDirection, budget: FrameBudget | None
                     ) -> BatchOutcome | None:
        """Read-only checks over a batch's keys or values, with what process_batch would
        report; None when the records themselves are needed (a record refused at fetch
        time is withheld: the batch must be rewritten)."""
        limit = budget.admit(batch) if budget is not None else MAX_DECOMPRESSED
        fields: dict[str, list[memoryview | None]] = {}
        for target in {stage.interceptor.target for stage in stages}:  # type: ignore[attr-defined]
            fields[target] = decode_field(batch, target, max_decompressed=limit)
            if budget is not None:
                budget.spent(sum(len(item) for item in fields[target] if item is not None))
        result = BatchOutcome()
        counts, sizes = result.counts, result.sizes
        live = list(range(batch.records_count))
        for stage in stages:
            if not live:
                break
            if budget is not None:
                budget.check_time()
            check: Any = stage.interceptor
            rule_id = stage.rule_id
            every = fields[check.target]
            data = every if len(live) == len(every) else [every[i] for i in live]
            try:
                verdicts = check.check_batch(topic, data)
            except ServiceUnavailable as err:
                effect, reason = "unavailable", err.reason
            except Exception as err:  # a failing check fails its batch, never the gateway
                log.warning("interceptor %s failed: %s: %s", rule_id, type(err).__name__, err)
                effect, reason = "failed", f"interceptor failed: {type(err).__name__}: {err}"
            else:
                refused = set()
                for position, effect, reason in verdicts:
                    counts[(rule_id, effect)] = counts.get((rule_id, effect), 0) + 1
                    # Only the checked field is read here: its bytes are the weight.
                    checked = data[position]
                    sizes[(rule_id, effect)] = (sizes.get((rule_id, effect), 0)
                                                + (len(checked) if checked is not None else 0))
                    if effect == "rejected":
                        refused.add(position)
                        result.rejections.append(Rejection(live[position], rule_id, reason))
                    else:
                        result.notes.setdefault((rule_id, effect), reason)
                unchanged = len(live) - len(verdicts)
                if unchanged:
                    key = (rule_id, "unchanged")
                    counts[key] = counts.get(key, 0) + unchanged
                if refused:
                    live = [index for position, index in enumerate(live)
                            if position not in refused]
                continue
            counts[(rule_id, effect)] = counts.get((rule_id, effect), 0) + len(live)
            sizes[(rule_id, effect)] = (sizes.get((rule_id, effect), 0)
                                        + sum(len(item) for item in data if item is not None))
            result.failure = StepResult(rule_id, stage.kind, effect, reason[:500])  # type: ignore[arg-type]
            return result
        if result.rejections and direction == "consume":
            return None
        result.rejections.sort(key=lambda rejection: rejection.index)
        return result


def record_size(record: Record | InterceptedRecord | None) -> int:
    """Key, value and header bytes: what a record weighs in a batch (framing aside)."""
    if record is None:
        return 0
    size = len(record.key or b"") + len(record.value or b"")
    for name, value in record.headers:
        size += len(name.encode("utf-8", "surrogateescape")) + len(value or b"")
    return size


class _DiscardedSideEffects:
    """Where a dry-run rule's copies go: nowhere (its steps say what it would do)."""

    def to_topic(self, topic: str, record: InterceptedRecord) -> bool:
        return True

    def to_http(self, url: str, record: InterceptedRecord, queue_size: int) -> bool:
        return True


_DISCARDED: Final = _DiscardedSideEffects()


class _CapturesNothing:
    """A dry-run capture: sees every record, writes none."""

    def configure(self, config: Mapping[str, Any]) -> None:
        """Nothing to configure."""

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord:
        return record


def _copy(record: InterceptedRecord) -> InterceptedRecord:
    clone = copy.copy(record)
    clone.headers = list(record.headers)
    return clone


def _apply(stage: Stage, live: list[RecordOutcome], budget: FrameBudget | None = None) -> None:
    """One stage over live records, inline: outcomes updated in place."""
    intercept = stage.interceptor.intercept
    rule_id, kind = stage.rule.id, stage.rule.kind
    # Steps are immutable: the usual ones are made once per stage, not once per record.
    unchanged = StepResult(rule_id, kind, "unchanged")
    modified = StepResult(rule_id, kind, "modified")
    dropped = StepResult(rule_id, kind, "dropped")
    for index, outcome in enumerate(live):
        if budget is not None and not index % _CHECK_EVERY:
            budget.check_time()
        record = outcome.record
        assert record is not None
        key, value, headers = record.key, record.value, list(record.headers)
        try:
            result = intercept(record)
        except RecordRejected as err:
            step = StepResult(rule_id, kind, "rejected", err.reason)
        except ServiceUnavailable as err:
            step = StepResult(rule_id, kind, "unchecked" if err.fail_open else "unavailable",
                              err.reason)
        except Exception as err:  # a failing interceptor fails its batch, never the gateway
            log.warning("interceptor %s failed: %s: %s", rule_id, type(err).__name__, err)
            step = StepResult(rule_id, kind, "failed",
                              f"interceptor failed: {type(err).__name__}: {err}"[:500])
        else:
            outcome.record = result
            if result is None:
                step = dropped
            elif (result is record and result.key is key and result.value is value
                  and result.headers == headers):
                outcome.steps.append(unchanged)  # changes no status
                continue
            else:
                step = modified
        outcome.steps.append(step)
        _settle(outcome, step)


def _settle(outcome: RecordOutcome, step: StepResult) -> None:
    """Fold one step into the record's status (the worst so far wins)."""
    if step.dry_run:
        return
    if step.effect == "dropped":
        outcome.record, outcome.status = None, "dropped"
    elif step.effect in REFUSING:
        outcome.status = "rejected" if step.effect == "rejected" else "failed"
        outcome.reason = step.reason
    elif step.effect == "modified" and outcome.status == "unchanged":
        outcome.status = "modified"
