"""The audit log: JSON lines, stable keys, rotation, redaction, never raising."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.audit import (
    DENIED,
    AuditEvent,
    AuditLog,
    JsonlAuditLog,
    MemoryAuditLog,
    NullAuditLog,
    is_sensitive,
    to_json_line,
    to_record,
    utc_timestamp,
)
from ext_proc.connection import ConnectionInfo
from ext_proc.identity import IdentityTracker
from kafka_wire import ApiKey

FIXED_KEYS = [
    "ts", "event_id", "connection_id", "principal", "client_id", "client_host", "client_port",
    "listener", "security_protocol", "broker_id", "api_key", "api_name", "api_version",
    "correlation_id", "topic", "partition", "rule_id", "rule_version", "action", "mode",
    "outcome", "error_code", "bytes", "records", "latency_ms", "reason",
]


def event(**fields: Any) -> AuditEvent:
    base: dict[str, Any] = {
        "connection_id": "c-1", "principal": "User:alice", "client_id": "orders",
        "api_key": 0, "api_name": "Produce", "api_version": 9, "correlation_id": 7,
        "topic": "payments", "partition": 3, "rule_id": "no-pii", "action": "deny",
        "mode": "enforce", "outcome": DENIED, "error_code": 29, "bytes": 1234,
        "latency_ms": 0.12, "reason": "topic denied",
    }
    base.update(fields)
    return AuditEvent(**base)


def read_lines(*paths: Path) -> list[dict[str, Any]]:
    records = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            records.append(json.loads(line))
    return records


def test_timestamps_are_rfc3339_utc_milliseconds() -> None:
    assert utc_timestamp(0) == "1970-01-01T00:00:00.000Z"
    assert utc_timestamp(1_700_000_000.5) == "2023-11-14T22:13:20.500Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", AuditEvent().ts)


def test_record_has_stable_key_order_and_no_payload_unless_asked() -> None:
    e = event()
    record = to_record(e)
    assert list(record) == FIXED_KEYS
    assert "record_key" not in record and "record_value" not in record
    line = to_json_line(e)
    assert "\n" not in line and json.loads(line) == record


def test_payload_fields_are_base64() -> None:
    record = to_record(event(record_key=b"k\x00\xff", record_value=b"{\"a\":1}"))
    assert list(record)[-2:] == ["record_key", "record_value"]
    assert base64.b64decode(record["record_key"]) == b"k\x00\xff"
    assert base64.b64decode(record["record_value"]) == b'{"a":1}'


def test_extra_fields_come_after_in_sorted_order_and_cannot_override() -> None:
    record = to_record(event(extra={"zeta": 1, "alpha": {"b": 2, "a": 1}, "principal": "x"}))
    assert list(record)[len(FIXED_KEYS):] == ["alpha", "zeta"]
    assert list(record["alpha"]) == ["a", "b"]
    assert record["principal"] == "User:alice"


def test_events_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        event().principal = "User:mallory"  # type: ignore[misc]


def test_for_connection_fills_in_who() -> None:
    conn = ConnectionInfo(client_host="10.0.0.5", client_port=55000, gateway_address="gw:19092",
                          connection_id="42", broker_id=1)
    identity = IdentityTracker()
    identity.observe_client_id("billing")
    e = AuditEvent.for_connection(conn, identity, api_key=ApiKey.METADATA, outcome="observed")
    assert (e.connection_id, e.client_host, e.client_port, e.listener, e.broker_id) == (
        "42", "10.0.0.5", 55000, "gw:19092", 1)
    assert (e.principal, e.client_id, e.security_protocol) == (
        "User:ANONYMOUS", "billing", "PLAINTEXT")
    assert e.api_key == ApiKey.METADATA


# -- redaction ------------------------------------------------------------------------------

SECRETS = {
    "password": "hunter2-A",
    "sasl_password": "hunter2-B",
    "clientSecret": "hunter2-C",
    "SECRET_KEY": "hunter2-D",
    "access_token": "hunter2-E",
    "TokenValue": "hunter2-F",
    "auth_bytes": b"\0alice\0hunter2-G",
    "raw_Auth_Bytes": "hunter2-H",
}


def test_sensitive_names() -> None:
    assert all(is_sensitive(name) for name in SECRETS)
    assert not any(is_sensitive(name) for name in FIXED_KEYS)
    assert not is_sensitive("record_value") and not is_sensitive("authorizer")


def test_redaction_guard_in_every_sink(tmp_path: Path) -> None:
    nested = {"ok": 1, "inner": dict(SECRETS), "list": [dict(SECRETS), 2]}
    e = event(extra={**SECRETS, "nested": nested, "kept": "visible"})
    path = tmp_path / "audit.jsonl"
    memory = MemoryAuditLog()
    with JsonlAuditLog(path) as jsonl:
        for sink in (memory, jsonl, NullAuditLog()):
            sink.emit(e)
        jsonl.emit({"password": "hunter2-I", "topic": "t"})  # a plain mapping, too
    text = path.read_text(encoding="utf-8")
    written = [json.dumps(r) for r in memory.records] + [text]
    for blob in written:
        assert "hunter2" not in blob and "aHVudGVyMi" not in blob  # nor its base64
    # What is not secret is kept, in both sinks that keep anything.
    assert [r["kept"] for r in memory.records] == ["visible"]
    record = read_lines(path)[0]
    assert record["kept"] == "visible"
    assert record["nested"] == {"inner": {}, "list": [{}, 2], "ok": 1}
    assert read_lines(path)[1] == {"topic": "t"}


@given(st.dictionaries(
    st.tuples(st.text(max_size=5), st.sampled_from(["password", "Secret", "TOKEN", "auth_bytes"]),
              st.text(max_size=5)).map("".join),
    st.text(min_size=1, max_size=10).map(lambda s: "SENSITIVE" + s),
    max_size=5,
))
@settings(max_examples=100, deadline=None, derandomize=True)
def test_no_sensitive_name_is_ever_written(fields: dict[str, str]) -> None:
    line = to_json_line(event(extra={"outer": fields, **fields}))
    assert "SENSITIVE" not in line


# -- the JSON lines file --------------------------------------------------------------------


def test_jsonl_one_object_per_line(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "audit.jsonl"  # the directory is created
    log: AuditLog = JsonlAuditLog(path)
    for i in range(5):
        log.emit(event(correlation_id=i, reason="naïve ✓ \n newline"))
    records = read_lines(path)  # flushed per line: readable before close
    log.close()
    assert [r["correlation_id"] for r in records] == list(range(5))
    assert all(list(r) == FIXED_KEYS for r in records)
    assert records[0]["reason"] == "naïve ✓ \n newline"


def test_rotation(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with JsonlAuditLog(path, max_bytes=2000, backups=3) as log:
        for i in range(300):
            log.emit(event(correlation_id=i))
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2",
                                       "audit.jsonl.3"]
    for f in files:
        assert f.stat().st_size <= 2000
    records = read_lines(*files)  # every line of every file is valid JSON
    ids = sorted(r["correlation_id"] for r in records)
    assert ids[-1] == 299 and ids == list(range(ids[0], 300)), "the newest events are kept"


def test_a_file_removed_or_renamed_by_someone_else_is_opened_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Events went on into the deleted file (its space never freed, the audit view
    empty) until the next rotation or restart."""
    import ext_proc.audit

    monkeypatch.setattr(ext_proc.audit, "REOPEN_CHECK_S", 0.0)
    path = tmp_path / "audit.jsonl"
    with JsonlAuditLog(path) as log:
        log.emit(event(correlation_id=1))
        path.unlink()  # a clean-up
        log.emit(event(correlation_id=2))
        assert [r["correlation_id"] for r in read_lines(path)] == [2]
        path.rename(tmp_path / "audit.jsonl.old")  # logrotate, without copytruncate
        log.emit(event(correlation_id=3))
    assert [r["correlation_id"] for r in read_lines(path)] == [3]
    assert [r["correlation_id"] for r in read_lines(tmp_path / "audit.jsonl.old")] == [2]
    assert path.stat().st_mode & 0o777 == 0o600


