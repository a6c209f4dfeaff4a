"""The audit log: one structured event per rule decision, one JSON object per line.

An `AuditEvent` says who (principal, client id and address, listener, security
protocol), what (API, version, correlation id, topic, partition, bytes, records),
which rule (id and the rule set's version) and what came of it (action, mode,
outcome, error code, reason), how long the request took at the gateway
(``latency_ms``) and when (``ts``, RFC 3339 UTC with milliseconds). Every event has
an ``event_id`` (32 hex digits, random): sinks deliver at least once, readers
de-duplicate by it. Record payloads appear only when a rule asks for them
(`record_key`, `record_value`, base64). docs/audit.md defines every field.

Latency needs the answer: a decision is made while its request is judged, but its
event is written when the request's answer leaves the gateway (`RequestAudit`,
bound to the request being processed by `auditing`), so `latency_ms` runs from the
request's first bytes reaching the gateway to its answer going back (the broker's,
or the gateway's own), and the event is written before the client can read that
answer.

Sinks implement `AuditLog` (``emit(event)``, ``close()``):

* `JsonlAuditLog` appends JSON lines to a file rotated by size, as the stdlib's
  RotatingFileHandler does (``path``, ``path.1`` ... ``path.<backups>``, ``.1`` the
  newest), in a small writer of its own that counts bytes instead of asking the file
  system on every line. Writing is synchronous (a few µs per event into the page
  cache), thread-safe and flushed per line; it never raises into the data path:
  failures are counted (`errors`) and logged once.
* `NullAuditLog` drops events; `MemoryAuditLog` keeps the written records (tests).
* `ext_proc.audit_kafka.KafkaAuditLog` produces them to a Kafka topic through a
  durable local spool (at least once); `TeeAuditLog` writes to several sinks.

Redaction guard: whatever reaches a sink, a field whose name contains "password",
"secret", "token" or "auth_bytes" (any case, at any depth of `extra`) is never written.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from ext_proc.connection import ConnectionInfo
from ext_proc.identity import IdentityTracker
from ext_proc.private_files import open_private, private_dir

log = logging.getLogger(__name__)

Mode = Literal["enforce", "dry-run"]
SENSITIVE_WORDS = ("password", "secret", "token", "auth_bytes")
DEFAULT_MAX_BYTES = 100 * 1024 * 1024
DEFAULT_BACKUPS = 5

# Outcomes the data path reports (free text is allowed; these are the usual ones).
DENIED = "denied"
WOULD_DENY = "would-deny"
OBSERVED = "observed"
THROTTLED = "throttled"


def utc_timestamp(t: float | None = None) -> str:
    """RFC 3339, UTC, milliseconds: ``2024-05-01T12:00:00.123Z``."""
    moment = datetime.fromtimestamp(time.time() if t is None else t, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def new_event_id() -> str:
    """A random 128-bit id (hex): unique per event, the key readers de-duplicate by."""
    return uuid.uuid4().hex


def is_sensitive(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in SENSITIVE_WORDS)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AuditEvent:
    """One audited frame. Unknown facts are None (written as null)."""

    ts: str = dataclasses.field(default_factory=utc_timestamp)
    event_id: str = dataclasses.field(default_factory=new_event_id)
    connection_id: str | None = None
    principal: str | None = None
    client_id: str | None = None
    client_host: str | None = None
    client_port: int | None = None
    listener: str | None = None
    security_protocol: str | None = None
    broker_id: int | None = None
    api_key: int | None = None
    api_name: str | None = None
    api_version: int | None = None
    correlation_id: int | None = None
    topic: str | None = None
    partition: int | None = None
    rule_id: str | None = None
    rule_version: str | None = None  # the content hash of the rule set that decided
    action: str | None = None
    mode: Mode | None = None
    outcome: str = OBSERVED
    error_code: int | None = None
    bytes: int | None = None
    records: int | None = None
    latency_ms: float | None = None
    reason: str | None = None
    # Written only when set (a rule asked for payloads); raw bytes are base64-encoded.
    record_key: builtins.bytes | str | None = None
    record_value: builtins.bytes | str | None = None
    # Anything else, after the fixed fields in sorted key order (redacted like the rest).
    extra: Mapping[str, Any] | None = None

    @classmethod
    def for_connection(
        cls, conn: ConnectionInfo, identity: IdentityTracker | None = None, **fields: Any
    ) -> AuditEvent:
        """An event with the connection's facts filled in; `fields` add or override."""
        known: dict[str, Any] = {
            "connection_id": conn.connection_id or None,
            "client_host": conn.client_host,
            "client_port": conn.client_port,
            "listener": conn.gateway_address or None,
            "broker_id": conn.broker_id,
        }
        if identity is not None:
            known["principal"] = identity.principal
            known["client_id"] = identity.client_id
            known["security_protocol"] = identity.security_protocol
        known.update(fields)
        return cls(**known)


