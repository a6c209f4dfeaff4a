"""What a real `keg up` leaves on disk: its state (rule store, rule cache, audit log) is
its user's only, and runs do not pile rule caches up in it."""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from keg.embedded.kafka import EmbeddedKafka
from tests.integration.conftest import create_topic, produce_one
from tests.integration.runtime.test_keg_up import keg_up, rule_dir

pytestmark = pytest.mark.integration


@pytest.fixture
def usual_umask() -> Iterator[None]:
    """022 (inherited by `keg up`), as on most systems: files default to 0644."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


PRIVATE = ("control-plane.sqlite3", "control-plane.sqlite3-wal", "control-plane.sqlite3-shm",
           "keg-rules.json", ".keg.lock")


def modes(directory: Path) -> dict[str, int]:
    return {path.name: stat.S_IMODE(path.stat().st_mode) for path in directory.iterdir()
            if path.is_file()}


@pytest.mark.usefixtures("usual_umask")
def test_keg_up_keeps_its_state_private_and_one_rule_cache(kafka: EmbeddedKafka,
                                                          tmp_path: Path) -> None:
    """Two runs on one rule directory. The rule store (with SQLite's -wal and -shm),
    the ext_proc rule cache and the audit log were 0644 in a 0755 directory, and every
    run left a keg-rules-<port>.json behind (now: one per worker, removed at stop)."""
    rules = rule_dir(tmp_path, "rules", "private.")
    topic = create_topic(kafka.bootstrap, name=f"private.{time.monotonic_ns()}")
    state = None
    for _ in range(2):
        with keg_up(kafka, tmp_path, tmp_path / "cache", rules, "--ext-proc-workers", "2") as up:
            assert produce_one(up.bootstrap, topic) == "TOPIC_AUTHORIZATION_FAILED"  # audited
            state = Path(up.wait_for(r"state: (\S+)").group(1))
            files = modes(state)
            kept = {name: files.get(name) for name in PRIVATE}
            assert kept == dict.fromkeys(PRIVATE, 0o600), files
            # The audit logs (one per ext_proc worker, which wrote the denial's) too.
            audits = modes(state / "audit")
            assert audits and set(audits.values()) == {0o600}, audits
            assert stat.S_IMODE((state / "audit").stat().st_mode) == 0o700
            # One rule cache per ext_proc worker, the same names each run.
            assert sorted(name for name in files if re.match(r"keg-rules", name)) == [
                "keg-rules-1.json", "keg-rules.json"]
            # Envoy's own files (its bootstrap, log, admin address) are in there too.
            assert stat.S_IMODE(state.stat().st_mode) == 0o700
            assert up.stop() == 0, up.output
        assert not list(state.glob("keg-rules*")), sorted(p.name for p in state.iterdir())
