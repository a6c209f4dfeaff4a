"""Where a job's records come from: capture Parquet files, or a Kafka topic.

`--input PATH` is a capture directory (or one file) as written by the `capture`
action and `keg capture`. `--input kafka://host:port/topic` reads the topic from
its earliest to its latest offsets with Spark's Kafka source (batch mode); the
rows are put in the capture schema (principal unknown, direction produce).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, get_args
from urllib.parse import urlsplit

from filter_rules.record_actions import TOPIC_NAME_PATTERN
from interceptors.contract import RecordDirection
from pipeline.errors import PipelineError
from pipeline.spark import spark_errors

# What a capture's direction column may say.
CAPTURE_DIRECTIONS: Final[tuple[str, ...]] = get_args(RecordDirection)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

KAFKA_SCHEME = "kafka://"


@dataclass(frozen=True)
class KafkaInput:
    bootstrap: str
    topic: str


def parse_input(value: str) -> Path | KafkaInput:
    """A checked input: an existing, readable path or a kafka://host:port/topic URL."""
    if value.startswith(KAFKA_SCHEME):
        url = urlsplit(value)
        topic = url.path.lstrip("/")
        if not url.hostname or not url.port or not re.match(TOPIC_NAME_PATTERN, topic):
            raise PipelineError(
                f"invalid Kafka input '{value}' (expected kafka://host:port/topic)")
        return KafkaInput(url.netloc, topic)
    if "://" in value:
        raise PipelineError(f"unsupported input '{value}' (a path or kafka://host:port/topic)")
    path = Path(value).expanduser()
    if not path.exists():
        raise PipelineError(f"input {path} does not exist")
    if not os.access(path, os.R_OK):
        raise PipelineError(f"input {path} is not readable")
    if path.is_dir() and not any(path.rglob("*.parquet")):
        raise PipelineError(f"input {path} holds no Parquet files")
    return path


def check_capture_files(path: Path) -> None:
    """Every Parquet file under `path` (a backtest's `--input`) has the columns a
    capture always holds (read from the files' footers, not their rows): Spark reads a
    file without them as rows of nulls, and the job then failed deep inside with a
    stack trace."""
    import pyarrow.parquet as pq

    from interceptors.capture import capture_schema

    required = [f.name for f in capture_schema() if not f.nullable]
    files = [path] if path.is_file() else sorted(path.rglob("*.parquet"))
    for file in files:
        try:
            names = set(pq.read_schema(file).names)
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            raise PipelineError(f"{file} is not a readable Parquet file: {err}") from None
        missing = [name for name in required if name not in names]
        if missing:
            raise PipelineError(
                f"{file} is not a capture file: it lacks the column(s) {', '.join(missing)} "
                f"(a capture has {', '.join(f.name for f in capture_schema())}; "
                "docs/pipeline.md)")
        if "direction" in names:
            _check_directions(file)


def _check_directions(file: Path) -> None:
    """A capture's direction is produce or consume (null: produce). Another value made
    every task fail with a KeyError and Spark's stack traces; one column is read."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        found = pc.unique(pq.read_table(file, columns=["direction"]).column(0)).to_pylist()
    except (OSError, ValueError) as err:
        raise PipelineError(f"{file} is not a readable Parquet file: {err}") from None
    wrong = sorted(str(d) for d in found if d not in (None, *CAPTURE_DIRECTIONS))
    if wrong:
        raise PipelineError(
            f"{file}: column direction holds {', '.join(map(repr, wrong))}; a capture's "
            f"direction is {' or '.join(CAPTURE_DIRECTIONS)} (null: produce)")


def read_records(spark: SparkSession, source: Path | KafkaInput) -> DataFrame:
    """The records as a DataFrame in the capture schema."""
    if isinstance(source, KafkaInput):
        return _read_kafka(spark, source)
    from pyspark.sql.types import StructType

    from interceptors.capture import capture_schema
    from pipeline.arrow_types import to_spark_schema

    schema: StructType = to_spark_schema(capture_schema())
    with spark_errors(f"reading {source}"):
        # Partition directories (date=/topic=) repeat columns the files hold: no discovery.
        return (spark.read.schema(schema).option("recursiveFileLookup", "true")
                .option("pathGlobFilter", "*.parquet").parquet(str(source)))


def _read_kafka(spark: SparkSession, source: KafkaInput) -> DataFrame:
    from pyspark.sql import functions as F

    with spark_errors(f"reading kafka://{source.bootstrap}/{source.topic}"):
        raw = (spark.read.format("kafka")
               .option("kafka.bootstrap.servers", source.bootstrap)
               .option("subscribe", source.topic)
               .option("startingOffsets", "earliest")
               .option("endingOffsets", "latest")
               .option("includeHeaders", "true")
               .load())
        return raw.select(
            F.col("topic"), F.col("partition").cast("int"), F.col("offset"),
            F.col("timestamp"), F.col("key"), F.col("value"), F.col("headers"),
            F.lit(None).cast("string").alias("principal"),
            F.lit("produce").alias("direction"),
            F.current_timestamp().alias("captured_at"),
        )


__all__ = ["KAFKA_SCHEME", "KafkaInput", "parse_input", "read_records"]
