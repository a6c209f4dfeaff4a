"""The rule-churn benchmark's own arithmetic: what it calls enforced, and its tables."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.rule_churn import ChurnResult, latest_per_data_path, markdown, probe_rule


def test_the_summary_counts_changes_within_the_goal_and_those_never_seen() -> None:
    result = ChurnResult(changes=4, enforced_s=[0.02, 1.5, None, 0.01], flow_acknowledged=10,
                         flow_stored=10, records_during_changes=7)
    summary = result.summary()
    assert result.unenforced == [2]
    assert (summary["enforced"], summary["within_goal"]) == (3, 2)
    assert (summary["p50_s"], summary["max_s"]) == (0.02, 1.5)


def test_a_run_that_saw_nothing_has_no_times() -> None:
    summary = ChurnResult(changes=2, enforced_s=[None, None]).summary()
    assert (summary["enforced"], summary["p50_s"], summary["p99_s"]) == (0, None, None)


def test_the_table_keeps_the_latest_run_of_each_data_path(tmp_path: Path) -> None:
    def run(path: str, commit: str) -> str:
        summary = ChurnResult(changes=1, enforced_s=[0.5]).summary()
        return json.dumps({"data_path": path, "commit": commit, "summary": summary})

    jsonl = tmp_path / "rule_churn.jsonl"
    jsonl.write_text("\n".join([run("native", "old"), run("ext-proc", "b"),
                                run("native", "new")]) + "\n")
    table = markdown(latest_per_data_path(jsonl))
    assert "| native | new |" in table and "| ext-proc | b |" in table
    assert "| native | old |" not in table


def test_changes_alternate_between_a_produce_deny_and_an_observe() -> None:
    deny, observe = probe_rule("t", deny=True), probe_rule("t", deny=False)
    assert deny["match"] == observe["match"] == {"apis": ["Produce"], "topics": {"exact": ["t"]}}
    assert (deny["action"], observe["action"]) == ({"deny": {}}, {"observe": {}})
