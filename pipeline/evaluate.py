"""Captured records through the candidate (and live) rule engine, batch by batch.

This is the code every Spark task runs. A batch of Arrow rows is grouped by
(direction, topic, principal) on its columns; each group is planned once with the
engine's compiled matchers (`RecordEngine.plan`), as the gateway plans a Produce
batch, and run through `RecordEngine.run` — the data path's own code — in batches of
up to EVAL_BATCH records. Only groups some rule applies to become Python records;
the rest are answered from the columns (unchanged, no steps). The result columns are
built column-wise. Per record the outcome equals `RecordEngine.evaluate` (the plain
loop `records_from_arrow` + `evaluate` is the reference the tests compare with).
Nothing of the engine is re-implemented here.

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
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from filter_rules import CompiledRuleSet, MatchContext, load_rule_dir
from interceptors.contract import BuildContext, InterceptedRecord, Interceptor
from interceptors.engine import (
    PLAN_VERSIONS,
    RecordEngine,
    RecordOutcome,
    StepResult,
    default_builders,
    record_size,
)
from kafka_wire import ApiKey
from pipeline.scope import Unjudged

if TYPE_CHECKING:
    import pyarrow as pa

MAX_RULE_DIR_BYTES: Final = 64 << 20
MAX_STEPS_REASON: Final = 500


@dataclass(frozen=True)
class RuleFiles:
    """A rule directory as bytes (relative path -> content), shippable to executors."""

    name: str
    files: tuple[tuple[str, bytes], ...]
    # The rules a backtest does not judge as the gateway would (`pipeline.scope`).
    unjudged: tuple[Unjudged, ...] = ()

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
    """Capture-schema rows as records (timestamps back to ms; null timestamp: -1): the
    plain loop's way in, one record per row."""
    def column(name: str) -> list[Any]:
        return batch.column(batch.schema.get_field_index(name)).to_pylist()

    names = set(batch.schema.names)
    n = batch.num_rows
    principals = column("principal") if "principal" in names else [None] * n
    directions = column("direction") if "direction" in names else ["produce"] * n
    return [
        InterceptedRecord(topic, partition, key, value,
                          [(h["key"], h["value"]) for h in headers or ()],
                          -1 if ts is None else ts, offset, principal, direction or "produce")
        for topic, partition, offset, ts, key, value, headers, principal, direction in zip(
            column("topic"), column("partition"), column("offset"),
            _timestamps_ms(batch).to_pylist(), column("key"), column("value"),
            column("headers"), principals, directions, strict=True)
    ]


record_bytes = record_size  # key, value and header bytes (the data path's measure)


def record_digest(record: InterceptedRecord | None) -> str | None:
    """A fingerprint of what the broker (or consumer) would get; None: nothing."""
    if record is None:
        return None
    parts: list[bytes] = []
    for part in (record.key, record.value):
        if part is None:
            parts.append(b"\0")
        else:
            parts += (b"\1%d\0" % len(part), part)
    for name, value in record.headers:
        parts += (name.encode(), b"\0\0" if value is None else b"\0\1", value or b"")
    return hashlib.blake2b(b"".join(parts), digest_size=16).hexdigest()


def step_type() -> pa.DataType:
    import pyarrow as pa

    return pa.struct([
        pa.field("rule_id", pa.string()), pa.field("kind", pa.string()),
        pa.field("effect", pa.string()), pa.field("reason", pa.string()),
        pa.field("dry_run", pa.bool_()),
        # The record's bytes as the rule got it and as it passed it on (StepResult).
        pa.field("bytes_in", pa.int64()), pa.field("bytes_out", pa.int64()),
    ])


def result_schema() -> pa.Schema:
    """`digest` is the final record's fingerprint when a rule modified it (null when it
    goes on as captured, or not at all)."""
    import pyarrow as pa

    step = step_type()
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


