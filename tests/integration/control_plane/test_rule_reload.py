"""A large rule-directory reload on the control plane as deployed (store, REST API on
the real uvicorn server, xDS, a real ext_proc child): the rules are written a file at a
time while a client keeps calling the API. benchmarks/rule_reload.py does the same with
100,000 rules and reports the latencies; here only what must hold is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.rule_reload import run
from keg.embedded.kafka import EmbeddedKafka

pytestmark = pytest.mark.integration


def test_a_large_reload_publishes_all_of_the_directory_or_nothing_and_the_api_answers(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """The reload ran on the event loop: the REST API was down for minutes, and the
    directory was read while files were still being written, so a version holding part
    of them was published. Now the directory is read once it holds still, off the loop,
    and the API answers all along."""
    lines: list[str] = []
    results = run(kafka.bootstrap, 20_000, tmp_path, report=lines.append)
    print("\n" + "\n".join(lines))
    # Only the first version (one rule) and the whole directory were ever shown.
    assert results.rule_counts == [1, 20_001]
    # Between the last file written and the ext_proc ACK, the API kept answering.
    assert results.failed == 0
    assert results.answered >= 20, lines
