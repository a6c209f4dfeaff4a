"""`keg analyze`: the gateway's audit log (JSON Lines, ext_proc.audit) aggregated.

Per topic, principal, client id, rule and API: events and bytes; outcomes over time;
denied and rejected requests; top talkers by bytes; latency percentiles (exact,
linear interpolation) where events carry `latency_ms`. Each table is written as
Parquet under `out/` and collected into `summary.json` for the report.

On Spark, at the speed of Arrow: the log is cut into slices (byte ranges of whole
lines, about SLICE_BYTES each; a Parquet file's row groups), one Spark task per
slice; each task parses its slice with pyarrow and aggregates it with Arrow's hash
aggregation (`pipeline.audit_tables`), and the driver merges the partial aggregates.
The JVM schedules and moves a few kilobytes per task; no event passes through it.
Audit events kept as Parquet (`*.parquet` files with these fields) are read as such.

Lines that are not JSON objects are counted (`malformed`) and skipped, never fatal:
a log cut by a crash still analyses. Rotated files compressed by logrotate (`.gz`,
`.bz2`, `.xz`) are read whole, one task each: a compressed stream cannot be cut.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipeline.errors import PipelineError
from pipeline.spark import spark_errors

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

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


SLICE_BYTES: Final = 64 << 20
# (file, first byte, end byte), (file, row group, PARQUET) or (file, 0, COMPRESSED)
Slice = tuple[str, int, int]
PARQUET: Final = -1
COMPRESSED: Final = -2
# What logrotate's compressors leave (compress, compresscmd bzip2 / xz): opened by suffix.
_DECOMPRESS: Final = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}


def _compression(file: str) -> str | None:
    """The stdlib module that reads `file`, when its suffix says it is compressed."""
    return _DECOMPRESS.get(os.path.splitext(file)[1])


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


def audit_slices(files: list[str], slice_bytes: int = SLICE_BYTES,
                 min_slices: int = 1) -> list[Slice]:
    """The files cut into slices of about `slice_bytes` (at least `min_slices` when the
    data allows): byte ranges of JSON Lines files, row groups of Parquet files."""
    import pyarrow.parquet as pq

    total = sum(os.path.getsize(f) for f in files
                if not f.endswith(".parquet") and not _compression(f))
    size = max(1 << 20, min(slice_bytes, -(-total // max(1, min_slices))))
    slices: list[Slice] = []
    for file in files:
        if file.endswith(".parquet"):
            try:
                groups = pq.ParquetFile(file).metadata.num_row_groups
            except Exception as exc:  # pyarrow's ArrowInvalid, OSError...
                raise PipelineError(f"{file} is not a readable Parquet file "
                                    f"({str(exc).splitlines()[0]})") from None
            slices += [(file, group, PARQUET) for group in range(groups)]
            continue
        if _compression(file):
            slices.append((file, 0, COMPRESSED))
            continue
        length = os.path.getsize(file)
        slices += [(file, start, min(start + size, length)) for start in range(0, length, size)]
    return slices


def read_slice(file: str, start: int, end: int) -> bytes:
    """The lines that begin in [start, end) (as Hadoop's line reader splits files)."""
    with open(file, "rb") as handle:
        if start > 0:
            handle.seek(start - 1)
            if handle.read(1) != b"\n":
                handle.readline()  # the rest of a line that began before: not ours
        begin = handle.tell()
        if begin >= end:
            return b""
        data = handle.read(end - begin)
        if not data.endswith(b"\n"):
            data += handle.readline()  # the last line, to its end
        return data


def analyze_slice(piece: Slice) -> dict[str, Any]:
    """One task: the slice's partial aggregates (pipeline.audit_tables)."""
    import pyarrow.parquet as pq

    from pipeline.audit_tables import parse_lines, parsed_schema, partial_aggregates

    file, start, end = piece
    if end == COMPRESSED:
        module = importlib.import_module(_compression(file) or "gzip")
        try:
            with module.open(file, "rb") as handle:
                data = handle.read()
        except (OSError, EOFError, ValueError) as exc:  # gzip.BadGzipFile, lzma.LZMAError
            raise PipelineError(f"cannot read audit log {file}: {exc}") from None
        events, malformed = parse_lines(data)
        return partial_aggregates(events, malformed)
    if end == PARQUET:
        names = parsed_schema().names
        table = pq.ParquetFile(file).read_row_group(start, columns=names)
        return partial_aggregates(table.cast(parsed_schema()))
    events, malformed = parse_lines(read_slice(file, start, end))
    return partial_aggregates(events, malformed)


def _ipc(table: pa.Table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def _table(data: bytes) -> pa.Table:
    import pyarrow as pa

    return pa.ipc.open_stream(data).read_all()


def partials_on_spark(spark: SparkSession, slices: list[Slice]) -> list[dict[str, pa.Table]]:
    """Every slice's partial aggregates, one Spark task per slice."""
    import pyarrow as pa
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    descriptors = spark.createDataFrame(spark.sparkContext.parallelize(
        [(n, json.dumps(piece)) for n, piece in enumerate(slices)], max(1, len(slices))),
        "slice long, piece string")

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for number, piece in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                                     strict=True):
                file, first, last = json.loads(piece)
                partial = analyze_slice((file, first, last))
                yield pa.RecordBatch.from_pydict({
                    "slice": [number] * len(partial), "name": list(partial),
                    "data": [_ipc(t) for t in partial.values()]})

    schema = StructType([StructField("slice", LongType()), StructField("name", StringType()),
                         StructField("data", BinaryType())])
    rows = descriptors.mapInArrow(run, schema).collect()
    by_slice: dict[int, dict[str, pa.Table]] = {}
    for row in rows:
        by_slice.setdefault(row["slice"], {})[row["name"]] = _table(row["data"])
    if len(by_slice) != len(slices):
        raise PipelineError(f"the analysis got {len(by_slice)} of {len(slices)} slices")
    return list(by_slice.values())


@dataclass
class AnalyzeResult:
    out: Path
    summary: dict[str, Any]
    seconds: float


def run_analyze(spark: SparkSession, audit: Path, out: Path) -> AnalyzeResult:
    import pyarrow.parquet as pq

    from pipeline.audit_tables import finish, merge_partials

    start = time.perf_counter()
    files = audit_files(audit)
    out.mkdir(parents=True, exist_ok=True)
    slices = audit_slices(files, min_slices=2 * spark.sparkContext.defaultParallelism)
    with spark_errors("the analysis"):
        finished, tables = finish(merge_partials(partials_on_spark(spark, slices)))
    summary: dict[str, Any] = {"audit": str(audit), "files": len(files), **finished}
    for name, table in tables.items():
        target = out / f"{name}.parquet"
        if target.is_dir():  # written by Spark before: overwrite as Spark would
            shutil.rmtree(target)
        pq.write_table(table, target)
    seconds = time.perf_counter() - start
    summary["seconds"] = round(seconds, 3)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return AnalyzeResult(out, summary, seconds)


__all__ = ["AnalyzeResult", "analyze_slice", "audit_files", "audit_schema", "audit_slices",
           "read_slice", "run_analyze"]