def differs(candidate: RecordOutcome, live: RecordOutcome | None) -> bool:
    """Whether the candidate rules treat the record otherwise than the live ones."""
    if live is None:
        return candidate.status != "unchanged"
    if candidate.status != live.status:
        return True
    # Both forward the record changed: do they forward the same bytes?
    return candidate.status == "modified" and (
        outcome_digest(candidate) != outcome_digest(live))


def outcome_digest(outcome: RecordOutcome) -> str | None:
    """The fingerprint a backtest keeps of a record a rule modified: its bytes'
    (`record_digest`), but for one an encrypt rule changed. Encryption draws a fresh
    nonce (and data key) each time, so the same rule makes other bytes of the same
    record: every record an encrypt rule changed differed from live, the rule sets being
    the same. Such a record's fingerprint is what each rule did to it and the bytes it
    passed on (ciphertext has the plaintext's length), and its final size."""
    if not any(s.kind == "encrypt" and s.effect == "modified" and not s.dry_run
               for s in outcome.steps):
        return record_digest(outcome.record)
    done = [(s.rule_id, s.kind, s.effect, s.bytes_out) for s in outcome.steps if not s.dry_run]
    seen = repr((done, record_size(outcome.record) if outcome.record else None)).encode()
    return "encrypted-" + hashlib.blake2b(seen, digest_size=16).hexdigest()


# --- a batch, column-wise ------------------------------------------------------------

# Records of one topic evaluated together, as the gateway evaluates a Produce batch
# (a custom interceptor's time budget is per batch there too).
EVAL_BATCH: Final = 500
_NO_STEPS: Final[list[StepResult]] = []


@dataclass
class _Side:
    """One rule set's result columns for a batch, filled group by group."""

    size: int
    status: list[str] = field(default_factory=list)
    reason: list[str | None] = field(default_factory=list)
    bytes_after: list[int] = field(default_factory=list)
    digest: list[str | None] = field(default_factory=list)
    steps: list[list[StepResult]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.status = ["unchanged"] * self.size
        self.reason = [None] * self.size
        self.bytes_after = [-1] * self.size  # -1: as before (filled from bytes_before)
        self.digest = [None] * self.size
        self.steps = [_NO_STEPS] * self.size

    def record(self, row: int, outcome: RecordOutcome) -> None:
        status = outcome.status
        self.status[row] = status
        self.reason[row] = outcome.reason
        self.steps[row] = outcome.steps
        if status == "modified":
            self.bytes_after[row] = record_size(outcome.record)
            self.digest[row] = outcome_digest(outcome)
        elif status != "unchanged":
            self.bytes_after[row] = 0

    def columns(self, bytes_before: Any) -> list[Any]:
        import numpy as np
        import pyarrow as pa

        after = np.asarray(self.bytes_after, dtype=np.int64)
        after = np.where(after < 0, bytes_before, after)
        return [pa.array(self.status, pa.string()), pa.array(self.reason, pa.string()),
                pa.array(after, pa.int64()), pa.array(self.digest, pa.string()),
                _steps_array(self.steps)]


def _steps_array(per_row: list[list[StepResult]]) -> Any:
    """list<struct<rule_id, kind, effect, reason, dry_run, bytes_in, bytes_out>>, built
    column-wise."""
    import numpy as np
    import pyarrow as pa

    lengths = np.fromiter((len(steps) for steps in per_row), dtype=np.int32,
                          count=len(per_row))
    offsets = np.zeros(len(per_row) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = [step for steps in per_row for step in steps]
    kind = step_type()
    struct = pa.StructArray.from_arrays(
        [pa.array([s.rule_id for s in flat], pa.string()),
         pa.array([s.kind for s in flat], pa.string()),
         pa.array([s.effect for s in flat], pa.string()),
         pa.array([None if s.reason is None else s.reason[:MAX_STEPS_REASON] for s in flat],
                  pa.string()),
         pa.array([s.dry_run for s in flat], pa.bool_()),
         pa.array([s.bytes_in for s in flat], pa.int64()),
         pa.array([s.bytes_out for s in flat], pa.int64())],
        fields=[kind.field(i) for i in range(kind.num_fields)])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), struct)


