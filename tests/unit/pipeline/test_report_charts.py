"""The report's charts: what their axes show."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import matplotlib.dates as mdates

from pipeline.report import SINGLE_POINT_SPAN, pyplot, time_chart


def x_span(fig: object) -> timedelta:
    low, high = fig.axes[0].get_xlim()  # type: ignore[attr-defined]
    return mdates.num2date(high) - mdates.num2date(low)


def test_a_timeline_of_one_point_in_time_spans_minutes_not_years() -> None:
    """A capture of less than a bucket has one point on its timeline: matplotlib widened
    the date axis by two years each side, 2025 to 2029 (regression)."""
    moment = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    fig = time_chart([moment], {"unchanged": [5.0], "dropped": [1.0]}, "records", "records")
    try:
        assert x_span(fig) == 2 * SINGLE_POINT_SPAN
    finally:
        pyplot().close(fig)


def test_a_timeline_of_several_points_keeps_its_own_span() -> None:
    start = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    times = [start + timedelta(seconds=10 * i) for i in range(7)]
    fig = time_chart(times, {"unchanged": [float(i) for i in range(7)]}, "records", "records")
    try:
        assert timedelta(seconds=60) <= x_span(fig) < timedelta(minutes=5)
    finally:
        pyplot().close(fig)
