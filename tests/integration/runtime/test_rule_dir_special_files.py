"""A FIFO and a symlink to /dev/zero dropped into the rule directory of a running
`keg up`: both refused (logged with the reason), the last good rules stay, a later
valid change is enforced for a real client, and SIGINT still ends `keg up`.

Regression: the control plane's reload thread opened the FIFO and blocked forever,
so every later change was ignored (/readyz still said ok) and `keg up` could not exit
on SIGINT; /dev/zero (st_size 0) was read until MemoryError, which ended the watch."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from keg.embedded.kafka import EmbeddedKafka
from tests.integration.conftest import create_topic, produce_one
from tests.integration.runtime.test_keg_up import DENY, KegUp, keg_up, rule_dir
from tests.unit.special_files import release

pytestmark = pytest.mark.integration

HANG = 30.0  # seconds after which a change is taken as never applied (a guard, not a check)


def _refusals(up: KegUp, rules: Path) -> int:
    return len(re.findall(rf"rule set in {re.escape(str(rules))} refused", up.output))


def _wait_for_refusal(up: KegUp, rules: Path, count: int, *names: str) -> None:
    """The `count`th refusal of the directory is logged, naming each of `names`."""
    deadline = time.monotonic() + HANG
    while _refusals(up, rules) < count:
        assert up.process.poll() is None, up.output
        assert time.monotonic() < deadline, (
            f"the rule directory was never read again (refusal {count}):\n{up.output}")
        time.sleep(0.1)
    for name in names:
        up.wait_for(rf"{re.escape(str(rules / name))}: cannot read: not a regular file",
                    timeout=HANG)


def test_a_fifo_and_a_dev_zero_link_in_the_rule_directory_do_not_stop_reloads(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    rules = rule_dir(tmp_path, "rules", "a.")
    later = create_topic(kafka.bootstrap, name=f"b.{time.monotonic_ns()}")
    fifo, zero = rules / "fifo.yaml", rules / "zero.yaml"
    with keg_up(kafka, work, tmp_path / "cache", rules) as up:
        try:
            assert produce_one(up.bootstrap, later) is None, up.output
            # The FIFO first: sorted before zero.yaml, it is what a reload meets first
            # (without the fix nothing ever reads /dev/zero whole here).
            os.mkfifo(fifo)
            zero.symlink_to("/dev/zero")
            _wait_for_refusal(up, rules, 1, "fifo.yaml", "zero.yaml")

            # Fixed: the special files go, a rule denying b.* comes.
            zero.unlink()
            fifo.unlink()
            (rules / "more.yaml").write_text(DENY.format("b.").replace("deny-produce",
                                                                       "deny-b"))
            deadline = time.monotonic() + HANG
            while (outcome := produce_one(up.bootstrap, later)) is None:
                assert time.monotonic() < deadline, (
                    f"the valid change was never applied:\n{up.output}")
                time.sleep(0.5)
            assert outcome == "TOPIC_AUTHORIZATION_FAILED", up.output

            # A FIFO in the directory at shutdown: SIGINT still ends keg up.
            os.mkfifo(rules / "again.yaml")
            _wait_for_refusal(up, rules, 2, "again.yaml")
            try:
                assert up.stop() == 0, up.output
            except subprocess.TimeoutExpired:
                raise AssertionError(f"keg up did not exit on SIGINT:\n{up.output}") from None
            assert "Traceback" not in up.output and "MemoryError" not in up.output, up.output
        finally:
            if zero.is_symlink():
                zero.unlink()
            for pipe in (fifo, rules / "again.yaml"):
                if pipe.exists():
                    release(pipe)
            if up.process.poll() is None and not _stopped(up):
                up.process.kill()


def _stopped(up: KegUp) -> bool:
    try:
        up.stop()
    except subprocess.TimeoutExpired:
        return False
    return True


def test_a_rule_file_swapped_for_one_of_the_same_size_and_time_is_applied(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """Kubernetes mounts a ConfigMap as `name -> ..data/name`, `..data -> ..<version>`,
    and swaps `..data` for a new version. A new file of the same size and modification
    time (`cp -p`, `rsync -a` and reproducible builds keep times too) was never noticed:
    the old rules stayed enforced (regression). The file a name leads to now counts."""
    from keg.gateway import Gateway
    from tests.integration.conftest import gateway_settings

    rules = tmp_path / "rules"
    rules.mkdir()
    for version, prefix in (("..v1", "aa."), ("..v2", "bb.")):
        (rules / version).mkdir()
        (rules / version / "k8s.yaml").write_text(
            f"rules:\n  - id: deny\n    match: {{apis: [Produce], topics: {{prefix: "
            f"[{prefix}]}}}}\n    action: {{deny: {{}}}}\n")
    first, second = rules / "..v1" / "k8s.yaml", rules / "..v2" / "k8s.yaml"
    os.utime(second, ns=(first.stat().st_atime_ns, first.stat().st_mtime_ns))
    (rules / "..data").symlink_to("..v1")
    (rules / "k8s.yaml").symlink_to("..data/k8s.yaml")
    aa = create_topic(kafka.bootstrap, name=f"aa.{time.monotonic_ns()}")
    bb = create_topic(kafka.bootstrap, name=f"bb.{time.monotonic_ns()}")
    with Gateway(gateway_settings(kafka, tmp_path / "work", rules_dir=rules)) as gateway:
        assert produce_one(gateway.bootstrap, aa) == "TOPIC_AUTHORIZATION_FAILED"
        assert produce_one(gateway.bootstrap, bb) is None
        (rules / "..data.tmp").symlink_to("..v2")
        os.replace(rules / "..data.tmp", rules / "..data")  # the swap, atomic
        deadline = time.monotonic() + HANG
        while produce_one(gateway.bootstrap, bb) is None:
            assert time.monotonic() < deadline, "the swapped rule file was never applied"
            time.sleep(0.5)
        assert produce_one(gateway.bootstrap, aa) is None
