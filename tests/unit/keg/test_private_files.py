"""The files keg writes for itself are its user's only: 0600, in directories it creates
0700, whatever the umask -- also files made later (audit rotation, a new rule cache)
and files an older keg left 0644."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.store import Change, open_store
from ext_proc.audit import JsonlAuditLog
from ext_proc.filters.rules import RuleEngine
from ext_proc.rule_subscription import RuleSubscription, encode_rule_set
from filter_rules import CompiledRuleSet, Rule, RuleSet, load_rule_text
from keg.state import DirectoryLock


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """022, as on most systems: without keg's care, files come out 0644."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_audit_files_are_private_after_rotation_too(tmp_path: Path) -> None:
    for backups in (2, 0):  # rotation renames, or truncates when no backups are kept
        path = tmp_path / f"logs-{backups}" / "audit.jsonl"
        with JsonlAuditLog(path, max_bytes=300, backups=backups) as audit:
            for n in range(40):
                audit.emit({"event": "denied", "n": n, "padding": "x" * 50})
        files = sorted(path.parent.iterdir())
        assert len(files) == backups + 1
        assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
        assert mode(path.parent) == 0o700


def test_an_older_audit_file_left_0644_is_narrowed(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    path = tmp_path / "audit.jsonl"
    path.write_text("{}\n")
    path.chmod(0o644)
    JsonlAuditLog(path).close()
    assert mode(path) == 0o600 and path.read_text() == "{}\n"  # appended to, not replaced
    assert mode(tmp_path) == 0o755  # a directory that was there is the operator's


def test_the_rule_cache_is_private(tmp_path: Path) -> None:
    cache = tmp_path / "state" / "keg-rules.json"
    subscription = RuleSubscription("unused:1", RuleEngine(CompiledRuleSet(RuleSet())), "xp",
                                    cache_file=cache)
    rules = load_rule_text("rules:\n  - id: d\n    action: {deny: {}}\n", "r.yaml")
    subscription.apply("1", [encode_rule_set(rules)])
    assert (mode(cache), mode(cache.parent)) == (0o600, 0o700)
    cache.chmod(0o644)  # an older keg's
    subscription.apply("2", [encode_rule_set(RuleSet())])  # a new file, renamed over it
    assert mode(cache) == 0o600
    assert [p.name for p in cache.parent.iterdir()] == ["keg-rules.json"]  # no .tmp left


def test_the_sqlite_store_is_private(tmp_path: Path) -> None:
    older = tmp_path / "older"
    older.mkdir()
    (older / "control-plane.sqlite3-wal").write_bytes(b"")
    (older / "control-plane.sqlite3-wal").chmod(0o644)
    for data_dir in (tmp_path / "store", older):
        store = open_store(None, data_dir)
        store.put_rule(Rule.model_validate({"id": "a", "action": {"observe": {}}}), Change("t"))
        files = {p.name: mode(p) for p in data_dir.iterdir()}
        assert files == {"control-plane.sqlite3": 0o600, "control-plane.sqlite3-wal": 0o600,
                         "control-plane.sqlite3-shm": 0o600}
        store.close()
    assert mode(tmp_path / "store") == 0o700


def test_keg_ups_state_directory_is_private(tmp_path: Path) -> None:
    with DirectoryLock(tmp_path / "up" / "rules-0123", "keg up's state") as lock:
        assert mode(lock.directory) == 0o700
        assert mode(lock.directory / ".keg.lock") == 0o600
