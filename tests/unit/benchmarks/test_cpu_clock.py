"""The CPU clock the data-path benchmarks read for Envoy and keg's workers (/proc)."""

import os
import time

from benchmarks.gateway_vs_direct import process_cpu_seconds


def test_a_process_clock_counts_what_the_process_burns() -> None:
    before = process_cpu_seconds([os.getpid()])
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    assert process_cpu_seconds([os.getpid()]) - before >= 0.2


def test_processes_that_are_gone_or_unknown_count_nothing() -> None:
    assert process_cpu_seconds([None, 2**22 + 12345]) == 0.0
