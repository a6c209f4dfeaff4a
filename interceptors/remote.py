"""Calls to the services record rules need (a schema registry, a KMS): bounded, shared,
remembered.

Record work runs in worker threads, off the data path's event loop (ext_proc/server.py),
but a worker waiting for a stalled service is a worker other connections do not get. So:

- every call runs in its service's own small thread pool and the record waits at most the
  service's timeout for it (the call may finish later: its answer is kept for the next
  record that asks);
- records asking the same question at the same time share one call (single flight);
- after a failure the service counts as down for a short back-off: records needing it
  are answered at once (ServiceUnavailable) instead of each waiting out the timeout,
  and the first record after the back-off tries again.

A question whose answer is known (cached) costs a dictionary lookup: the service is never
called per record. `TtlCache` is the bounded memory: least recently used entries go
first, and each entry may expire.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from functools import partial
from typing import Final, Generic, TypeVar

from interceptors.contract import ServiceUnavailable

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

DEFAULT_BACKOFF_S: Final = 1.0
_WORKERS_PER_SERVICE: Final = 4


class ServiceFailure(Exception):
    """The service answered, but not usefully (a 5xx, a malformed answer): like being
    unreachable. Answers that are verdicts (an unknown id: 404) are not failures."""


class TtlCache(Generic[K, V]):
    """At most `max_entries` values; each expires `ttl_s` after it was put (None: never).

    Thread-safe. `get` gives a fresh value or None; `get_any` also gives an expired one
    (with its freshness), for callers that prefer a stale answer to none.
    """

    def __init__(self, max_entries: int, ttl_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[K, tuple[V, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        found = self.get_any(key)
        return found[0] if found is not None and found[1] else None

    def get_any(self, key: K) -> tuple[V, bool] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            value, expires = entry
            return value, self._clock() < expires

    def put(self, key: K, value: V, ttl_s: float | None = None) -> None:
        ttl = self.ttl_s if ttl_s is None else ttl_s
        expires = float("inf") if ttl is None else self._clock() + ttl
        with self._lock:
            self._entries[key] = (value, expires)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)


class ServiceCaller:
    """Bounded, shared calls to one service (see the module's docstring)."""

    def __init__(self, name: str, timeout_s: float, backoff_s: float = DEFAULT_BACKOFF_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self._clock = clock
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=_WORKERS_PER_SERVICE, thread_name_prefix="keg-service")
        # Reentrant: a call that is done already runs its done-callback (_forget) at
        # once, in the thread that registers it, which holds this lock.
        self._lock = threading.RLock()
        self._inflight: dict[Hashable, concurrent.futures.Future[object]] = {}
        self._down_until = 0.0
        self._last_problem = ""
        self.calls = 0  # made, for tests and metrics: the service is not called per record
        self.failures = 0

    def call(self, key: Hashable, fn: Callable[[], V], fail_open: bool = False) -> V:
        """fn()'s result, waiting at most the timeout; ServiceUnavailable when the service
        is down, fails (OSError, TimeoutError, ServiceFailure) or is too slow. Any other
        exception of fn (a verdict, e.g. "not found") is raised as it is."""
        with self._lock:
            future = self._inflight.get(key)
            if future is None:
                if self._clock() < self._down_until:
                    raise ServiceUnavailable(
                        f"{self.name} is unavailable ({self._last_problem}); retrying "
                        "shortly", fail_open)
                future = self._pool.submit(self._run, fn)
                self._inflight[key] = future
                future.add_done_callback(partial(self._forget, key))
        try:
            return future.result(timeout=self.timeout_s)  # type: ignore[return-value]
        except concurrent.futures.TimeoutError:
            self._failed(f"no answer within {self.timeout_s * 1000:.0f} ms")
            raise ServiceUnavailable(
                f"{self.name} did not answer within {self.timeout_s * 1000:.0f} ms",
                fail_open) from None
        except (OSError, TimeoutError, ServiceFailure) as err:
            problem = _describe(err)
            self._failed(problem)
            raise ServiceUnavailable(f"{self.name} is unavailable ({problem})",
                                     fail_open) from None

    def _run(self, fn: Callable[[], V]) -> V:
        self.calls += 1
        return fn()

    def _forget(self, key: Hashable, _done: object) -> None:
        with self._lock:
            self._inflight.pop(key, None)

    def _failed(self, problem: str) -> None:
        with self._lock:
            self.failures += 1
            first = self._clock() >= self._down_until
            self._down_until = self._clock() + self.backoff_s
            self._last_problem = problem
        if first:
            log.warning("%s unavailable: %s (records needing it are answered at once for "
                        "%.1f s, then it is tried again)", self.name, problem, self.backoff_s)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _describe(err: BaseException) -> str:
    reason = getattr(err, "reason", None)  # urllib's URLError wraps the socket error
    if isinstance(reason, BaseException):
        err = reason
    text = str(err) or type(err).__name__
    return text[:200]
