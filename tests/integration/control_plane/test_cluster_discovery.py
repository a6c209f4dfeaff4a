"""Broker discovery against a real cluster of several brokers (a controller and brokers
joining it, Kafka 4.1.1 from its jars), through real Envoy and a real client.

Discovery and listener ports are the control plane's: those tests run on one data path
(`one_data_path`); how an answer names a broker is the data path's, and runs on both."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer

from control_plane.service import free_port
from control_plane.topology import fetch_topology
from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from keg.gateway import ApiOptions, Gateway
from tests.integration.conftest import api_get, create_topic, free_port_run, gateway_settings

HEAP = "256m"


def listener_ports(gateway: Gateway) -> dict[int, int]:
    """The gateway's listener port of each broker it has one for."""
    assert gateway.control_plane is not None
    plane = gateway.control_plane

    def ports() -> list[tuple[int, int]]:
        assert plane.plan is not None
        return [(r.node_id, r.listen_port) for r in plane.plan.routes]

    return dict(gateway.call(ports))


def routed_brokers(gateway: Gateway) -> set[int]:
    """The node ids the gateway has a listener for."""
    return set(listener_ports(gateway))


def until_routed(gateway: Gateway, node_id: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node_id in routed_brokers(gateway):
            return True
        time.sleep(0.2)
    return False


def topic_on(controller: EmbeddedKafka, prefix: str, node_id: int) -> str:
    """A new topic of one partition, led by broker `node_id` (made through the controller)."""
    topic = f"{prefix}.{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": controller.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[
        [node_id]])])[topic].result(30)
    return topic


def deliver(bootstrap: str, topic: str, values: list[bytes]) -> tuple[int, list[str]]:
    """librdkafka produces `values`: the records still undelivered after a flush, and
    the delivery errors."""
    failures: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 30000})
    for value in values:
        producer.produce(topic, value, on_delivery=lambda err, _m:
                         failures.append(str(err)) if err is not None else None)
    return producer.flush(60), failures


@pytest.mark.one_data_path
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
                topic = topic_on(controller, "on-broker-3", added.node_id)
                assert until_routed(gateway, 3), (
                    f"no listener for broker 3 (routes: {sorted(routed_brokers(gateway))})")
                listener = f"127.0.0.1:{listener_ports(gateway)[controller.node_id]}"
                assert deliver(listener, topic, [f"record {i}".encode() for i in range(10)]) \
                    == (0, [])


@pytest.mark.one_data_path
def test_a_broker_keeps_its_listener_port_when_keg_restarts_while_another_is_down(
        tmp_path: Path) -> None:
    """Listener ports went to brokers in the order one run of keg first saw them: keg
    restarted while a broker was down gave the next broker that one's port (clients,
    firewall rules and dashboards keyed by port then reached another broker). The order
    is now kept in the gateway's state."""
    base = free_port_run(3)
    with EmbeddedKafka(heap=HEAP) as controller, \
            EmbeddedKafka(heap=HEAP, joins=controller, node_id=2) as second, \
            EmbeddedKafka(heap=HEAP, joins=controller, node_id=3) as third:
        settings = gateway_settings(controller, tmp_path / "state", listen_port_base=base)
        with Gateway(settings) as gateway:
            assert until_routed(gateway, 2) and until_routed(gateway, 3)
            before = listener_ports(gateway)
        assert before == {1: base, 2: base + 1, 3: base + 2}
        second.stop()
        topic = topic_on(controller, "on-broker-3", third.node_id)
        with Gateway(settings) as gateway:
            assert until_routed(gateway, 3)
            assert listener_ports(gateway) == {1: base, 3: base + 2}
            # A client that knows broker 3 by its port still reaches broker 3.
            assert deliver(f"127.0.0.1:{base + 2}", topic, [b"kept"]) == (0, [])


@pytest.mark.one_data_path
def test_a_late_brokers_listener_whose_port_was_taken_binds_once_the_port_is_free(
        tmp_path: Path) -> None:
    """A broker that joined after start, its listener port held by another process:
    Envoy NACKed that listener, and it was never tried again (the same resources went
    unchanged), so once the port was free, clients Metadata sent there were still
    refused, and nothing said why. Now it is tried again until it binds, and until then
    the gateway's readiness names it."""
    base = free_port_run(2)
    with EmbeddedKafka(heap=HEAP) as controller:
        settings = gateway_settings(controller, tmp_path / "work", listen_port_base=base,
                                    refresh_interval_s=0.5,
                                    api=ApiOptions(data_dir=tmp_path / "api", port=free_port()))
        with Gateway(settings) as gateway, socket.socket() as squatter:
            assert gateway.control_plane is not None
            plane = gateway.control_plane
            squatter.bind(("127.0.0.1", base + 1))
            squatter.listen()
            with EmbeddedKafka(heap=HEAP, joins=controller, node_id=2) as added:
                topic = topic_on(controller, "on-broker-2", added.node_id)
                assert until_routed(gateway, 2)
                deadline = time.monotonic() + 30
                while not (problems := gateway.call(plane.unbound.problems)):
                    assert time.monotonic() < deadline, "no NACK of broker 2's listener"
                    time.sleep(0.2)
                assert len(problems) == 1 and "kafka_broker_2" in problems[0], problems
                assert f"127.0.0.1:{base + 1}" in problems[0], problems
                status, body = api_get(gateway, "/readyz")
                assert status == 503 and "kafka_broker_2" in body, body
                squatter.close()  # the port is free
                assert deliver(f"127.0.0.1:{base}", topic, [b"after"]) == (0, [])
                assert gateway.call(plane.unbound.problems) == []
                assert api_get(gateway, "/readyz")[0] == 200


