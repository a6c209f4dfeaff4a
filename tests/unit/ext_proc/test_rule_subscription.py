"""The ext_proc side of rule distribution: validate, install, ACK or NACK, keep the last
good set on disk, reconnect and resume; against the control plane's real ADS server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc
from google.protobuf import any_pb2, wrappers_pb2

from control_plane.ads import AggregatedDiscovery
from control_plane.fleet import EXT_PROC, Fleet
from control_plane.rules_distribution import rules_snapshot
from control_plane.snapshot import RULES, Snapshot, SnapshotCache
from ext_proc.filters.rules import RuleEngine
from ext_proc.rule_subscription import (
    RULE_SET_RESOURCE,
    RULES_TYPE_URL,
    Backoff,
    RuleSetRejected,
    RuleSubscription,
    decode_rule_set,
    encode_rule_set,
)
from filter_rules import CompiledRuleSet, Rule, RuleSet, load_rule_text
from interceptors import InterceptorConfigError
from interceptors.engine import RecordEngine

RULES_YAML = """
rules:
  - id: no-deletes
    action: {deny_apis: [DeleteTopics]}
"""
OTHER_YAML = """
rules:
  - id: no-creates
    action: {deny_apis: [CreateTopics]}
"""


def engine() -> RuleEngine:
    return RuleEngine(CompiledRuleSet(RuleSet()))


def payload(data: object) -> any_pb2.Any:
    raw = json.dumps(data).encode()
    return any_pb2.Any(type_url=RULES_TYPE_URL,
                       value=wrappers_pb2.BytesValue(value=raw).SerializeToString())


def test_round_trip_keeps_rules_and_sources() -> None:
    ruleset = load_rule_text(RULES_YAML, "deny.yaml")
    decoded = decode_rule_set(encode_rule_set(ruleset))
    assert decoded == ruleset and decoded.sources["no-deletes"].file == "deny.yaml"


@pytest.mark.parametrize(("resource", "message"), [
    (any_pb2.Any(type_url="type.googleapis.com/other", value=b""), "expected a"),
    (any_pb2.Any(type_url=RULES_TYPE_URL, value=b"\xff\xff"), "not JSON"),
    (payload({"rules": [{"id": "x"}]}), "does not validate"),
])
def test_bad_resources_are_refused_with_a_reason(resource: any_pb2.Any, message: str) -> None:
    with pytest.raises(RuleSetRejected, match=message):
        decode_rule_set(resource)


def test_apply_installs_persists_and_restores(tmp_path: Path) -> None:
    cache = tmp_path / "rules.json"
    live = engine()
    subscription = RuleSubscription("unused:1", live, "xp", cache_file=cache)
    ruleset = load_rule_text(RULES_YAML, "deny.yaml")
    subscription.apply("v7", [encode_rule_set(ruleset)])
    assert subscription.version == "v7" and live.compiled.version == ruleset.version
    # A refused set leaves the running one (and the file) alone.
    with pytest.raises(RuleSetRejected, match="exactly one"):
        subscription.apply("v8", [])
    assert subscription.version == "v7" and "exactly one" in (subscription.last_error or "")
    restarted = engine()
    again = RuleSubscription("unused:1", restarted, "xp", cache_file=cache)
    assert again.restore()
    assert again.version == "v7" and restarted.compiled.version == ruleset.version


def test_a_broken_cache_file_is_ignored(tmp_path: Path) -> None:
    cache = tmp_path / "rules.json"
    cache.write_text('{"version": "v1", "ruleset": {"rules": [{"id": 1}]}}')
    subscription = RuleSubscription("unused:1", engine(), "xp", cache_file=cache)
    assert not subscription.restore()
    assert subscription.version == ""


def test_rules_that_cannot_be_built_are_refused() -> None:
    class Refusing(RuleEngine):
        def install(self, compiled: CompiledRuleSet,
                    prepared: tuple[RecordEngine, CompiledRuleSet] | None = None) -> None:
            if compiled.rules:
                raise InterceptorConfigError("mask: field path $.x[ is not valid")
            super().install(compiled, prepared)

    subscription = RuleSubscription("unused:1", Refusing(CompiledRuleSet(RuleSet())), "xp")
    with pytest.raises(RuleSetRejected, match="cannot be installed: mask"):
        subscription.apply("v1", [encode_rule_set(load_rule_text(RULES_YAML, "r.yaml"))])
    assert subscription.version == ""


def test_backoff_grows_and_is_capped() -> None:
    backoff = Backoff(initial_s=0.1, max_s=2.0)
    assert 0.05 <= backoff.delay(0) <= 0.1
    assert 1.0 <= backoff.delay(10) <= 2.0
    assert backoff.delay(1000) <= 2.0


class Plane:
    """The control plane's ADS server alone, on a fixed port (so it can be restarted)."""

    def __init__(self, cache: SnapshotCache, fleet: Fleet, port: int = 0) -> None:
        self.cache, self.fleet, self.port = cache, fleet, port
        self.server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.server = grpc.aio.server()
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(
            AggregatedDiscovery(self.cache, self.fleet), self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self.server.start()

    async def stop(self) -> None:
        assert self.server is not None
        await self.server.stop(0)


async def until(predicate: object, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def subscription_scenario(tmp_path: Path) -> None:
    cache, fleet = SnapshotCache(), Fleet()
    first = load_rule_text(RULES_YAML, "r.yaml")
    cache.set("xp", rules_snapshot("v1", first))
    plane = Plane(cache, fleet)
    await plane.start()
    live = engine()
    subscription = RuleSubscription(f"127.0.0.1:{plane.port}", live, "xp",
                                    cache_file=tmp_path / "rules.json",
                                    backoff=Backoff(0.05, 0.2))
    task = asyncio.create_task(subscription.run())
    try:
        await until(lambda: fleet.nodes.get("xp") is not None
                    and fleet.nodes["xp"].of(RULES).acked_version == "v1")
        assert fleet.nodes["xp"].role == EXT_PROC and live.compiled.version == first.version

        # A set that does not validate: NACKed with the reason, v1 keeps running.
        bad = Snapshot({RULES: {RULE_SET_RESOURCE: payload({"rules": [{"id": "x"}]})}},
                       fixed_versions={RULES: "v2"})
        cache.set("xp", bad)
        await until(lambda: fleet.nodes["xp"].of(RULES).last_nack is not None)
        status = fleet.nodes["xp"].of(RULES)
        assert "does not validate" in (status.last_nack or "")
        assert status.last_nack_version == "v2" and status.acked_version == "v1"
        assert subscription.version == "v1" and live.compiled.version == first.version

        # The control plane goes away and comes back on the same port with v3.
        await plane.stop()
        await until(lambda: not subscription.connected)
        second = load_rule_text(OTHER_YAML, "r.yaml")
        cache.set("xp", rules_snapshot("v3", second))
        plane = Plane(cache, fleet, plane.port)
        await plane.start()
        await until(lambda: subscription.version == "v3")
        assert live.compiled.version == second.version

        # Once more, with nothing new: it resumes at v3 and nothing is resent.
        await plane.stop()
        await until(lambda: fleet.nodes["xp"].streams == 0)
        fresh = Fleet()
        plane = Plane(cache, fresh, plane.port)
        await plane.start()
        await until(lambda: fresh.nodes.get("xp") is not None
                    and fresh.nodes["xp"].of(RULES).acked_version == "v3")
        assert subscription.connected and subscription.connects == 3
        assert fresh.nodes["xp"].of(RULES).sent_version == "v3"  # recorded, never sent
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await plane.stop()


def test_subscription_acks_nacks_and_resumes(tmp_path: Path) -> None:
    asyncio.run(subscription_scenario(tmp_path))


async def restart_scenario() -> None:
    cache, fleet = SnapshotCache(), Fleet()
    cache.set("xp", rules_snapshot("v1", load_rule_text(RULES_YAML, "r.yaml")))
    plane = Plane(cache, fleet)
    await plane.start()
    target = f"127.0.0.1:{plane.port}"
    old = RuleSubscription(target, engine(), "xp", backoff=Backoff(0.05, 0.2))
    task = asyncio.create_task(old.run())
    try:
        await until(lambda: fleet.nodes.get("xp") is not None
                    and fleet.nodes["xp"].of(RULES).acked_version == "v1")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await until(lambda: fleet.nodes["xp"].streams == 0)
        # The same node id restarted with nothing kept, and nothing for it yet: the
        # fleet says it runs nothing (not what its old process ACKed).
        cache.clear("xp")
        installed: list[str] = []
        fresh = RuleSubscription(target, engine(), "xp", backoff=Backoff(0.05, 0.2),
                                 on_installed=lambda: installed.append(fresh.version))
        task = asyncio.create_task(fresh.run())
        await until(lambda: fleet.nodes["xp"].streams == 1)
        assert fleet.nodes["xp"].of(RULES).acked_version == "" and installed == []
        cache.set("xp", rules_snapshot("v2", load_rule_text(OTHER_YAML, "r.yaml")))
        await until(lambda: fleet.nodes["xp"].of(RULES).acked_version == "v2")
        assert installed == ["v2"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await plane.stop()


def test_a_restarted_node_runs_nothing_until_it_acks_and_says_when_it_installs() -> None:
    asyncio.run(restart_scenario())


class Flaky(RuleEngine):
    """An engine whose record rules cannot be built while `broken` (a key file gone bad)."""

    broken = True

    def prepare(self, compiled: CompiledRuleSet) -> tuple[RecordEngine, CompiledRuleSet]:
        if self.broken and compiled.rules:
            raise InterceptorConfigError("key k1: key file k1.key: not a key")
        return super().prepare(compiled)


async def no_rules_retry_scenario() -> None:
    cache, fleet = SnapshotCache(), Fleet()
    cache.set("xp", rules_snapshot("v6", load_rule_text(RULES_YAML, "r.yaml")))
    plane = Plane(cache, fleet)
    await plane.start()
    live = Flaky(CompiledRuleSet(RuleSet()))
    subscription = RuleSubscription(f"127.0.0.1:{plane.port}", live, "xp",
                                    backoff=Backoff(0.05, 0.2), no_rules_retry_s=0.3)
    task = asyncio.create_task(subscription.run())
    try:
        await until(lambda: fleet.nodes.get("xp") is not None
                    and fleet.nodes["xp"].of(RULES).last_nack_version == "v6")
        assert subscription.version == ""
        connects = subscription.connects
        live.broken = False  # the key file fixed; nothing new from the control plane
        await until(lambda: subscription.version == "v6")
        assert subscription.connects > connects, "asked again on a new stream"
        await until(lambda: fleet.nodes["xp"].of(RULES).acked_version == "v6")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await plane.stop()


def test_an_instance_without_rules_asks_again_for_the_set_it_could_not_build() -> None:
    """A worker restarted after its key file went bad refused the served version and ran
    no rules; once the file was fixed it stayed so (nothing new came), its connections
    stalled until some rule changed (a new user's report). It now asks again."""
    asyncio.run(no_rules_retry_scenario())


def many_rules(count: int) -> RuleSet:
    """`count` deny rules, about 500 bytes each as the control plane sends them."""
    return RuleSet(rules=[Rule.model_validate({
        "id": f"deny-{i}", "match": {"apis": ["Produce"], "topics": {"prefix": [f"t{i}."]}},
        "action": {"deny": {}}}) for i in range(count)])


async def size_scenario() -> None:
    small = load_rule_text(RULES_YAML, "r.yaml")
    large = many_rules(15_000)
    assert rules_snapshot("v2", large).resources[RULES][RULE_SET_RESOURCE].ByteSize() > 5 << 20
    cache, fleet = SnapshotCache(), Fleet()
    plane = Plane(cache, fleet)
    await plane.start()
    cache.set("xp-small", rules_snapshot("v1", small))
    cache.set("xp-default", rules_snapshot("v2", large))
    roomy, cramped = engine(), engine()
    subscriptions = [
        RuleSubscription(f"127.0.0.1:{plane.port}", roomy, "xp-default"),
        RuleSubscription(f"127.0.0.1:{plane.port}", cramped, "xp-small",
                         max_rule_set_bytes=1 << 20),
    ]
    tasks = [asyncio.create_task(s.run()) for s in subscriptions]
    try:
        # Over gRPC's 4 MiB default: delivered, applied, ACKed.
        await until(lambda: subscriptions[0].version == "v2", timeout=60)
        assert len(roomy.compiled) == 15_000
        await until(lambda: fleet.nodes["xp-default"].of(RULES).acked_version == "v2")

        # Over what an instance says it accepts: the control plane answers for it
        # with a NACK naming both sizes, and sends nothing; the instance keeps v1.
        await until(lambda: subscriptions[1].version == "v1")
        node = fleet.nodes["xp-small"]
        assert node.max_message_bytes == 1 << 20
        cache.set("xp-small", rules_snapshot("v3", large))
        await until(lambda: node.of(RULES).last_nack is not None)
        state = node.of(RULES)
        assert state.last_nack_version == "v3" and state.acked_version == "v1"
        assert state.last_nack is not None and "more than the 1048576 this node accepts" \
            in state.last_nack
        assert subscriptions[1].version == "v1" and subscriptions[1].last_error is None
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await plane.stop()


def test_rule_sets_over_4_mib_arrive_and_over_an_instances_limit_are_nacked() -> None:
    """gRPC drops a message over the receiver's limit (4 MiB by default) without a
    word: a 15,000-rule set (5.9 MB) never arrived and nobody NACKed it. Instances now accept
    128 MiB and state their limit; over it, the control plane NACKs for them."""
    asyncio.run(size_scenario())


def test_an_instance_that_states_no_limit_is_taken_at_grpcs_default() -> None:
    from envoy.config.core.v3 import base_pb2
    from google.protobuf import struct_pb2

    from control_plane.fleet import GRPC_DEFAULT_MAX_RECEIVE, NodeInfo

    metadata = struct_pb2.Struct()
    metadata.update({"keg.role": "ext_proc"})
    old = NodeInfo.from_proto(base_pb2.Node(id="old", metadata=metadata))
    assert old.max_message_bytes == GRPC_DEFAULT_MAX_RECEIVE
    assert NodeInfo.from_proto(base_pb2.Node(id="envoy")).max_message_bytes is None
