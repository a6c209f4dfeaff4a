"""One batch of captured records through the candidate (and live) rule engine.

This is the code every Spark task runs (and the benchmark's plain loop): Arrow rows
become `InterceptedRecord`s, each goes through `RecordEngine.evaluate` — the data
path's own per-record code — and the outcome becomes one result row. Nothing of the
engine is re-implemented here.

Rule files reach executors as their bytes (`RuleFiles`): an executor writes them to
a private directory once and loads them like `keg validate` would, so relative file
names in rules (schemas) resolve next to them. Engines are cached per Python worker
and rule-set content; a capture rule is evaluated but writes nothing, and copies are
counted, not sent.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from filter_rules import CompiledRuleSet, load_rule_dir
from interceptors.contract import BuildContext, InterceptedRecord, Interceptor
from interceptors.engine import RecordEngine, RecordOutcome, default_builders, record_size

if TYPE_CHECKING:
    import pyarrow as pa

MAX_RULE_DIR_BYTES: Final = 64 << 20
MAX_STEPS_REASON: Final = 500


@dataclass(frozen=True)
class RuleFiles:
    """A rule directory as bytes (relative path -> content), shippable to executors."""

    name: str
    files: tuple[tuple[str, bytes], ...]

    @classmethod
    def read(cls, directory: Path) -> RuleFiles:
        files = []
        total = 0
        for path in sorted(directory.rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                data = path.read_bytes()
                total += len(data)
                if total > MAX_RULE_DIR_BYTES:
                    raise ValueError(f"{directory}: more than {MAX_RULE_DIR_BYTES} bytes")
                files.append((str(path.relative_to(directory)), data))
        return cls(str(directory), tuple(files))

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for name, data in self.files:
            h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
        return h.hexdigest()[:16]

    def materialize(self) -> Path:
        """Write the files to a fresh directory (once per worker and content)."""
        root = Path(tempfile.mkdtemp(prefix=f"keg-rules-{self.digest}-"))
        for name, data in self.files:
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return root


class CountingSideEffects:
    """Side effects for backtests: copies are counted, never sent, never kept."""

    def __init__(self) -> None:
        self.topic_copies = 0
        self.http_posts = 0

    def to_topic(self, topic: str, record: InterceptedRecord) -> bool:
        self.topic_copies += 1
        return True

    def to_http(self, url: str, record: InterceptedRecord, queue_size: int) -> bool:
        self.http_posts += 1
        return True


class _NoCapture:
    """A capture rule in a backtest: it matches and leaves the record; writes nothing."""

    def configure(self, config: Mapping[str, Any]) -> None:
        pass

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord:
        return record


def _no_capture(spec: Any, ctx: BuildContext) -> Interceptor:
    return _NoCapture()


def backtest_engine(compiled: CompiledRuleSet) -> RecordEngine:
    """The data path's engine for `compiled`, with backtest-safe side effects."""
    builders = {**default_builders(), "capture": _no_capture}
    return RecordEngine(compiled, BuildContext(side_effects=CountingSideEffects()),
                        builders=builders)


_ENGINES: dict[str, RecordEngine] = {}
_ENGINES_LOCK = threading.Lock()


def engine_for(rules: RuleFiles) -> RecordEngine:
    """This worker's engine for `rules` (built on first use)."""
    with _ENGINES_LOCK:
        engine = _ENGINES.get(rules.digest)
        if engine is None:
            engine = backtest_engine(CompiledRuleSet(load_rule_dir(rules.materialize())))
            _ENGINES[rules.digest] = engine
        return engine


# --- Arrow rows <-> records -----------------------------------------------------------