def _bytes_before(batch: pa.RecordBatch | pa.Table) -> Any:
    """Key + value + header bytes of every row (`record_size`), on the Arrow columns."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    def column(name: str) -> Any:
        found = batch.column(batch.schema.get_field_index(name))
        return found.combine_chunks() if isinstance(found, pa.ChunkedArray) else found

    def lengths(array: Any) -> Any:
        return np.asarray(pc.fill_null(pc.binary_length(array), 0), dtype=np.int64)

    total = lengths(column("key")) + lengths(column("value"))
    headers = column("headers")
    if headers.null_count:
        headers = pc.fill_null(headers, pa.scalar([], headers.type))
    flat = headers.flatten()
    if len(flat):
        names = pc.cast(flat.field("key"), pa.binary())  # UTF-8 bytes, as record_size
        each = lengths(names) + lengths(flat.field("value"))
        ends = np.cumsum(each)
        offsets = np.asarray(headers.offsets, dtype=np.int64) - headers.offsets[0].as_py()
        before = np.concatenate(([0], ends))
        total += before[offsets[1:]] - before[offsets[:-1]]
    return total


def _group_rows(batch: pa.RecordBatch | pa.Table) -> list[tuple[str, str, str | None, Any]]:
    """(direction, topic, principal, row indices) for each distinct combination."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    names = set(batch.schema.names)

    def encoded(name: str, default: str | None) -> tuple[Any, list[Any]]:
        if name not in names:
            return np.zeros(n, dtype=np.int64), [default]
        column = batch.column(batch.schema.get_field_index(name))
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        codes = pc.dictionary_encode(column, null_encoding="encode")
        values = codes.dictionary.to_pylist()
        return codes.indices.to_numpy(zero_copy_only=False).astype(np.int64), values

    topic_codes, topics = encoded("topic", None)
    principal_codes, principals = encoded("principal", None)
    direction_codes, directions = encoded("direction", "produce")
    combined = (topic_codes * len(principals) + principal_codes) * len(directions) + \
        direction_codes
    keys, inverse = np.unique(combined, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(keys) + 1))
    groups = []
    for g, key in enumerate(keys):
        direction = directions[int(key % len(directions))]
        rest = int(key // len(directions))
        principal = principals[rest % len(principals)]
        topic = topics[rest // len(principals)]
        groups.append((direction or "produce", topic, principal,
                       order[bounds[g]:bounds[g + 1]]))
    return groups


def _records(batch: pa.RecordBatch | pa.Table, rows: Any, topic: str,
             principal: str | None, direction: str) -> list[InterceptedRecord]:
    """The records of `rows` (one topic, principal and direction), their headers from
    the flattened header columns (no dict per header)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    taken = batch.take(pa.array(rows))

    def column(name: str) -> Any:
        found = taken.column(taken.schema.get_field_index(name))
        return found.combine_chunks() if isinstance(found, pa.ChunkedArray) else found

    headers = column("headers")
    flat = headers.flatten()
    every = zip(flat.field("key").to_pylist(), flat.field("value").to_pylist(), strict=True)
    counts = pc.list_value_length(headers).fill_null(0).to_pylist()
    pairs = [list(islice(every, count)) if count else [] for count in counts]
    return [
        InterceptedRecord(topic, partition, key, value, header_pairs,
                          -1 if ts is None else ts, offset, principal, direction)  # type: ignore[arg-type]
        for partition, offset, ts, key, value, header_pairs in zip(
            column("partition").to_pylist(), column("offset").to_pylist(),
            _timestamps_ms(taken).to_pylist(), column("key").to_pylist(),
            column("value").to_pylist(), pairs, strict=True)
    ]


def _timestamps_ms(batch: pa.RecordBatch | pa.Table) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    ts_column = batch.column(batch.schema.get_field_index("timestamp"))
    if pa.types.is_timestamp(ts_column.type):  # Spark hands over microseconds
        ms = pa.timestamp("ms", tz=ts_column.type.tz)
        ts_column = pc.cast(ts_column, ms, safe=False).cast(pa.int64())
    return ts_column


def evaluate_batch(batch: pa.RecordBatch | pa.Table, candidate: RecordEngine,
                   live: RecordEngine | None) -> pa.RecordBatch:
    """One result row per captured record (see `result_schema`), at the data path's speed.

    Records are grouped by (direction, topic, principal) on the Arrow columns; each group
    is planned once with the engine's compiled matchers (`RecordEngine.plan`), as a
    connection's Produce batch is, and only groups some rule applies to become records,
    run through `RecordEngine.run` in batches of up to EVAL_BATCH. Groups no rule
    applies to are answered from the Arrow columns alone (unchanged, no steps). Results
    equal `RecordEngine.evaluate` per record (tests/pipeline/test_backtest.py)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    ours, theirs = _Side(n), _Side(n) if live is not None else None
    for direction, topic, principal, rows in _group_rows(batch):
        ctx = MatchContext(api_key=ApiKey.PRODUCE if direction == "produce" else ApiKey.FETCH,
                           api_version=PLAN_VERSIONS[direction], principal=principal)
        stages = candidate.plan(direction, topic, ctx)  # type: ignore[arg-type]
        live_stages = live.plan(direction, topic, ctx) if live is not None else ()  # type: ignore[arg-type]
        if not stages and not live_stages:
            continue  # unchanged by both: nothing to build
        records = _records(batch, rows, topic, principal, direction)
        for side, engine, planned, fresh in ((ours, candidate, stages, live_stages),
                                             (theirs, live, live_stages, False)):
            if side is None or engine is None or not planned:
                continue
            # The engine may change records in place: the first side gets copies.
            inputs = [_clone(r) for r in records] if fresh else records
            for start in range(0, len(inputs), EVAL_BATCH):
                chunk = inputs[start:start + EVAL_BATCH]
                for row, outcome in zip(rows[start:start + EVAL_BATCH],
                                        engine.run(chunk, planned, measure=True),
                                        strict=True):
                    side.record(int(row), outcome)
    before = _bytes_before(batch)
    candidate_columns = ours.columns(before)
    if theirs is not None:
        live_columns = theirs.columns(before)
        same_status = pc.equal(candidate_columns[0], live_columns[0])
        same_record = pc.fill_null(pc.equal(candidate_columns[3], live_columns[3]), True)
        differ = pc.invert(pc.and_(same_status, same_record))
    else:
        live_columns = [pa.nulls(n, f.type) for f in list(result_schema())[11:16]]
        differ = pc.not_equal(candidate_columns[0], "unchanged")
    offsets = batch.column(batch.schema.get_field_index("offset"))
    timestamps = _timestamps_ms(batch)
    schema = result_schema()
    columns = [batch.column(batch.schema.get_field_index("topic")),
               batch.column(batch.schema.get_field_index("partition")),
               offsets, timestamps, batch.column(batch.schema.get_field_index("key")),
               pa.array(before, pa.int64()), *candidate_columns, *live_columns, differ]
    return pa.RecordBatch.from_arrays(
        [_as(col, f.type) for col, f in zip(columns, schema, strict=True)], schema=schema)


def _as(column: Any, kind: Any) -> Any:
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column if column.type == kind else column.cast(kind)


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
    "EVAL_BATCH",
    "CountingSideEffects",
    "RuleFiles",
    "backtest_engine",
    "differs",
    "engine_for",
    "evaluate_batch",
    "evaluate_batches",
    "outcome_digest",
    "record_bytes",
    "record_digest",
    "records_from_arrow",
    "result_schema",
    "step_type",
]
