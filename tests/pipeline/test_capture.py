"""The capture action: a side effect that writes sampled, bounded Parquet files."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from filter_rules import CompiledRuleSet, load_rule_text
from filter_rules.record_actions import CaptureSpec
from interceptors.capture import (
    CaptureInterceptor,
    CaptureWriter,
    build_capture,
    capture_schema,
    directory_bytes,
    read_capture,
    sample_point,
    to_row,
)
from interceptors.contract import BuildContext, InterceptedRecord, InterceptorConfigError
from interceptors.engine import RecordEngine


def _record(i: int, topic: str = "orders", offset: int | None = None) -> InterceptedRecord:
    return InterceptedRecord(topic, i % 2, b"k%d" % i, b'{"n": %d}' % i,
                             [("trace", b"t%d" % i), ("empty", None)],
                             1_700_000_000_000 + i, offset, "User:alice", "produce")


def _wait_for(condition: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_records_pass_unchanged_and_land_in_date_topic_partitions(tmp_path: Path) -> None:
    capture = build_capture(CaptureSpec(path="cap"), BuildContext(base_dir=tmp_path))
    records = [_record(i, topic) for i, topic in enumerate(["orders", "events"] * 5)]
    for record in records:
        assert capture.intercept(record) is record
    capture.close()
    folders = {p.parent.relative_to(tmp_path / "cap").as_posix() for p in capture.files}
    assert folders == {"date=2023-11-14/topic=orders", "date=2023-11-14/topic=events"}
    table = read_capture(tmp_path / "cap")
    assert table.schema == capture_schema()
    rows = sorted(table.to_pylist(), key=lambda r: r["key"])
    expected = sorted(records, key=lambda r: r.key or b"")
    assert [(r["topic"], r["partition"], r["key"], r["value"], r["principal"], r["direction"])
            for r in rows] == [(r.topic, r.partition, r.key, r.value, r.principal, r.direction)
                               for r in expected]
    assert rows[0]["headers"] == [{"key": "trace", "value": b"t0"},
                                  {"key": "empty", "value": None}]
    assert rows[0]["offset"] is None
    assert int(rows[0]["timestamp"].timestamp() * 1000) == 1_700_000_000_000


def test_without_values(tmp_path: Path) -> None:
    capture = build_capture(CaptureSpec(path=str(tmp_path), include_values=False),
                            BuildContext())
    capture.intercept(_record(1))
    capture.close()
    row = read_capture(tmp_path).to_pylist()[0]
    assert row["value"] is None and row["key"] == b"k1"


def test_sampling_is_deterministic(tmp_path: Path) -> None:
    records = [_record(i, offset=i) for i in range(400)]
    kept = []
    for run in ("a", "b"):
        capture = build_capture(CaptureSpec(path=run, sample=0.25),
                                BuildContext(base_dir=tmp_path))
        for record in records:
            capture.intercept(record)
        capture.close()
        kept.append(sorted(read_capture(tmp_path / run).column("offset").to_pylist()))
    expected = [i for i, r in enumerate(records) if sample_point(r) < 0.25]
    assert kept[0] == kept[1] == expected
    assert 40 < len(expected) < 160


def test_rotation_and_size_cap(tmp_path: Path) -> None:
    writer = CaptureWriter(tmp_path, max_bytes=60_000, rotate_bytes=4_000)
    big = [to_row(InterceptedRecord("t", 0, b"k%d" % i, bytes(range(256)) * 4, [], 1, i),
                  include_value=True, now_ms=1) for i in range(200)]
    written = sum(writer.write(big[i:i + 10]) for i in range(0, 200, 10))
    writer.close()
    assert 0 < written < 200
    assert writer.full
    assert len(writer.files) > 1
    sizes = [f.stat().st_size for f in writer.files]
    assert sum(sizes) <= 60_000
    assert read_capture(tmp_path).num_rows == written
    # The cap is on the directory: a new writer there counts the files already written.
    again = CaptureWriter(tmp_path, max_bytes=60_000)
    assert again.write(big) < 10
    again.close()
    assert again.full
    assert directory_bytes(tmp_path) <= 60_000


def test_writers_sharing_a_directory_keep_its_cap_together(tmp_path: Path) -> None:
    """Each ext_proc worker of a pool runs its own capture into the rule's directory:
    each counts the others' files, open ones included (each wrote up to the cap)."""
    noise = random.Random(7)  # values zstd cannot shrink: bytes written ~ bytes given
    big = [to_row(InterceptedRecord("t", 0, b"k%d" % i, noise.randbytes(1000), [], 1, i),
                  include_value=True, now_ms=1) for i in range(200)]
    writers = [CaptureWriter(tmp_path, max_bytes=60_000, rotate_bytes=1 << 20)
               for _ in range(2)]
    written = sum(writer.write(big[i:i + 5]) for i in range(0, 200, 5) for writer in writers)
    assert all(writer.full for writer in writers)  # each saw the other's bytes
    for writer in writers:
        writer.close()
    assert 0 < written < 60  # about 60 KB of 1 KB rows, not 60 KB each
    # Within the cap but for the footer each writer adds at close for its open file (the
    # row groups' metadata), which only it knows.
    assert directory_bytes(tmp_path) <= 60_000 + 2 * 8192
    assert read_capture(tmp_path).num_rows == written


