"""Rule sets far over gRPC's 4 MiB default, through real parts: 100,000 rules from the
control plane to the ext_proc service of a real gateway, enforced on a real client;
and an instance that accepts less NACKs visibly, so `keg apply --wait` names it.

Delivery times are printed (docs/xds.md has the figures), never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from control_plane.providers import StaticRuleProvider
from control_plane.service import ControlPlaneSettings, free_port
from control_plane.snapshot import RULES
from filter_rules import Rule, RuleSet, load_rule_text
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import ApiOptions, BackgroundLoop, ControlPlaneApp, Gateway
from tests.integration.conftest import create_topic, gateway_settings, produce_one

pytestmark = pytest.mark.integration

TOKEN = "large-rules-token-0123456789"


def deny_rules(count: int, prefix: str = "tenant") -> list[Rule]:
    return [Rule.model_validate({
        "id": f"deny-{prefix}-{i}",
        "match": {"apis": ["Produce"], "topics": {"prefix": [f"{prefix}-{i}."]}},
        "action": {"deny": {}}}) for i in range(count)]


def wait_until(what: str, predicate: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout} s"
        time.sleep(0.1)
    return time.monotonic() - started


def test_100k_rules_reach_the_ext_proc_service_and_a_deny_among_them_holds(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """100,000 rules are about 40 MB as the control plane sends them: gRPC's 4 MiB
    default receive limit dropped them without a NACK, and the new deny rules were
    never enforced. Now the ext_proc service ACKs them and a real producer is denied
    by rule 73,000."""
    started = time.monotonic()
    large = RuleSet(rules=deny_rules(100_000))
    print(f"\n100,000 rules built in {time.monotonic() - started:.1f} s")
    provider = StaticRuleProvider(load_rule_text(
        "rules:\n  - id: observe\n    action: {observe: {audit: false}}\n"), version="1")
    denied = create_topic(kafka.bootstrap, name=f"tenant-73000.{time.monotonic_ns()}")
    allowed = create_topic(kafka.bootstrap, name=f"other-73000.{time.monotonic_ns()}")
    settings = gateway_settings(kafka, tmp_path / "work", rules_provider=provider)
    with Gateway(settings) as gateway:
        assert produce_one(gateway.bootstrap, denied) is None  # before: no deny rule

        def ext_proc_runs() -> dict[str, Any]:
            try:
                nodes = gateway.fleet_status()
            except TimeoutError:  # the control plane's loop did not answer in 10 s
                return {"applied_version": None, "last_nack": None}
            (node,) = [n for n in nodes if n["role"] == "ext_proc"]
            state: dict[str, Any] = node["types"]["keg.v1.RuleSet"]
            return state

        started = time.monotonic()
        provider.set(large, version="2")
        took = wait_until("the ext_proc service ACKs the 100,000 rules",
                          lambda: ext_proc_runs()["applied_version"] == "2", timeout=600)
        assert ext_proc_runs()["last_nack"] is None
        print(f"100,000 rules: provider -> ext_proc ACK in {took:.1f} s "
              f"(encode, send, decode, validate, compile, install)")
        assert produce_one(gateway.bootstrap, denied) == "TOPIC_AUTHORIZATION_FAILED"
        assert produce_one(gateway.bootstrap, allowed) is None
        cache = gateway.rules_cache_file
        assert cache.stat().st_size > 4 * 1024 * 1024
        assert json.loads(cache.read_bytes())["version"] == "2"


def write_rules(directory: Path, count: int, extra: str = "") -> None:
    """`count` deny rules in files of 1,000 (one rule file holds at most 200,000 values)."""
    for old in directory.glob("*.yaml"):
        old.unlink()
    for start in range(0, count, 1000):
        (directory / f"rules-{start // 1000:03d}.yaml").write_text("rules:\n" + "".join(
            f"  - id: deny-{i}\n    match: {{apis: [Produce], topics: {{prefix: [t{i}.]}}}}\n"
            "    action: {deny: {}}\n" for i in range(start, min(count, start + 1000))))
    if extra:
        (directory / "extra.yaml").write_text(extra)


def test_an_instance_that_accepts_less_nacks_and_keg_apply_wait_names_it(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """The control plane as deployed (store, REST API, xDS) and real `keg ext-proc`
    children. 12,000 rules (5 MB) reach an instance with the default limit: `keg apply
    --wait` returns 0. An instance started with --max-rule-set-bytes 1048576 cannot
    take them: the control plane NACKs for it; a new version it refuses first is
    rejected (the fleet goes back to version 1, which it refuses too), and `keg apply
    --wait` exits 6 naming the instance and both sizes (it waited out its timeout when
    the instance's last NACK was of version 1)."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"ci:{TOKEN}\n")
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n")
    loop = BackgroundLoop()
    process = ControlPlaneApp(
        ControlPlaneSettings(bootstrap_servers=kafka.bootstrap, ext_proc_host="127.0.0.1",
                             ext_proc_port=1, listen_port_base=0),
        ApiOptions(data_dir=tmp_path / "store", port=0, tokens_file=tokens,
                   public_reads=True))
    children: dict[str, subprocess.Popen[bytes]] = {}
    try:
        plane = loop.run(process.start(), timeout=60)
        api = f"http://127.0.0.1:{process.api_server.port}"

        def ext_proc(name: str, *extra: str) -> None:
            children[name] = subprocess.Popen([
                sys.executable, "-m", "keg", "ext-proc", "--port", str(free_port()),
                "--control-plane", f"127.0.0.1:{plane.xds_port}", "--node-id", name,
                "--rules-cache", str(tmp_path / f"{name}.json"), "--log-level", "WARNING",
                *extra])

        def fleet() -> dict[str, Any]:
            with urllib.request.urlopen(f"{api}/v1/fleet", timeout=10) as response:
                nodes = json.loads(response.read())["nodes"]
            return {n["node_id"]: n["types"].get(RULES.rsplit("/", 1)[-1], {})
                    for n in nodes if n["role"] == "ext_proc" and n["connected"]}

        def keg_apply(directory: Path) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "keg", "apply", str(directory), "--api", api,
                 "--token-file", str(token_file), "--wait", "--wait-timeout", "300"],
                capture_output=True, text=True, timeout=600)

        ext_proc("xp-default")
        wait_until("xp-default connects", lambda: "xp-default" in fleet(), timeout=120)
        rules = tmp_path / "rules"
        rules.mkdir()
        write_rules(rules, 12_000)
        started = time.monotonic()
        done = keg_apply(rules)
        assert done.returncode == 0, done.stdout + done.stderr
        print(f"\n12,000 rules: keg apply --wait -> ACK in {time.monotonic() - started:.1f} s")
        assert fleet()["xp-default"]["applied_version"] == "1"

        # An instance that accepts 1 MiB is served version 1 as it connects: NACKed
        # for it. Version 1, which xp-default applied, stays served (an instance's
        # refusal of a version the fleet runs is that instance's trouble).
        ext_proc("xp-small", "--max-rule-set-bytes", "1048576")
        wait_until("xp-small's NACK", lambda: (fleet().get("xp-small") or {}).get("last_nack")
                   is not None, timeout=120)
        nack = fleet()["xp-small"]["last_nack"]
        assert nack["version"] == "1"
        assert "more than the 1048576 this node accepts" in nack["error"]
        first = process.store.verdict(1)
        assert first is not None and first.status == "applied"

        write_rules(rules, 12_000, extra="rules:\n  - id: one-more\n    action: {deny: {}}\n")
        done = keg_apply(rules)
        output = done.stdout + done.stderr
        assert done.returncode == 6, output
        assert "NACK xp-small refused version 2: not sent: version 2 is" in output, output
        assert "more than the 1048576 this node accepts" in output
        verdict = process.store.verdict(2)
        assert verdict is not None and verdict.status == "rejected"
        assert verdict.node == "xp-small"
    finally:
        for child in children.values():
            child.terminate()
            child.wait(30)
        loop.run(process.stop(), timeout=60)
        loop.close()
