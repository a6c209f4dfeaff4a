"""A clock for tests, moved by hand (`clock.now += 2`): the code under test is given it
where it would call `time.monotonic` or `time.perf_counter`, so durations are exact."""

from __future__ import annotations


class ManualClock:
    """Called like `time.monotonic()`; reads `now`, which only the test moves."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