def test_open_files_are_hidden_until_closed(tmp_path: Path) -> None:
    writer = CaptureWriter(tmp_path)
    writer.write([to_row(_record(1), include_value=True, now_ms=1)])
    assert not list(tmp_path.rglob("*.parquet"))  # only the hidden .tmp file
    writer.close()
    assert len(list(tmp_path.rglob("*.parquet"))) == 1


def test_writer_thread_flushes_full_row_groups(tmp_path: Path) -> None:
    capture = CaptureInterceptor(CaptureSpec(path=str(tmp_path)), tmp_path, row_group_rows=10,
                                 flush_seconds=3600)
    for i in range(25):
        capture.intercept(_record(i))
    _wait_for(lambda: capture.writer.rows >= 20)
    capture.close()
    assert capture.writer.rows == 25
    assert pq.ParquetFile(capture.files[0]).metadata.num_rows == 25


def test_records_are_shed_when_the_writer_falls_behind(tmp_path: Path) -> None:
    capture = CaptureInterceptor(CaptureSpec(path=str(tmp_path)), tmp_path,
                                 row_group_rows=1000, flush_seconds=3600, max_buffered_rows=5)
    for i in range(12):
        capture.intercept(_record(i))
    assert capture.shed == 7
    capture.close()
    assert read_capture(tmp_path).num_rows == 5


def test_bad_directory_fails_at_build_time(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(InterceptorConfigError, match="capture directory"):
        build_capture(CaptureSpec(path="file/cap"), BuildContext(base_dir=tmp_path))


def test_the_engine_runs_capture_rules(tmp_path: Path) -> None:
    rules = load_rule_text(
        "apiVersion: keg/v1\nkind: RuleSet\nrules:\n  - id: cap\n"
        "    match: {topics: {exact: [orders]}}\n"
        f"    action: {{capture: {{path: {tmp_path}}}}}\n")
    engine = RecordEngine(CompiledRuleSet(rules))
    outcome = engine.evaluate(_record(7))
    other = engine.evaluate(_record(8, topic="events"))
    engine.close()
    assert outcome.status == "unchanged"
    assert [(s.rule_id, s.effect) for s in outcome.steps] == [("cap", "unchanged")]
    assert other.steps == []
    assert read_capture(tmp_path).column("key").to_pylist() == [b"k7"]


def test_a_header_name_that_is_not_utf8_is_captured_with_its_odd_bytes_escaped(
        tmp_path: Path) -> None:
    """kafka_wire reads such a name with surrogateescape; Parquet strings are UTF-8 and
    refused it, which failed the capture of the whole batch."""
    odd = b"\xff\xfebad".decode("utf-8", "surrogateescape")
    capture = build_capture(CaptureSpec(path="cap"), BuildContext(base_dir=tmp_path))
    record = InterceptedRecord("orders", 0, b"k", b"v", [(odd, b"1"), ("ok", b"2")],
                               1_700_000_000_000, None, "User:alice", "produce")
    assert capture.intercept(record) is record
    capture.close()
    (row,) = read_capture(tmp_path / "cap").to_pylist()
    assert row["headers"] == [{"key": "\\xff\\xfebad", "value": b"1"},
                              {"key": "ok", "value": b"2"}]


def test_a_snapshot_never_captures_a_topic_twice_into_one_directory(tmp_path: Path) -> None:
    """`keg capture` run twice into one --out added a second copy of every record, and
    the backtest, which reads every file, counted 1,800 records for a 900-record topic.
    Refused before anything is read (here, before Kafka is even asked)."""
    from pipeline.errors import PipelineError
    from pipeline.snapshot import snapshot

    held = tmp_path / "date=2026-11-30" / "topic=orders"
    held.mkdir(parents=True)
    (held / "part-1-a.parquet").write_bytes(b"")
    with pytest.raises(PipelineError, match="already holds a capture of orders"):
        snapshot("127.0.0.1:1", "orders", tmp_path)
