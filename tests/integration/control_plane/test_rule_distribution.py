"""Rule rollout to 100 ext_proc subscribers (real gRPC clients) with 10 real Envoys on the
same control plane: every round converges; the times are printed (benchmarks/fleet_rollout.py
has the details), never asserted."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks import rule_churn
from benchmarks.fleet_rollout import run
from control_plane.service import ControlPlaneSettings, free_port
from control_plane.store import StoreError
from filter_rules import load_rule_dir
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import ApiOptions, BackgroundLoop, ControlPlaneApp, Gateway
from tests.integration.conftest import (
    create_topic,
    deliver,
    gateway_settings,
    produce_one,
    rule_dir,
)

pytestmark = pytest.mark.integration


def test_rule_write_to_last_ack_with_100_subscribers_and_10_envoys() -> None:
    lines: list[str] = []
    results = run(subscribers=100, envoys=10, rounds=3, report=lines.append)
    print("\n" + "\n".join(lines))
    # Each round waited for every subscriber's ACK (and every Envoy's) or raised.
    assert len(results.rules_s) == 3 and len(results.topology_s) == 3


def _observe_only(rule_id: str) -> str:
    return f"rules:\n  - id: {rule_id}\n    action: {{observe: {{audit: false}}}}\n"


def test_rest_and_directory_changes_reach_every_ext_proc_process(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """The control plane process as deployed: store + REST API + xDS; two `keg ext-proc
    --control-plane` processes. A REST write and a rule-directory change (GitOps) each
    become a store version that both instances ACK."""
    rules_dir = rule_dir(tmp_path / "rules", {"base.yaml": _observe_only("from-git")})
    tokens = tmp_path / "tokens"
    tokens.write_text("ci:s3cret-token-of-the-ci\n")
    loop = BackgroundLoop()
    process = ControlPlaneApp(
        ControlPlaneSettings(bootstrap_servers=kafka.bootstrap, ext_proc_host="127.0.0.1",
                             ext_proc_port=1, listen_port_base=0),
        ApiOptions(data_dir=tmp_path / "store", port=0, tokens_file=tokens, public_reads=True,
                   rules_dir=rules_dir))
    children = []
    try:
        plane = loop.run(process.start(), timeout=60)
        api = f"http://127.0.0.1:{process.api_server.port}"
        for name in ("xp-a", "xp-b"):
            children.append(subprocess.Popen([
                sys.executable, "-m", "keg", "ext-proc", "--port", str(free_port()),
                "--control-plane", f"127.0.0.1:{plane.xds_port}", "--node-id", name,
                "--rules-cache", str(tmp_path / f"{name}.json"), "--log-level", "WARNING"]))

        def applied() -> dict[str, str]:
            with urllib.request.urlopen(f"{api}/v1/fleet", timeout=5) as response:
                body = json.loads(response.read())
            nodes = body if isinstance(body, list) else body.get("nodes", [])
            return {n["node_id"]: n["types"].get("keg.v1.RuleSet", {}).get("applied_version")
                    for n in nodes if n["role"] == "ext_proc" and n["connected"]}

        def wait_for(version: str) -> float:
            started = time.monotonic()
            while applied() != {"xp-a": version, "xp-b": version}:
                assert time.monotonic() - started < 30, applied()
                time.sleep(0.02)
            return time.monotonic() - started

        first = loop.run(_current(process))
        wait_for(first)

        rule = json.dumps({"id": "from-rest", "match": {"apis": ["Produce"],
                           "topics": {"prefix": ["rest."]}}, "action": {"deny": {}}}).encode()
        request = urllib.request.Request(
            f"{api}/v1/rules/from-rest", data=rule, method="PUT",
            headers={"Authorization": "Bearer s3cret-token-of-the-ci", "If-None-Match": "*",
                     "Content-Type": "application/json"})
        started = time.monotonic()
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 201
        second = loop.run(_current(process))
        assert second != first
        wait_for(second)
        print(f"\nREST write -> both ext_proc processes ACKed: {time.monotonic() - started:.2f} s")

        (rules_dir / "base.yaml").write_text(
            "rules:\n  - id: from-git\n    action: {observe: {audit: true}}\n")
        started = time.monotonic()
        while loop.run(_current(process)) == second:
            assert time.monotonic() - started < 30
            time.sleep(0.05)
        third = loop.run(_current(process))
        wait_for(third)
        print(f"rule directory write -> both ACKed: {time.monotonic() - started:.2f} s "
              f"(1 s directory poll included)")

        # GitOps from CI: `keg apply` of another directory, as its own owner.
        team = rule_dir(tmp_path / "team-rules", {"team.yaml": _observe_only("from-apply")})
        token_file = tmp_path / "ci-token"
        token_file.write_text("s3cret-token-of-the-ci\n")
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "keg", "apply", str(team), "--api", api,
                               "--token-file", str(token_file), "--reason", "ci run 42",
                               "--wait"], capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, done.stdout + done.stderr
        fourth = loop.run(_current(process))
        assert fourth != third
        # --wait returned once both instances ran the version: no polling here.
        assert applied() == {"xp-a": fourth, "xp-b": fourth}
        assert f"version {fourth} applied by all 2 connected" in done.stderr
        print(f"keg apply --wait -> both ACKed: {time.monotonic() - started:.2f} s")
        _, live = process.store.current()
        assert {r.id for r in live.rules} == {"from-git", "from-rest", "from-apply"}
    finally:
        for child in children:
            child.terminate()
            child.wait(10)
        loop.run(process.stop(), timeout=30)
        loop.close()


async def _current(process: ControlPlaneApp) -> str:
    number, _ = process.store.current()
    return str(number)


def test_keg_up_gateway_takes_its_rules_from_the_control_plane(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """`keg up`'s default: the ext_proc child subscribes to the in-process control plane,
    and Envoy starts only once it has ACKed the rule set."""
    rules_dir = rule_dir(tmp_path / "rules", {"deny.yaml": (
        "rules:\n  - id: no-up-topics\n    match: {apis: [Produce], topics: {prefix: [up.]}}\n"
        "    action: {deny: {}}\n")})
    settings = gateway_settings(kafka, tmp_path / "envoy", rules_dir=rules_dir,
                                rules_delivery="control-plane")
    with Gateway(settings) as gateway:
        (node,) = [n for n in gateway.fleet_status() if n["role"] == "ext_proc"]
        version = load_rule_dir(rules_dir).version
        assert node["types"]["keg.v1.RuleSet"]["applied_version"] == version
        assert gateway.rules_cache_file == tmp_path / "envoy" / "keg-rules.json"
        assert gateway.rules_cache_file.exists()
        denied = create_topic(kafka.bootstrap, name=f"up.{time.monotonic_ns()}")
        assert produce_one(gateway.bootstrap, denied) == "TOPIC_AUTHORIZATION_FAILED"


@contextlib.contextmanager
def gateway_with_api(kafka: EmbeddedKafka, tmp_path: Path, rules_dir: Path,
                     **overrides: Any) -> Iterator[tuple[Gateway, Any, str]]:
    """`keg up`'s arrangement: the directory applied to the store, the REST API (tokens
    in tmp_path/tokens) and the fleet served from the store. (gateway, store, API URL).
    `overrides`: more GatewaySettings."""
    settings = gateway_settings(
        kafka, tmp_path / "work", rules_dir=rules_dir,
        api=ApiOptions(data_dir=tmp_path / "store", port=0, tokens_file=tmp_path / "tokens"),
        **overrides)
    with Gateway(settings) as gateway:
        assert gateway.app is not None and gateway.app.store is not None
        yield gateway, gateway.app.store, f"http://127.0.0.1:{gateway.app.api_server.port}"


def test_a_rule_set_the_ext_proc_service_refuses_is_rejected_and_never_served(
        kafka: EmbeddedKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`keg up`'s control plane (store, REST API, xDS) and its real ext_proc child. The
    directory's second version names a key the ext_proc service cannot use (its variable
    is given to the workers, with a value that is no key): it NACKs it. The store marks
    it rejected, serves the first version again -- a fresh instance gets that, not the
    rejected one -- and the API and `keg diff` never call it live."""
    monkeypatch.delenv("KEG_TEST_ABSENT_KEY", raising=False)  # the ext_proc child's env
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    deny = ("rules:\n  - id: no-nack-topics\n    match: {apis: [Produce], topics: "
            "{prefix: [nack.]}}\n    action: {deny: {}}\n")
    (rules_dir / "rules.yaml").write_text(deny)
    token = "reader-token-0123456789"
    (tmp_path / "tokens").write_text(f"ci:{token}\n")
    (tmp_path / "token").write_text(f"{token}\n")
    topic = create_topic(kafka.bootstrap, name=f"nack.{time.monotonic_ns()}")
    with gateway_with_api(kafka, tmp_path, rules_dir, ext_proc_env=("KEG_TEST_ABSENT_KEY",),
                          extra_env={"KEG_TEST_ABSENT_KEY": "not a key"}) as (
            gateway, store, api):

        def get(path: str) -> Any:
            request = urllib.request.Request(f"{api}{path}",
                                             headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())

        def ext_proc_runs() -> str | None:
            (node,) = [n for n in gateway.fleet_status() if n["role"] == "ext_proc"]
            return node["types"]["keg.v1.RuleSet"]["applied_version"]

        assert produce_one(gateway.bootstrap, topic) == "TOPIC_AUTHORIZATION_FAILED"
        # Version 2 drops the deny and encrypts with a key the ext_proc host lacks.
        (rules_dir / "rules.yaml").write_text(
            "rules:\n  - id: encrypt-nack\n    match: {topics: {prefix: [nack.]}}\n"
            "    action:\n      encrypt:\n        key: {id: k1, secret: {env: "
            "KEG_TEST_ABSENT_KEY}}\n")
        deadline = time.monotonic() + 30
        while (verdict := store.verdict(2)) is None:  # the directory is polled each second
            assert time.monotonic() < deadline, "version 2 was never answered"
            time.sleep(0.1)
        assert verdict.status == "rejected" and "KEG_TEST_ABSENT_KEY" in verdict.detail
        assert store.current()[0] == 1

        # A fresh ext_proc instance, without the rule cache of the old one, is served
        # the last good version: the deny holds for a real client through Envoy.
        gateway.stop_ext_proc()
        gateway.rules_cache_file.unlink()
        gateway.start_ext_proc()
        gateway.wait_for_rules()
        assert ext_proc_runs() == "1"
        assert produce_one(gateway.bootstrap, topic) == "TOPIC_AUTHORIZATION_FAILED"

        listed = get("/v1/rules")
        assert (listed["version"], listed["status"], listed["live_version"]) == (
            2, "rejected", 1)
        version = get("/v1/versions/2")["info"]
        assert version["status"] == "rejected"
        assert version["status_detail"].startswith("ext-proc-gateway: ")
        assert get("/v1/versions/1")["info"]["status"] == "applied"
        diff = subprocess.run(
            [sys.executable, "-m", "keg", "diff", str(rules_dir), "--api", api,
             "--token-file", str(tmp_path / "token"), "--owner", f"dir:{rules_dir}"],
            capture_output=True, text=True, timeout=60)
        output = diff.stdout + diff.stderr
        assert diff.returncode == 6, output
        assert "version 2 was REJECTED by the fleet" in output
        assert "the fleet runs version 1" in output and "is live" not in output

        # Fixed on the host and applied again (as `keg up` does at start): served, live.
        gateway.stop_ext_proc()
        gateway.settings.extra_env["KEG_TEST_ABSENT_KEY"] = "11" * 32
        gateway.start_ext_proc()
        gateway.wait_for_rules()
        (rules_dir / "rules.yaml").write_text(deny)
        deadline = time.monotonic() + 30
        while store.live() is None or store.live().number != 3:
            assert time.monotonic() < deadline, get("/v1/versions")
            time.sleep(0.1)
        assert ext_proc_runs() == "3"