_PAYLOAD_FIELDS = frozenset({"record_key", "record_value"})
# The guard covers the fixed fields too, decided once: none is sensitive today.
_FIELDS = tuple(
    f.name for f in dataclasses.fields(AuditEvent)
    if f.name != "extra" and not is_sensitive(f.name)
)


_SCALARS = (str, int, float, bool, type(None))


def _plain(value: Any) -> Any:
    """A JSON-ready value: bytes as base64, nested mappings redacted."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, builtins.bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Mapping):
        return redact(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def redact(fields: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` without sensitive names (at any depth), in sorted key order."""
    return {
        str(k): _plain(v) for k, v in sorted(fields.items(), key=lambda kv: str(kv[0]))
        if not is_sensitive(str(k))
    }


def to_record(event: AuditEvent | Mapping[str, Any]) -> dict[str, Any]:
    """The JSON object written for `event`: fixed fields in declaration order, then extras.

    A plain mapping is accepted too (its keys sorted); both pass the redaction guard.
    """
    if not isinstance(event, AuditEvent):
        return redact(event)
    record: dict[str, Any] = {}
    for name in _FIELDS:
        value = getattr(event, name)
        if value is None and name in _PAYLOAD_FIELDS:
            continue
        record[name] = _plain(value)
    if event.extra:
        for key, value in redact(event.extra).items():
            record.setdefault(key, value)
    return record


def to_json_line(event: AuditEvent | Mapping[str, Any]) -> str:
    return json.dumps(to_record(event), ensure_ascii=False, separators=(",", ":"), default=str)


class AuditLog(Protocol):
    def emit(self, event: AuditEvent) -> None: ...

    def close(self) -> None: ...


class NullAuditLog:
    """Audit disabled."""

    def emit(self, event: AuditEvent) -> None:
        pass

    def close(self) -> None:
        pass


