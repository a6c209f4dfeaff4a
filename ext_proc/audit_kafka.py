"""The audit stream on Kafka: every event spooled on local disk, then produced to a topic.

`KafkaAuditLog.emit` (called on the data path) appends the event's JSON line to a
local spool: one write(2) into the page cache under a lock, no network, never a wait
on Kafka. A shipper thread reads the spool in order and produces the events through
one librdkafka producer (idempotent, acks=all, batched: linger.ms and lz4), as JSON or
Avro (`ext_proc/audit.avsc`, single-object encoding). The spool's cursor advances over
the prefix Kafka acknowledged, and segments behind it are deleted.

While Kafka cannot be reached, deliveries time out (`message.timeout.ms`); the shipper
then starts over from the cursor with a new producer after a backoff (1 s, doubling to
30 s), and the spool holds what comes meanwhile, up to `max_bytes` (beyond it new
events are dropped and counted, never blocking the data path). When Kafka is back the
spool drains in order. A restart (or a crash: the spool is in the page cache before the
request's answer leaves the gateway) reopens the spool and ships from its cursor:
events written but not known delivered are produced again, so delivery is at least
once and readers de-duplicate by `event_id`.

The spool is a directory (0700) of segment files (0600) `<n>.spool`, one JSON line per
event, and `cursor` ("<segment> <offset>": the first byte not known delivered). A
line torn by a crash mid-write (no newline) is skipped when its segment is read. A
spool is one process's (an exclusive lock on its `lock` file, released when the
process ends, even by kill -9): two processes given the same directory would ship each
other's events and move each other's cursor, so the second is refused (`SpoolInUse`);
each worker of an ext_proc pool has its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import logging
import os
import re
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import fastavro
import fastavro.schema
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ext_proc.audit import AuditEvent, to_json_line
from ext_proc.private_files import open_private

log = logging.getLogger(__name__)
# librdkafka's own log lines (its `logger` callback).
client_log = logging.getLogger(__name__ + ".librdkafka")

DEFAULT_TOPIC: Final = "_keg_audit"
DEFAULT_SPOOL_BYTES: Final = 1 << 30
DEFAULT_SEGMENT_BYTES: Final = 16 << 20
AuditFormat = Literal["json", "avro"]
FORMATS: Final = ("json", "avro")
AVRO_SCHEMA_FILE: Final = Path(__file__).resolve().parent / "audit.avsc"
AVRO_MAGIC: Final = b"\xc3\x01"  # Avro single-object encoding

PRODUCER_DEFAULTS: Final[Mapping[str, Any]] = {
    "client.id": "keg-audit",
    "enable.idempotence": True,  # acks=all, in order, no duplicates from retries
    "linger.ms": 50,
    "compression.type": "lz4",
    # Unreachable this long: the shipper starts over from the spool's cursor.
    "message.timeout.ms": 30_000,
    # What the shipper reads ahead of the spool into librdkafka's memory.
    "queue.buffering.max.messages": 100_000,
    "queue.buffering.max.kbytes": 65_536,
    "log.connection.close": False,
}
MAX_IN_FLIGHT: Final = 50_000  # events read from the spool, not yet acknowledged
READ_BATCH: Final = 2_000
BACKOFF_FIRST_S: Final = 1.0
BACKOFF_MAX_S: Final = 30.0
# Errors after which creating the topic is left to the cluster (it exists, or the
# gateway may not create topics: then the broker's auto-creation or an operator does).
_CREATE_SETTLED: Final = frozenset({
    KafkaError.TOPIC_ALREADY_EXISTS, KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.POLICY_VIOLATION,
    KafkaError.INVALID_REPLICATION_FACTOR,
})


@dataclass(frozen=True)
class KafkaAuditSettings:
    """Where the audit stream goes: a cluster (librdkafka properties in `config`, e.g.
    SASL), a topic (created at start unless `create_topic` is off), a format, and the
    local spool that holds events until Kafka has them."""

    bootstrap_servers: str
    spool_dir: Path
    topic: str = DEFAULT_TOPIC
    config: tuple[tuple[str, str], ...] = ()
    format: AuditFormat = "json"
    create_topic: bool = True
    partitions: int = 1
    spool_max_bytes: int = DEFAULT_SPOOL_BYTES
    segment_bytes: int = DEFAULT_SEGMENT_BYTES

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"audit format is json or avro, not {self.format!r}")
        if not self.topic:
            raise ValueError("the audit topic needs a name")
        if self.partitions < 1:
            raise ValueError("the audit topic needs at least one partition")


# -- librdkafka's log -------------------------------------------------------------------

# What differs between two reports of one problem: the client instance (a new producer
# each time the shipper starts over), times and counts.
_VARYING: Final = re.compile(r"#(producer|admin)-\d+|\d+(\.\d+)?\s*ms|\d+ (times|attempts)")


class QuietRepeats(logging.Filter):
    """While the audit cluster is down librdkafka reports the failed connection every
    few hundred milliseconds, from every worker and every new producer: the first
    report of a kind goes through, the same again at most once per `every_s`, saying
    how many were held back. The outage itself is one warning of the shipper's."""

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 max_kinds: int = 1000) -> None:
        super().__init__()
        self.every_s = every_s
        self._clock = clock
        self._max_kinds = max_kinds
        self._kinds: dict[str, tuple[float, int]] = {}  # kind: (last let through, held)
        self._lock = threading.Lock()  # librdkafka logs from its own threads

    def filter(self, record: logging.LogRecord) -> bool:
        kind = _VARYING.sub("", record.getMessage())
        now = self._clock()
        with self._lock:
            last = self._kinds.get(kind)
            if last is not None and now - last[0] < self.every_s:
                self._kinds[kind] = (last[0], last[1] + 1)
                return False
            if len(self._kinds) >= self._max_kinds:
                self._kinds.clear()
            self._kinds[kind] = (now, 0)
        if last is not None and last[1]:
            record.msg = (f"{record.getMessage()} ({last[1]} more like it in the last "
                          f"{now - last[0]:.0f} s)")
            record.args = None
        return True


