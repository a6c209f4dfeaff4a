"""Files that are not regular files, for the tests of what keg refuses to read (no tests
here): a FIFO (opening one to read waits for a writer) and a symlink to /dev/zero (its
st_size is 0, its content never ends).

Code that reads them anyway must fail its test, not hang it or eat the machine's memory:
`guarded` runs a call in a thread and lets it go should it block on a FIFO; `run_capped`
runs Python in a child process with bounded memory and time."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
CHILD_MEMORY = 1 << 30  # what a child of run_capped may map: far more than it needs
HANG = 30.0  # seconds after which a call is taken as blocked for good (never a timing check)


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def zero_link(path: Path) -> Path:
    path.symlink_to("/dev/zero")
    return path


def release(path: Path) -> None:
    """Let a reader blocked opening the FIFO `path` go on (it reads end of file)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no reader waiting (ENXIO), or it is gone
        return
    os.close(fd)


def guarded(call: Callable[[], T], fifos: Sequence[Path] = ()) -> T:
    """`call()`'s result (or its exception); AssertionError if it is still running after
    HANG seconds: blocked on one of `fifos`, which are then released so that the thread
    does not stay blocked after the test."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name="guarded-call")
    thread.start()
    thread.join(HANG)
    if thread.is_alive():
        for _ in range(100):
            for path in fifos:
                release(path)
            thread.join(0.1)
            if not thread.is_alive():
                break
        raise AssertionError(f"still running after {HANG} s: blocked reading a FIFO")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def run_capped(*args: str, cwd: Path = REPO, timeout: float = 120.0
               ) -> subprocess.CompletedProcess[str]:
    """`python args...` in a child process that may map CHILD_MEMORY bytes at most (reading
    /dev/zero whole ends in a MemoryError there) and is killed after `timeout` seconds
    (subprocess.TimeoutExpired: it hung)."""
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=_cap_memory, check=False)
