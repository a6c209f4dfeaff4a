"""Where the data path's rules come from: a rule directory, watched for changes.

A change is applied only if the whole directory validates; otherwise the errors are
logged (file:line each) and the last good rule set stays. Live connections pick the
new rules up on their next request, and nothing is closed. A directory is read off
the event loop, and only once it holds still (`WatchedDirectory`).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

from ext_proc.defaults import DEFAULT_POLL_INTERVAL_S
from ext_proc.filters.rules import RuleEngine
from ext_proc.heap import building
from ext_proc.metrics import Metrics
from filter_rules import CompiledRuleSet, RuleSetInvalid, load_rule_dir
from interceptors.engine import RecordEngine

log = logging.getLogger(__name__)


# Per rule file: name, mtime, size, device, inode, ctime (of the file it leads to).
Signature = tuple[tuple[str, int, int, int, int, int], ...]
Loaded = TypeVar("Loaded")


def directory_signature(directory: Path) -> Signature:
    """What changes when a rule file is added, removed, written or replaced. The file a
    name leads to (symlinks followed) counts, not only its size and time: a file swapped
    for another of the same size and modification time (Kubernetes' ConfigMap volumes
    swap a `..data` symlink; `cp -p`, `rsync -a` and reproducible builds keep times) is
    a change too."""
    entries = []
    for path in sorted(directory.glob("*.y*ml")):
        try:
            stat = path.stat()
        except OSError:
            continue
        entries.append((path.name, stat.st_mtime_ns, stat.st_size, stat.st_dev, stat.st_ino,
                        stat.st_ctime_ns))
    return tuple(entries)


def load_compiled(directory: Path) -> CompiledRuleSet:
    return CompiledRuleSet(load_rule_dir(directory))


class WatchedDirectory(Generic[Loaded]):
    """A rule directory polled for changes: `watch()` reloads it whenever a file was
    added, removed or written since the last reload.

    A directory is read only once it held still for one interval (two polls saw the
    same files), and what was read is used only if no file changed while it was read:
    a directory being written (a copy, a checkout, an editor) is never taken
    half-written; it is read again at the next poll. `watch()` reads in a worker
    thread, never on the event loop. Subclasses say how to read (`read`, any thread),
    what to do with a valid result (`use`) and with an invalid one (`refused`), and
    whether `use` may run in the worker thread too (`use_in_worker`)."""

    use_in_worker: ClassVar[bool] = False

    def __init__(self, directory: Path, interval: float = DEFAULT_POLL_INTERVAL_S) -> None:
        self.directory = directory
        self.interval = interval
        self._signature: Signature | None = directory_signature(directory)

    def read(self) -> Loaded:
        """Load the directory (RuleSetInvalid when it is invalid)."""
        raise NotImplementedError

    def use(self, loaded: Loaded) -> bool:
        """Put what was read to use; whether it changed anything."""
        raise NotImplementedError

    def refused(self, err: RuleSetInvalid) -> None:
        raise NotImplementedError

    def reload(self) -> bool:
        """Read the directory now and use it; False when it is invalid (the last good
        rules stay) or changed while it was read."""
        with building():  # no garbage collection walking the new rules meanwhile
            return self._use(self._read_stable())

    async def reload_async(self) -> bool:
        """`reload`, with the reading (and `use` if `use_in_worker`) in a worker thread."""
        if self.use_in_worker:
            return await asyncio.to_thread(self.reload)
        with building():
            loaded = await asyncio.to_thread(self._read_stable)
        return self._use(loaded)

    def _read_stable(self) -> Loaded | RuleSetInvalid | None:
        """What the directory holds, or None if a file changed while it was read."""
        self._signature = directory_signature(self.directory)  # what `watch` compares to
        try:
            loaded: Loaded | RuleSetInvalid = self.read()
        except RuleSetInvalid as err:
            loaded = err
        if directory_signature(self.directory) != self._signature:
            self._signature = None  # read it again once it holds still
            log.info("%s changed while it was read: reading it again", self.directory)
            return None
        return loaded

    def _use(self, outcome: Loaded | RuleSetInvalid | None) -> bool:
        if outcome is None:
            return False
        if isinstance(outcome, RuleSetInvalid):
            self.refused(outcome)
            return False
        return self.use(outcome)

    def failed(self, err: Exception) -> None:
        """Reading or using the directory raised something other than an invalid rule
        set (a MemoryError, a bug, a file system's hiccup): the last good rules stay and
        the next change is read again; the watch never ends on an error."""
        log.error("reading the rule directory %s failed, keeping the last good rules: "
                  "%s: %s; watching on", self.directory, type(err).__name__, err, exc_info=err)

    async def watch(self) -> None:
        settled = self._signature
        while True:
            await asyncio.sleep(self.interval)
            try:
                now = await asyncio.to_thread(directory_signature, self.directory)
                if now == self._signature:
                    settled = now
                    continue
                if now != settled:  # still changing: wait until it holds still
                    settled = now
                    continue
                await self.reload_async()
            except Exception as err:
                self.failed(err)


_Loaded = tuple[CompiledRuleSet, tuple[RecordEngine, CompiledRuleSet]]


class RuleDirectory(WatchedDirectory[_Loaded]):
    """The ext_proc service's own rule directory: compiled and built in a worker thread,
    swapped into the engine on the event loop (live connections use it there)."""

    def __init__(self, directory: Path, engine: RuleEngine, metrics: Metrics | None = None,
                 interval: float = DEFAULT_POLL_INTERVAL_S) -> None:
        super().__init__(directory, interval)
        self.engine = engine
        self.metrics = metrics

    def read(self) -> _Loaded:
        compiled = load_compiled(self.directory)
        return compiled, self.engine.prepare(compiled)

    def refused(self, err: RuleSetInvalid) -> None:
        log.error("rule set in %s refused, keeping version %s:\n%s", self.directory,
                  self.engine.compiled.version, err)
        if self.metrics is not None:
            self.metrics.rule_reload("rejected")

    def use(self, loaded: _Loaded) -> bool:
        compiled, built = loaded
        self.engine.install(compiled, built)
        log.info("rule set version %s applied: %d rules from %s", compiled.version,
                 len(compiled), self.directory)
        if self.metrics is not None:
            self.metrics.rule_reload("applied")
            self.metrics.set_rule_set_version(compiled.version)
        return True
