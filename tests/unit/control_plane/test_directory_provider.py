"""The control plane's watched rule directory (`keg up`'s rule source) never stops
watching: a reload that fails in an unexpected way (a MemoryError, a bug) is logged with
the directory, the last good rule set stays, and a later change is applied. Regression:
the exception ended the watch task silently, and every later edit was ignored."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

import ext_proc.rule_source
from control_plane.providers import DirectoryRuleProvider
from filter_rules import RuleSet, load_rule_dir
from tests.unit.special_files import HANG, fifo, release, zero_link


def _rules(rule_id: str) -> str:
    return f"rules:\n  - id: {rule_id}\n    action: {{deny: {{}}}}\n"


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG  # a hang guard, not a timing check
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.01)


def _run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("a bug")])
def test_an_unexpected_error_in_one_reload_does_not_stop_later_reloads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        error: Exception) -> None:
    (tmp_path / "rules.yaml").write_text(_rules("first"))
    provider = DirectoryRuleProvider(tmp_path, interval=0.01)
    first = provider.current()[0]
    published: list[str] = []
    provider.subscribe(lambda version, _ruleset: published.append(version))
    calls: list[int] = []
    real_read = provider.read

    def read() -> RuleSet:
        calls.append(1)
        if len(calls) == 1:
            raise error
        return real_read()

    monkeypatch.setattr(provider, "read", read)

    async def scenario() -> None:
        watch = asyncio.create_task(provider.watch())
        try:
            (tmp_path / "rules.yaml").write_text(_rules("second"))
            await _until(lambda: bool(calls), "the second version was read")
            await asyncio.sleep(0.1)  # several polls: the watch goes on (or has ended)
            assert provider.current()[0] == first and published == []
            (tmp_path / "rules.yaml").write_text(_rules("third"))
            third = load_rule_dir(tmp_path).version
            await _until(lambda: provider.current()[0] == third,
                         "the third version was applied after the failed reload")
            assert published == [third] and provider.last_error is None
            assert not watch.done()
        finally:
            watch.cancel()

    with caplog.at_level(logging.ERROR, logger="control_plane.providers"):
        _run(scenario)
    (failure,) = [r for r in caplog.records if "failed" in r.getMessage()]
    assert str(tmp_path) in failure.getMessage() and first in failure.getMessage()
    assert type(error).__name__ in failure.getMessage() and failure.exc_info is not None


def test_an_error_of_the_watch_itself_does_not_end_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
        ) -> None:
    """Listing the directory failed once (a bug, a file system's hiccup): logged, and the
    watch goes on."""
    (tmp_path / "rules.yaml").write_text(_rules("first"))
    provider = DirectoryRuleProvider(tmp_path, interval=0.01)
    real_signature = ext_proc.rule_source.directory_signature
    failed: list[int] = []

    def signature(directory: Path) -> ext_proc.rule_source.Signature:
        if not failed:
            failed.append(1)
            raise RuntimeError("listing failed")
        return real_signature(directory)

    monkeypatch.setattr(ext_proc.rule_source, "directory_signature", signature)

    async def scenario() -> None:
        watch = asyncio.create_task(provider.watch())
        try:
            await _until(lambda: bool(failed), "the watch listed the directory")
            (tmp_path / "rules.yaml").write_text(_rules("second"))
            second = load_rule_dir(tmp_path).version
            await _until(lambda: provider.current()[0] == second, "the change was applied")
        finally:
            watch.cancel()

    with caplog.at_level(logging.ERROR, logger="control_plane.providers"):
        _run(scenario)
    assert any(str(tmp_path) in r.getMessage() and "watching on" in r.getMessage()
               for r in caplog.records)


def test_a_fifo_and_a_dev_zero_link_are_refused_and_later_changes_applied(
        tmp_path: Path) -> None:
    """The tester's case, on the provider: the FIFO (first in name order, so that without
    the fix nothing reads /dev/zero) blocked the reload thread for good."""
    (tmp_path / "rules.yaml").write_text(_rules("first"))
    provider = DirectoryRuleProvider(tmp_path, interval=0.01)
    first = provider.current()[0]
    pipe = fifo(tmp_path / "a-fifo.yaml")
    zero = zero_link(tmp_path / "zero.yaml")

    async def scenario() -> None:
        watch = asyncio.create_task(provider.watch())
        try:
            await _until(lambda: provider.last_error is not None, "the set was refused")
            refused = str(provider.last_error)
            assert f"{pipe}: cannot read: not a regular file (a FIFO)" in refused
            assert f"{zero}: cannot read: not a regular file (a character device)" in refused
            assert provider.current()[0] == first
            zero.unlink()
            pipe.unlink()
            (tmp_path / "rules.yaml").write_text(_rules("second"))
            second = load_rule_dir(tmp_path).version
            await _until(lambda: provider.current()[0] == second, "the fix was applied")
        finally:
            watch.cancel()
            # Without the fix a worker thread is blocked opening the FIFO, and the loop
            # would wait for it at its end: let it go (to no /dev/zero).
            if zero.is_symlink():
                zero.unlink()
            if pipe.exists():
                release(pipe)

    _run(scenario)


def test_a_rule_that_moves_within_its_file_is_published_with_its_new_line(
        tmp_path: Path) -> None:
    """Lines added above a rule leave the rule set's version as it was (sources are not
    part of it): the provider kept the old set, and the API showed the rule's old line
    (regression). The same version with new sources is published."""
    (tmp_path / "rules.yaml").write_text(_rules("moved"))
    provider = DirectoryRuleProvider(tmp_path, interval=0.01)
    version, before = provider.current()
    line = before.sources["moved"].line
    assert line is not None
    published: list[tuple[str, int | None]] = []
    provider.subscribe(lambda v, ruleset: published.append((v, ruleset.sources["moved"].line)))
    (tmp_path / "rules.yaml").write_text("# a comment\n# and another\n" + _rules("moved"))
    assert provider.use(provider.read())
    assert published == [(version, line + 2)]
    assert provider.current()[1].sources["moved"].line == line + 2
    assert not provider.use(provider.read())  # nothing moved since: nothing published
