"""`keg analyze`: the gateway's audit log (JSON Lines, ext_proc.audit) aggregated.

Per topic, principal, client id and rule: events and bytes; outcomes over time;
denied and rejected requests; top talkers by bytes; latency percentiles (exact,
linear interpolation) where events carry `latency_ms`. Each table is written as
Parquet under `out/` and collected into `summary.json` for the report.

Lines that are not JSON objects are counted (`malformed`) and skipped, never fatal:
a log cut by a crash still analyses.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipeline.errors import PipelineError
from pipeline.spark import spark_errors

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

DENIED: Final = ("denied", "would-deny", "rejected")
PERCENTILES: Final = (0.5, 0.9, 0.99)
TOP: Final = 20
CORRUPT: Final = "_corrupt_record"


def audit_schema(corrupt_column: bool = True) -> StructType:
    """The fields `ext_proc.audit.AuditEvent` writes (extras are not analysed), and the
    column a permissive JSON read puts unreadable lines in."""
    from pyspark.sql.types import (
        DoubleType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    strings = ("ts", "event_id", "connection_id", "principal", "client_id", "client_host",
               "listener", "security_protocol", "api_name", "topic", "rule_id",
               "rule_version", "action", "mode", "outcome", "reason")
    ints = ("client_port", "broker_id", "api_key", "api_version", "correlation_id",
            "partition", "error_code")
    return StructType([
        *(StructField(n, StringType()) for n in strings),
        *(StructField(n, IntegerType()) for n in ints),
        StructField("bytes", LongType()),
        StructField("records", LongType()),
        StructField("latency_ms", DoubleType()),
        *([StructField(CORRUPT, StringType())] if corrupt_column else []),
    ])


def audit_files(path: Path) -> list[str]:
    """The audit files at `path`: one file, or every file of a directory (rotated ones too)."""
    if not path.exists():
        raise PipelineError(f"audit log {path} does not exist")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()
                                                 and not p.name.startswith((".", "_")))
    if not files:
        raise PipelineError(f"audit directory {path} holds no files")
    for file in files:
        try:
            with file.open("rb") as handle:
                handle.read(1)
        except OSError as exc:
            raise PipelineError(f"cannot read audit log {file}: {exc.strerror or exc}") from None
    return [str(f) for f in files]


def read_audit(spark: SparkSession, files: list[str]) -> DataFrame:
    from pyspark.sql import functions as F

    with spark_errors("reading the audit log"):
        raw = (spark.read.schema(audit_schema()).option("mode", "PERMISSIVE")
               .option("columnNameOfCorruptRecord", CORRUPT).json(files))
        # Spark refuses queries on the corrupt column alone unless the frame is cached.
        raw = raw.cache()
        return raw.withColumn("time", F.to_timestamp("ts"))


@dataclass
class AnalyzeResult:
    out: Path
    summary: dict[str, Any]
    seconds: float


def _events(frame: DataFrame) -> list[Column]:
    from pyspark.sql import functions as F

    return [
        F.count(F.lit(1)).alias("events"),
        F.coalesce(F.sum("bytes"), F.lit(0)).alias("bytes"),
        F.sum(F.when(F.col("outcome") == "denied", 1).otherwise(0)).alias("denied"),
        F.sum(F.when(F.col("outcome") == "would-deny", 1).otherwise(0)).alias("would_deny"),
        F.sum(F.when(F.col("outcome") == "rejected", 1).otherwise(0)).alias("rejected"),
        F.sum(F.when(F.col("error_code").isNotNull() & (F.col("error_code") != 0), 1)
              .otherwise(0)).alias("errors"),
    ]


def tables(events: DataFrame) -> dict[str, DataFrame]:
    """Every aggregate, lazily, by name (each written as `<name>.parquet`)."""
    from pyspark.sql import functions as F

    def by(*keys: str) -> DataFrame:
        return events.groupBy(*keys).agg(*_events(events)).orderBy(F.desc("events"), *keys)

    latency = events.where(F.col("latency_ms").isNotNull())
    pct = F.percentile("latency_ms", F.array(*(F.lit(p) for p in PERCENTILES)))
    latency_cols = [
        F.count(F.lit(1)).alias("events"),
        *(pct[i].alias(f"p{round(p * 100)}") for i, p in enumerate(PERCENTILES)),
        F.max("latency_ms").alias("max"),
    ]
    return {
        "outcomes": events.groupBy("outcome").agg(F.count(F.lit(1)).alias("events"),
                                                  F.coalesce(F.sum("bytes"), F.lit(0))
                                                  .alias("bytes")).orderBy(F.desc("events")),
        "topics": by("topic"),
        "principals": by("principal"),
        "clients": by("client_id"),
        "rules": by("rule_id", "action", "mode"),
        "apis": by("api_name"),
        "denied": (events.where(F.col("outcome").isin(*DENIED))
                   .groupBy("outcome", "topic", "principal", "rule_id", "error_code", "reason")
                   .agg(F.count(F.lit(1)).alias("events")).orderBy(F.desc("events"))),
        "top_talkers": (events.groupBy("principal", "client_id", "client_host")
                        .agg(F.count(F.lit(1)).alias("events"),
                             F.coalesce(F.sum("bytes"), F.lit(0)).alias("bytes"))
                        .orderBy(F.desc("bytes"), F.desc("events")).limit(TOP)),
        "latency": latency.agg(*latency_cols),
        "latency_by_api": latency.groupBy("api_name").agg(*latency_cols).orderBy("api_name"),
    }


def timeline(events: DataFrame) -> DataFrame:
    """Events and bytes per outcome in about 60 time buckets."""
    from pyspark.sql import functions as F

    bounds = events.agg(F.min("time").cast("double"), F.max("time").cast("double")).first()
    low, high = (bounds[0], bounds[1]) if bounds else (None, None)
    if low is None or high is None:
        return events.limit(0).select(F.lit(None).cast("timestamp").alias("bucket"))
    width = max(1.0, (high - low) / 60)
    start = F.floor((F.col("time").cast("double") - low) / width) * width + low
    return (events.where(F.col("time").isNotNull())
            .groupBy(F.timestamp_seconds(start).alias("bucket"), "outcome")
            .agg(F.count(F.lit(1)).alias("events"),
                 F.coalesce(F.sum("bytes"), F.lit(0)).alias("bytes"))
            .orderBy("bucket", "outcome"))


def run_analyze(spark: SparkSession, audit: Path, out: Path) -> AnalyzeResult:
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    start = time.perf_counter()
    files = audit_files(audit)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"audit": str(audit), "files": len(files)}
    with spark_errors("the analysis"):
        raw = read_audit(spark, files)
        malformed = raw.where(F.col(CORRUPT).isNotNull()).count()
        events = raw.where(F.col(CORRUPT).isNull()).drop(CORRUPT)
        totals = events.agg(*_events(events), F.min("time").alias("first"),
                            F.max("time").alias("last"),
                            F.countDistinct("principal").alias("principals"),
                            F.countDistinct("topic").alias("topics")).first()
        assert totals is not None
        summary["totals"] = {**totals.asDict(), "malformed": malformed}
        named = {**tables(events), "timeline": timeline(events)}
        for name, frame in named.items():
            # Aggregates are small: one Spark job each, written from the driver.
            table = frame.toArrow()
            target = out / f"{name}.parquet"
            if target.is_dir():  # written by Spark before: overwrite as Spark would
                shutil.rmtree(target)
            pq.write_table(table, target)
            summary[name] = table.to_pylist()
        raw.unpersist()
    seconds = time.perf_counter() - start
    summary["seconds"] = round(seconds, 3)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return AnalyzeResult(out, summary, seconds)


__all__ = ["AnalyzeResult", "audit_files", "audit_schema", "read_audit", "run_analyze"]
