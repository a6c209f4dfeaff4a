"""Building a large rule set: no garbage collection meanwhile, what it built frozen."""

from __future__ import annotations

import gc
import threading

from ext_proc.heap import building


def test_collection_pauses_across_threads_and_resumes_with_the_rules_frozen() -> None:
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    inside, leave = threading.Event(), threading.Event()

    def other_build() -> None:
        with building():
            inside.set()
            assert leave.wait(10)

    thread = threading.Thread(target=other_build)
    with building():
        assert not gc.isenabled()
        thread.start()
        assert inside.wait(10)
        rules = [{"id": f"r{i}", "match": {"topics": [f"t{i}."]}} for i in range(1000)]
    assert not gc.isenabled()  # the other build still runs
    leave.set()
    thread.join(10)
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(rules)  # walked by no collection now
    gc.unfreeze()  # leave the test session as it was


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        with building():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
