"""The audit analysis's tables, computed on Arrow: partial aggregates per slice of the
log, merged into the tables `keg analyze` reports.

Every Spark task of `keg analyze` takes one slice (a byte range of a JSON Lines file,
whole lines, or a Parquet row group), parses it with pyarrow's JSON reader (C++, only
the analysed fields), and aggregates it with Arrow's hash aggregation
(`partial_aggregates`): per grouped table the metrics, plus what can be merged exactly
— counts per second for the timeline, counts per latency value for the percentiles,
the distinct principals and topics. The driver merges the partials (`merge_partials`)
and finishes the tables (`finish`). Nothing is approximated: percentiles are exact
(linear interpolation between the two nearest ranks, as Spark's `percentile` and
DuckDB's `quantile_cont`).

Lines that are not JSON objects, or whose fields do not have the audit types, are
counted as malformed and skipped (a slice with one is parsed line by line).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import pyarrow as pa

PERCENTILES: Final = (0.5, 0.9, 0.99)
TOP: Final = 20
SUMMARY_ROWS: Final = 1000  # of a table, in summary.json (its Parquet file has all)
DENIED: Final = ("denied", "would-deny", "rejected")
METRICS: Final = ("events", "bytes", "denied", "would_deny", "rejected", "errors")
DENIED_KEYS: Final = ("outcome", "topic", "principal", "rule_id", "error_code", "reason")
TALKER_KEYS: Final = ("principal", "client_id", "client_host")
GROUPED: Final[dict[str, tuple[str, ...]]] = {
    "outcomes": ("outcome",),
    "topics": ("topic",),
    "principals": ("principal",),
    "clients": ("client_id",),
    "rules": ("rule_id", "action", "mode"),
    "apis": ("api_name",),
    "denied": DENIED_KEYS,
    "top_talkers": TALKER_KEYS,
    "timeline": ("second", "outcome"),  # merged per second, bucketed at the end
}
STRINGS: Final = ("ts", "principal", "client_id", "client_host", "topic", "api_name",
                  "rule_id", "action", "mode", "outcome", "reason")


def parsed_schema() -> pa.Schema:
    """The analysed fields of an audit event (ext_proc.audit.AuditEvent)."""
    import pyarrow as pa

    return pa.schema([*(pa.field(n, pa.string()) for n in STRINGS),
                      pa.field("error_code", pa.int32()), pa.field("bytes", pa.int64()),
                      pa.field("latency_ms", pa.float64())])


# -- parsing -------------------------------------------------------------------------------


def parse_lines(data: bytes) -> tuple[pa.Table, int]:
    """JSON lines -> (events, malformed lines)."""
    import pyarrow as pa
    import pyarrow.json as pj

    schema = parsed_schema()
    try:
        table = pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(
            use_threads=False, block_size=max(1 << 20, min(len(data) + 1, 64 << 20))),
            parse_options=pj.ParseOptions(explicit_schema=schema,
                                          unexpected_field_behavior="ignore"))
        return table.select(schema.names), 0
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return _parse_each(data, schema)


def _parse_each(data: bytes, schema: pa.Schema) -> tuple[pa.Table, int]:
    """The slow path for a slice with a bad line: each line alone."""
    import orjson
    import pyarrow as pa

    rows: list[dict[str, Any]] = []
    malformed = 0
    checks: list[tuple[str, Callable[[Any], bool]]] = [
        *((n, lambda v: isinstance(v, str)) for n in STRINGS),
        *((n, lambda v: isinstance(v, int) and not isinstance(v, bool))
          for n in ("error_code", "bytes")),
        ("latency_ms", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    ]
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            malformed += 1
            continue
        if not isinstance(event, dict) or any(
                event.get(name) is not None and not ok(event[name]) for name, ok in checks):
            malformed += 1
            continue
        rows.append({name: event.get(name) for name in schema.names})
    return pa.Table.from_pylist(rows, schema=schema), malformed


def with_time(table: pa.Table) -> pa.Table:
    """`ts` (RFC 3339, UTC) as `ms` since the epoch (null when unreadable)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ts = table.column("ts")
    try:
        ms = pc.cast(pc.cast(ts, pa.timestamp("ms", tz="UTC")), pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        ms = pa.array([_ms(v) for v in ts.to_pylist()], pa.int64())
    return table.append_column("ms", ms)


def _ms(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


# -- partial aggregates (one slice) ----------------------------------------------------------


def partial_aggregates(table: pa.Table, malformed: int = 0) -> dict[str, pa.Table]:
    """One slice's mergeable aggregates, by name (see the module docstring)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = with_time(table)
    outcome = table.column("outcome")
    code = table.column("error_code")
    flags = {
        "denied": pc.equal(outcome, "denied"),
        "would_deny": pc.equal(outcome, "would-deny"),
        "rejected": pc.equal(outcome, "rejected"),
        "errors": pc.and_(pc.is_valid(code), pc.not_equal(code, 0)),
    }
    for name, flag in flags.items():
        table = table.append_column(f"_{name}", pc.cast(pc.fill_null(flag, False), pa.int64()))
    table = table.append_column("second", pc.divide(table.column("ms"), 1000))
    sums = [("bytes", "sum"), *((f"_{m}", "sum") for m in flags), ([], "count_all")]
    out: dict[str, pa.Table] = {}
    refused = table.filter(pc.is_in(outcome, pa.array(DENIED)))
    for name, keys in GROUPED.items():
        source = refused if name == "denied" else table
        grouped = source.group_by(list(keys), use_threads=False).aggregate(sums)
        out[name] = _metrics(grouped, keys)
    latency = table.filter(pc.is_valid(table.column("latency_ms")))
    counted = latency.group_by(["api_name", "latency_ms"], use_threads=False).aggregate(
        [([], "count_all")])
    out["latency"] = pa.table({"api_name": counted.column("api_name"),
                               "latency_ms": counted.column("latency_ms"),
                               "count": pc.cast(counted.column("count_all"), pa.int64())})
    def total(column: str) -> int:
        return int(pc.sum(table.column(column)).as_py() or 0)

    out["totals"] = pa.table({
        "malformed": pa.array([malformed], pa.int64()),
        "events": pa.array([table.num_rows], pa.int64()),
        "bytes": pa.array([total("bytes")], pa.int64()),
        **{m: pa.array([total(f"_{m}")], pa.int64()) for m in flags},
        "first_ms": pa.array([pc.min(table.column("ms")).as_py()], pa.int64()),
        "last_ms": pa.array([pc.max(table.column("ms")).as_py()], pa.int64()),
    })
    out["distinct"] = _distinct(table)
    return out


def _distinct(table: pa.Table) -> pa.Table:
    import pyarrow as pa
    import pyarrow.compute as pc

    principals = pc.unique(pc.drop_null(table.column("principal")))
    topics = pc.unique(pc.drop_null(table.column("topic")))
    return pa.table({"kind": ["principal"] * len(principals) + ["topic"] * len(topics),
                     "value": pa.concat_arrays([principals, topics]) if len(principals) +
                     len(topics) else pa.array([], pa.string())})


def _metrics(grouped: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Arrow's aggregate names (`bytes_sum`, `count_all`...) as the tables' metrics."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = {k: grouped.column(k) for k in keys}
    columns["events"] = pc.cast(grouped.column("count_all"), pa.int64())
    columns["bytes"] = pc.fill_null(grouped.column("bytes_sum"), 0)
    for name in ("denied", "would_deny", "rejected", "errors"):
        columns[name] = pc.fill_null(grouped.column(f"_{name}_sum"), 0)
    return pa.table(columns)


# -- merging and finishing (the driver) --------------------------------------------------


def merge_partials(partials: Iterable[Mapping[str, pa.Table]]) -> dict[str, pa.Table]:
    """The slices' partials as one set of partials (the same shapes)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    collected: dict[str, list[pa.Table]] = {}
    for partial in partials:
        for name, table in partial.items():
            collected.setdefault(name, []).append(table)
    if not collected:  # no events at all (a gateway that saw no traffic): empty tables
        for name, table in partial_aggregates(parsed_schema().empty_table()).items():
            collected[name] = [table]
    merged: dict[str, pa.Table] = {}
    for name, tables in collected.items():
        table = pa.concat_tables(tables, promote_options="permissive")
        if name in GROUPED:
            keys = list(GROUPED[name])
            summed = table.group_by(keys).aggregate([(m, "sum") for m in METRICS])
            merged[name] = summed.select([*keys, *(f"{m}_sum" for m in METRICS)]
                                         ).rename_columns([*keys, *METRICS])
        elif name == "latency":
            summed = table.group_by(["api_name", "latency_ms"]).aggregate([("count", "sum")])
            merged[name] = summed.select(["api_name", "latency_ms", "count_sum"]
                                         ).rename_columns(["api_name", "latency_ms", "count"])
        elif name == "totals":
            first = pc.min(table.column("first_ms")).as_py()
            last = pc.max(table.column("last_ms")).as_py()
            merged[name] = pa.table({
                **{c: [pc.sum(table.column(c)).as_py() or 0] for c in ("malformed", *METRICS)},
                "first_ms": pa.array([first], pa.int64()),
                "last_ms": pa.array([last], pa.int64())})
        else:  # distinct values
            merged[name] = table.group_by(["kind", "value"]).aggregate([])
    return merged


def finish(merged: Mapping[str, pa.Table]) -> tuple[dict[str, Any], dict[str, pa.Table]]:
    """The summary `keg analyze` writes (totals, and each table's first SUMMARY_ROWS
    rows) and every table whole (for its Parquet file), ordered as the report shows
    them: the biggest first, ties by key (nulls first)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    totals_row = merged["totals"].to_pylist()[0]
    kinds = merged["distinct"].column("kind")
    first, last = totals_row["first_ms"], totals_row["last_ms"]
    totals = {**{m: totals_row[m] for m in METRICS},
              "first": _time(first), "last": _time(last),
              "principals": pc.sum(pc.equal(kinds, "principal")).as_py() or 0,
              "topics": pc.sum(pc.equal(kinds, "topic")).as_py() or 0,
              "malformed": totals_row["malformed"]}
    tables: dict[str, pa.Table] = {}
    outcomes = merged["outcomes"]
    tables["outcomes"] = _ordered(outcomes.select(["outcome", "events", "bytes"]),
                                  ("outcome",), ("events",))
    for name in ("topics", "principals", "clients", "rules", "apis"):
        tables[name] = _ordered(merged[name], GROUPED[name], ("events",))
    denied = merged["denied"]
    denied = denied.filter(pc.is_in(denied.column("outcome"), pa.array(DENIED)))
    tables["denied"] = _ordered(denied.select([*DENIED_KEYS, "events"]), DENIED_KEYS,
                                ("events",))
    tables["top_talkers"] = _ordered(merged["top_talkers"].select(
        [*TALKER_KEYS, "events", "bytes"]), TALKER_KEYS, ("bytes", "events")).slice(0, TOP)
    tables["timeline"] = timeline(merged["timeline"], first, last)
    latency, by_api = latency_tables(merged["latency"])
    tables["latency"] = pa.Table.from_pylist(latency)
    tables["latency_by_api"] = pa.Table.from_pylist(by_api) if by_api else pa.table(
        {"api_name": pa.array([], pa.string()), "events": pa.array([], pa.int64())})
    summary: dict[str, Any] = {"totals": totals}
    for name, table in tables.items():
        summary[name] = table.slice(0, SUMMARY_ROWS).to_pylist()
    return summary, tables


def _time(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def _ordered(table: pa.Table, keys: Sequence[str], biggest: Sequence[str]) -> pa.Table:
    return table.sort_by([*((m, "descending", "at_end") for m in biggest),
                          *((k, "ascending", "at_start") for k in keys)])


def timeline(per_second: pa.Table, first_ms: int | None, last_ms: int | None) -> pa.Table:
    """Events and bytes per outcome in about 60 buckets of whole seconds, from the
    first event's second on."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if first_ms is None or last_ms is None:
        return pa.table({"bucket": pa.array([], pa.timestamp("s", tz="UTC")),
                         "outcome": pa.array([], pa.string()),
                         "events": pa.array([], pa.int64()),
                         "bytes": pa.array([], pa.int64())})
    low = first_ms // 1000
    width = max(1, math.ceil((last_ms // 1000 - low + 1) / 60))
    rows = per_second.filter(pc.is_valid(per_second.column("second")))
    offset = pc.subtract(rows.column("second"), low)
    start = pc.add(pc.multiply(pc.divide(offset, width), width), low)
    bucketed = pa.table({"bucket": pc.cast(start, pa.int64()),
                         "outcome": rows.column("outcome"), "events": rows.column("events"),
                         "bytes": rows.column("bytes")})
    summed = bucketed.group_by(["bucket", "outcome"]).aggregate(
        [("events", "sum"), ("bytes", "sum")])
    table = pa.table({"bucket": pc.cast(summed.column("bucket"), pa.timestamp("s", tz="UTC")),
                      "outcome": summed.column("outcome"),
                      "events": summed.column("events_sum"),
                      "bytes": summed.column("bytes_sum")})
    return table.sort_by([("bucket", "ascending", "at_start"),
                          ("outcome", "ascending", "at_start")])


def latency_tables(counts: pa.Table) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Exact percentiles, overall and per API, from counts per latency value."""
    import numpy as np

    apis = counts.column("api_name").to_pylist()
    values = counts.column("latency_ms").to_numpy(zero_copy_only=False)
    weights = counts.column("count").to_numpy(zero_copy_only=False).astype(np.int64)

    def row(mask: Any) -> dict[str, Any]:
        v, w = values[mask], weights[mask]
        n = int(w.sum())
        if n == 0:
            return {"events": 0, **{f"p{round(p * 100)}": None for p in PERCENTILES},
                    "max": None}
        order = np.argsort(v, kind="stable")
        v, cumulative = v[order], np.cumsum(w[order])
        out: dict[str, Any] = {"events": n}
        for p in PERCENTILES:
            rank = p * (n - 1)
            low, high = math.floor(rank), math.ceil(rank)
            below = v[np.searchsorted(cumulative, low, side="right")]
            above = v[np.searchsorted(cumulative, high, side="right")]
            out[f"p{round(p * 100)}"] = float(below + (above - below) * (rank - low))
        out["max"] = float(v[-1])
        return out

    everything = np.ones(len(values), dtype=bool)
    names = np.array(apis, dtype=object)
    by_api = [{"api_name": api, **row(names == api if api is not None
                                      else np.array([a is None for a in apis], dtype=bool))}
              for api in sorted(set(apis), key=lambda a: (a is not None, a or ""))]
    return [row(everything)], by_api


__all__ = [
    "DENIED",
    "GROUPED",
    "PERCENTILES",
    "SUMMARY_ROWS",
    "TOP",
    "finish",
    "latency_tables",
    "merge_partials",
    "parse_lines",
    "parsed_schema",
    "partial_aggregates",
    "timeline",
    "with_time",
]
