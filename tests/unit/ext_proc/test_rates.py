"""The token buckets behind rate rules: in one process, and shared by a pool's processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ext_proc.filters.rates import (
    MAX_DEBT_S,
    RateBuckets,
    RateLimiter,
    SharedRates,
    TokenBucket,
)
from ext_proc.shared_slots import WAYS
from filter_rules.model import RateSpec


def test_token_bucket_allows_the_burst_then_asks_to_wait() -> None:
    spec = RateSpec(bytes_per_second=1000, burst_seconds=1)
    bucket = TokenBucket(spec, now=0.0)
    assert bucket.take(1000, now=0.0) == 0.0  # the burst
    assert bucket.take(500, now=0.0) == pytest.approx(0.5)
    assert bucket.take(0, now=2.0) == 0.0  # refilled (capped at the burst)


def test_what_a_bucket_owes_is_bounded_so_the_penalty_ends() -> None:
    """A client that ignores throttle_time_ms (librdkafka) used to run up a debt of
    minutes, which every client of the key then paid and which outlived the rule."""
    spec = RateSpec(bytes_per_second=1000, requests_per_second=10, burst_seconds=1)
    bucket = TokenBucket(spec, now=0.0)
    waits = [bucket.take(10_000, now=0.0) for _ in range(100)]  # a megabyte at once
    assert max(waits) == pytest.approx(MAX_DEBT_S)
    assert bucket.take(0, now=MAX_DEBT_S + 1) == 0.0  # paid off within the bound


Limiter = tuple[RateBuckets, list[float]]


@pytest.fixture(params=["process", "shared"])
def limiter_at(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Limiter]:
    """A limiter of either kind, on a clock the test sets."""
    clock = [0.0]
    if request.param == "process":
        yield RateLimiter(clock=lambda: clock[0]), clock
        return
    shared = SharedRates(tmp_path / "rates", sets=4, clock=lambda: clock[0])
    yield shared, clock
    shared.close()


def test_request_rate_and_keys_are_separate(limiter_at: Limiter) -> None:
    limiter, clock = limiter_at
    spec = RateSpec(requests_per_second=2, burst_seconds=1)
    assert [limiter.take("r", spec, "alice", 0) for _ in range(2)] == [0.0, 0.0]
    assert limiter.take("r", spec, "alice", 0) == pytest.approx(0.5)
    assert limiter.take("r", spec, "bob", 0) == 0.0  # bob has his own bucket
    assert limiter.take("other-rule", spec, "alice", 0) == 0.0  # so has another rule
    clock[0] = 10.0
    assert limiter.take("r", spec, "alice", 0) == 0.0


def test_a_bucket_restarts_full_when_its_rule_numbers_change_not_on_a_reload(
        limiter_at: Limiter) -> None:
    limiter, _clock = limiter_at
    spec = RateSpec(bytes_per_second=100, burst_seconds=1)
    assert limiter.take("r", spec, "k", 100) == 0.0
    reloaded = RateSpec(bytes_per_second=100, burst_seconds=1)  # the same rule, parsed again
    assert limiter.take("r", reloaded, "k", 100) == pytest.approx(1.0)  # still spent
    raised = RateSpec(bytes_per_second=1000, burst_seconds=1)
    assert limiter.take("r", raised, "k", 100) == 0.0


def test_shared_buckets_are_one_budget_for_every_process_mapping_the_file(
        tmp_path: Path) -> None:
    path = tmp_path / "rates"
    # 1,000 bytes, refilled at 100 a second (what a bucket may owe is bounded by
    # MAX_DEBT_S of its rate: a slower rate would cap the wait asked for below).
    spec = RateSpec(bytes_per_second=100, burst_seconds=10)
    here = SharedRates(path)
    assert here.take("r", spec, "payments", 600) == 0.0
    # Another process (a worker of the pool) spends from the same bucket: 400 left, it
    # takes 900 and is told to wait for the 500 it is over (5 s).
    script = ("import sys; from pathlib import Path; from ext_proc.filters.rates import "
              "SharedRates; from filter_rules.model import RateSpec; "
              "spec = RateSpec(bytes_per_second=100, burst_seconds=10); "
              "print(SharedRates(Path(sys.argv[1])).take('r', spec, 'payments', 900))")
    out = subprocess.run([sys.executable, "-c", script, str(path)], check=True,
                         capture_output=True, text=True).stdout
    # (less what the bucket refills while the other process starts)
    assert 0.0 < float(out) <= 5.0  # a bucket of its own would have had it all
    assert here.take("r", spec, "payments", 1) > 0.0  # and this process sees it spent
    assert here.take("r", spec, "orders", 600) == 0.0  # another key, its own bucket
    here.close()


def test_a_full_set_forgets_its_stalest_bucket_and_memory_stays_bounded(
        tmp_path: Path) -> None:
    clock = [0.0]
    rates = SharedRates(tmp_path / "rates", sets=1, clock=lambda: clock[0])
    spec = RateSpec(requests_per_second=1, burst_seconds=1)
    assert rates.take("r", spec, "first", 0) == 0.0
    for n in range(WAYS - 1):  # fill the set
        clock[0] += 0.001
        assert rates.take("r", spec, f"k{n}", 0) == 0.0
    assert rates.take("r", spec, "k0", 0) > 0  # still there: spent
    clock[0] += 0.001
    assert rates.take("r", spec, "newcomer", 0) == 0.0  # takes the stalest slot ("first")
    assert rates.take("r", spec, "first", 0) == 0.0  # which restarted full
    assert (tmp_path / "rates").stat().st_size == 64 + WAYS * 40  # one set, never grown


def test_a_bucket_counted_after_now_restarts_full(tmp_path: Path) -> None:
    """After a reboot the monotonic clock starts again below what the file says."""
    clock = [1000.0]
    rates = SharedRates(tmp_path / "rates", sets=2, clock=lambda: clock[0])
    spec = RateSpec(requests_per_second=1, burst_seconds=1)
    assert rates.take("r", spec, "k", 0) == 0.0
    assert rates.take("r", spec, "k", 0) > 0
    clock[0] = 5.0
    assert rates.take("r", spec, "k", 0) == 0.0