def test_concurrent_writers(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = JsonlAuditLog(path, max_bytes=50_000, backups=50)

    def write(thread: int) -> None:
        for i in range(200):
            log.emit(event(connection_id=f"t{thread}", correlation_id=i))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    records = read_lines(*tmp_path.iterdir())
    assert len(records) == 1600 and log.errors == 0
    for n in range(8):
        assert sorted(r["correlation_id"] for r in records if r["connection_id"] == f"t{n}") == \
            list(range(200))


class _FullDisk:
    def write(self, _: bytes) -> int:
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        pass


def test_write_failures_are_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = JsonlAuditLog(tmp_path / "audit.jsonl")
    real = log._writer._file
    log._writer._file = _FullDisk()
    with caplog.at_level(logging.WARNING, logger="ext_proc.audit"):
        for _ in range(3):
            log.emit(event())
    assert log.errors == 3
    assert len([r for r in caplog.records if r.name == "ext_proc.audit"]) == 1
    log._writer._file = real
    log.emit(event(extra={"unserialisable": object()}))  # default=str, no failure
    log.close()
    log.emit(event())  # after close: dropped, no raise, no reopen
    assert log.errors == 3
    assert len(read_lines(tmp_path / "audit.jsonl")) == 1


def test_bad_path_fails_at_start_up(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError):
        JsonlAuditLog(blocker / "audit.jsonl")


def test_null_and_memory_logs() -> None:
    NullAuditLog().emit(event())
    memory = MemoryAuditLog()
    memory.emit(event())
    assert memory.records[0]["rule_id"] == "no-pii"


def test_rotation_without_backups_truncates(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with JsonlAuditLog(path, max_bytes=1500, backups=0) as log:
        for i in range(50):
            log.emit(event(correlation_id=i))
    assert [f.name for f in tmp_path.iterdir()] == ["audit.jsonl"]
    records = read_lines(path)
    assert path.stat().st_size <= 1500 and records[-1]["correlation_id"] == 49


def test_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    for i in range(2):
        with JsonlAuditLog(path) as log:
            log.emit(event(correlation_id=i))
    assert [r["correlation_id"] for r in read_lines(path)] == [0, 1]
