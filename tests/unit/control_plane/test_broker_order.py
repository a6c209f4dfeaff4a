"""The broker order the listener ports follow, kept across control plane restarts, and
whom discovery asks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from control_plane.service import ControlPlane, ControlPlaneSettings
from control_plane.topology import Broker, Topology

BASE = 29092


def plane(tmp_path: Path, bootstrap: str = "boot:9092") -> ControlPlane:
    async def made() -> ControlPlane:  # a control plane is made on a running loop
        return ControlPlane(ControlPlaneSettings(
            bootstrap_servers=bootstrap, ext_proc_host="127.0.0.1", ext_proc_port=1,
            listen_port_base=BASE, broker_order_file=tmp_path / "order.json"))
    return asyncio.run(made())


def ports(control_plane: ControlPlane) -> dict[int, int]:
    assert control_plane.plan is not None
    return {r.node_id: r.listen_port for r in control_plane.plan.routes}


def brokers(*ids: int) -> tuple[Broker, ...]:
    return tuple(Broker(i, f"kafka-{i}", 9092) for i in ids)


def test_a_restart_keeps_each_brokers_port_whoever_is_down(tmp_path: Path) -> None:
    first = plane(tmp_path)
    first.set_topology(Topology("c", brokers(1, 3)))
    first.set_topology(Topology("c", brokers(1, 2, 3)))
    assert ports(first) == {1: BASE, 3: BASE + 1, 2: BASE + 2}
    again = plane(tmp_path)
    again.set_topology(Topology("c", brokers(2, 3)))
    assert ports(again) == {3: BASE + 1, 2: BASE + 2}


def test_another_clusters_brokers_get_ports_afresh(tmp_path: Path) -> None:
    plane(tmp_path).set_topology(Topology("old", brokers(5, 6)))
    other = plane(tmp_path)
    other.set_topology(Topology("new", brokers(6, 7)))
    assert ports(other) == {6: BASE, 7: BASE + 1}
    assert json.loads((tmp_path / "order.json").read_text()) == {
        "cluster_id": "new", "brokers": [6, 7], "addresses": ["kafka-6:9092", "kafka-7:9092"]}


def test_a_restart_asks_the_brokers_the_last_run_knew(tmp_path: Path) -> None:
    """keg restarted while its only bootstrap server was down could not start, although
    the other brokers were up: discovery now asks the brokers the last run knew too."""
    plane(tmp_path).set_topology(Topology("c", brokers(1, 2)))
    again = plane(tmp_path, bootstrap="kafka-1:9092")
    assert again._discovery_servers() == "kafka-1:9092,kafka-2:9092"


@pytest.mark.parametrize("kept", ["not json", "[1, 2]", '{"cluster_id": "c", "brokers": [1, 1]}',
                                  '{"cluster_id": 5, "brokers": [1]}'])
def test_a_kept_order_that_cannot_be_read_is_set_aside(tmp_path: Path, kept: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "order.json").write_text(kept)
    control_plane = plane(tmp_path)
    control_plane.set_topology(Topology("c", brokers(1, 2)))
    assert ports(control_plane) == {1: BASE, 2: BASE + 1}
    assert "order.json" in caplog.text


def test_discovery_asks_the_bootstrap_servers_then_every_known_broker(tmp_path: Path) -> None:
    control_plane = plane(tmp_path, bootstrap="lb:9092, kafka-1:9092")
    assert control_plane._discovery_servers() == "lb:9092,kafka-1:9092"
    control_plane.set_topology(Topology("c", (*brokers(1, 2), Broker(3, "::1", 9093))))
    assert control_plane._discovery_servers() == "lb:9092,kafka-1:9092,kafka-2:9092,[::1]:9093"


def test_a_broker_gone_from_the_metadata_is_still_advertised_at_its_own_port(
        tmp_path: Path) -> None:
    control_plane = plane(tmp_path)
    control_plane.set_topology(Topology("c", brokers(1, 2, 3)))
    control_plane.set_topology(Topology("c", brokers(1, 3)))
    assert control_plane.plan is not None
    assert ports(control_plane) == {1: BASE, 3: BASE + 2}  # no listener for broker 2
    host = control_plane.plan.advertised_host
    assert control_plane.plan.advertised_routes() == {
        1: (host, BASE), 2: (host, BASE + 1), 3: (host, BASE + 2)}


def test_brokers_listeners_go_around_the_ports_keg_itself_uses(tmp_path: Path) -> None:
    async def made() -> ControlPlane:
        return ControlPlane(ControlPlaneSettings(
            bootstrap_servers="boot:9092", ext_proc_host="127.0.0.1", ext_proc_port=1,
            listen_port_base=BASE, reserved_ports=frozenset({BASE + 1, BASE + 2, BASE + 4})))
    control_plane = asyncio.run(made())
    control_plane.set_topology(Topology("c", brokers(1, 2, 3)))
    assert ports(control_plane) == {1: BASE, 2: BASE + 3, 3: BASE + 5}
