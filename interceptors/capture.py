"""The `capture` action: matching records, sampled and bounded, written to Parquet.

The interceptor is a side effect: it returns the record unchanged. The data path
only appends a tuple to an in-memory buffer (under a lock, no I/O); a writer thread
turns the buffer into a Parquet row group when it holds `row_group_rows` rows or
every `flush_seconds`, and on `close()`. When the writer falls behind, the buffer is
capped at `max_buffered_rows` and further records are shed (counted in `shed`), so a
slow disk never stalls the gateway.

Layout (what `keg backtest` and `keg capture` read and write; see CAPTURE_SCHEMA):

    <path>/date=YYYY-MM-DD/topic=<topic>/part-<ms>-<uuid>.parquet

`date` is the record's timestamp (UTC), or the capture time when it has none. A file
is written as a hidden `.part-*.parquet.tmp` (readers skip names starting with "."),
renamed when it reaches `rotate_bytes`, gets older than `roll_seconds`, when no record
came for `flush_seconds`, or on close.
`max_bytes` caps the whole directory: files already there count, and so do the files
every other writer (each ext_proc worker of a pool runs its own capture) writes there
now; a write checks the room and writes under a lock on the directory (`.lock`), so
writers never overrun the cap together (but for the footers of files another writer
still has open: its row groups' metadata, about a KiB each). Once reached, nothing more
is captured.

Sampling is deterministic: a record is kept when a hash of (topic, partition, offset)
— or, before the broker gave it an offset, of (topic, key, timestamp, value) — falls
below `sample`. The same record is sampled the same way on every gateway and rerun.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from filter_rules.record_actions import CaptureSpec
from interceptors.contract import BuildContext, InterceptedRecord, InterceptorConfigError

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

COLUMNS: Final = ("topic", "partition", "offset", "timestamp", "key", "value", "headers",
                  "principal", "direction", "captured_at")
ROW_GROUP_ROWS: Final = 4096
FLUSH_SECONDS: Final = 5.0
ROLL_SECONDS: Final = 300.0
MAX_OPEN_FILES: Final = 32
_HASH_SCALE: Final = float(1 << 64)
_GROUP_OVERHEAD: Final = 2048  # bytes a row group's metadata may take, at most
_FOOTER_RESERVE: Final = 4096  # and a file's footer (statistics only on small columns)
_STATISTICS: Final = ["topic", "partition", "offset", "timestamp", "direction", "captured_at"]

# One buffered row, in COLUMNS order (timestamps as ms since the epoch, None: unknown).
Row = tuple[str, int, int | None, int | None, bytes | None, bytes | None,
            list[tuple[str, bytes | None]], str | None, str, int]


def capture_schema() -> pa.Schema:
    """The Arrow schema of a capture file (Parquet), shared with the Spark jobs."""
    import pyarrow as pa

    ts = pa.timestamp("ms", tz="UTC")
    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    return pa.schema([
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", ts),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", pa.list_(header)),
        pa.field("principal", pa.string()),
        pa.field("direction", pa.string(), nullable=False),
        pa.field("captured_at", ts, nullable=False),
    ])


def sample_point(record: InterceptedRecord) -> float:
    """Where `record` falls in [0, 1): kept when below the sample rate."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(record.topic.encode())
    if record.offset is not None:
        digest.update(b"\0o%d\0%d" % (record.partition, record.offset))
    else:
        digest.update(b"\0k" + (record.key or b"") + b"\0t%d\0v" % record.timestamp)
        digest.update(record.value or b"")
    return int.from_bytes(digest.digest(), "big") / _HASH_SCALE


def to_row(record: InterceptedRecord, *, include_value: bool, now_ms: int) -> Row:
    return (record.topic, record.partition, record.offset,
            record.timestamp if record.timestamp >= 0 else None, record.key,
            record.value if include_value else None, list(record.headers),
            record.principal, record.direction, now_ms)


def row_bytes(row: Row) -> int:
    """The payload a row carries (key, value, headers): what `max_bytes` budgets."""
    headers = sum(len(k) + len(v or b"") for k, v in row[6])
    return 64 + len(row[0]) + len(row[4] or b"") + len(row[5] or b"") + headers