@pytest.mark.one_data_path
def test_a_kafka_python_group_consumer_waits_quietly_while_its_broker_restarts(
        tmp_path: Path) -> None:
    """The listener of a broker that was down accepted a client's connection and closed
    it: kafka-python's group consumer raised `KafkaConnectionError: socket disconnected`
    from poll() at every try while its only broker restarted (4 times in 25 s), where
    directly (refused) it waited quietly. A broker that refuses connections now has its
    listener withdrawn until it answers again."""
    with EmbeddedKafka(heap=HEAP, data_dir=tmp_path / "kafka") as kafka:
        topic = create_topic(kafka.bootstrap)
        settings = gateway_settings(kafka, tmp_path / "work")
        with Gateway(settings) as gateway:
            producer = KafkaProducer(bootstrap_servers=gateway.bootstrap)
            producer.send(topic, b"before").get(30)
            producer.close()
            consumer = KafkaConsumer(topic, bootstrap_servers=gateway.bootstrap,
                                     group_id=f"g-{uuid.uuid4().hex[:6]}",
                                     auto_offset_reset="earliest")
            got: list[bytes] = []
            errors: list[str] = []

            def poll(seconds: float, until: int = 0) -> None:
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline and (not until or len(got) < until):
                    try:
                        got.extend(m.value for b in consumer.poll(500).values() for m in b)
                    except Exception as err:  # what the application sees
                        errors.append(repr(err))
            try:
                poll(30, until=1)
                kafka.stop()
                poll(15)
                kafka.start()
                producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
                producer.send(topic, b"after").get(30)
                producer.close()
                poll(60, until=2)
            finally:
                consumer.close()
            assert errors == [] and got == [b"before", b"after"]


def test_a_fenced_broker_is_shown_at_its_own_listener_port(tmp_path: Path) -> None:
    """Kafka's ClusterTool listing fenced brokers through keg showed a stopped broker at
    another broker's listener (directly: at its own address). It is now shown at the
    port its listener has whenever it is up."""
    with EmbeddedKafka(heap=HEAP) as controller, \
            EmbeddedKafka(heap=HEAP, joins=controller, node_id=2) as stopped:
        settings = gateway_settings(controller, tmp_path / "work", refresh_interval_s=0.5)
        with Gateway(settings) as gateway:
            assert until_routed(gateway, 2)
            ports = listener_ports(gateway)
            stopped.stop()
            deadline = time.monotonic() + 30
            while 2 in routed_brokers(gateway) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert routed_brokers(gateway) == {1}
            done = run_java_tool(
                "org.apache.kafka.tools.ClusterTool", "list-endpoints", "--bootstrap-server",
                f"127.0.0.1:{ports[1]}", "--include-fenced-brokers", timeout=120, check=True)
            rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()
                    if line.split() and line.split()[0].isdigit()}
            assert rows["2"][1:3] == ["127.0.0.1", str(ports[2])], done.stdout
            assert "fenced" in rows["2"], done.stdout
            assert rows["1"][1:3] == ["127.0.0.1", str(ports[1])], done.stdout


@pytest.mark.one_data_path
def test_a_brokers_listener_never_takes_a_port_of_kegs_own(tmp_path: Path) -> None:
    """A broker's listener port is the next one from the base: it was given a port keg
    itself serves (its metrics here), Envoy could not bind it, and the broker's clients
    were sent there and timed out. Brokers' ports now go around keg's own."""
    base = free_port_run(3)
    with EmbeddedKafka(heap=HEAP) as controller, \
            EmbeddedKafka(heap=HEAP, joins=controller, node_id=2) as second:
        settings = gateway_settings(controller, tmp_path / "work", listen_port_base=base,
                                    metrics_port=base + 1)
        with Gateway(settings) as gateway:
            assert until_routed(gateway, 2)
            assert listener_ports(gateway) == {1: base, 2: base + 2}
            topic = topic_on(controller, "on-broker-2", second.node_id)
            assert deliver(f"127.0.0.1:{base}", topic, [b"reached"]) == (0, [])


@pytest.mark.one_data_path
def test_keg_starts_again_while_its_only_bootstrap_server_is_down(tmp_path: Path) -> None:
    """keg restarted while the one broker of --bootstrap-servers was down gave up after
    a minute ("no bootstrap server answered"), the other brokers up: it now asks the
    brokers its last run knew too."""
    with EmbeddedKafka(heap=HEAP) as controller, \
            EmbeddedKafka(heap=HEAP, joins=controller, node_id=2) as bootstrap:
        settings = gateway_settings(bootstrap, tmp_path / "work")
        with Gateway(settings) as gateway:
            assert until_routed(gateway, 1) and until_routed(gateway, 2)
        bootstrap.stop()
        with Gateway(settings) as gateway:
            assert until_routed(gateway, 1)
            topic = topic_on(controller, "restarted", controller.node_id)
            assert deliver(gateway.bootstrap, topic, [b"up again"]) == (0, [])


@pytest.mark.one_data_path
def test_a_server_that_never_answers_does_not_hold_discovery(kafka: EmbeddedKafka) -> None:
    """Discovery asked one server after another, each for the whole timeout: one that
    accepts and never answers (a stopped process) held every refresh that long before
    the next was asked. The next one is now asked after a second without an answer."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen()  # connections complete in the backlog; nothing ever answers
        servers = f"127.0.0.1:{hung.getsockname()[1]},{kafka.bootstrap}"
        topology = asyncio.run(asyncio.wait_for(fetch_topology(servers, timeout=600), 60))
    assert [(b.host, b.port) for b in topology.brokers] == [("127.0.0.1", kafka.port)]
