"""keg analyze's Arrow side (pipeline.audit_tables, pipeline.analyze slices), without
Spark: slices own each line exactly once, partials merged equal one pass over
everything, percentiles are exact, a bad line costs its slice nothing but itself.
The whole job on Spark against DuckDB: tests/pipeline/test_analyze.py."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.analyze import COMPRESSED, analyze_slice, audit_files, audit_slices, read_slice
from pipeline.audit_tables import finish, merge_partials, parse_lines, partial_aggregates
from pipeline.errors import PipelineError


def events(n: int, seed: int = 3) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"ts": f"2026-05-01T12:{i // 600 % 60:02d}:{i // 10 % 60:02d}.{i % 10}00Z",
             "principal": rng.choice(["User:a", "User:b", None]),
             "client_id": rng.choice(["c1", "c2"]), "client_host": "10.0.0.1",
             "topic": rng.choice(["orders", "events", None]),
             "api_name": rng.choice(["Produce", "Fetch"]), "rule_id": "r", "action": "deny",
             "mode": "enforce", "outcome": rng.choice(["denied", "observed", "rejected"]),
             "reason": None, "error_code": rng.choice([0, 29, None]),
             "bytes": rng.choice([None, rng.randrange(1000)]),
             "latency_ms": rng.choice([None, round(rng.uniform(0, 50), 3)]),
             "event_id": f"{i:032x}"} for i in range(n)]


def write(path: Path, rows: list[dict[str, Any]], garbage: bool = False) -> Path:
    lines = [json.dumps(r) for r in rows]
    if garbage:
        lines.insert(len(lines) // 2, "not json")
        lines.insert(len(lines) // 3, '{"ts": "x", "bytes": "many"}')  # wrong types
    path.write_text("\n".join(lines) + "\n")
    return path


def test_slices_own_every_line_exactly_once(tmp_path: Path) -> None:
    log = write(tmp_path / "a.jsonl", events(3000))
    size = log.stat().st_size
    for cut in (1 << 20, size // 7 + 13):  # odd cuts fall inside lines
        pieces = [(str(log), start, min(start + cut, size)) for start in range(0, size, cut)]
        text = b"".join(read_slice(*piece) for piece in pieces)
        assert text == log.read_bytes()


def test_partials_merged_equal_one_pass(tmp_path: Path) -> None:
    rows = events(5000)
    log = write(tmp_path / "a.jsonl", rows, garbage=True)
    whole, malformed = parse_lines(log.read_bytes())
    assert malformed == 2 and whole.num_rows == 5000
    one, one_tables = finish(merge_partials([partial_aggregates(whole, malformed)]))
    slices = audit_slices([str(log)], slice_bytes=1 << 20, min_slices=9)
    assert len(slices) > 1
    many, _ = finish(merge_partials([analyze_slice(piece) for piece in slices]))
    assert many == one
    assert one["totals"]["events"] == 5000 and one["totals"]["malformed"] == 2
    denied = sum(r["outcome"] == "denied" for r in rows)
    assert one["totals"]["denied"] == denied
    topics = {r["topic"]: r["events"] for r in one["topics"]}
    assert topics == {t: sum(r["topic"] == t for r in rows) for t in ("orders", "events", None)}
    assert sum(r["events"] for r in one["timeline"]) == 5000
    assert one_tables["topics"].num_rows == 3


def test_percentiles_are_exact(tmp_path: Path) -> None:
    rows = events(4001)
    table, _ = parse_lines(write(tmp_path / "a.jsonl", rows).read_bytes())
    summary, _ = finish(merge_partials([partial_aggregates(table)]))
    values = np.array([r["latency_ms"] for r in rows if r["latency_ms"] is not None])
    latency = summary["latency"][0]
    assert latency["events"] == len(values)
    for p in (0.5, 0.9, 0.99):
        assert latency[f"p{round(p * 100)}"] == pytest.approx(np.quantile(values, p))
    assert latency["max"] == values.max()
    fetch = [r["latency_ms"] for r in rows if r["latency_ms"] is not None
             and r["api_name"] == "Fetch"]
    (by_fetch,) = [r for r in summary["latency_by_api"] if r["api_name"] == "Fetch"]
    assert by_fetch["p90"] == pytest.approx(np.quantile(fetch, 0.9))


def test_an_empty_log_has_empty_tables(tmp_path: Path) -> None:
    table, malformed = parse_lines(b"garbage\n")
    summary, tables = finish(merge_partials([partial_aggregates(table, malformed)]))
    assert summary["totals"]["events"] == 0 and summary["totals"]["malformed"] == 1
    assert summary["timeline"] == [] and summary["latency"][0]["p50"] is None
    assert tables["topics"].num_rows == 0


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_rotated_files_compressed_by_logrotate_are_read_not_counted_malformed(
        tmp_path: Path, suffix: str) -> None:
    """logrotate's `compress` leaves `audit.jsonl.1.gz`: its bytes were read as lines and
    every one counted malformed (regression). A compressed file is one slice, read whole."""
    import bz2
    import gzip
    import lzma

    rows = events(2000)
    plain = write(tmp_path / "audit.jsonl", rows[:1000])
    rotated = write(tmp_path / "staged.jsonl", rows[1000:])
    compress: dict[str, Callable[[bytes], bytes]] = {
        ".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}
    packed = tmp_path / f"audit.jsonl.1{suffix}"
    packed.write_bytes(compress[suffix](rotated.read_bytes()))
    rotated.unlink()
    files = audit_files(tmp_path)
    slices = audit_slices(files, slice_bytes=1 << 20, min_slices=4)
    assert (str(packed), 0, COMPRESSED) in slices
    summary, _ = finish(merge_partials([analyze_slice(piece) for piece in slices]))
    assert summary["totals"]["events"] == 2000 and summary["totals"]["malformed"] == 0
    assert plain.exists()


def test_a_compressed_file_that_is_cut_is_a_clear_error(tmp_path: Path) -> None:
    import gzip

    cut = tmp_path / "audit.jsonl.2.gz"
    cut.write_bytes(gzip.compress(b'{"rule_id": "r"}\n' * 1000)[:40])
    with pytest.raises(PipelineError, match=r"cannot read audit log .*audit.jsonl.2.gz"):
        analyze_slice((str(cut), 0, COMPRESSED))