def directory_bytes(root: Path, skip: Collection[str] = ()) -> int:
    """The bytes of every file under `root`, but those in `skip` (paths)."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if path in skip:
                continue
            try:
                total += os.stat(path).st_size
            except OSError:  # renamed or removed meanwhile
                continue
    return total


class _OpenFile:
    __slots__ = ("final", "opened", "temp", "writer")

    def __init__(self, folder: Path, schema: pa.Schema) -> None:
        import pyarrow.parquet as pq

        name = f"part-{int(time.time() * 1000)}-{uuid.uuid4().hex[:12]}.parquet"
        folder.mkdir(parents=True, exist_ok=True)
        self.final = folder / name
        self.temp = folder / f".{name}.tmp"
        self.opened = time.monotonic()
        self.writer = pq.ParquetWriter(self.temp, schema, compression="zstd",
                                       write_statistics=_STATISTICS)

    def size(self) -> int:
        return int(self.writer.file_handle.tell()) if self.writer.file_handle else 0

    def close(self) -> None:
        self.writer.close()
        os.replace(self.temp, self.final)


class CaptureWriter:
    """Writes capture rows as Parquet under `root`: partitioned, rotated, capped.

    Not thread-safe: one thread writes (the capture's writer thread, or `keg capture`).
    """

    def __init__(self, root: str | os.PathLike[str], *, max_bytes: int = 1 << 30,
                 rotate_bytes: int = 64 << 20, roll_seconds: float = ROLL_SECONDS) -> None:
        import pyarrow  # noqa: F401  (fail here, at build time, when it is missing)

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.rotate_bytes = rotate_bytes
        self.roll_seconds = roll_seconds
        self.schema = capture_schema()
        self.rows = 0
        self.capped = False
        self.files: list[Path] = []
        self._open: dict[tuple[str, str], _OpenFile] = {}

    @property
    def full(self) -> bool:
        """No more room: a write was cut short by `max_bytes`, or the directory is full."""
        return self.capped or self.used_bytes() >= self.max_bytes

    def used_bytes(self) -> int:
        """The directory's bytes: every writer's files, this one's open ones as far as
        they are written (what is on disk of them may lag)."""
        mine = {str(f.temp): f.size() for f in self._open.values()}
        return directory_bytes(self.root, skip=mine) + sum(mine.values())

    @contextmanager
    def _directory_locked(self) -> Iterator[None]:
        """The directory to this writer alone (between processes: an flock, freed by
        the kernel if its holder dies) while it checks the room and writes."""
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield  # closing the file frees the lock

    def write(self, rows: list[Row]) -> int:
        """Write rows (as many as `max_bytes` leaves room for); returns how many.

        Room is estimated before writing: payload plus a margin for Parquet's encoding,
        row-group metadata and the footers of the files still open.
        """
        with self._directory_locked():
            return self._write(rows)

    def _write(self, rows: list[Row]) -> int:
        room = (self.max_bytes - self.used_bytes() - _GROUP_OVERHEAD
                - _FOOTER_RESERVE * (len(self._open) + 1))
        kept: list[Row] = []
        for row in rows:
            room -= row_bytes(row) * 11 // 10
            if room < 0:
                self.capped = True
                break
            kept.append(row)
        if not kept:
            return 0
        groups: dict[tuple[str, str], list[Row]] = {}
        for row in kept:
            groups.setdefault((_date(row), row[0]), []).append(row)
        for (date, topic), group in groups.items():
            target = self._file(date, topic)
            target.writer.write_table(self._table(group))
            if target.size() >= self.rotate_bytes:
                self._close((date, topic))
        self.rows += len(kept)
        return len(kept)

    def roll(self) -> None:
        """Close files open longer than `roll_seconds`, so readers see them."""
        now = time.monotonic()
        for key in [k for k, f in self._open.items() if now - f.opened >= self.roll_seconds]:
            self._close(key)

    def close(self) -> None:
        for key in list(self._open):
            self._close(key)

    def write_empty(self, topic: str) -> None:
        """A file of no rows for `topic` (today's date): a capture of a range that held
        no records is still a capture, which `keg backtest` reads as 0 records (with no
        file it refused the directory, and a scheduled capture-then-backtest job failed
        whenever its topic had been quiet)."""
        today = datetime.now(tz=UTC).strftime("%Y-%m-%d")
        self._file(today, topic)
        self._close((today, topic))

    def abort(self) -> list[Path]:
        """Removes what this writer wrote (its open files and those it completed): a
        capture cut short (Ctrl-C, an error) left files a backtest would read as a whole
        capture, and a capture again into the same directory was refused for them.
        Returns the files removed."""
        removed: list[Path] = []
        for target in self._open.values():
            with suppress(Exception):  # a half-written file: its footer may fail
                target.writer.close()
            with suppress(FileNotFoundError):
                target.temp.unlink()
        self._open.clear()
        for done in self.files:
            with suppress(FileNotFoundError):
                done.unlink()
                removed.append(done)
        self.files = []
        return removed

    def _file(self, date: str, topic: str) -> _OpenFile:
        key = (date, topic)
        target = self._open.get(key)
        if target is None:
            if len(self._open) >= MAX_OPEN_FILES:
                self._close(min(self._open, key=lambda k: self._open[k].opened))
            target = _OpenFile(self.root / f"date={date}" / f"topic={topic}", self.schema)
            self._open[key] = target
        return target

    def _close(self, key: tuple[str, str]) -> None:
        target = self._open.pop(key)
        target.close()
        self.files.append(target.final)

    def _table(self, rows: list[Row]) -> pa.Table:
        import pyarrow as pa

        columns: list[Any] = list(zip(*rows, strict=True))
        columns[6] = [[{"key": _text(k), "value": v} for k, v in headers]
                      for headers in columns[6]]
        return pa.Table.from_arrays(
            [pa.array(col, type=field.type) for col, field in zip(columns, self.schema,
                                                                   strict=True)],
            schema=self.schema,
        )


def _text(name: str) -> str:
    """A header name as Parquet's UTF-8 strings can hold it: a name that is not UTF-8
    (kafka_wire reads it with surrogateescape) keeps its odd bytes as `\\xNN` escapes."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _date(row: Row) -> str:
    ms = row[3] if row[3] is not None else row[9]
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d")


class CaptureInterceptor:
    """The side-effect interceptor the engine runs for a `capture` rule."""

    def __init__(self, spec: CaptureSpec, root: Path, *, row_group_rows: int = ROW_GROUP_ROWS,
                 flush_seconds: float = FLUSH_SECONDS, roll_seconds: float = ROLL_SECONDS,
                 max_buffered_rows: int | None = None) -> None:
        self.spec = spec
        self.writer = CaptureWriter(root, max_bytes=spec.max_bytes,
                                    rotate_bytes=spec.rotate_bytes, roll_seconds=roll_seconds)
        self.row_group_rows = row_group_rows
        self.flush_seconds = flush_seconds
        self.max_buffered_rows = max_buffered_rows or row_group_rows * 8
        self.shed = 0  # records not captured because the writer fell behind
        self.errors = 0
        self._buffer: list[Row] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._full = self.writer.full
        self._thread = threading.Thread(target=self._loop, name="keg-capture", daemon=True)
        self._thread.start()

    def configure(self, config: Mapping[str, Any]) -> None:
        """Built from its rule; nothing to configure."""

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord:
        if self._full or self._closed:
            return record
        if self.spec.sample < 1.0 and sample_point(record) >= self.spec.sample:
            return record
        row = to_row(record, include_value=self.spec.include_values,
                     now_ms=int(time.time() * 1000))
        with self._lock:
            if len(self._buffer) >= self.max_buffered_rows:
                self.shed += 1
                return record
            self._buffer.append(row)
            ready = len(self._buffer) >= self.row_group_rows
        if ready:
            self._wake.set()
        return record

    def flush(self) -> int:
        """Write what is buffered now (tests, close); returns how many rows."""
        with self._lock:
            rows, self._buffer = self._buffer, []
        if rows:
            self._write(rows)
        return len(rows)

    def close(self) -> None:
        """Write the buffer, close every file (renamed: readable) and stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=30)
        self.flush()
        self.writer.close()

    @property
    def files(self) -> list[Path]:
        return list(self.writer.files)

    def _loop(self) -> None:
        while not self._closed:
            self._wake.wait(self.flush_seconds)
            self._wake.clear()
            if self._closed:
                return
            try:
                if self.flush():
                    self.writer.roll()
                else:  # idle for a while: close the files so readers see them now
                    self.writer.close()
            except Exception as exc:
                self._failed(exc)

    def _write(self, rows: list[Row]) -> None:
        try:
            self.writer.write(rows)
        except Exception as exc:  # never into the data path
            self._failed(exc)
        if self.writer.full and not self._full:
            self._full = True
            log.warning("capture %s reached max_bytes (%d): capture stopped",
                        self.writer.root, self.spec.max_bytes)

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        if self.errors == 1:
            log.warning("capture %s: write failed (%s); further failures are only counted",
                        self.writer.root, exc)


def build_capture(spec: CaptureSpec, ctx: BuildContext) -> CaptureInterceptor:
    """The `capture` builder: the directory resolves against the rule file's folder."""
    root = ctx.resolve(spec.path)
    try:
        return CaptureInterceptor(spec, root)
    except ImportError as exc:
        raise InterceptorConfigError(f"capture needs pyarrow ({exc})") from None
    except OSError as exc:
        raise InterceptorConfigError(f"capture directory {root}: {exc.strerror or exc}") from None


def read_capture(path: str | os.PathLike[str]) -> pa.Table:
    """Every capture file under `path` (a file or a directory), one Arrow table."""
    import pyarrow.dataset as ds

    return ds.dataset(os.fspath(path), format="parquet", schema=capture_schema()).to_table()


__all__ = [
    "COLUMNS",
    "CaptureInterceptor",
    "CaptureWriter",
    "build_capture",
    "capture_schema",
    "read_capture",
    "sample_point",
]
