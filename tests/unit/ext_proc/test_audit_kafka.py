"""The audit stream's spool and shipper (ext_proc.audit_kafka), without a broker.

The spool: append-only segments, a cursor, torn tails skipped, a bound that drops
(never blocks), files private to the user. The shipper over a scripted producer:
in order, a failed delivery makes it ship again from the last delivered event (at
least once), closing leaves the undelivered in the spool for the next start. The
same code against a real broker: tests/integration/runtime/test_audit_stream.py.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from ext_proc.audit import AuditEvent, to_record
from ext_proc.audit_kafka import (
    AvroEncoder,
    KafkaAuditLog,
    KafkaAuditSettings,
    Position,
    QuietRepeats,
    Spool,
    SpoolInUse,
)


def line(n: int) -> bytes:
    return json.dumps({"n": n}).encode() + b"\n"


def numbers(lines: list[tuple[Position, bytes]]) -> list[int]:
    return [json.loads(data)["n"] for _, data in lines]


def test_the_spool_reads_back_in_order_across_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", segment_bytes=40)
    for n in range(10):
        assert spool.append(line(n))
    assert len(list((tmp_path / "spool").glob("*.spool"))) > 1
    first = spool.read(spool.cursor, 4)
    assert numbers(first) == [0, 1, 2, 3]
    rest = spool.read(first[-1][0], 100)
    assert numbers(rest) == list(range(4, 10))
    assert spool.read(rest[-1][0], 100) == []


def test_a_read_takes_about_max_bytes_and_a_longer_event_whole(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    for n in range(100):
        assert spool.append(line(n))  # 10 bytes each, one segment
    batch = spool.read(spool.cursor, 1000, max_bytes=35)
    assert numbers(batch) == [0, 1, 2]
    long = json.dumps({"n": 100, "pad": "x" * 200}).encode() + b"\n"
    assert spool.append(long)
    tail = spool.read(batch[-1][0], 1000, max_bytes=35)
    while tail[-1][1] != long:
        tail += spool.read(tail[-1][0], 1000, max_bytes=35)
    assert numbers(tail) == list(range(3, 101))


def test_files_are_private(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.append(line(1))
    spool.commit(spool.read(spool.cursor, 1)[0][0])
    assert stat.S_IMODE((tmp_path / "spool").stat().st_mode) == 0o700
    for path in (tmp_path / "spool").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def _write_and_die(directory: Path) -> None:
    """A process that spools six events, has three delivered and is killed -9."""
    spool = Spool(directory, segment_bytes=40)
    for n in range(6):
        spool.append(line(n))
    read = spool.read(spool.cursor, 3)
    spool.commit(read[-1][0])
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_reopened_spool_ships_from_its_cursor(tmp_path: Path) -> None:
    # Spawned, not forked: a forked child of a process with gRPC's threads (earlier
    # tests') crashes now and then before it runs anything.
    child = multiprocessing.get_context("spawn").Process(target=_write_and_die,
                                                        args=(tmp_path / "spool",))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    # A new process picks up after the delivered prefix (the dead one's lock went with it).
    again = Spool(tmp_path / "spool", segment_bytes=40)
    assert numbers(again.read(again.cursor, 100)) == [3, 4, 5]
    again.append(line(6))  # into a new segment, never the old one's tail
    assert numbers(again.read(again.cursor, 100)) == [3, 4, 5, 6]


def test_a_spool_is_one_process_s(tmp_path: Path) -> None:
    # Two ext_proc workers given one directory would ship and commit each other's events.
    spool = Spool(tmp_path / "spool")
    with pytest.raises(SpoolInUse, match="needs a spool of its own"):
        Spool(tmp_path / "spool")
    spool.close()
    Spool(tmp_path / "spool").close()  # free again once closed


def test_delivered_segments_are_deleted(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", segment_bytes=40)
    for n in range(12):
        spool.append(line(n))
    before = len(list((tmp_path / "spool").glob("*.spool")))
    everything = spool.read(spool.cursor, 100)
    spool.commit(everything[-1][0])
    assert len(list((tmp_path / "spool").glob("*.spool"))) == 1 < before  # the active one
    assert spool.pending_bytes == 0


def test_a_torn_tail_is_skipped(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.append(line(1))
    spool.append(line(2))
    spool.close()
    (segment,) = (tmp_path / "spool").glob("*.spool")
    with segment.open("ab") as handle:  # a crash in the middle of a write
        handle.write(b'{"n": 3')
    again = Spool(tmp_path / "spool")
    again.append(line(4))
    assert numbers(again.read(again.cursor, 100)) == [1, 2, 4]
    assert again.torn == 1


def test_a_full_spool_drops_new_events_and_counts_them(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=3 * len(line(0)))
    assert [spool.append(line(n)) for n in range(5)] == [True, True, True, False, False]
    assert (spool.spooled, spool.dropped) == (3, 2)
    spool.commit(spool.read(spool.cursor, 2)[-1][0])  # two delivered: room again
    assert spool.append(line(9))


def test_concurrent_appends_are_whole_lines(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", segment_bytes=4096)

    def write(base: int) -> None:
        for n in range(500):
            spool.append(line(base + n))

    threads = [threading.Thread(target=write, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = numbers(spool.read(spool.cursor, 10_000))
    assert sorted(got) == sorted(k * 1000 + n for k in range(4) for n in range(500))


# -- the shipper, over a scripted producer ------------------------------------------------


class FakeProducer:
    """librdkafka's Producer as the shipper uses it; `fail_next` fails deliveries."""

    made: ClassVar[list[FakeProducer]] = []
    fail_next = 0
    topic_log: ClassVar[list[bytes]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.queue: list[tuple[bytes, Callable[[Any, Any], None]]] = []
        FakeProducer.made.append(self)

    def produce(self, topic: str, value: bytes, on_delivery: Callable[[Any, Any], None]
                ) -> None:
        self.queue.append((value, on_delivery))

    def poll(self, timeout: float = 0) -> int:
        queue, self.queue = self.queue, []
        for value, report in queue:
            if FakeProducer.fail_next:
                FakeProducer.fail_next -= 1
                report(FakeError(), None)
            else:
                FakeProducer.topic_log.append(value)
                report(None, None)
        return len(queue)

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return 0

    def purge(self) -> None:
        self.queue = []


class FakeError:
    def str(self) -> str:
        return "Local: Message timed out"


@pytest.fixture
def fake() -> type[FakeProducer]:
    FakeProducer.made, FakeProducer.fail_next, FakeProducer.topic_log = [], 0, []
    return FakeProducer


def settings(tmp_path: Path, **kw: Any) -> KafkaAuditSettings:
    return KafkaAuditSettings(bootstrap_servers="127.0.0.1:1", spool_dir=tmp_path / "spool",
                              create_topic=False, **kw)


def wait_until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_events_are_shipped_in_order_and_the_cursor_follows(
        tmp_path: Path, fake: type[FakeProducer]) -> None:
    sink = KafkaAuditLog(settings(tmp_path), producer=fake)
    for n in range(50):
        sink.emit(AuditEvent(correlation_id=n))
    wait_until(lambda: sink.delivered == 50)
    sink.close()
    assert [json.loads(v)["correlation_id"] for v in fake.topic_log] == list(range(50))
    assert sink.spool.pending_bytes == 0
    assert fake.made[0].config["enable.idempotence"] is True


def test_a_failed_delivery_ships_again_from_the_last_delivered_event(
        tmp_path: Path, fake: type[FakeProducer], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ext_proc.audit_kafka.BACKOFF_FIRST_S", 0.01)
    fake.fail_next = 1
    sink = KafkaAuditLog(settings(tmp_path), producer=fake)
    for n in range(5):
        sink.emit(AuditEvent(correlation_id=n))
    wait_until(lambda: sink.delivered == 5)
    sink.close()
    shipped = [json.loads(v)["correlation_id"] for v in fake.topic_log]
    # The first delivery failed: everything from it came again, by a new producer.
    assert sorted(set(shipped)) == list(range(5)) and shipped[-5:] == list(range(5))
    assert len(fake.made) == 2 and sink.restarts >= 1


def test_what_is_not_delivered_at_close_is_shipped_by_the_next_start(
        tmp_path: Path, fake: type[FakeProducer], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ext_proc.audit_kafka.BACKOFF_FIRST_S", 60.0)
    fake.fail_next = 10**9  # Kafka unreachable: nothing is ever delivered
    sink = KafkaAuditLog(settings(tmp_path), producer=fake)
    events = [AuditEvent(correlation_id=n) for n in range(3)]
    for e in events:
        sink.emit(e)
    wait_until(lambda: sink.restarts >= 1)
    sink.close(timeout=0.1)
    assert sink.delivered == 0
    fake.fail_next = 0
    again = KafkaAuditLog(settings(tmp_path), producer=fake)
    wait_until(lambda: again.delivered == 3)
    again.close()
    assert [json.loads(v)["event_id"] for v in fake.topic_log] == [e.event_id for e in events]


def test_avro_events_decode_to_the_json_record(tmp_path: Path,
                                               fake: type[FakeProducer]) -> None:
    event = AuditEvent(principal="User:alice", topic="orders", partition=2, bytes=10,
                       records=2, latency_ms=1.5, outcome="modified", rule_id="mask",
                       extra={"answered": False})
    sink = KafkaAuditLog(settings(tmp_path, format="avro"), producer=fake)
    sink.emit(event)
    wait_until(lambda: sink.delivered == 1)
    sink.close()
    (payload,) = fake.topic_log
    assert payload[:2] == b"\xc3\x01"  # Avro single-object encoding
    assert AvroEncoder().decode(payload) == to_record(event)


def test_librdkafka_repeating_itself_is_heard_once_a_minute() -> None:
    now = [0.0]
    quiet = QuietRepeats(every_s=60, clock=lambda: now[0])

    def report(instance: int, after_ms: int) -> logging.LogRecord:
        return logging.LogRecord(
            "ext_proc.audit_kafka.librdkafka", logging.ERROR, __file__, 1,
            "%s [%s] %s", ("FAIL", f"keg-audit#producer-{instance}",
                           f"127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: "
                           f"Connection refused (after {after_ms}ms in state CONNECT)"), None)

    assert quiet.filter(report(1, 0))
    # The same failure again and again, from new producers: held back for a minute.
    held = [quiet.filter(report(n, n % 3)) for n in range(2, 300)]
    assert not any(held)
    other = logging.LogRecord("x", logging.ERROR, __file__, 1, "1/1 brokers are down", (), None)
    assert quiet.filter(other)  # another kind of report goes through
    now[0] = 61.0
    again = report(301, 0)
    assert quiet.filter(again)
    assert again.getMessage().endswith("(298 more like it in the last 61 s)")
