"""State every process of an ext_proc pool shares: a file of fixed-size slots each maps.

keg up's ext_proc service is a pool of worker processes on one host, and which of them
judges a connection is the data path's choice (a hash, a failover, a restart). What a
rule promises across connections must therefore not live in one process: a rate limit is
the host's (`ext_proc.filters.rates`), and the record counts dropped from an idempotent
producer's batches must follow the producer to whichever worker its next connection
reaches (`ext_proc.sequences`).

The file is set-associative: a key (a 64-bit hash) lives in one of the `ways` slots of
the set its hash picks, and a set is read and written under one lock, so two processes
never make two slots of one key. The lock is a POSIX record lock on the set's bytes (the
kernel frees it when its holder dies, kill -9 included) plus a thread lock, as record
locks do not exclude the threads of one process. A full set gives the slot used longest
ago to a new key: the file never grows, whatever keys clients make up. Each slot starts
with its key and when it was last used (CLOCK_MONOTONIC, the same in every process of
the host); what follows is the owner's `payload`.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ext_proc.private_files import open_private

_HEAD: Final = struct.Struct("<Qd")  # key hash (0: free), last used
WAYS: Final = 8
# The file's first bytes: byte 0 is set once any slot was taken, so lookups in a table
# nobody wrote to (no rule ever dropped a record, say) take no lock.
_FILE_HEADER: Final = 64

Clock = Callable[[], float]


@dataclass
class Slot:
    """A key's slot, held under its set's lock: `fresh` when the key had none (its
    payload is then the previous owner's, or zeros), `used` when it was last used (in
    the future after a reboot restarted the clock: treat as fresh)."""

    slots: SharedSlots
    at: int
    fresh: bool
    used: float
    now: float

    def read(self) -> tuple[Any, ...]:
        return self.slots.payload.unpack_from(self.slots.view, self.at + _HEAD.size)

    def write(self, *values: Any) -> None:
        self.slots.payload.pack_into(self.slots.view, self.at + _HEAD.size, *values)


class SharedSlots:
    def __init__(self, path: Path, payload: struct.Struct, sets: int,
                 clock: Clock = time.monotonic, *, future_is_stale: bool = True) -> None:
        """Map `path`, made and sized by the first process that needs it (it may be kept
        from an earlier run of the pool: keg up keeps it across restarts).
        `future_is_stale`: a slot last used after now was used before a reboot restarted
        the clock (CLOCK_MONOTONIC): read as fresh. A wall clock (time.time) survives
        reboots; its slots are kept whatever the time says (a clock stepped back)."""
        self.payload = payload
        self._clock = clock
        self._future_is_stale = future_is_stale
        self._slot_bytes = _HEAD.size + payload.size
        self._set_bytes = WAYS * self._slot_bytes
        self._thread_lock = threading.Lock()
        self._fd = open_private(path, os.O_RDWR)  # who sends what: the user's only
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX)  # the whole file: one process sizes it
            try:
                # Its first process sizes it (sparse zeros: every slot free); the others
                # take its number of sets, so all agree on where a key lives.
                if os.fstat(self._fd).st_size < _FILE_HEADER + self._set_bytes:
                    os.ftruncate(self._fd, _FILE_HEADER + sets * self._set_bytes)
                self._sets = (os.fstat(self._fd).st_size - _FILE_HEADER) // self._set_bytes
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN)
            self.view = mmap.mmap(self._fd, _FILE_HEADER + self._sets * self._set_bytes)
        except BaseException:
            os.close(self._fd)
            raise

    @contextmanager
    def slot(self, key_hash: int) -> Iterator[Slot]:
        """The key's slot (its own, else a free one, else its set's least recently used),
        locked until the block ends, then marked as the key's, used now."""
        with self._locked(key_hash) as (start, now):
            at = self._find(start, key_hash, claim=True)
            stored, used = _HEAD.unpack_from(self.view, at)
            yield Slot(self, at, fresh=stored != key_hash or self._stale(used, now), used=used,
                       now=now)
            _HEAD.pack_into(self.view, at, key_hash, now)
            if not self.view[0]:
                self.view[0] = 1

    @property
    def any_taken(self) -> bool:
        """Whether a slot was ever taken (read without a lock: only ever set)."""
        return bool(self.view[0])

    @contextmanager
    def existing(self, key_hash: int) -> Iterator[Slot | None]:
        """The key's own slot, locked until the block ends (None: it has none; no slot
        is taken for it). Callers ask `any_taken` first: a table never written to needs
        no lock."""
        with self._locked(key_hash) as (start, now):
            at = self._find(start, key_hash, claim=False)
            used = _HEAD.unpack_from(self.view, at)[1] if at >= 0 else now
            yield None if at < 0 or self._stale(used, now) else Slot(self, at, False, used, now)

    def _stale(self, used: float, now: float) -> bool:
        return self._future_is_stale and used > now

    @contextmanager
    def _locked(self, key_hash: int) -> Iterator[tuple[int, float]]:
        """The key's set (where it starts), locked; and the time now."""
        start = _FILE_HEADER + (key_hash % self._sets) * self._set_bytes
        with self._thread_lock:
            fcntl.lockf(self._fd, fcntl.LOCK_EX, self._set_bytes, start, os.SEEK_SET)
            try:
                yield start, self._clock()
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, self._set_bytes, start, os.SEEK_SET)

    def _find(self, start: int, key_hash: int, claim: bool) -> int:
        """Where the key's slot is in the set at `start` (-1: none, when not `claim`)."""
        free = oldest = -1
        oldest_used = float("inf")
        for at in range(start, start + self._set_bytes, self._slot_bytes):
            stored, used = _HEAD.unpack_from(self.view, at)
            if stored == key_hash:
                return at
            if stored == 0:
                if free < 0:
                    free = at
            elif used < oldest_used:
                oldest, oldest_used = at, used
        if not claim:
            return -1
        return free if free >= 0 else oldest

    def close(self) -> None:
        self.view.close()
        os.close(self._fd)


def key_hash(*parts: object) -> int:
    """A non-zero 64-bit hash of `parts` (0 marks a free slot), the same in every
    process (Python's own `hash` of a str is salted per process)."""
    digest = hashlib.blake2b("\0".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1
