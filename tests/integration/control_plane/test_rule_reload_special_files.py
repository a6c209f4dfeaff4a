"""A FIFO and a symlink to /dev/zero dropped into a watched rule directory (the gateway
of `gateway_settings`: the control plane and the ext_proc service both watch it): both
are refused, and a valid change written after them is enforced for a real client.
Regression: the reload thread opened the FIFO and blocked forever, so every later
change was ignored. (tests/integration/runtime/test_rule_dir_special_files.py: the same
through `keg up`, and its exit on SIGINT.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from control_plane.providers import DirectoryRuleProvider
from filter_rules import load_rule_dir
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, gateway_settings, produce_one, rule_dir
from tests.unit.special_files import release

pytestmark = pytest.mark.integration

HANG = 30.0  # seconds after which a change is taken as never applied (a guard, not a check)


def _deny(prefix: str, rule_id: str) -> str:
    return (f"rules:\n  - id: {rule_id}\n    match: {{apis: [Produce], topics: "
            f"{{prefix: [{prefix}]}}}}\n    action: {{deny: {{}}}}\n")


def test_a_fifo_and_a_dev_zero_link_do_not_stop_later_reloads(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    rules = rule_dir(tmp_path / "rules", {"deny.yaml": _deny("a.", "deny-a")})
    later = create_topic(kafka.bootstrap, name=f"b.{time.monotonic_ns()}")
    fifo, zero = rules / "fifo.yaml", rules / "zero.yaml"
    with Gateway(gateway_settings(kafka, tmp_path / "work", rules_dir=rules)) as gateway:
        try:
            assert gateway.control_plane is not None
            provider = gateway.control_plane.rules
            assert isinstance(provider, DirectoryRuleProvider)
            assert produce_one(gateway.bootstrap, later) is None
            # The FIFO first: sorted before zero.yaml, it is what a reload meets first
            # (without the fix nothing ever reads /dev/zero whole here).
            os.mkfifo(fifo)
            zero.symlink_to("/dev/zero")
            deadline = time.monotonic() + HANG
            while provider.last_error is None:
                assert time.monotonic() < deadline, "the rule directory was never read again"
                time.sleep(0.1)
            refused = provider.last_error
            assert f"{fifo}: cannot read: not a regular file (a FIFO)" in refused
            assert f"{zero}: cannot read: not a regular file (a character device)" in refused

            zero.unlink()
            fifo.unlink()
            (rules / "more.yaml").write_text(_deny("b.", "deny-b"))
            fixed = load_rule_dir(rules).version
            deadline = time.monotonic() + HANG
            while provider.current()[0] != fixed:
                assert time.monotonic() < deadline, "the valid change was never applied"
                time.sleep(0.1)
            assert provider.last_error is None
            # Enforced by the ext_proc service (its own watch of the directory, or the
            # control plane's xDS): the record is refused, once it has the new rules.
            while (outcome := produce_one(gateway.bootstrap, later)) is None:
                assert time.monotonic() < deadline, "the valid change was never enforced"
                time.sleep(0.5)
            assert outcome == "TOPIC_AUTHORIZATION_FAILED"
        finally:
            if zero.is_symlink():
                zero.unlink()
            if fifo.exists():
                release(fifo)