def records_from_arrow(batch: pa.RecordBatch | pa.Table) -> list[InterceptedRecord]:
    """Capture-schema rows as records (timestamps back to ms; null timestamp: -1)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def column(name: str) -> list[Any]:
        return batch.column(batch.schema.get_field_index(name)).to_pylist()

    ts_column = batch.column(batch.schema.get_field_index("timestamp"))
    if pa.types.is_timestamp(ts_column.type):  # Spark hands over microseconds
        ms = pa.timestamp("ms", tz=ts_column.type.tz)
        ts_column = pc.cast(ts_column, ms, safe=False).cast(pa.int64())
    timestamps = ts_column.to_pylist()
    names = set(batch.schema.names)
    n = batch.num_rows
    principals = column("principal") if "principal" in names else [None] * n
    directions = column("direction") if "direction" in names else ["produce"] * n
    return [
        InterceptedRecord(topic, partition, key, value,
                          [(h["key"], h["value"]) for h in headers or ()],
                          -1 if ts is None else ts, offset, principal, direction or "produce")
        for topic, partition, offset, ts, key, value, headers, principal, direction in zip(
            column("topic"), column("partition"), column("offset"), timestamps,
            column("key"), column("value"), column("headers"), principals, directions,
            strict=True)
    ]


record_bytes = record_size  # key, value and header bytes (the data path's measure)


def record_digest(record: InterceptedRecord | None) -> str | None:
    """A fingerprint of what the broker (or consumer) would get; None: nothing."""
    if record is None:
        return None
    h = hashlib.blake2b(digest_size=16)
    for part in (record.key, record.value):
        h.update(b"\0" if part is None else b"\1%d\0" % len(part) + part)
    for name, value in record.headers:
        h.update(name.encode() + b"\0" + (b"\0" if value is None else b"\1" + value))
    return h.hexdigest()


def result_schema() -> pa.Schema:
    import pyarrow as pa

    step = pa.struct([
        pa.field("rule_id", pa.string()), pa.field("kind", pa.string()),
        pa.field("effect", pa.string()), pa.field("reason", pa.string()),
        pa.field("dry_run", pa.bool_()),
    ])
    outcome = [
        ("status", pa.string()), ("reason", pa.string()), ("bytes_after", pa.int64()),
        ("digest", pa.string()), ("steps", pa.list_(step)),
    ]
    return pa.schema([
        pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()), pa.field("timestamp", pa.int64()),
        pa.field("key", pa.binary()), pa.field("bytes_before", pa.int64()),
        *(pa.field(name, kind) for name, kind in outcome),
        *(pa.field(f"live_{name}", kind) for name, kind in outcome),
        pa.field("differs", pa.bool_()),
    ])


def _outcome_columns(outcome: RecordOutcome | None) -> tuple[Any, ...]:
    if outcome is None:
        return (None, None, None, None, None)
    kept = outcome.status in ("unchanged", "modified")
    steps = [{"rule_id": s.rule_id, "kind": s.kind, "effect": s.effect,
              "reason": None if s.reason is None else s.reason[:MAX_STEPS_REASON],
              "dry_run": s.dry_run} for s in outcome.steps]
    return (outcome.status, outcome.reason, record_bytes(outcome.record) if kept else 0,
            record_digest(outcome.record) if kept else None, steps)


def differs(candidate: RecordOutcome, live: RecordOutcome | None) -> bool:
    """Whether the candidate rules treat the record otherwise than the live ones."""
    if live is None:
        return candidate.status != "unchanged"
    if candidate.status != live.status:
        return True
    return record_digest(candidate.record) != record_digest(live.record)


def evaluate_batch(batch: pa.RecordBatch | pa.Table, candidate: RecordEngine,
                   live: RecordEngine | None) -> pa.RecordBatch:
    """One result row per captured record (see `result_schema`)."""
    import pyarrow as pa

    rows = []
    for record in records_from_arrow(batch):
        before = record_bytes(record)
        identity = (record.topic, record.partition, record.offset,
                    None if record.timestamp < 0 else record.timestamp, record.key, before)
        # The engine may change a record in place: each engine gets its own copy.
        live_outcome = live.evaluate(_clone(record)) if live is not None else None
        outcome = candidate.evaluate(record)
        rows.append((*identity, *_outcome_columns(outcome), *_outcome_columns(live_outcome),
                     differs(outcome, live_outcome)))
    schema = result_schema()
    columns: list[Any] = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
    return pa.RecordBatch.from_arrays(
        [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)],
        schema=schema)


def _clone(record: InterceptedRecord) -> InterceptedRecord:
    return InterceptedRecord(record.topic, record.partition, record.key, record.value,
                             list(record.headers), record.timestamp, record.offset,
                             record.principal, record.direction)


def evaluate_batches(batches: Iterator[pa.RecordBatch], rules: RuleFiles,
                     live_rules: RuleFiles | None) -> Iterator[pa.RecordBatch]:
    """The mapInArrow function body: engines once per worker, then batch by batch."""
    candidate = engine_for(rules)
    live = engine_for(live_rules) if live_rules is not None else None
    for batch in batches:
        yield evaluate_batch(batch, candidate, live)


__all__ = [
    "CountingSideEffects",
    "RuleFiles",
    "backtest_engine",
    "differs",
    "engine_for",
    "evaluate_batch",
    "evaluate_batches",
    "record_bytes",
    "record_digest",
    "records_from_arrow",
    "result_schema",
]
