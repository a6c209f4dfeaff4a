"""Broker discovery against a real cluster of several brokers (a controller and brokers
joining it, Kafka 4.1.1 from its jars), through real Envoy and a real client."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import gateway_settings

HEAP = "256m"


def routed_brokers(gateway: Gateway) -> set[int]:
    """The node ids the gateway has a listener for."""
    assert gateway.control_plane is not None
    plane = gateway.control_plane
    return set(gateway.call(lambda: [r.node_id for r in plane.plan.routes]))


def until_routed(gateway: Gateway, node_id: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node_id in routed_brokers(gateway):
            return True
        time.sleep(0.2)
    return False


def test_a_broker_added_while_the_only_bootstrap_server_is_down_gets_a_listener(
        tmp_path: Path) -> None:
    """keg asked only its bootstrap servers which brokers there are: with the one it was
    given down, the topology froze, and a broker added meanwhile was advertised at
    another broker's listener (librdkafka: every record _MSG_TIMED_OUT; directly: 1 s).
    Discovery now asks every broker it knows too, as Kafka's clients do."""
    with EmbeddedKafka(heap=HEAP) as controller, \
            EmbeddedKafka(heap=HEAP, joins=controller, node_id=2) as bootstrap:
        settings = gateway_settings(bootstrap, tmp_path / "work", refresh_interval_s=0.5)
        with Gateway(settings) as gateway:
            assert until_routed(gateway, 1) and until_routed(gateway, 2)
            bootstrap.stop()
            with EmbeddedKafka(heap=HEAP, joins=controller, node_id=3) as added:
                topic = f"on-broker-3.{uuid.uuid4().hex[:6]}"
                admin = AdminClient({"bootstrap.servers": controller.bootstrap})
                admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[
                    [added.node_id]])])[topic].result(30)
                assert until_routed(gateway, 3), (
                    f"no listener for broker 3 (routes: {sorted(routed_brokers(gateway))})")
                listener = next(f"127.0.0.1:{r.listen_port}" for r in gateway.call(
                    lambda: list(gateway.control_plane.plan.routes)) if r.node_id == 1)
                failures: list[str] = []
                producer = Producer({"bootstrap.servers": listener, "message.timeout.ms": 30000})
                for i in range(10):
                    producer.produce(topic, f"record {i}".encode(), on_delivery=lambda err, _m:
                                     failures.append(str(err)) if err is not None else None)
                assert producer.flush(60) == 0
                assert failures == []
