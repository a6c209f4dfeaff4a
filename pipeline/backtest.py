"""`keg backtest`: a candidate rule set over captured records, on Spark.

Every record goes through the data path's own engine (`pipeline.evaluate`:
`RecordEngine.plan` once per topic and principal, `RecordEngine.run` per batch) in the
Python workers. Three routes, one result:

* `direct` (the default for capture files): Spark schedules one task per slice of the
  capture's Parquet row groups; each task reads its slice with pyarrow, evaluates it
  in Arrow batches and writes its part of `records/` with pyarrow. No record passes
  through the JVM, which only schedules and then aggregates the results.
* `arrow` (`mapInArrow`; the route for `kafka://` input, which Spark's Kafka source
  reads): the JVM reads the records and hands them to the workers as Arrow batches.
* `pandas` (`mapInPandas`): the same through pandas, kept for comparison.

The per-record results are written as Parquet (`records/`), then aggregated by Spark
into the summary (`summary.json`, `rules.parquet`, `topics.parquet`) the report and
thresholds read. docs/pipeline.md has the measurements.

Bytes: `bytes_before` is a record's key + value + headers as captured;
`bytes_after` is the same for what would be forwarded (0 when dropped, rejected or
failed: those never reach the broker or consumer).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from filter_rules import CompiledRuleSet, RuleSetInvalid, load_rule_dir
from interceptors.contract import InterceptorConfigError
from pipeline.arrow_types import to_spark_schema
from pipeline.errors import PipelineError
from pipeline.evaluate import (
    RuleFiles,
    backtest_engine,
    engine_for,
    evaluate_batch,
    evaluate_batches,
    result_schema,
)
from pipeline.scope import unjudged
from pipeline.spark import spark_errors

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

Method = Literal["direct", "arrow", "pandas"]
METHODS: Final = ("direct", "arrow", "pandas")
# Rows of capture a direct task reads, evaluates and writes (whole row groups).
SPLIT_ROWS: Final = 250_000
STATUSES: Final = ("unchanged", "modified", "dropped", "rejected", "failed")
SAMPLE_REASONS: Final = 5
SAMPLE_DIFFS: Final = 20


class RulesInvalid(PipelineError):
    """A rule directory does not load: `lines` are file:line:column messages."""

    def __init__(self, directory: Path, lines: list[str]) -> None:
        super().__init__("\n".join([*lines, f"{directory}: {len(lines)} problem(s)"]))
        self.lines = lines


def load_rules(directory: Path) -> RuleFiles:
    """Check a rule directory as the gateway would (loaded, compiled, built) and read it."""
    if not directory.is_dir():
        raise PipelineError(f"rule directory {directory} does not exist")
    try:
        compiled = CompiledRuleSet(load_rule_dir(directory))
        engine = backtest_engine(compiled)
    except RuleSetInvalid as err:
        raise RulesInvalid(directory, [str(e) for e in err.errors]) from None
    except InterceptorConfigError as err:
        raise RulesInvalid(directory, [str(err)]) from None
    engine.close()
    try:
        files = RuleFiles.read(directory)
    except (OSError, ValueError) as err:
        raise PipelineError(f"cannot read {directory}: {err}") from None
    return dataclasses.replace(files, unjudged=tuple(unjudged(compiled, str(directory))))


def evaluate_frame(records: DataFrame, rules: RuleFiles, live: RuleFiles | None,
                   method: Method = "arrow") -> DataFrame:
    """One result row per record (pipeline.evaluate.result_schema), lazily."""
    schema = to_spark_schema(result_schema())
    if method == "arrow":
        def run_arrow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return evaluate_batches(batches, rules, live)

        return records.mapInArrow(run_arrow, schema)

    def run_pandas(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in evaluate_batches((_arrow_batch(f) for f in frames), rules, live):
            yield batch.to_pandas()

    return records.mapInPandas(run_pandas, schema)


def _arrow_batch(frame: pd.DataFrame) -> pa.RecordBatch:
    """A pandas frame of captured records as Arrow, the headers typed as the capture's:
    inferred, a frame with records of no headers beside others (`cannot mix struct and
    non-struct`) or of none at all (a list of nulls) could not be read."""
    import pyarrow as pa

    from interceptors.capture import capture_schema

    rest = pa.RecordBatch.from_pandas(frame.drop(columns=["headers"]), preserve_index=False)
    header_type = capture_schema().field("headers").type
    headers = pa.array([None if h is None else list(h) for h in frame["headers"]],
                       type=header_type)
    return pa.RecordBatch.from_arrays([*rest.columns, headers],
                                      names=[*rest.schema.names, "headers"])


# --- the direct route ----------------------------------------------------------------

Split = tuple[int, list[tuple[str, int]]]  # (task number, [(file, row group)])


def capture_splits(capture: Path, rows_per_split: int = SPLIT_ROWS,
                   min_splits: int = 1) -> list[Split]:
    """The capture's row groups in slices of about `rows_per_split` rows (at least
    `min_splits` when there are enough row groups), in file order. Files as Spark
    reads them: `*.parquet`, hidden (`.`, `_`) ones left out."""
    import pyarrow.parquet as pq

    files = [capture] if capture.is_file() else sorted(
        p for p in capture.rglob("*.parquet") if p.is_file()
        and not any(part.startswith((".", "_")) for part in p.relative_to(capture).parts))
    groups: list[tuple[str, int, int]] = []
    for file in files:
        try:
            metadata = pq.ParquetFile(file).metadata
        except Exception as exc:  # pyarrow's ArrowInvalid, OSError...
            raise PipelineError(f"the backtest failed: {file} is not a readable Parquet "
                                f"file ({str(exc).splitlines()[0]})") from None
        groups += [(str(file), g, metadata.row_group(g).num_rows)
                   for g in range(metadata.num_row_groups)]
    total = sum(rows for _, _, rows in groups)
    size = max(1, min(rows_per_split, -(-total // max(1, min_splits))))
    splits: list[Split] = []
    current: list[tuple[str, int]] = []
    rows_in = 0
    for name, group, rows in groups:
        if current and rows_in + rows > size:
            splits.append((len(splits), current))
            current, rows_in = [], 0
        current.append((name, group))
        rows_in += rows
    if current:
        splits.append((len(splits), current))
    return splits


def evaluate_split(split: Split, rules: RuleFiles, live: RuleFiles | None,
                   target: Path) -> int:
    """One task of the direct route: read, evaluate and write one slice of the capture
    (written beside, then renamed: a retried task replaces its part whole)."""
    import pyarrow.parquet as pq

    from interceptors.capture import capture_schema

    number, parts = split
    candidate = engine_for(rules)
    live_engine = engine_for(live) if live is not None else None
    columns = capture_schema().names
    final = target / f"part-{number:05d}.parquet"
    staging = target / f".part-{number:05d}.{uuid.uuid4().hex}.tmp"
    count = 0
    with pq.ParquetWriter(staging, result_schema()) as writer:
        for file, group in parts:
            table = pq.ParquetFile(file).read_row_group(
                group, columns=[c for c in columns if c != "captured_at"])
            for batch in table.to_batches(max_chunksize=10_000):
                writer.write_batch(evaluate_batch(batch, candidate, live_engine))
                count += batch.num_rows
    os.replace(staging, final)
    return count


def evaluate_direct(spark: SparkSession, capture: Path, rules: RuleFiles,
                    live: RuleFiles | None, target: Path) -> int:
    """The direct route (see the module docstring); returns the records written."""
    import pyarrow as pa
    from pyspark.sql.types import LongType, StructField, StructType

    splits = capture_splits(capture, min_splits=2 * spark.sparkContext.defaultParallelism)
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    resolved = target.resolve()
    # One Spark partition (task) per split.
    descriptors = spark.createDataFrame(spark.sparkContext.parallelize(
        [(number, json.dumps(parts)) for number, parts in splits], max(1, len(splits))),
        "split long, parts string")

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for number, parts in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                                     strict=True):
                written = evaluate_split((number, [tuple(p) for p in json.loads(parts)]),
                                         rules, live, resolved)
                yield pa.RecordBatch.from_pydict({"split": [number], "records": [written]})

    schema = StructType([StructField("split", LongType()), StructField("records", LongType())])
    done = descriptors.mapInArrow(run, schema).collect()
    if len(done) != len(splits):
        raise PipelineError(f"the backtest wrote {len(done)} of {len(splits)} parts")
    (target / "_SUCCESS").write_text("")
    return sum(row["records"] for row in done)


@dataclass
class BacktestResult:
    out: Path
    summary: dict[str, Any]
    seconds: float
    crossed: list[str] = field(default_factory=list)


def run_backtest(spark: SparkSession, records: DataFrame | Path, rules: RuleFiles,
                 live: RuleFiles | None, out: Path, method: Method | None = None
                 ) -> BacktestResult:
    """Evaluate, write `out/records`, aggregate; returns the summary (also as JSON).

    `records`: a capture (a Parquet file or directory) or any DataFrame in the capture
    schema; `method` (default: direct for a capture, arrow for a DataFrame)."""
    start = time.perf_counter()
    method = method or ("direct" if isinstance(records, Path) else "arrow")
    if method not in METHODS:
        raise PipelineError(f"method is one of {', '.join(METHODS)}, not {method!r}")
    out.mkdir(parents=True, exist_ok=True)
    with spark_errors("the backtest"):
        if method == "direct":
            if not isinstance(records, Path):
                raise PipelineError("the direct route reads capture files: give their path")
            evaluate_direct(spark, records, rules, live, out / "records")
        else:
            if isinstance(records, Path):
                from pipeline.inputs import read_records

                records = read_records(spark, records)
            evaluate_frame(records, rules, live, method).write.mode("overwrite").parquet(
                str(out / "records"))
        # Read back once and kept in memory: every aggregate below scans it.
        reader = spark.read
        if not any((out / "records").rglob("*.parquet")):  # no records (a quiet capture)
            reader = reader.schema(to_spark_schema(result_schema()))
        results = reader.parquet(str(out / "records")).cache()
        summary = summarize(results, out)
        results.unpersist()
    summary["rules_dir"] = rules.name
    summary["live_rules_dir"] = live.name if live else None
    summary["unjudged"] = [u.as_dict() for u in rules.unjudged]
    summary["live_unjudged"] = [u.as_dict() for u in live.unjudged] if live else []
    summary["method"] = method
    seconds = time.perf_counter() - start
    summary["seconds"] = round(seconds, 3)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return BacktestResult(out, summary, seconds)


# --- aggregation ------------------------------------------------------------------


def _status_counts(prefix: str = "") -> list[Any]:
    from pyspark.sql import functions as F

    return [F.sum(F.when(F.col(f"{prefix}status") == s, 1).otherwise(0)).alias(s)
            for s in STATUSES]


def _rules_frame(results: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    steps = results.select(F.explode("steps").alias("s"))

    def effect(name: str, dry_run: bool) -> Any:
        hit = (F.col("s.effect") == name) & (F.col("s.dry_run") == F.lit(dry_run))
        return F.sum(F.when(hit, 1).otherwise(0))

    effects = ("unchanged", "modified", "dropped", "rejected")
    failed = F.col("s.effect").isin("failed", "timeout", "unavailable")
    reasons = F.slice(F.array_sort(F.collect_set("s.reason")), 1, SAMPLE_REASONS)
    return (steps.groupBy(F.col("s.rule_id").alias("rule_id"), F.col("s.kind").alias("kind"))
            .agg(F.count(F.lit(1)).alias("matched"),
                 F.sum(F.when(F.col("s.effect") == "unchanged", 1).otherwise(0))
                 .alias("unchanged"),
                 *(effect(e, False).alias(e) for e in effects[1:]),
                 F.sum(F.when(failed & ~F.col("s.dry_run"), 1).otherwise(0)).alias("failed"),
                 *(effect(e, True).alias(f"would_{e}") for e in effects[1:]),
                 # What the rule got and passed on (the record's final bytes made every
                 # rule that matched the same records report the same bytes).
                 F.sum("s.bytes_in").alias("bytes_before"),
                 F.sum("s.bytes_out").alias("bytes_after"),
                 reasons.alias("sample_reasons"))
            .orderBy("rule_id"))


def _topics_frame(results: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return (results.groupBy("topic")
            .agg(F.count(F.lit(1)).alias("records"), *_status_counts(),
                 F.sum("bytes_before").alias("bytes_before"),
                 F.sum("bytes_after").alias("bytes_after"),
                 F.sum(F.col("differs").cast("int")).alias("differs"))
            .orderBy("topic"))


def _collect(frame: DataFrame, out: Path | None, name: str) -> list[dict[str, Any]]:
    """A small aggregate as rows, also written as `out/<name>.parquet` (from the driver)."""
    import pyarrow.parquet as pq

    table = frame.toArrow()
    if out is not None:
        target = out / f"{name}.parquet"
        if target.is_dir():
            shutil.rmtree(target)
        pq.write_table(table, target)
    return table.to_pylist()


def summarize(results: DataFrame, out: Path | None = None) -> dict[str, Any]:
    """Totals, per rule, per topic and the diff against the live rules, as plain data
    (per rule and per topic also as Parquet under `out`)."""
    from pyspark.sql import functions as F

    totals_row = results.agg(
        F.count(F.lit(1)).alias("records"), *_status_counts(),
        *(c.alias(f"live_{s}") for c, s in zip(_status_counts("live_"), STATUSES, strict=True)),
        F.coalesce(F.sum("bytes_before"), F.lit(0)).alias("bytes_before"),
        F.coalesce(F.sum("bytes_after"), F.lit(0)).alias("bytes_after"),
        F.coalesce(F.sum("live_bytes_after"), F.lit(0)).alias("live_bytes_after"),
        F.coalesce(F.sum(F.col("differs").cast("int")), F.lit(0)).alias("differs"),
        F.min("timestamp").alias("first_timestamp"), F.max("timestamp").alias("last_timestamp"),
    ).first()
    assert totals_row is not None
    totals = {k: (v if v is not None else 0) for k, v in totals_row.asDict().items()}
    totals["changed"] = totals["records"] - totals["unchanged"]
    diffs = results.where("differs")
    transitions = [
        {"live_status": r["live_status"], "status": r["status"], "records": r["count"]}
        for r in diffs.groupBy("live_status", "status").count()
        .orderBy(F.desc("count")).collect()
    ]
    samples = [
        {"topic": r["topic"], "partition": r["partition"], "offset": r["offset"],
         "key": _text(r["key"]), "live_status": r["live_status"], "status": r["status"],
         "reason": r["reason"], "live_reason": r["live_reason"]}
        for r in diffs.orderBy("topic", "partition", "offset").limit(SAMPLE_DIFFS).collect()
    ]
    return {
        "totals": totals,
        "rules": _collect(_rules_frame(results), out, "rules"),
        "topics": _collect(_topics_frame(results), out, "topics"),
        "diff": {"transitions": transitions, "samples": samples},
        "timeline": _timeline(results, totals_row["first_timestamp"],
                              totals_row["last_timestamp"]),
    }


def _timeline(results: DataFrame, low: int | None, high: int | None) -> list[dict[str, Any]]:
    """Records per status over time (record timestamps), about 60 buckets."""
    from pyspark.sql import functions as F

    if low is None or high is None:
        return []
    width = max(1000, (high - low) // 60 + 1)
    bucket = (F.floor((F.col("timestamp") - low) / width) * width + low).cast("long")
    rows = (results.where(F.col("timestamp").isNotNull())
            .groupBy(bucket.alias("bucket_ms")).agg(*_status_counts())
            .orderBy("bucket_ms").collect())
    return [r.asDict() for r in rows]


def _text(key: bytes | bytearray | None) -> str | None:
    if key is None:
        return None
    return bytes(key).decode("utf-8", "backslashreplace")[:200]


__all__ = [
    "METHODS",
    "BacktestResult",
    "Method",
    "RulesInvalid",
    "capture_splits",
    "evaluate_direct",
    "evaluate_frame",
    "evaluate_split",
    "load_rules",
    "run_backtest",
    "summarize",
]
