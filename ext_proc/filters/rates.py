"""Rate limits: token buckets keyed by rule and principal, client id or topic.

A rate rule limits what a principal (client id, topic) sends through the gateway, not
what it sends through one process of it. The ext_proc service runs as a pool of worker
processes (`keg up`: one per core) and each client connection is served by one of them,
so the buckets of one host live in one file every worker maps ([`SharedRates`]); a
single process keeps them in a dict ([`RateLimiter`]). Separate hosts (replicas) each
keep their own, as Kafka's own quotas are per broker.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol

from filter_rules.model import RateSpec

Clock = Callable[[], float]


def spend(spec: RateSpec, requests: float, nbytes_left: float, elapsed: float,
          nbytes: int) -> tuple[float, float, float]:
    """One request of `nbytes` against a bucket holding `requests` and `nbytes_left`
    tokens, refilled for `elapsed` seconds (capped at the burst): the tokens left and the
    seconds the caller is over its rate (0: within it)."""
    wait = 0.0
    if spec.requests_per_second:
        cap = spec.requests_per_second * spec.burst_seconds
        requests = min(cap, requests + elapsed * spec.requests_per_second) - 1
        if requests < 0:
            wait = max(wait, -requests / spec.requests_per_second)
    if spec.bytes_per_second:
        cap = spec.bytes_per_second * spec.burst_seconds
        nbytes_left = min(cap, nbytes_left + elapsed * spec.bytes_per_second) - nbytes
        if nbytes_left < 0:
            wait = max(wait, -nbytes_left / spec.bytes_per_second)
    return requests, nbytes_left, wait


def full(spec: RateSpec) -> tuple[float, float]:
    """A new bucket's tokens: the whole burst."""
    return ((spec.requests_per_second or 0) * spec.burst_seconds,
            float((spec.bytes_per_second or 0) * spec.burst_seconds))


class RateBuckets(Protocol):
    def take(self, rule_id: str, spec: RateSpec, key: str, nbytes: int) -> float:
        """Spend one request and `nbytes` from the bucket of (rule, key): the seconds the
        caller is over its rate."""


class TokenBucket:
    """Requests and bytes per second with a burst allowance; time in seconds."""

    def __init__(self, spec: RateSpec, now: float) -> None:
        self.spec = spec
        self.requests, self.bytes = full(spec)
        self.updated = now

    def take(self, nbytes: int, now: float) -> float:
        """Spend one request and `nbytes`; return seconds the caller is over its rate."""
        elapsed = max(0.0, now - self.updated)
        self.updated = now
        self.requests, self.bytes, wait = spend(self.spec, self.requests, self.bytes,
                                                elapsed, nbytes)
        return wait


class RateLimiter:
    """Buckets for every (rule, key) seen, in this process only."""

    def __init__(self, clock: Clock = time.monotonic, max_buckets: int = 100_000) -> None:
        self._clock = clock
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._max_buckets = max_buckets

    def take(self, rule_id: str, spec: RateSpec, key: str, nbytes: int) -> float:
        now = self._clock()
        bucket = self._buckets.get((rule_id, key))
        if bucket is None or bucket.spec != spec:
            if len(self._buckets) >= self._max_buckets:
                self._buckets.clear()  # a flood of keys must not grow memory without bound
            bucket = self._buckets[(rule_id, key)] = TokenBucket(spec, now)
        return bucket.take(nbytes, now)


# A bucket in the shared file: its key's hash (0: free), its spec's, the tokens left and
# when they were counted (CLOCK_MONOTONIC, the same clock in every process of the host).
_SLOT: Final = struct.Struct("<QQddd")
# Set-associative: a key lives in one of the WAYS slots of the set its hash picks, and a
# set is read and written under one lock, so two workers never make two buckets of a key.
WAYS: Final = 8
_SET_BYTES: Final = WAYS * _SLOT.size
DEFAULT_SETS: Final = 16_384  # 131,072 buckets, 5 MiB


def _digest(*parts: str) -> int:
    """A non-zero 64-bit hash (0 marks a free slot)."""
    h = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") or 1


def _spec_digest(spec: RateSpec) -> int:
    """Buckets restart full when their rule's numbers change, not on every rule-set
    reload."""
    return _digest(repr((spec.requests_per_second, spec.bytes_per_second,
                         spec.burst_seconds)))


class SharedRates:
    """Buckets every process of the host shares: a file of slots mapped by each of them.

    A take locks the key's set (a POSIX record lock on its bytes, so the kernel frees it
    if the holder dies; and a thread lock, as record locks do not exclude threads of one
    process), finds the key's slot (or takes a free one, or the set's stalest), spends
    and writes back: a few microseconds, for requests a rate rule judges only. A full
    set forgets its stalest bucket, which then restarts full: memory stays bounded
    whatever keys clients make up.
    """

    def __init__(self, path: Path, sets: int = DEFAULT_SETS,
                 clock: Clock = time.monotonic) -> None:
        """Map `path`, made (and sized) by the first process that needs it. The pool's
        owner removes it before the pool starts, so no bucket outlives a restart of the
        whole gateway; a bucket counted after now (a reboot restarted the clock) restarts
        full."""
        self._clock = clock
        self._thread_lock = threading.Lock()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            size = sets * _SET_BYTES
            fcntl.lockf(self._fd, fcntl.LOCK_EX)  # the whole file: one process sizes it
            try:
                if os.fstat(self._fd).st_size < size:
                    os.ftruncate(self._fd, size)  # zeros: every slot free
                size = os.fstat(self._fd).st_size // _SET_BYTES * _SET_BYTES
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN)
            self._sets = size // _SET_BYTES
            self._map = mmap.mmap(self._fd, size)
        except BaseException:
            os.close(self._fd)
            raise

    def take(self, rule_id: str, spec: RateSpec, key: str, nbytes: int) -> float:
        key_hash, spec_hash = _digest(rule_id, key), _spec_digest(spec)
        start = (key_hash % self._sets) * _SET_BYTES
        with self._thread_lock:
            fcntl.lockf(self._fd, fcntl.LOCK_EX, _SET_BYTES, start, os.SEEK_SET)
            try:
                now = self._clock()
                at = self._slot_of(start, key_hash)
                stored_key, stored_spec, requests, nbytes_left, updated = _SLOT.unpack_from(
                    self._map, at)
                if stored_key != key_hash or stored_spec != spec_hash or updated > now:
                    requests, nbytes_left = full(spec)
                    updated = now
                requests, nbytes_left, wait = spend(spec, requests, nbytes_left,
                                                    now - updated, nbytes)
                _SLOT.pack_into(self._map, at, key_hash, spec_hash, requests, nbytes_left, now)
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, _SET_BYTES, start, os.SEEK_SET)
        return wait

    def _slot_of(self, start: int, key_hash: int) -> int:
        """Where the key's bucket is in its set: its own slot, else the first free one,
        else the one counted longest ago (held under the set's lock)."""
        free = stalest = -1
        stalest_at = float("inf")
        for at in range(start, start + _SET_BYTES, _SLOT.size):
            stored_key, _, _, _, updated = _SLOT.unpack_from(self._map, at)
            if stored_key == key_hash:
                return at
            if stored_key == 0:
                if free < 0:
                    free = at
            elif updated < stalest_at:
                stalest, stalest_at = at, updated
        return free if free >= 0 else stalest

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)
