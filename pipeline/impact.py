"""`keg analyze --follow`: live rule impact from the audit topic, on Spark Structured
Streaming.

The job reads the audit topic with Spark's Kafka source, parses each event (JSON,
`ext_proc.audit`'s fields), drops duplicates by `event_id` (the stream is at least
once) and keeps, per event-time minute, rule, topic, principal and outcome: decisions,
bytes, records, errors (the gateway answered an error code) and p50/p99 latency
(`percentile_approx`). Each micro-batch's updated aggregates (update mode) are merged
into Parquet files in `out` (`control_plane.impact`) that the control plane serves as
`/v1/impact` (its impact directory is this `out`); `report.html` beside them plots the
last hour.

Late and duplicate events: the event-time watermark trails the newest event by
`late_after` (default 10 minutes). An event older than that is not counted (Spark
reports it as dropped by the watermark); within it, a repeated `event_id` (a spool
delivering again after a crash) is counted once, and the minute's row is updated in
place. The checkpoint (`out/_checkpoint`) keeps the offsets and the state: a restarted
job goes on where it stopped, and a replayed micro-batch rewrites the same rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from control_plane import impact
from pipeline.analyze import audit_schema
from pipeline.errors import PipelineError
from pipeline.inputs import KafkaInput
from pipeline.spark import spark_errors

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

DEFAULT_LATE_AFTER: Final = "10 minutes"
DEFAULT_TRIGGER: Final = "2 seconds"
REPORT_EVERY_S: Final = 10.0
REPORT_HOURS: Final = 1


def impact_events(raw: DataFrame) -> DataFrame:
    """The Kafka source's rows as audit events with an event time; unparsable ones (no
    id or no time) are left out."""
    from pyspark.sql import functions as F

    parsed = raw.select(F.from_json(F.col("value").cast("string"),
                                    audit_schema(corrupt_column=False)).alias("e"))
    return (parsed.select("e.*")
            .withColumn("time", F.to_timestamp("ts"))
            .where(F.col("event_id").isNotNull() & F.col("time").isNotNull()))


def impact_aggregates(events: DataFrame, late_after: str = DEFAULT_LATE_AFTER) -> DataFrame:
    """Per minute, rule, topic, principal and outcome (see the module docstring)."""
    from pyspark.sql import functions as F

    refused = (F.coalesce(F.col("error_code"), F.lit(0)) != 0) & ~F.col("outcome").startswith(
        "would-")
    percentiles = F.percentile_approx("latency_ms", F.array(F.lit(0.5), F.lit(0.99)))
    return (events.withWatermark("time", late_after)
            .dropDuplicatesWithinWatermark(["event_id"])
            .groupBy(F.window("time", "1 minute").alias("window"), *impact.KEYS[1:])
            .agg(F.count(F.lit(1)).alias("decisions"),
                 F.coalesce(F.sum("bytes"), F.lit(0)).alias("bytes"),
                 F.coalesce(F.sum("records"), F.lit(0)).alias("records"),
                 F.sum(F.when(refused, 1).otherwise(0)).alias("errors"),
                 percentiles.alias("latency"))
            .select(F.col("window.start").alias("minute"), *impact.KEYS[1:], "decisions",
                    "bytes", "records", "errors",
                    F.col("latency")[0].alias("p50_latency_ms"),
                    F.col("latency")[1].alias("p99_latency_ms")))


@dataclass
class Follower:
    """Merges each micro-batch into the impact files; rewrites the report now and then."""

    out: Path
    report: bool = True
    batches: int = 0
    rows_written: int = 0
    on_batch: Callable[[int, int], None] | None = None
    _reported: float = field(default=0.0)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        rows = frame.toArrow().to_pylist()
        if rows:
            impact.merge(self.out, rows)
        self.batches += 1
        self.rows_written += len(rows)
        if self.on_batch is not None:
            self.on_batch(batch_id, len(rows))
        if self.report and rows and time.monotonic() - self._reported > REPORT_EVERY_S:
            self._reported = time.monotonic()
            write_report(self.out)


def write_report(out: Path) -> Path:
    """report.html: the last hour's impact (per rule over time, bytes, latency)."""
    from datetime import UTC, datetime, timedelta

    from pipeline.reports import impact_report

    since = datetime.now(UTC) - timedelta(hours=REPORT_HOURS)
    rows, _ = impact.query(out, impact.ImpactQuery(since=since, limit=100_000))
    return impact_report(rows, out / "report.html")


def follow(spark: SparkSession, source: KafkaInput, out: Path, *,
           kafka_options: Mapping[str, str] | None = None, starting: str = "earliest",
           late_after: str = DEFAULT_LATE_AFTER, trigger: str = DEFAULT_TRIGGER,
           report: bool = True, on_batch: Callable[[int, int], None] | None = None,
           ) -> tuple[StreamingQuery, Follower]:
    """Start the streaming query (it runs until stopped); `out` gets the impact files
    (`hour=*/impact.parquet`, what /v1/impact serves), the checkpoint and `report.html`."""
    if starting not in ("earliest", "latest"):
        raise PipelineError(f"--from is earliest or latest, not {starting!r}")
    out.mkdir(parents=True, exist_ok=True)
    sink = Follower(out, report=report, on_batch=on_batch)
    with spark_errors(f"following kafka://{source.bootstrap}/{source.topic}"):
        reader = (spark.readStream.format("kafka")
                  .option("kafka.bootstrap.servers", source.bootstrap)
                  .option("subscribe", source.topic)
                  .option("startingOffsets", starting)
                  # Audit events aged out of the topic are gone: go on, never stop.
                  .option("failOnDataLoss", "false"))
        for key, value in (kafka_options or {}).items():
            reader = reader.option(f"kafka.{key}", value)
        aggregates = impact_aggregates(impact_events(reader.load()), late_after)
        query = (aggregates.writeStream.outputMode("update").foreachBatch(sink)
                 .option("checkpointLocation", str(out / "_checkpoint"))
                 .trigger(processingTime=trigger).queryName("keg-impact").start())
    return query, sink


__all__ = ["Follower", "follow", "impact_aggregates", "impact_events", "write_report"]