def test_a_rollback_cannot_take_the_rule_directorys_rules_away(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """The rule directory is the source of truth for its rules, yet a rollback to a
    version before one of them removed it from the store, and the directory never put
    it back (it applies itself only when its files change): a deny in a file stopped
    being enforced. Then the gateway applied the directory again after the rollback,
    which the caller was never told, and the deny was off meanwhile. A rollback now
    keeps the directory's rules as they are and takes the others (REST writes) back."""
    token = "admin-token-0123456789"
    (tmp_path / "tokens").write_text(f"ops:{token}\n")
    (tmp_path / "tokens-only").write_text(f"{token}\n")
    (tmp_path / "tokens-only").chmod(0o600)
    rules = rule_dir(tmp_path / "rules", {
        "watch.yaml": "rules:\n  - id: watch\n    action: {observe: {}}\n"})
    topic = create_topic(kafka.bootstrap, name=f"held.{time.monotonic_ns()}")
    with gateway_with_api(kafka, tmp_path, rules) as (gateway, store, api):

        def runs(number: int) -> None:
            """Until the store serves `number` and the ext_proc service runs it."""
            deadline = time.monotonic() + 30
            while not (store.live() is not None and store.live().number == number and [
                    n for n in gateway.fleet_status() if n["role"] == "ext_proc"
                    and n["types"]["keg.v1.RuleSet"]["applied_version"] == str(number)]):
                assert time.monotonic() < deadline, (number, store.rules()[0])
                time.sleep(0.1)

        def post(path: str, body: bytes | None = None, method: str = "POST") -> Any:
            request = urllib.request.Request(f"{api}{path}", data=body, method=method, headers={
                "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())

        assert produce_one(gateway.bootstrap, topic) is None
        (rules / "deny.yaml").write_text(
            "rules:\n  - id: deny-held\n    match: {apis: [Produce], topics: {prefix: [held.]}}\n"
            "    action: {deny: {}}\n")
        runs(2)
        assert produce_one(gateway.bootstrap, topic) == "TOPIC_AUTHORIZATION_FAILED"
        post("/v1/rules/from-rest", b'{"action": {"observe": {}}}', method="PUT")
        runs(3)

        assert post("/v1/versions/1/rollback")["number"] == 4
        runs(4)
        assert {r.id for r in store.rules()[1]} == {"watch", "deny-held"}
        assert produce_one(gateway.bootstrap, topic) == "TOPIC_AUTHORIZATION_FAILED"
        time.sleep(2)  # the directory is polled each second: nothing for it to undo
        assert store.rules()[0] == 4

        # `keg apply` as the served directory's owner: its version was undone by the
        # directory in the same millisecond while the CLI said "applied". Refused now.
        other = rule_dir(tmp_path / "elsewhere", {
            "open.yaml": "rules:\n  - id: deny-held\n    action: {observe: {}}\n"})
        applied = subprocess.run(
            [sys.executable, "-m", "keg", "apply", str(other), "--api", api, "--token-file",
             str(tmp_path / "tokens-only"), "--owner", f"dir:{rules}", "--wait"],
            capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
        assert applied.returncode == 4, applied.stdout + applied.stderr
        assert "is the rule directory this control plane serves" in applied.stderr, (
            applied.stdout + applied.stderr)
        assert store.rules()[0] == 4
        assert produce_one(gateway.bootstrap, topic) == "TOPIC_AUTHORIZATION_FAILED"

        # A rule written through REST, then moved into the directory (which adopts it):
        # a rollback to a version before the move answered 500 (a duplicate rule id) and
        # rolled nothing back. The directory's rule stays, as above.
        moved = create_topic(kafka.bootstrap, name=f"moved.{time.monotonic_ns()}")
        post("/v1/rules/moved", b'{"action": {"observe": {}}}', method="PUT")
        runs(5)
        (rules / "moved.yaml").write_text(
            "rules:\n  - id: moved\n    match: {apis: [Produce], topics: {prefix: [moved.]}}\n"
            "    action: {deny: {}}\n")
        runs(6)
        assert produce_one(gateway.bootstrap, moved) == "TOPIC_AUTHORIZATION_FAILED"
        assert post("/v1/versions/5/rollback")["number"] == 7
        runs(7)
        assert sorted(r.id for r in store.rules()[1]) == ["deny-held", "moved", "watch"]
        assert produce_one(gateway.bootstrap, moved) == "TOPIC_AUTHORIZATION_FAILED"


def served_deny(kafka: EmbeddedKafka, tmp_path: Path, name: str) -> tuple[str, Path, str]:
    """A rule directory denying Produce to `name`.*, the API's token file, and a topic it
    denies: (the rule file's text, the directory, the topic)."""
    deny = (f"rules:\n  - id: deny-{name}\n    match: {{apis: [Produce], topics: "
            f"{{prefix: [{name}.]}}}}\n    action: {{deny: {{}}}}\n")
    rules = rule_dir(tmp_path / "rules", {"rules.yaml": deny})
    (tmp_path / "tokens").write_text("ops:token-0123456789abcdef\n")
    return deny, rules, create_topic(kafka.bootstrap, name=f"{name}.{time.monotonic_ns()}")


def test_a_served_directory_that_is_not_in_force_shows_in_the_metrics(
        kafka: EmbeddedKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A change of the served directory that was refused (invalid files, or a rule its
    workers could not run) showed nowhere but the log: /readyz, the API and the metrics
    said all was well while a merged commit was not enforced; the second case logged a
    traceback ("rule subscriber failed"). keg_rule_directory_refused is 1 until the
    directory is in force again; the last good rules serve meanwhile."""
    monkeypatch.delenv("KEG_TEST_NOT_GIVEN", raising=False)
    deny, rules, topic = served_deny(kafka, tmp_path, "shown")
    with gateway_with_api(kafka, tmp_path, rules) as (gateway, _store, api):

        def refused() -> float:
            with urllib.request.urlopen(f"{api}/metrics", timeout=10) as response:
                lines = response.read().decode().splitlines()
            (value,) = [line.split()[1] for line in lines
                        if line.startswith("keg_rule_directory_refused ")]
            return float(value)

        def until(expected: float) -> None:
            deadline = time.monotonic() + 30  # the directory is polled each second
            while refused() != expected:
                assert time.monotonic() < deadline, f"keg_rule_directory_refused != {expected}"
                time.sleep(0.1)

        assert refused() == 0
        (rules / "rules.yaml").write_text(deny + "  - id: [broken\n")
        until(1)
        assert produce_one(gateway.bootstrap, topic) == "TOPIC_AUTHORIZATION_FAILED"
        with caplog.at_level("ERROR"):
            (rules / "rules.yaml").write_text(
                deny + "  - id: encrypt-shown\n    match: {topics: {prefix: [shown.]}}\n"
                "    action:\n      encrypt:\n        key: {id: k1, secret: {env: "
                "KEG_TEST_NOT_GIVEN}}\n")
            deadline = time.monotonic() + 30
            while "KEG_TEST_NOT_GIVEN" not in caplog.text:
                assert time.monotonic() < deadline, "the refusal was not logged"
                time.sleep(0.1)
        assert refused() == 1
        assert "rule subscriber failed" not in caplog.text and "Traceback" not in caplog.text
        assert produce_one(gateway.bootstrap, topic) == "TOPIC_AUTHORIZATION_FAILED"
        (rules / "rules.yaml").write_text(deny.replace("deny-shown", "deny-shown-again"))
        until(0)


def test_a_gateway_restarted_on_a_directory_it_refused_serves_its_last_good_rules(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """A bad commit the running gateway refused (the last good rules served) stopped it
    from starting again: `keg up` exited at the next restart (a reboot, a crash), a whole
    gateway down for a file it had already kept out. It now starts on the directory's
    rules its store served last, keg_rule_directory_refused says so, and the fixed files
    apply. Without a version to fall back on (a first start) it still refuses."""
    deny, rules, topic = served_deny(kafka, tmp_path, "kept")
    with gateway_with_api(kafka, tmp_path, rules) as (gateway, _store, _api):
        gateway.wait_for_rules()
        assert produce_one(gateway.bootstrap, topic) == "TOPIC_AUTHORIZATION_FAILED"
    (rules / "rules.yaml").write_text(deny + "  - id: [broken\n")
    with gateway_with_api(kafka, tmp_path, rules) as (gateway, _store, _api):
        gateway.wait_for_rules()
        assert produce_one(gateway.bootstrap, topic) == "TOPIC_AUTHORIZATION_FAILED"
        assert gateway.app is not None and gateway.app.directory_error is not None
        (rules / "rules.yaml").write_text(deny.replace("kept.]", "other.]"))
        deadline = time.monotonic() + 30
        while produce_one(gateway.bootstrap, topic) is not None:
            assert time.monotonic() < deadline, "the fixed directory was not applied"
            time.sleep(0.5)
        assert gateway.app.directory_error is None
    first = rule_dir(tmp_path / "first", {"rules.yaml": "rules:\n  - id: [broken\n"})
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "tokens").write_text("ops:token-0123456789abcdef\n")
    with pytest.raises(StoreError, match="no version to serve"), \
            gateway_with_api(kafka, tmp_path / "fresh", first):
        pass


def test_a_compression_policy_that_allows_uncompressed_batches_is_served(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """`forbid: [gzip, snappy]` (uncompressed batches allowed) passed `keg validate`, but
    its JSON, which carries every default, was refused on the way into the store: keg up
    died at start (ValidationError), and a running gateway never applied it."""
    rules = rule_dir(tmp_path / "rules", {"rules.yaml": (
        "rules:\n  - id: no-gzip\n    match: {apis: [Produce], topics: {prefix: [codec.]}}\n"
        "    action: {safeguard: {compression: {forbid: [gzip, snappy]}}}\n")})
    (tmp_path / "tokens").write_text("ops:token-0123456789abcdef\n")
    topic = create_topic(kafka.bootstrap, name=f"codec.{time.monotonic_ns()}")
    with gateway_with_api(kafka, tmp_path, rules) as (gateway, _store, _api):
        gateway.wait_for_rules()
        assert produce_one(gateway.bootstrap, topic) is None
        producer = Producer({"bootstrap.servers": gateway.bootstrap, "compression.type": "gzip",
                             "retries": 0, "linger.ms": 0})
        errors: list[Any] = []
        producer.produce(topic, b"x" * 4000, on_delivery=lambda err, _m: errors.append(err))
        assert producer.flush(30) == 0
        assert errors and errors[0] is not None, errors


def test_a_fresh_ext_proc_instance_serves_nothing_before_its_rules_arrive(
        kafka: EmbeddedKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker restarted without its kept rule set (lost cache, a new instance) while the
    control plane cannot answer it: its engine starts empty. Regression: it served
    connections with that empty set, and a denied Produce was stored; and the fleet view
    still showed what the old process had ACKed, so `wait_for_rules` did not wait. Now
    a connection waits for the first rule set (then is refused), and the fleet shows
    nothing applied until the new process ACKs."""
    rules_dir = rule_dir(tmp_path / "rules", {"rules.yaml": (
        "rules:\n  - id: no-secret-topics\n    match: {apis: [Produce], topics: "
        "{prefix: [secret.]}}\n    action: {deny: {}}\n")})
    denied = create_topic(kafka.bootstrap, name=f"secret.{time.monotonic_ns()}")
    allowed = create_topic(kafka.bootstrap)
    settings = gateway_settings(kafka, tmp_path / "work", rules_dir=rules_dir,
                                rules_delivery="control-plane")
    with Gateway(settings) as gateway:
        assert produce_one(gateway.bootstrap, denied) == "TOPIC_AUTHORIZATION_FAILED"
        assert gateway.control_plane is not None
        gateway.stop_ext_proc()
        gateway.rules_cache_file.unlink()
        # The control plane's loop held: the new worker gets no rules for 8 s. (Spawning
        # reads the rules' key variables on that loop: none here, and it must not wait.)
        monkeypatch.setattr(gateway, "_rule_secret_env_names", set)
        held = threading.Thread(target=gateway.call, args=(time.sleep, 8.0))
        held.start()
        try:
            gateway.start_ext_proc()
            assert held.is_alive(), "the control plane was free before the record went"
            outcome = produce_one(gateway.bootstrap, denied)
        finally:
            held.join()
        assert outcome is not None, "a denied record was stored by a worker without rules"
        gateway.wait_for_rules()
        assert [n["types"]["keg.v1.RuleSet"]["applied_version"] for n in gateway.fleet_status()
                if n["role"] == "ext_proc"] == [gateway.control_plane.rules_version]
        assert produce_one(gateway.bootstrap, denied) == "TOPIC_AUTHORIZATION_FAILED"
        assert produce_one(gateway.bootstrap, allowed) is None
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "watermarks"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(denied, 0), timeout=30) == (0, 0)
    finally:
        consumer.close()


def put_refused_rule(url: str, body: bytes, token: str,
                     content_type: str = "application/json") -> dict[str, Any]:
    """PUT a new rule the API must refuse: asserts 422 with one error, returns it."""
    return refused_with_one_error(urllib.request.Request(url, data=body, method="PUT", headers={
        "Authorization": f"Bearer {token}", "Content-Type": content_type,
        "If-None-Match": "*"}))


def validate_refused(api: str, rule_id: str, rule: bytes, token: str) -> dict[str, Any]:
    """POST a rule file of one rule to /v1/validate, which must refuse it as a write
    would: asserts 422 with one error, returns it."""
    body = json.dumps({"rules": [{"id": rule_id, **json.loads(rule)}]}).encode()
    return refused_with_one_error(urllib.request.Request(
        f"{api}/v1/validate?file=candidate.json", data=body, method="POST", headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"}))


def refused_with_one_error(request: urllib.request.Request) -> dict[str, Any]:
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    problem = json.loads(refused.value.read())
    assert refused.value.code == 422, problem
    (error,) = problem["errors"]
    return dict(error)


def test_a_rule_written_with_a_repeated_key_is_refused_and_traffic_goes_on(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """A PUT whose JSON repeats a key: Python's decoder kept the last copy, so
    `{"action": {"observe": {}}, "action": {"deny": {}}}` was stored as a deny without a
    match and refused every request of every client (regression). It is now refused
    with 422, whatever the Content-Type says (curl -d sends a form type), and with the
    line and column of the repeated key; the gateway goes on serving."""
    token = "admin-token-0123456789"
    (tmp_path / "tokens").write_text(f"ops:{token}\n")
    (tmp_path / "tokens-only").write_text(f"{token}\n")
    (tmp_path / "tokens-only").chmod(0o600)
    rules = rule_dir(tmp_path / "rules", {
        "watch.yaml": "rules:\n  - id: watch\n    action: {observe: {}}\n"})
    topic = create_topic(kafka.bootstrap)
    body = b'{"action": {"observe": {}},\n "action": {"deny": {}}}'
    with gateway_with_api(kafka, tmp_path, rules) as (gateway, store, api):
        assert produce_one(gateway.bootstrap, topic) is None
        for content_type in ("application/json", "application/x-www-form-urlencoded"):
            error = put_refused_rule(f"{api}/v1/rules/everything", body, token, content_type)
            assert (error["field"], error["message"]) == ("action", "duplicate key 'action'")
            if content_type != "application/json":  # read by the route: where it is
                assert (error["line"], error["column"]) == (2, 2)
        assert [r.id for r in store.rules()[1]] == ["watch"]
        time.sleep(1.5)  # a change would have reached the fleet by now
        assert produce_one(gateway.bootstrap, topic) is None


def test_a_rule_naming_a_key_variable_the_workers_lack_is_refused_and_blocks_nothing(
        kafka: EmbeddedKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway has KEG_TEST_LATE_KEY; its ext_proc workers, started before any rule
    named it, do not. A REST rule naming it was taken (this process could read it),
    every worker refused the version, and every later version held the rule: a deny
    then written to the rule directory was never enforced (regression). The rule is now
    refused with 422, at its field; the directory's deny is enforced."""
    monkeypatch.setenv("KEG_TEST_LATE_KEY", "11" * 32)
    token = "admin-token-0123456789"
    (tmp_path / "tokens").write_text(f"ops:{token}\n")
    (tmp_path / "tokens-only").write_text(f"{token}\n")
    (tmp_path / "tokens-only").chmod(0o600)
    rules = rule_dir(tmp_path / "rules", {
        "watch.yaml": "rules:\n  - id: watch\n    action: {observe: {}}\n"})
    topic = create_topic(kafka.bootstrap, name=f"late.{time.monotonic_ns()}")
    body = json.dumps({"match": {"topics": {"prefix": ["late."]}}, "action": {"encrypt": {
        "key": {"id": "k1", "secret": {"env": "KEG_TEST_LATE_KEY"}}}}}).encode()
    with gateway_with_api(kafka, tmp_path, rules) as (gateway, store, api):
        # Validated first, as the console and CI do: it said valid (regression).
        for error in (validate_refused(api, "encrypt-late", body, token),
                      put_refused_rule(f"{api}/v1/rules/encrypt-late", body, token)):
            assert "KEG_TEST_LATE_KEY is not given to the running ext_proc workers" in \
                error["message"]
            assert error["field"].startswith("encrypt-late.action.encrypt.key.secret")
        (rules / "deny.yaml").write_text(
            "rules:\n  - id: deny-late\n    match: {apis: [Produce], topics: {prefix: "
            "[late.]}}\n    action: {deny: {}}\n")
        deadline = time.monotonic() + 30
        while produce_one(gateway.bootstrap, topic) is None:
            assert time.monotonic() < deadline, store.rules()[0]
            time.sleep(0.5)
        assert {r.id for r in store.rules()[1]} == {"watch", "deny-late"}


def test_a_rule_naming_a_key_file_the_workers_cannot_read_is_refused_and_blocks_nothing(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """A REST rule whose encryption key is a file that is not there was taken (201),
    every worker refused the version, and every later version held the rule: a deny
    then written to the rule directory was never enforced (regression). `keg up`'s
    workers run on the control plane's host, so the rule is now refused with 422 at its
    field, as `POST /v1/dry-run` already did; the directory's deny is enforced."""
    token = "admin-token-0123456789"
    (tmp_path / "tokens").write_text(f"ops:{token}\n")
    (tmp_path / "tokens-only").write_text(f"{token}\n")
    (tmp_path / "tokens-only").chmod(0o600)
    rules = rule_dir(tmp_path / "rules", {
        "watch.yaml": "rules:\n  - id: watch\n    action: {observe: {}}\n"})
    topic = create_topic(kafka.bootstrap, name=f"keyfile.{time.monotonic_ns()}")
    missing = tmp_path / "no-such-key"
    body = json.dumps({"match": {"topics": {"prefix": ["keyfile."]}}, "action": {"encrypt": {
        "key": {"id": "k1", "secret": {"file": str(missing)}}}}}).encode()
    with gateway_with_api(kafka, tmp_path, rules) as (gateway, store, api):
        for error in (validate_refused(api, "encrypt-missing", body, token),
                      put_refused_rule(f"{api}/v1/rules/encrypt-missing", body, token)):
            assert error["field"] == "encrypt-missing.action.encrypt.key.secret.file", error
            assert str(missing) in error["message"]
        (rules / "deny.yaml").write_text(
            "rules:\n  - id: deny-keyfile\n    match: {apis: [Produce], topics: {prefix: "
            "[keyfile.]}}\n    action: {deny: {}}\n")
        deadline = time.monotonic() + 30
        while produce_one(gateway.bootstrap, topic) is None:
            assert time.monotonic() < deadline, store.rules()[0]
            time.sleep(0.5)
        assert {r.id for r in store.rules()[1]} == {"watch", "deny-keyfile"}


def test_rule_changes_under_load_close_no_connection_and_lose_no_record(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """20 REST changes of one rule (a Produce deny of a topic, then an observe of it,
    alternately) while an idempotent librdkafka producer's records flow through a mask
    rule: every change is enforced on a live connection (a bare Kafka connection's next
    Produce answers it), no connection closes, nothing fails, and the topic holds
    exactly the records acknowledged. The times are printed, not asserted:
    benchmarks/rule_churn.py measures them with 100 changes and 200,000 records."""
    token = "churn-token-0123456789"
    (tmp_path / "tokens").write_text(f"ops:{token}\n")
    rules = rule_dir(tmp_path / "rules", {"flow.yaml": rule_churn.FLOW_RULES})
    with gateway_with_api(kafka, tmp_path, rules) as (gateway, _store, api):
        result = rule_churn.churn(gateway.bootstrap, api, token, records=20_000, changes=20,
                                  admin_bootstrap=kafka.bootstrap)
    print(f"rule changes under load: {result.summary()}")
    assert result.unenforced == [], result.enforced_s
    assert result.flow_errors == []
    assert result.disconnects == 0
    assert result.records_during_changes > 0  # the changes happened under load
    assert result.flow_stored == result.flow_acknowledged >= 20_000


def test_a_worker_that_cannot_build_the_served_version_after_a_restart_does_not_take_it_back(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """A new user's botched key rotation (the key file the encrypt rule reads replaced by
    junk), then kill -9 of one of keg up's two workers: the restarted worker could not
    build the version the fleet ran and NACKed it; the store marked it rejected, fell
    back to the versions before, which both workers refused in turn, until all were
    rejected, and the worker ran no rules (its connections stalled) even once the key
    file was fixed. A version an instance applied stays served; the worker asks again."""
    key = tmp_path / "k1.key"
    good = "11" * 32
    key.write_text(good)
    rules_dir = rule_dir(tmp_path / "rules", {"rules.yaml": (
        "rules:\n  - id: seal-cards\n    match: {topics: {prefix: [sealed.]}}\n"
        "    action:\n      encrypt:\n        fields: [$.card]\n"
        f"        key: {{id: k1, secret: {{file: {key}}}}}\n")})
    topic = create_topic(kafka.bootstrap, name=f"sealed.{time.monotonic_ns()}")
    (tmp_path / "tokens").write_text("ci:writer-token-0123456789\n")
    with gateway_with_api(kafka, tmp_path, rules_dir, ext_proc_workers=2) as (
            gateway, store, _api):
        deadline = time.monotonic() + 30
        while (verdict := store.verdict(1)) is None:
            assert time.monotonic() < deadline, "version 1 was never answered"
            time.sleep(0.1)
        assert verdict.status == "applied"

        def runs(node_id: str) -> tuple[str | None, str | None]:
            node = next(n for n in gateway.fleet_status() if n["node_id"] == node_id)
            state = node["types"].get("keg.v1.RuleSet", {})
            return state.get("applied_version"), (state.get("last_nack") or {}).get("version")

        victim = gateway.workers[0]
        pid = victim.current_pid()
        assert pid is not None
        bad = tmp_path / "k1.key.new"
        bad.write_text("not-a-key\n")
        bad.replace(key)  # atomically, as a rotation script would
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while runs(victim.node_id)[1] != "1":
            assert time.monotonic() < deadline, "the restarted worker never answered"
            time.sleep(0.2)
        time.sleep(2)  # a cascade went on for seconds
        verdicts = store.verdicts([1])
        assert store.current()[0] == 1 and verdicts[1].status == "applied", verdicts

        key.write_text(good)
        deadline = time.monotonic() + 30
        while runs(victim.node_id)[0] != "1":
            assert time.monotonic() < deadline, "the worker kept running no rules"
            time.sleep(0.2)
        # Every connection is served again, whichever worker it reaches.
        for _ in range(4):
            producer = Producer({"bootstrap.servers": gateway.bootstrap,
                                 "message.timeout.ms": 15000})
            assert deliver(producer, topic, b'{"card": "4111"}') == 0
            del producer