client_log.addFilter(QuietRepeats())


# -- the spool ---------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Position:
    """A place in the spool: a segment and a byte offset in it."""

    segment: int
    offset: int


class SpoolInUse(ValueError):
    """Another process (or another Spool) holds the spool directory."""


class Spool:
    """Append-only segments with a delivered-up-to cursor (see the module docstring).

    Thread-safe: the data path appends while the shipper reads and commits. A reader
    only reads what `append` finished writing (the lengths kept here), never a line
    being written.
    """

    def __init__(self, directory: Path, max_bytes: int = DEFAULT_SPOOL_BYTES,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        self._owner = self._take_ownership()
        self._lock = threading.Lock()
        self.cursor = self._read_cursor()
        self._sizes: dict[int, int] = {}
        for path in self.directory.glob("*.spool"):
            number = int(path.stem)
            if number < self.cursor.segment:  # delivered before a crash could delete it
                path.unlink(missing_ok=True)
            else:
                self._sizes[number] = path.stat().st_size
        # Never append to a segment of an earlier run: its tail may be torn.
        self._active = max([*self._sizes, self.cursor.segment - 1]) + 1
        self._sizes[self._active] = 0
        self._fd: int | None = None
        self.pending_bytes = sum(self._sizes.values()) - self.cursor.offset
        self.spooled = 0
        self.dropped = 0
        self.torn = 0
        self._closed = False

    # -- writing (the data path) ---------------------------------------------------------

    def append(self, line: bytes) -> bool:
        """Spool one event line; False (and counted) when the spool is full or broken."""
        with self._lock:
            if self._closed or self.pending_bytes + len(line) > self.max_bytes:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 100_000 == 0:
                    log.warning("audit spool %s is full (%d bytes): %d event(s) dropped so "
                                "far", self.directory, self.max_bytes, self.dropped)
                return False
            try:
                if self._sizes[self._active] + len(line) > self.segment_bytes > 0 and \
                        self._sizes[self._active]:
                    self._rotate()
                if self._fd is None:
                    self._fd = os.open(self._path(self._active),
                                       os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                view = memoryview(line)
                while view:
                    written = os.write(self._fd, view)
                    view = view[written:]
            except OSError as exc:
                self.dropped += 1
                if self.dropped == 1:
                    log.warning("audit spool %s: write failed (%s); events are dropped "
                                "while it fails", self.directory, exc)
                return False
            self._sizes[self._active] += len(line)
            self.pending_bytes += len(line)
            self.spooled += 1
            return True

    def _rotate(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._active += 1
        self._sizes[self._active] = 0

    # -- reading and committing (the shipper) ----------------------------------------------

    def read(self, position: Position, max_events: int,
             max_bytes: int = 4 << 20) -> list[tuple[Position, bytes]]:
        """Up to `max_events` complete lines from `position` (about `max_bytes`), each
        with the position just after it."""
        out: list[tuple[Position, bytes]] = []
        taken = 0
        while len(out) < max_events and taken < max_bytes:
            with self._lock:
                later = [n for n in self._sizes if n >= position.segment]
                if not later:
                    return out
                segment = min(later)
                size = self._sizes[segment]
                sealed = segment != self._active
            if segment != position.segment:
                position = Position(segment, 0)
            left = size - position.offset
            if left <= 0:
                if not sealed:
                    return out
                position = Position(segment + 1, 0)
                continue
            # About max_bytes at a time (a drain after an outage must not read a whole
            # segment for each batch); a line longer than that is read whole when it
            # comes first: a long event never blocks the spool.
            want = min(left, max_bytes - taken if out else max_bytes)
            with open(self._path(segment), "rb") as handle:
                handle.seek(position.offset)
                data = handle.read(want)
                if not out and want < left and b"\n" not in data:
                    data += handle.read(left - want)
                    want = left
            consumed = 0
            while len(out) < max_events:
                end = data.find(b"\n", consumed)
                if end < 0:
                    break
                line, consumed = data[consumed:end + 1], end + 1
                out.append((Position(segment, position.offset + consumed), line))
            taken += consumed
            if consumed:
                position = Position(segment, position.offset + consumed)
            elif want == left and sealed:
                # A line without its newline at the end of a sealed segment: torn by a
                # crash mid-write (its request was never answered). Skipped.
                self.torn += 1
                log.warning("audit spool %s: skipped a torn event at the end of segment %d",
                            self.directory, segment)
                position = Position(segment + 1, 0)
            else:
                return out
        return out

    def commit(self, position: Position) -> None:
        """Everything before `position` is delivered: remember it, drop what is behind."""
        with self._lock:
            if position <= self.cursor:
                return
            done = [n for n in self._sizes if n < position.segment and n != self._active]
            for number in done:
                del self._sizes[number]
            self.cursor = position
            self.pending_bytes = sum(self._sizes.values()) - position.offset
        tmp = self.directory / "cursor.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, f"{position.segment} {position.offset}\n".encode())
        finally:
            os.close(fd)
        os.replace(tmp, self.directory / "cursor")
        for number in done:
            with contextlib.suppress(FileNotFoundError):
                self._path(number).unlink()

    def _read_cursor(self) -> Position:
        try:
            segment, offset = (self.directory / "cursor").read_text().split()
            return Position(int(segment), int(offset))
        except FileNotFoundError:
            return Position(0, 0)
        except (OSError, ValueError) as exc:
            # Unreadable: ship from the oldest segment (duplicates, never losses).
            log.warning("audit spool %s: cursor unreadable (%s); shipping every segment",
                        self.directory, exc)
            return Position(0, 0)

    def _path(self, segment: int) -> Path:
        return self.directory / f"{segment:016d}.spool"

    def _take_ownership(self) -> int:
        """The spool's lock, held until `close` (or the process's end)."""
        fd = open_private(self.directory / "lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SpoolInUse(f"the audit spool {self.directory} is in use by another "
                             "process: each ext_proc process needs a spool of its own "
                             "(--audit-spool)") from None
        return fd

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            os.close(self._owner)  # releases the lock


# -- formats ---------------------------------------------------------------------------


class AvroEncoder:
    """A JSON event line as Avro single-object encoding (ext_proc/audit.avsc)."""

    def __init__(self) -> None:
        raw = json.loads(AVRO_SCHEMA_FILE.read_text())
        self.schema = fastavro.parse_schema(raw)
        self.fields = [f["name"] for f in raw["fields"] if f["name"] != "extra"]
        canonical = fastavro.schema.to_parsing_canonical_form(raw)
        fingerprint = int(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO"), 16)
        self.prefix = AVRO_MAGIC + struct.pack("<Q", fingerprint)

    def __call__(self, line: bytes) -> bytes:
        event = json.loads(line)
        record = {name: event.pop(name, None) for name in self.fields}
        record["extra"] = json.dumps(event, separators=(",", ":")) if event else None
        out = io.BytesIO()
        out.write(self.prefix)
        fastavro.schemaless_writer(out, self.schema, record)
        return out.getvalue()

    def decode(self, payload: bytes) -> dict[str, Any]:
        """The event an encoded payload holds (extras merged back), for readers and tests."""
        if payload[:10] != self.prefix:
            raise ValueError("not an audit event in this schema (magic or fingerprint differ)")
        record = fastavro.schemaless_reader(io.BytesIO(payload[10:]), self.schema, None)
        assert isinstance(record, dict)
        extra = record.pop("extra", None)
        for payload_field in ("record_key", "record_value"):  # as in JSON: only when set
            if record.get(payload_field) is None:
                record.pop(payload_field, None)
        return {**record, **(json.loads(extra) if extra else {})}


def _json_payload(line: bytes) -> bytes:
    return line.rstrip(b"\n")


# -- the sink ----------------------------------------------------------------------------


class KafkaAuditLog:
    """An `AuditLog` producing to Kafka through the spool (see the module docstring)."""

    def __init__(self, settings: KafkaAuditSettings,
                 producer: Callable[[dict[str, Any]], Any] = Producer,
                 admin: Callable[[dict[str, Any]], Any] = AdminClient) -> None:
        self.settings = settings
        self.spool = Spool(settings.spool_dir, settings.spool_max_bytes, settings.segment_bytes)
        self._client_config = {**dict(settings.config),
                               "bootstrap.servers": settings.bootstrap_servers}
        self._make_producer = producer
        self._make_admin = admin
        self._encode: Callable[[bytes], bytes] = (
            AvroEncoder() if settings.format == "avro" else _json_payload)
        self.delivered = 0
        self.redelivered = 0  # acknowledged, then produced again after a start-over
        self.restarts = 0
        self._close_timeout = 5.0
        self._uncommitted: Position | None = None  # delivered, cursor not written yet
        self._topic_ready = not settings.create_topic
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._ship, name="keg-audit-kafka", daemon=True)
        self._thread.start()

    def emit(self, event: AuditEvent | Mapping[str, Any]) -> None:
        try:
            line = (to_json_line(event) + "\n").encode("utf-8")
        except Exception as exc:  # never into the data path
            log.warning("audit event not serializable: %s", exc)
            return
        if self.spool.append(line):
            self._wake.set()

    def counters(self) -> dict[str, int]:
        return {"spooled": self.spool.spooled, "delivered": self.delivered,
                "dropped": self.spool.dropped, "redelivered": self.redelivered,
                "spool_bytes": max(0, self.spool.pending_bytes)}

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what the spool holds within `timeout` s; the rest stays spooled for
        the next start."""
        self._close_timeout = timeout
        self._closing.set()
        self._wake.set()
        self._thread.join(timeout + 10)
        self.spool.close()

    # -- the shipper thread ----------------------------------------------------------------

    def _ship(self) -> None:
        backoff = BACKOFF_FIRST_S
        while not self._closing.is_set():
            progressed = False
            try:
                if not self._topic_ready:
                    self._create_topic()
                progressed = self._run_producer()
            except Exception as exc:
                log.warning("audit stream to %s: %s; retrying", self.settings.topic, exc)
            if self._closing.is_set():
                break
            backoff = BACKOFF_FIRST_S if progressed else min(backoff * 2, BACKOFF_MAX_S)
            self.restarts += 1
            self._closing.wait(backoff)

    def _producer_config(self) -> dict[str, Any]:
        config = {**PRODUCER_DEFAULTS, **self._client_config}
        config.setdefault("logger", client_log)
        return config

    def _create_topic(self) -> None:
        admin_config: dict[str, Any] = {**self._client_config}
        admin_config.setdefault("logger", client_log)
        admin = self._make_admin(admin_config)
        topic = NewTopic(self.settings.topic, num_partitions=self.settings.partitions)
        future = admin.create_topics([topic], operation_timeout=10,
                                     request_timeout=15)[self.settings.topic]
        deadline = time.monotonic() + 30
        while not future.done():  # in slices: closing the sink must not wait for this
            if self._closing.is_set():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"creating topic {self.settings.topic} timed out")
            self._closing.wait(0.2)
        try:
            future.result()
            log.info("audit topic %s created", self.settings.topic)
        except KafkaException as exc:
            error = exc.args[0]
            if not isinstance(error, KafkaError) or error.code() not in _CREATE_SETTLED:
                raise RuntimeError(f"cannot create topic {self.settings.topic}: "
                                   f"{error}") from None
            if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                log.warning("audit topic %s not created (%s): it must exist or be "
                            "auto-created", self.settings.topic, error.str())
        self._topic_ready = True

    def _run_producer(self) -> bool:
        """Ship from the cursor until a delivery fails (False: nothing delivered) or the
        sink closes."""
        producer = self._make_producer(self._producer_config())
        # [position after the event, None pending | True delivered | False failed]
        in_flight: deque[list[Any]] = deque()
        read_from = self.spool.cursor
        progressed = False
        last_commit = time.monotonic()
        failure: list[str] = []

        def delivered(entry: list[Any]) -> Callable[[KafkaError | None, Message], None]:
            def report(err: KafkaError | None, _msg: Message) -> None:
                entry[1] = err is None
                if err is not None and not failure:
                    failure.append(err.str())
            return report

        try:
            while True:
                closing = self._closing.is_set()
                room = MAX_IN_FLIGHT - len(in_flight)
                lines = (self.spool.read(read_from, min(room, READ_BATCH))
                         if room > 0 and not closing else [])
                for position, line in lines:
                    entry: list[Any] = [position, None]
                    try:
                        producer.produce(self.settings.topic, self._encode(line),
                                         on_delivery=delivered(entry))
                    except BufferError:
                        break  # librdkafka's queue is full: read this one again later
                    in_flight.append(entry)
                    read_from = position
                if closing:
                    producer.flush(self._close_timeout)
                producer.poll(0 if lines else 0.05)
                while in_flight and in_flight[0][1] is True:
                    self._uncommitted = in_flight.popleft()[0]
                    self.delivered += 1
                    progressed = True
                # The cursor is written at most five times a second under load, and
                # whenever the shipper goes idle.
                idle = not lines and not in_flight
                if self._uncommitted is not None and (
                        idle or closing or time.monotonic() - last_commit > 0.2):
                    self._commit()
                    last_commit = time.monotonic()
                if failure:
                    self._start_over(failure[0], in_flight)
                    return progressed
                if closing:
                    return progressed
                if idle:
                    self._wake.wait(0.5)
                    self._wake.clear()
        finally:
            self._commit()
            with contextlib.suppress(Exception):
                producer.purge()
                producer.flush(0)

    def _commit(self) -> None:
        if self._uncommitted is not None:
            self.spool.commit(self._uncommitted)
            self._uncommitted = None

    def _start_over(self, error: str, in_flight: deque[list[Any]]) -> None:
        """A delivery failed: everything from the first unacknowledged event is produced
        again by the next producer (those acknowledged after it become duplicates)."""
        self.redelivered += sum(1 for entry in in_flight if entry[1] is True)
        log.warning("audit stream to %s: delivery failed (%s); %d event(s) spooled, "
                    "shipping again from the last delivered one", self.settings.topic,
                    error, self.spool.spooled - self.delivered)


__all__ = [
    "DEFAULT_TOPIC",
    "FORMATS",
    "AuditFormat",
    "AvroEncoder",
    "KafkaAuditLog",
    "KafkaAuditSettings",
    "Position",
    "Spool",
]
