"""Children that come back by themselves: a supervisor for the processes keg starts.

`Supervisor.watch(name, child)` gives a child process (the ext_proc service, Envoy,
the embedded broker) a watcher thread. When the process exits without having been
asked to (a crash, an OOM kill, a kill -9), the watcher reaps it (no zombie), logs an
ERROR line, counts the restart (`keg_component_restarts_total{component}`), shows the
component down (`keg_component_up{component}` 0, `Supervisor.problems()` for health
checks) and starts it again: at once the first time, then with exponential backoff
while it keeps failing, so a child that cannot start does not spin a core.

A child may also say whether it answers (`Child.answers`, e.g. its /metrics page): one
that is there but does not answer for `hung_after_s` (stopped with SIGSTOP, deadlocked)
is killed (SIGKILL, an ERROR line) and so restarted like any child that exits. Before, a
stopped ext_proc worker held every connection the module had given it for as long as it
was stopped, and new connections went on reaching it; nothing noticed.

Children are started with `keg.children.die_with_parent`: when keg itself is killed,
they get SIGTERM instead of living on as orphans holding the ports a new keg needs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from keg.lifecycle import Service

log = logging.getLogger(__name__)

UP: Final = "up"
RESTARTING: Final = "restarting"
# How often a child that can say whether it answers is asked, and how long it may not
# answer before it is killed: far past what a busy but healthy worker takes to serve
# its /metrics page (a frame's record work is bounded to 1.5 s; a 100,000-rule set is
# built in a thread of its own), on a machine short of cores too.
PROBE_INTERVAL_S: Final = 2.0
HUNG_AFTER_S: Final = 20.0


def describe_exit(returncode: int) -> str:
    """"exit code 3", "signal 9 (SIGKILL)": how a process ended, for a log line."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown"
        return f"signal {-returncode} ({name})"
    return f"exit code {returncode}"


@dataclass(frozen=True)
class Backoff:
    """Delays between restarts: `first_s` after a child that ran long enough
    (`stable_after_s`), then doubling from `initial_s` up to `max_s` while it keeps
    exiting (or failing to start) sooner than that."""

    first_s: float = 0.0
    initial_s: float = 0.5
    max_s: float = 30.0
    stable_after_s: float = 10.0

    def delay(self, failures: int) -> float:
        """The delay before restart attempt `failures` (1: the first in a row)."""
        if failures <= 1:
            return self.first_s
        return float(min(self.max_s, self.initial_s * 2 ** (failures - 2)))


@dataclass(frozen=True)
class Child:
    """What a supervisor needs of a child: `poll()` reaps the process and returns its
    exit code (None while it runs), `restart()` starts a new process and returns once it
    serves (raising when it cannot), `pid()` for the log."""

    poll: Callable[[], int | None]
    restart: Callable[[], object]
    pid: Callable[[], int | None]
    # Whether the process answers now (a probe with a timeout of its own); None: not
    # probed, only its exit is watched.
    answers: Callable[[], bool] | None = None


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    state: str  # UP or RESTARTING
    restarts: int
    last_exit: str | None  # how the last process ended, e.g. "signal 9 (SIGKILL)"
    since: float  # time.time() of the last state change

    def describe(self) -> str:
        if self.state == UP:
            return f"{self.name} up"
        return (f"{self.name} {self.state} (its process ended with {self.last_exit}; "
                f"{self.restarts} restart(s) so far)")


class _Watched:
    def __init__(self, name: str, child: Child) -> None:
        self.name = name
        self.child = child
        self.state = UP
        self.restarts = 0
        self.last_exit: str | None = None
        self.since = time.time()
        self.started = time.monotonic()
        self.failures = 0  # exits (or failed starts) in a row, each soon after a start
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None


