"""Live rule impact: per-minute aggregates of the audit stream, kept as Parquet files.

`keg analyze --follow` (pipeline.impact, Spark Structured Streaming over the audit
topic) writes them with `merge`; the REST API (`/v1/impact`) reads them with `query`.
One row per (minute, rule, topic, principal, outcome): decisions (events), bytes,
records, errors (the gateway answered an error code), p50 and p99 latency.

Layout: `<dir>/hour=YYYY-MM-DDTHH/impact.parquet`, one file per UTC hour, replaced
whole (written beside it, then renamed): a reader sees the file before or after an
update, never half of one. A minute's row is replaced when a later micro-batch
updates it (Spark's update mode emits the whole aggregate), so replays after a
restart of the streaming job change nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

KEYS: Final = ("minute", "rule_id", "topic", "principal", "outcome")
FILE: Final = "impact.parquet"


def impact_schema() -> pa.Schema:
    return pa.schema([
        pa.field("minute", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("rule_id", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("principal", pa.string()),
        pa.field("outcome", pa.string()),
        pa.field("decisions", pa.int64()),
        pa.field("bytes", pa.int64()),
        pa.field("records", pa.int64()),
        pa.field("errors", pa.int64()),
        pa.field("p50_latency_ms", pa.float64()),
        pa.field("p99_latency_ms", pa.float64()),
    ])


def _hour(minute: datetime) -> str:
    return minute.astimezone(UTC).strftime("%Y-%m-%dT%H")


def _key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(k) for k in KEYS)


def merge(directory: Path, rows: Iterable[Mapping[str, Any]]) -> int:
    """Put `rows` in place of the rows with the same key; returns the hours written."""
    by_hour: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        minute = row["minute"]
        if minute.tzinfo is None:  # Spark hands out naive UTC
            row = {**row, "minute": minute.replace(tzinfo=UTC)}
        by_hour.setdefault(_hour(row["minute"]), []).append(row)
    schema = impact_schema()
    for hour, fresh in by_hour.items():
        target = directory / f"hour={hour}" / FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        merged: dict[tuple[Any, ...], Mapping[str, Any]] = {}
        if target.exists():
            merged = {_key(r): r for r in pq.read_table(target, schema=schema).to_pylist()}
        merged.update((_key(r), r) for r in fresh)
        ordered = sorted(merged.values(), key=lambda r: tuple(
            "" if v is None else v for v in (r["minute"].isoformat(), *_key(r)[1:])))
        table = pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema}
                                      for r in ordered], schema=schema)
        staging = target.with_name(f".{FILE}.{os.getpid()}.tmp")
        pq.write_table(table, staging)
        os.replace(staging, target)
    return len(by_hour)


@dataclass(frozen=True)
class ImpactQuery:
    since: datetime | None = None
    until: datetime | None = None
    rule_id: str | None = None
    topic: str | None = None
    principal: str | None = None
    outcome: str | None = None
    limit: int = 10_000


def query(directory: Path, q: ImpactQuery) -> tuple[list[dict[str, Any]], bool]:
    """The rows matching `q`, by minute (newest last), and whether `limit` cut them."""
    if not directory.is_dir():
        return [], False
    since = q.since.astimezone(UTC) if q.since else None
    until = q.until.astimezone(UTC) if q.until else None
    rows: list[dict[str, Any]] = []
    for path in sorted(directory.glob(f"hour=*/{FILE}")):
        hour = datetime.strptime(path.parent.name[len("hour="):], "%Y-%m-%dT%H").replace(
            tzinfo=UTC)
        if (since and hour + timedelta(hours=1) <= since) or (until and hour >= until):
            continue
        for row in pq.read_table(path, schema=impact_schema()).to_pylist():
            if (since and row["minute"] < since) or (until and row["minute"] >= until):
                continue
            if any(want is not None and row[name] != want for name, want in (
                    ("rule_id", q.rule_id), ("topic", q.topic), ("principal", q.principal),
                    ("outcome", q.outcome))):
                continue
            rows.append(row)
    rows.sort(key=lambda r: r["minute"])
    truncated = len(rows) > q.limit
    return rows[-q.limit:] if truncated else rows, truncated


__all__ = ["FILE", "KEYS", "ImpactQuery", "impact_schema", "merge", "query"]
