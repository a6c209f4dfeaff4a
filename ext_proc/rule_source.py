"""Where the data path's rules come from: a rule directory, watched for changes.

A change is applied only if the whole directory validates; otherwise the errors are
logged (file:line each) and the last good rule set stays. Live connections pick the
new rules up on their next request, and nothing is closed.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from ext_proc.filters.rules import RuleEngine
from ext_proc.metrics import Metrics
from filter_rules import CompiledRuleSet, RuleSetInvalid, load_rule_dir

log = logging.getLogger(__name__)


def directory_signature(directory: Path) -> tuple[tuple[str, int, int], ...]:
    """What changes when a rule file is added, removed or written."""
    entries = []
    for path in sorted(directory.glob("*.y*ml")):
        try:
            stat = path.stat()
        except OSError:
            continue
        entries.append((path.name, stat.st_mtime_ns, stat.st_size))
    return tuple(entries)


def load_compiled(directory: Path) -> CompiledRuleSet:
    return CompiledRuleSet(load_rule_dir(directory))


class WatchedDirectory:
    """A rule directory polled for changes: `watch()` calls `reload()` (the subclass's)
    whenever a file was added, removed or written since the last reload."""

    def __init__(self, directory: Path, interval: float = 1.0) -> None:
        self.directory = directory
        self.interval = interval
        self._signature = directory_signature(directory)

    def reload(self) -> bool:
        raise NotImplementedError

    def _seen(self) -> None:
        """Called by `reload` first: what it reads is the state `watch` compares to."""
        self._signature = directory_signature(self.directory)

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if directory_signature(self.directory) != self._signature:
                self.reload()


class RuleDirectory(WatchedDirectory):
    def __init__(self, directory: Path, engine: RuleEngine, metrics: Metrics | None = None,
                 interval: float = 1.0) -> None:
        super().__init__(directory, interval)
        self.engine = engine
        self.metrics = metrics

    def reload(self) -> bool:
        """Apply the directory now; False (and the old rules kept) if it is invalid."""
        self._seen()
        try:
            compiled = load_compiled(self.directory)
        except RuleSetInvalid as err:
            log.error("rule set in %s refused, keeping version %s:\n%s", self.directory,
                      self.engine.compiled.version, err)
            if self.metrics is not None:
                self.metrics.rule_reload("rejected")
            return False
        self.engine.install(compiled)
        log.info("rule set version %s applied: %d rules from %s", compiled.version,
                 len(compiled), self.directory)
        if self.metrics is not None:
            self.metrics.rule_reload("applied")
            self.metrics.set_rule_set_version(compiled.version)
        return True