class Supervisor(Service):
    """Restarts the children it watches whenever they exit unasked; see the module doc.

    `unwatch(name)` before stopping a child on purpose, `watch` again after starting it.
    """

    def __init__(self, registry: CollectorRegistry | None = None,
                 backoff: Backoff | None = None, poll_interval_s: float = 0.05,
                 probe_interval_s: float = PROBE_INTERVAL_S,
                 hung_after_s: float = HUNG_AFTER_S) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.backoff = backoff or Backoff()
        self.poll_interval_s = poll_interval_s
        self.probe_interval_s = probe_interval_s
        self.hung_after_s = hung_after_s
        self._watched: dict[str, _Watched] = {}
        self._lock = threading.Lock()
        self.restarts = Counter(
            "keg_component_restarts", "Restarts of a part of the gateway (ext_proc, envoy, "
            "kafka, ...) after its process exited unasked.", ["component"],
            registry=self.registry)
        self.up = Gauge(
            "keg_component_up", "1 while a part of the gateway runs, 0 while it is being "
            "restarted.", ["component"], registry=self.registry)

    def start(self) -> Supervisor:
        return self

    def watch(self, name: str, child: Child) -> None:
        """Watch `child` (already running) from now on, under `name`."""
        self.unwatch(name)
        watched = _Watched(name, child)
        with self._lock:
            previous = self._watched.get(name)
            if previous is not None:  # the counts of an earlier run carry over
                watched.restarts = previous.restarts
            self._watched[name] = watched
        self.up.labels(name).set(1)
        self.restarts.labels(name).inc(0)
        watched.thread = threading.Thread(target=self._run, args=(watched,),
                                          name=f"keg-supervise-{name}", daemon=True)
        watched.thread.start()

    def unwatch(self, name: str) -> None:
        """Stop watching `name` (waits for a restart under way to end)."""
        with self._lock:
            watched = self._watched.get(name)
        if watched is None or watched.stop.is_set():
            return
        watched.stop.set()
        if watched.thread is not None and watched.thread is not threading.current_thread():
            watched.thread.join()
        with contextlib.suppress(KeyError):  # not watched: neither up nor down
            self.up.remove(name)

    def stop(self) -> None:
        with self._lock:
            names = list(self._watched)
        for name in names:
            self.unwatch(name)

    def status(self) -> list[ComponentStatus]:
        with self._lock:
            watched = list(self._watched.values())
        return [ComponentStatus(w.name, w.state, w.restarts, w.last_exit, w.since)
                for w in watched if not w.stop.is_set()]

    def problems(self) -> list[str]:
        """One sentence per watched part that is not up (empty: all up)."""
        return [s.describe() for s in self.status() if s.state != UP]

    # -- the watcher thread ------------------------------------------------------------

    def _run(self, watched: _Watched) -> None:
        answered = next_probe = time.monotonic()
        while not watched.stop.wait(self.poll_interval_s):
            code = watched.child.poll()
            if code is not None:
                self._recover(watched, code)
                answered = next_probe = time.monotonic()
                continue
            probe = watched.child.answers
            if probe is None or time.monotonic() < next_probe:
                continue
            if probe():
                answered = time.monotonic()
            elif time.monotonic() - answered >= self.hung_after_s:
                self._kill_hung(watched, time.monotonic() - answered)
            next_probe = time.monotonic() + self.probe_interval_s

    def _kill_hung(self, watched: _Watched, silent_s: float) -> None:
        """Kill a child that is there but does not answer: its exit, seen next, restarts
        it (its connections end; their clients retry on new ones)."""
        pid = watched.child.pid()
        log.error("%s (pid %s) has not answered for %.0f s: killing it to restart it",
                  watched.name, pid, silent_s)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _recover(self, watched: _Watched, returncode: int) -> None:
        name = watched.name
        how = describe_exit(returncode)
        ran_for = time.monotonic() - watched.started
        self._set_state(watched, RESTARTING, how)
        if ran_for >= self.backoff.stable_after_s:
            watched.failures = 0  # it ran well: a new failure, not a crash loop
        watched.failures += 1
        delay = self.backoff.delay(watched.failures)
        log.error("%s (pid %s) exited with %s after %.1f s; restarting it%s", name,
                  watched.child.pid(), how, ran_for, f" in {delay:.1f} s" if delay else "")
        while not watched.stop.wait(delay):
            self.restarts.labels(name).inc()
            with self._lock:
                watched.restarts += 1
            began = time.monotonic()
            try:
                watched.child.restart()
            except Exception as err:  # a start that fails is tried again, later
                watched.failures += 1
                delay = self.backoff.delay(watched.failures)
                log.error("%s did not come back: %s; trying again in %.1f s", name, err, delay)
                continue
            watched.started = time.monotonic()
            self._set_state(watched, UP, how)
            log.warning("%s is back (pid %s), %.1f s after its restart began", name,
                        watched.child.pid(), watched.started - began)
            return

    def _set_state(self, watched: _Watched, state: str, last_exit: str | None) -> None:
        with self._lock:
            watched.state, watched.last_exit, watched.since = state, last_exit, time.time()
        self.up.labels(watched.name).set(1 if state == UP else 0)
