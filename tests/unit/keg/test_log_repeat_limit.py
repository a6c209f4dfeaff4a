"""RepeatLimit: a kind of log line repeated by a client's doing is bounded, others pass."""

from __future__ import annotations

import logging

from keg.logs import RepeatLimit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def record(msg: str, *args: object, name: str = "ext_proc",
           level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_a_burst_passes_then_one_line_per_interval_saying_what_was_left_out() -> None:
    clock = Clock()
    limit = RepeatLimit(burst=3, every_s=5.0, clock=clock)
    passed = [limit.filter(record("refused %s-%d", "t", i)) for i in range(10)]
    assert passed == [True] * 3 + [False] * 7
    clock.now = 4.9
    assert not limit.filter(record("refused %s-%d", "t", 10))
    clock.now = 5.0
    line = record("refused %s-%d", "t", 11)
    assert limit.filter(line)
    assert line.getMessage() == "refused t-11 [8 more like this left out]"
    assert not limit.filter(record("refused %s-%d", "t", 12))


def test_other_kinds_of_lines_are_not_held_back_by_a_flood() -> None:
    limit = RepeatLimit(burst=2, clock=Clock())
    for i in range(100):
        limit.filter(record("refused %s", i))
    assert limit.filter(record("rule set %s applied", 7))
    assert limit.filter(record("refused %s", 0, level=logging.ERROR))  # another level
    assert limit.filter(record("refused %s", 0, name="control_plane"))  # another logger


def test_a_quiet_kind_gets_its_whole_burst_back() -> None:
    clock = Clock()
    limit = RepeatLimit(burst=2, every_s=1.0, clock=clock)
    assert [limit.filter(record("x")) for _ in range(3)] == [True, True, False]
    clock.now = 100.0
    assert [limit.filter(record("x")) for _ in range(3)] == [True, True, False]


def test_a_message_without_arguments_keeps_its_percent_signs() -> None:
    limit = RepeatLimit(burst=1, every_s=1.0, clock=(clock := Clock()))
    limit.filter(record("100% refused"))
    limit.filter(record("100% refused"))
    clock.now = 1.0
    line = record("100% refused")
    assert limit.filter(line)
    assert line.getMessage() == "100% refused [1 more like this left out]"


def test_kinds_are_bounded_the_oldest_forgotten_first() -> None:
    limit = RepeatLimit(burst=1, max_kinds=3, clock=Clock())
    for text in ("a", "b", "c", "d"):
        assert limit.filter(record(text))
    assert len(limit._buckets) == 3
    assert limit.filter(record("a"))  # forgotten: a fresh burst
    assert not limit.filter(record("d"))
