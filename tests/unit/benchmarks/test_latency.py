"""The fixed-rate latency benchmark's arithmetic: pacing, percentiles, what a path adds."""

import pytest

from benchmarks.gateway_vs_direct import DIRECT
from benchmarks.latency import Pace, added, percentile, summary, table


def test_a_pace_makes_records_due_at_its_rate_and_no_more_than_its_total() -> None:
    pace = Pace(rate=1000, seconds=2)
    assert pace.total == 2000
    assert pace.due(0.0) == 1  # the first record goes at once
    assert pace.due(0.0105) == 11
    assert pace.due(5.0) == 2000
    assert pace.at(500) == pytest.approx(0.5)


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.50) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 0.999) == 100.0
    assert percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 0.5)


def test_a_summary_is_in_milliseconds_and_says_the_rate_reached() -> None:
    result = summary([0.002, 0.001, 0.003, 0.004], elapsed_s=2.0)
    assert result["p50"] == pytest.approx(2.0)
    assert result["p99"] == pytest.approx(4.0)
    assert result["records_per_s"] == pytest.approx(2.0)


ROUNDS = [
    {DIRECT: {"p50": 1.0, "p99": 3.0, "p999": 5.0, "records_per_s": 5000.0},
     "native": {"p50": 1.2, "p99": 3.5, "p999": 6.0, "records_per_s": 5000.0},
     "ext_proc": {"p50": 9.0, "p99": 30.0, "p999": 40.0, "records_per_s": 4000.0}},
    {DIRECT: {"p50": 2.0, "p99": 4.0, "p999": 6.0, "records_per_s": 5000.0},
     "native": {"p50": 2.4, "p99": 4.1, "p999": 7.0, "records_per_s": 5000.0},
     "ext_proc": {"p50": 10.0, "p99": 40.0, "p999": 50.0, "records_per_s": 4100.0}},
]


def test_what_a_path_adds_is_compared_within_each_round() -> None:
    assert added(ROUNDS, "native", "p50") == pytest.approx(0.3)  # median of 0.2 and 0.4
    assert added(ROUNDS, "native", "p99") == pytest.approx(0.3)  # median of 0.5 and 0.1
    assert added(ROUNDS, "tcp_proxy", "p50") is None


def test_the_table_says_which_paths_meet_the_goal_and_which_could_not_keep_the_rate() -> None:
    text = table(ROUNDS, 5000)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| path")}
    assert rows["native"].endswith("| met |")
    assert "rate not kept (0.81 of it)" in rows["ext_proc"]
    assert "+0.30" in rows["native"]
