"""A service keg runs as a child process for local use and tests (a schema registry, a
KMS): started with its output in a log file, waited for until a probe says it serves,
stopped with SIGTERM (then SIGKILL), paused and resumed (SIGSTOP / SIGCONT) to play a
stalled service.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from keg.children import HoldsProcess, die_with_parent, stop_process
from keg.lifecycle import Service

log = logging.getLogger(__name__)


class ChildFailed(RuntimeError):
    """The child exited or did not serve in time; the message ends with its log's tail."""


class Child(HoldsProcess):
    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, cmd: list[str], env: Mapping[str, str], ready: Callable[[], bool],
              timeout: float, cwd: Path | None = None) -> None:
        """Run `cmd` and return once `ready()` is true; ChildFailed otherwise."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        started = time.monotonic()
        self._proc = subprocess.Popen(die_with_parent(cmd), stdin=subprocess.DEVNULL,
                                      stdout=self._log, stderr=subprocess.STDOUT,
                                      env=dict(env), cwd=cwd)
        atexit.register(self.stop)
        delay = 0.05
        while not ready():
            code = self._proc.poll()
            if code is not None:
                self.stop()
                raise ChildFailed(f"{self.name} exited with code {code} while starting\n"
                                  f"{self.tail()}")
            if time.monotonic() - started > timeout:
                self.stop()
                raise ChildFailed(f"{self.name} did not serve within {timeout:.0f} s\n"
                                  f"{self.tail()}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        log.info("%s is up after %.1f s (pid %d)", self.name, time.monotonic() - started,
                 self._proc.pid)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets and answers nothing (a stalled service)."""
        if self._proc is not None:
            os.kill(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            os.kill(self._proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 20 s; safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            atexit.unregister(self.stop)
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)  # a paused child cannot act on SIGTERM
                stop_process(proc, grace_s=20)
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_bytes()[-32768:].decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class ChildService(Service):
    """An HTTP service on loopback run as one Child (`_child`, set by start): its port and
    URL, pid, pause and resume, and stop, which also removes the scratch directory the
    service made for its files."""

    _child: Child | None = None
    _owned_dir: tempfile.TemporaryDirectory[str] | None = None
    port: int = 0  # set by start

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _scratch_dir(self, prefix: str) -> Path:
        """A temporary directory for the child's files, removed by stop."""
        self._owned_dir = tempfile.TemporaryDirectory(prefix=prefix)
        return Path(self._owned_dir.name)

    def stop(self) -> None:
        child, self._child = self._child, None
        scratch, self._owned_dir = self._owned_dir, None
        if child is not None:
            child.stop()
        if scratch is not None:
            scratch.cleanup()

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def pause(self) -> None:
        """Stall the service (SIGSTOP): connections stay open, nothing is answered."""
        if self._child is None:
            raise ChildFailed("the service is not running")
        self._child.pause()

    def resume(self) -> None:
        if self._child is not None:
            self._child.resume()
