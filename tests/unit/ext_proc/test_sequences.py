"""The ledger of records dropped from idempotent producers' batches: in one process, and
shared by a pool's processes (a producer's next connection may reach any worker)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ext_proc.sequences import POINTS, Ledger, SequenceLedger, SharedSequenceLedger

KEY = (1, 0, "t", 0)


@pytest.fixture(params=["process", "shared"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    if request.param == "process":
        yield SequenceLedger()
        return
    shared = SharedSequenceLedger(tmp_path / "sequences", sets=4)
    yield shared
    shared.close()


def test_the_ledger_is_deterministic_for_retries(ledger: Ledger) -> None:
    ledger.dropped(KEY, 0, 2)
    ledger.dropped(KEY, 10, 1)
    ledger.dropped(KEY, 10, 1)  # a retry of the same batch counts once
    assert [ledger.shift(KEY, s) for s in (0, 5, 10, 11, 20)] == [0, 2, 2, 3, 3]
    ledger.dropped(KEY, 5, 4)  # an out-of-order arrival moves everything after it
    assert [ledger.shift(KEY, s) for s in (5, 6, 11)] == [2, 6, 7]
    assert ledger.shift((2, 0, "t", 0), 10) == 0
    assert ledger.shift((1, 1, "t", 0), 10) == 0  # a new epoch starts again


def test_a_shared_ledger_keeps_the_latest_drop_points(tmp_path: Path) -> None:
    ledger = SharedSequenceLedger(tmp_path / "sequences", sets=1)
    for n in range(POINTS + 10):
        ledger.dropped(KEY, n * 10, 1)
    # The batches in flight (the latest ones) shift exactly; long-acked ones are forgotten.
    last = (POINTS + 9) * 10
    assert ledger.shift(KEY, last + 1) == POINTS + 10
    assert ledger.shift(KEY, last) == POINTS + 9
    assert ledger.shift(KEY, last - 10 * (POINTS - 2)) == 11
    ledger.close()


def test_a_producer_finds_its_drops_in_another_process_of_the_pool(tmp_path: Path) -> None:
    path = tmp_path / "sequences"
    here = SharedSequenceLedger(path)  # mapped before any drop: it sees the other's
    assert here.shift(KEY, 5) == 0
    script = ("import sys; from pathlib import Path; "
              "from ext_proc.sequences import SharedSequenceLedger; "
              "SharedSequenceLedger(Path(sys.argv[1])).dropped((1, 0, 't', 0), 0, 3)")
    subprocess.run([sys.executable, "-c", script, str(path)], check=True)
    assert here.shift(KEY, 5) == 3
    here.dropped(KEY, 0, 3)  # the same batch retried through this worker: counted once
    assert here.shift(KEY, 5) == 3
    here.close()


def test_a_kept_ledger_still_shifts_after_the_host_restarted(tmp_path: Path) -> None:
    """A producer outlives a restart of the pool and of its host: the ledger is kept,
    and read on whatever a clock said before (a monotonic clock restarts at boot)."""
    before = SharedSequenceLedger(tmp_path / "sequences", sets=4, clock=lambda: 1_000_000.0)
    before.dropped(KEY, 10, 3)
    before.close()
    after = SharedSequenceLedger(tmp_path / "sequences", sets=4, clock=lambda: 5.0)
    assert after.shift(KEY, 20) == 3
    after.dropped(KEY, 20, 1)
    assert after.shift(KEY, 30) == 4
    after.close()
