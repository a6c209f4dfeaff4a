"""Rate limits: token buckets keyed by rule and principal, client id or topic.

A rate rule limits what a principal (client id, topic) sends through the gateway, not
what it sends through one process of it. The ext_proc service runs as a pool of worker
processes (`keg up`: one per core) and each client connection is served by one of them,
so the buckets of one host live in one file every worker maps (`SharedRates`); a
single process keeps them in a dict (`RateLimiter`). Separate hosts (replicas) each
keep their own, as Kafka's own quotas are per broker.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Final, Protocol

from ext_proc.shared_slots import Clock, SharedSlots, key_hash
from filter_rules.model import RateSpec

# The most a bucket may owe, in seconds of its rate: the longest throttle it asks for.
# Without a bound, a client that ignores throttle_time_ms (librdkafka does) ran a debt of
# minutes that every client of the same key then paid, and that outlived the rule; Kafka
# bounds its own quota throttles alike (by its quota window).
MAX_DEBT_S: Final = 10.0


def spend(spec: RateSpec, requests: float, nbytes_left: float, elapsed: float,
          nbytes: int) -> tuple[float, float, float]:
    """One request of `nbytes` against a bucket holding `requests` and `nbytes_left`
    tokens, refilled for `elapsed` seconds (capped at the burst, and owing at most
    MAX_DEBT_S of the rate): the tokens left and the seconds the caller is over its
    rate (0: within it)."""
    wait = 0.0
    if spec.requests_per_second:
        rate = spec.requests_per_second
        requests = max(-rate * MAX_DEBT_S,
                       min(rate * spec.burst_seconds, requests + elapsed * rate) - 1)
        if requests < 0:
            wait = max(wait, -requests / rate)
    if spec.bytes_per_second:
        rate = spec.bytes_per_second
        nbytes_left = max(-rate * MAX_DEBT_S,
                          min(rate * spec.burst_seconds, nbytes_left + elapsed * rate) - nbytes)
        if nbytes_left < 0:
            wait = max(wait, -nbytes_left / rate)
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


# A bucket's slot: its rule numbers' hash and the tokens left when it was last used.
_BUCKET: Final = struct.Struct("<Qdd")
DEFAULT_SETS: Final = 16_384  # 131,072 buckets, 5 MiB


def _spec_hash(spec: RateSpec) -> int:
    """Buckets restart full when their rule's numbers change, not on every rule-set
    reload."""
    return key_hash(spec.requests_per_second, spec.bytes_per_second, spec.burst_seconds)


class SharedRates:
    """Buckets every process mapping one file shares (`ext_proc.shared_slots`): a few
    microseconds per request a rate rule judges. A bucket forgotten (its set full of
    fresher ones) or counted after now (a reboot) restarts full."""

    def __init__(self, path: Path, sets: int = DEFAULT_SETS,
                 clock: Clock = time.monotonic) -> None:
        self._slots = SharedSlots(path, _BUCKET, sets, clock)

    def take(self, rule_id: str, spec: RateSpec, key: str, nbytes: int) -> float:
        spec_hash = _spec_hash(spec)
        with self._slots.slot(key_hash(rule_id, key)) as slot:
            stored_spec, requests, nbytes_left = slot.read()
            elapsed = slot.now - slot.used
            if slot.fresh or stored_spec != spec_hash:
                (requests, nbytes_left), elapsed = full(spec), 0.0
            requests, nbytes_left, wait = spend(spec, requests, nbytes_left, elapsed, nbytes)
            slot.write(spec_hash, requests, nbytes_left)
        return wait

    def close(self) -> None:
        self._slots.close()
