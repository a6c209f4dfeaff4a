"""ServiceCaller and TtlCache: bounded calls to a service, shared, remembered (no network)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from interceptors.contract import ServiceUnavailable
from interceptors.remote import ServiceCaller, ServiceFailure, TtlCache
from tests.unit.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(100.0)


@pytest.fixture
def caller(clock: ManualClock) -> Iterator[ServiceCaller]:
    c = ServiceCaller("test service", timeout_s=0.2, backoff_s=5.0, clock=clock)
    yield c
    c.close()


def test_cache_is_bounded_least_recently_used_first(clock: ManualClock) -> None:
    cache: TtlCache[int, str] = TtlCache(2, clock=clock)
    cache.put(1, "a")
    cache.put(2, "b")
    assert cache.get(1) == "a"  # 1 is now the most recently used
    cache.put(3, "c")
    assert (cache.get(1), cache.get(2), cache.get(3)) == ("a", None, "c")
    assert len(cache) == 2


def test_cache_entries_expire_but_stay_readable_as_stale(clock: ManualClock) -> None:
    cache: TtlCache[str, int] = TtlCache(10, ttl_s=30, clock=clock)
    cache.put("k", 1)
    cache.put("short", 2, ttl_s=1)
    clock.now += 2
    assert cache.get("k") == 1 and cache.get("short") is None
    assert cache.get_any("short") == (2, False)
    clock.now += 30
    assert cache.get_any("k") == (1, False)


def test_a_stalled_service_costs_one_timeout_then_nothing_for_the_backoff(
        caller: ServiceCaller, clock: ManualClock) -> None:
    release = threading.Event()
    with pytest.raises(ServiceUnavailable, match="did not answer within 200 ms"):
        caller.call("k", release.wait)
    assert caller.calls == 1
    # Down: answered at once, the service is not called again (another key too).
    with pytest.raises(ServiceUnavailable, match=r"unavailable .*retrying shortly"):
        caller.call("other", lambda: "x")
    assert caller.calls == 1
    release.set()
    clock.now += 6  # past the back-off: tried again
    assert caller.call("other", lambda: "x") == "x"
    assert caller.calls == 2


def test_failures_mark_the_service_down_and_verdicts_do_not(
        caller: ServiceCaller, clock: ManualClock) -> None:
    class NotFound(Exception):
        pass

    def not_found() -> str:
        raise NotFound("404")

    with pytest.raises(NotFound):
        caller.call("a", not_found)
    assert caller.call("b", lambda: "up") == "up"  # a verdict is not an outage

    def refused() -> str:
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(ServiceUnavailable, match="Connection refused") as err:
        caller.call("c", refused, fail_open=True)
    assert err.value.fail_open
    with pytest.raises(ServiceUnavailable):
        caller.call("d", lambda: "x")

    def broken() -> str:
        raise ServiceFailure("HTTP 503 for /x")

    clock.now += 6
    with pytest.raises(ServiceUnavailable, match="HTTP 503"):
        caller.call("e", broken)


def test_concurrent_askers_of_one_question_share_one_call(caller: ServiceCaller) -> None:
    started, release = threading.Event(), threading.Event()
    joined = threading.Semaphore(0)
    caller.timeout_s = 30

    class Inflight(dict[Any, Any]):
        def get(self, key: Any, default: Any = None) -> Any:
            found = super().get(key, default)
            if found is not None:
                joined.release()  # an asker found the call under way
            return found

    caller._inflight = Inflight()

    def slow() -> str:
        started.set()
        release.wait(30)
        return "answer"

    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(caller.call("q", slow)))
               for _ in range(5)]
    threads[0].start()
    assert started.wait(10)
    for t in threads[1:]:
        t.start()
    for _ in threads[1:]:
        assert joined.acquire(timeout=10)
    release.set()
    for t in threads:
        t.join(30)
    assert results == ["answer"] * 5
    assert caller.calls == 1
