"""Where the control plane's rules come from: a `RuleProvider` (current + subscribe).

Two sources exist: a rule directory, watched (GitOps without a store), and the
store behind the REST API, which has the same face (`current()` and
`subscribe(callback)`). The control plane reads `current()` whenever a provider
calls back, so callbacks carry no arguments it relies on, and may come from any
thread (the service hops back onto its event loop). A provider that has
`verdict(version, node_id, error)` hears every ext_proc instance's ACK (`error` None)
and NACK of its versions: the store keeps them and stops serving a rejected version.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ext_proc.defaults import DEFAULT_POLL_INTERVAL_S
from ext_proc.heap import building
from ext_proc.rule_source import WatchedDirectory
from filter_rules import RuleSet, RuleSetInvalid, load_rule_dir

log = logging.getLogger(__name__)

Listener = Callable[..., Any]


@runtime_checkable
class RuleProvider(Protocol):
    def current(self) -> tuple[str | int, RuleSet]:
        """The live rule set and its version (a string, or the store's version number)."""
        ...

    def subscribe(self, callback: Listener) -> Any:
        """Call `callback` (from any thread) after the live rule set changed."""
        ...


class _Subscribers:
    def __init__(self) -> None:
        self._callbacks: list[Listener] = []
        self._lock = threading.Lock()

    def subscribe(self, callback: Listener) -> None:
        with self._lock:
            self._callbacks.append(callback)

    def _notify(self, version: str, ruleset: RuleSet) -> None:
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback(version, ruleset)
            except Exception:  # one bad subscriber must not starve the others
                log.exception("rule subscriber failed")


class StaticRuleProvider(_Subscribers):
    """Rules set in code (tests, benchmarks, an embedding application)."""

    def __init__(self, ruleset: RuleSet | None = None, version: str | None = None) -> None:
        super().__init__()
        self._current = self._versioned(ruleset or RuleSet(), version)

    @staticmethod
    def _versioned(ruleset: RuleSet, version: str | None) -> tuple[str, RuleSet]:
        return (version or ruleset.version, ruleset)

    def current(self) -> tuple[str, RuleSet]:
        return self._current

    def set(self, ruleset: RuleSet, version: str | None = None) -> None:
        self._current = self._versioned(ruleset, version)
        self._notify(*self._current)


class DirectoryRuleProvider(_Subscribers, WatchedDirectory[RuleSet]):
    """A rule directory, re-read when its files change (in a worker thread, once they
    hold still); invalid changes are refused (errors logged with file:line,
    `last_error` kept) and the last good set stays, as it does when reading fails in
    any other way: the watch never ends on an error. Subscribers are called from that
    worker thread, so what they do with a large rule set (a store writing a version)
    stays off the event loop."""

    use_in_worker = True

    def __init__(self, directory: Path, interval: float = DEFAULT_POLL_INTERVAL_S,
                 kept: RuleSet | None = None) -> None:
        """`kept`: the directory's rules last in force elsewhere (a store's), which stand
        while its files are invalid at start; without them an invalid directory raises
        RuleSetInvalid (the caller refuses to start)."""
        if not directory.is_dir():
            raise FileNotFoundError(f"rule directory {directory} does not exist")
        _Subscribers.__init__(self)
        WatchedDirectory.__init__(self, directory, interval)
        self.last_error: str | None = None
        try:
            with building():
                ruleset = load_rule_dir(directory)
        except RuleSetInvalid as err:
            if kept is None:
                raise
            self._current = (kept.version, kept)
            self.refused(err)
            return
        self._current = (ruleset.version, ruleset)

    def current(self) -> tuple[str, RuleSet]:
        return self._current

    def read(self) -> RuleSet:
        return load_rule_dir(self.directory)

    def failed(self, err: Exception) -> None:
        self.last_error = f"{type(err).__name__}: {err}"
        log.error("reading the rule directory %s failed, keeping version %s: %s; watching on",
                  self.directory, self._current[0], self.last_error, exc_info=err)

    def refused(self, err: RuleSetInvalid) -> None:
        self.last_error = str(err)
        log.error("rule set in %s refused, keeping version %s:\n%s", self.directory,
                  self._current[0], err)

    def use(self, ruleset: RuleSet) -> bool:
        """Publish `ruleset`; True when it is a new version."""
        self.last_error = None
        version = ruleset.version
        # The same rules moved within their files (a comment added above them) are the
        # same version, but where they are written changed: the API showed the old line.
        if version == self._current[0] and ruleset.sources == self._current[1].sources:
            return False
        self._current = (version, ruleset)
        log.info("rule set version %s loaded from %s (%d rules)", version,
                 self.directory, len(ruleset.rules))
        self._notify(*self._current)
        return True


class StoreRuleProvider:
    """The rule store (control_plane.store.RuleStore, by duck typing) as a provider.

    Its version numbers become xDS versions ("12"); `watch()` polls it so that writes
    made through another control-plane instance (one PostgreSQL) reach this fleet too."""

    def __init__(self, store: Any, interval: float = 2.0) -> None:
        self.store = store
        self.interval = interval

    def current(self) -> tuple[str, RuleSet]:
        number, ruleset = self.store.current()
        return str(number), ruleset

    def subscribe(self, callback: Listener) -> Any:
        return self.store.subscribe(callback)

    def verdict(self, version: str, node_id: str, error: str | None) -> None:
        """An ext_proc instance applied (`error` None) or refused a version: kept in the
        store, where a refusal makes it serve the last good version again."""
        if version.isdigit():
            self.store.record_verdict(int(version), node_id, error)

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await asyncio.to_thread(self.store.poll)
            except Exception as err:  # a database hiccup must not end the watch
                log.warning("rule store poll failed, keeping the last rule set: %s", err)