class MemoryAuditLog:
    """Keeps the records it would write (after redaction), for tests."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def emit(self, event: AuditEvent) -> None:
        self.records.append(to_record(event))

    def close(self) -> None:
        pass


# How often a writer looks whether its file is still the one at its path.
REOPEN_CHECK_S = 1.0


class _RotatingWriter:
    """Appends bytes to `path`; before a write would pass `max_bytes`, rotates. A file
    removed or renamed by someone else (logrotate, a disk-full clean-up) is noticed
    within REOPEN_CHECK_S and `path` opened again, as logging's WatchedFileHandler does:
    before, events went on into the deleted file (its space never freed, the API's
    audit view empty) until the next rotation or restart.

    Not thread-safe by itself: JsonlAuditLog holds a lock around every call.
    """

    def __init__(self, path: str, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._file: Any = None
        self._check_at = 0.0
        self._reopen("ab")

    def write(self, data: builtins.bytes) -> None:
        if self._file is None:  # a failed rotation left no file: try again
            self._reopen("ab")
        now = time.monotonic()
        if now >= self._check_at:
            self._check_at = now + REOPEN_CHECK_S
            if self._moved():
                self._file.close()
                self._file = None
                self._reopen("ab")
        if self.max_bytes > 0 and self._size and self._size + len(data) > self.max_bytes:
            self._rotate()
        # Unbuffered: one write(2) per line, appended whole (O_APPEND).
        written = self._file.write(data)
        self._size += written
        if written != len(data):
            raise OSError(f"short write: {written} of {len(data)} bytes")

    def _moved(self) -> bool:
        """Whether `path` no longer names the open file."""
        try:
            at_path = os.stat(self.path)
        except FileNotFoundError:
            return True
        held = os.fstat(self._file.fileno())
        return (at_path.st_dev, at_path.st_ino) != (held.st_dev, held.st_ino)

    def _rotate(self) -> None:
        self._file.close()
        self._file = None
        if self.backups > 0:
            for n in range(self.backups - 1, 0, -1):
                older = f"{self.path}.{n}"
                if os.path.exists(older):
                    os.replace(older, f"{self.path}.{n + 1}")
            os.replace(self.path, f"{self.path}.1")
            self._reopen("ab")
        else:
            self._reopen("wb")

    def _reopen(self, mode: str) -> None:
        # 0600, the first file and every one after a rotation (docs: private_files).
        flags = os.O_WRONLY | (os.O_APPEND if mode == "ab" else os.O_TRUNC)
        self._file = os.fdopen(open_private(self.path, flags), mode, buffering=0)
        self._size = self._file.seek(0, os.SEEK_END)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class JsonlAuditLog:
    """Appends one JSON object per line to `path`, rotating at `max_bytes`.

    Rotation keeps `backups` older files (``path.1`` is the newest of them); a file
    exceeds `max_bytes` only if a single line does. The file is opened (and its
    directory created) at construction, so a bad path fails at start-up; after that
    `emit` never raises.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = DEFAULT_BACKUPS,
    ) -> None:
        self.path = os.fspath(path)
        private_dir(Path(os.path.abspath(self.path)).parent)
        self.errors = 0
        self._closed = False
        self._lock = threading.Lock()
        self._writer = _RotatingWriter(self.path, max_bytes, backups)

    def emit(self, event: AuditEvent | Mapping[str, Any]) -> None:
        if self._closed:
            return
        try:
            data = (to_json_line(event) + "\n").encode("utf-8")
            with self._lock:
                if not self._closed:
                    self._writer.write(data)
        except Exception as exc:  # never into the data path
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            self.errors += 1
            first = self.errors == 1
        if first:
            log.warning(
                "audit log %s: write failed (%s); further failures are only counted",
                self.path, exc,
            )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._writer.close()

    def __enter__(self) -> JsonlAuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TeeAuditLog:
    """Every event to each of `sinks`, in order (e.g. the Kafka sink and the file)."""

    def __init__(self, sinks: Sequence[AuditLog]) -> None:
        self.sinks = tuple(sinks)

    def emit(self, event: AuditEvent) -> None:
        for sink in self.sinks:
            sink.emit(event)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


# Writes one held event, given the request's latency (ms) and its size (bytes).
HeldEvent = Callable[[float, int], None]


class RequestAudit:
    """The events of one request, held until its answer leaves the gateway.

    Made when the request's first bytes arrive (`started`, a perf_counter reading;
    `size`, the frame's bytes); decisions made while it is judged, or while its
    answer is filtered, are held here (`hold`) and written by `finish` with the
    latency from `started` to the answer. `finish` is idempotent: a request finished
    once (answered, or its connection closed) writes nothing more.
    """

    __slots__ = ("_held", "size", "started")

    def __init__(self, size: int, started: float | None = None) -> None:
        self.size = size
        self.started = time.perf_counter() if started is None else started
        self._held: list[HeldEvent] = []

    def hold(self, event: HeldEvent) -> None:
        self._held.append(event)

    @property
    def pending(self) -> bool:
        return bool(self._held)

    def finish(self, now: float | None = None) -> None:
        if not self._held:
            return
        latency_ms = ((time.perf_counter() if now is None else now) - self.started) * 1000
        held, self._held = self._held, []
        for write in held:
            write(round(latency_ms, 3), self.size)


_CURRENT: ContextVar[RequestAudit | None] = ContextVar("keg_request_audit", default=None)


def current_request() -> RequestAudit | None:
    """The request being judged or answered on this thread (None: outside any)."""
    return _CURRENT.get()


@contextlib.contextmanager
def auditing(request: RequestAudit | None) -> Iterator[None]:
    """Decisions made inside belong to `request` (their events wait for its answer)."""
    token = _CURRENT.set(request)
    try:
        yield
    finally:
        _CURRENT.reset(token)


__all__ = [
    "DENIED",
    "OBSERVED",
    "SENSITIVE_WORDS",
    "THROTTLED",
    "WOULD_DENY",
    "AuditEvent",
    "AuditLog",
    "JsonlAuditLog",
    "MemoryAuditLog",
    "Mode",
    "NullAuditLog",
    "RequestAudit",
    "TeeAuditLog",
    "auditing",
    "current_request",
    "is_sensitive",
    "new_event_id",
    "redact",
    "to_json_line",
    "to_record",
    "utc_timestamp",
]
