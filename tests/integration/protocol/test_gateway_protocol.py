"""The gateway keeps clients on it, and one bad connection never harms another."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient

import kafka_wire
from kafka_wire import ApiKey
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import create_topic
from tests.integration.raw_kafka import RawConnection

pytestmark = pytest.mark.integration


def gateway_addresses(gateway: Gateway) -> set[tuple[str, int]]:
    assert gateway.control_plane is not None and gateway.control_plane.plan is not None
    plan = gateway.control_plane.plan
    return {(plan.advertised_host, r.listen_port) for r in plan.routes}


def broker_versions(bootstrap: str) -> dict[int, tuple[int, int]]:
    conn = RawConnection(bootstrap)
    try:
        body = conn.request(ApiKey.API_VERSIONS, 0, {})
    finally:
        conn.close()
    return {e["ApiKey"]: (e["MinVersion"], e["MaxVersion"]) for e in body["ApiKeys"]}


def test_metadata_every_version_names_only_gateway_listeners(
        gateway: Gateway, kafka: EmbeddedKafka) -> None:
    topic = create_topic(gateway.bootstrap)
    expected = gateway_addresses(gateway)
    low, high = broker_versions(gateway.bootstrap)[ApiKey.METADATA]
    direct_low, direct_high = broker_versions(kafka.bootstrap)[ApiKey.METADATA]
    codec_versions = kafka_wire.supported_versions(ApiKey.METADATA)
    assert codec_versions is not None
    assert (low, high) == (direct_low, min(direct_high, codec_versions[1]))
    conn = RawConnection(gateway.bootstrap)
    try:
        for version in range(low, high + 1):
            body = conn.request(ApiKey.METADATA, version, {"Topics": [{"Name": topic}]})
            brokers = {(b["Host"], b["Port"]) for b in body["Brokers"]}
            assert brokers == expected, f"Metadata v{version}"
    finally:
        conn.close()


def find_coordinators(conn: RawConnection, version: int) -> set[tuple[str, int]]:
    """Coordinator addresses, asking again while the broker is still electing them."""
    deadline = time.monotonic() + 30
    while True:
        if version < 4:
            body = conn.request(ApiKey.FIND_COORDINATOR, version, {"Key": "some-group"})
            answers = [body]
        else:
            body = conn.request(ApiKey.FIND_COORDINATOR, version, {"CoordinatorKeys": ["g1", "g2"]})
            answers = body["Coordinators"]
        if all(a["ErrorCode"] == 0 for a in answers):
            return {(a["Host"], a["Port"]) for a in answers}
        assert time.monotonic() < deadline, f"no coordinator: {answers}"
        time.sleep(0.5)


def test_coordinator_and_cluster_answers_name_only_gateway_listeners(gateway: Gateway) -> None:
    expected = gateway_addresses(gateway)
    versions = broker_versions(gateway.bootstrap)
    conn = RawConnection(gateway.bootstrap)
    try:
        for version in range(
            versions[ApiKey.FIND_COORDINATOR][0], versions[ApiKey.FIND_COORDINATOR][1] + 1
        ):
            found = find_coordinators(conn, version)
            assert found <= expected, f"FindCoordinator v{version}: {found}"
        for version in range(
            versions[ApiKey.DESCRIBE_CLUSTER][0], versions[ApiKey.DESCRIBE_CLUSTER][1] + 1
        ):
            body = conn.request(ApiKey.DESCRIBE_CLUSTER, version, {})
            brokers = {(b["Host"], b["Port"]) for b in body["Brokers"]}
            assert brokers == expected, f"DescribeCluster v{version}"
    finally:
        conn.close()


def test_real_clients_only_learn_gateway_addresses(gateway: Gateway) -> None:
    expected = gateway_addresses(gateway)
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    brokers = admin.list_topics(timeout=10).brokers.values()
    assert {(b.host, b.port) for b in brokers} == expected
    cluster = admin.describe_cluster().result(10)
    assert {(n.host, n.port) for n in cluster.nodes} == expected

    group = "bypass-check"
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": group})
    consumer.subscribe([create_topic(gateway.bootstrap)])
    consumer.consume(1, 3.0)  # joins the group, which needs the coordinator
    described = admin.describe_consumer_groups([group])[group].result(10)
    assert (described.coordinator.host, described.coordinator.port) in expected
    consumer.close()

    kp = KafkaAdminClient(bootstrap_servers=gateway.bootstrap)
    try:
        nodes = kp.describe_cluster()["brokers"]
        assert {(n["host"], n["port"]) for n in nodes} == expected
    finally:
        kp.close()


MALFORMED = {
    "negative-size": struct.pack(">i", -5) + b"\0" * 16,
    "oversized": struct.pack(">i", 2**31 - 1) + b"\0" * 16,
    "garbage-header": struct.pack(">ihhi", 12, -77, -3, 1) + b"\xff" * 4,
    "truncated": struct.pack(">ihhih", 100, 3, 12, 1, -1) + b"\0" * 5,
}


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_malformed_frames_close_only_their_connection(gateway: Gateway) -> None:
    topic = create_topic(gateway.bootstrap)
    stop = threading.Event()
    delivered: list[int] = []
    failures: list[str] = []

    def keep_producing() -> None:
        producer = Producer({"bootstrap.servers": gateway.bootstrap, "linger.ms": 0,
                             "acks": "all"})

        def report(err: object, _msg: object) -> None:
            if err is None:
                delivered.append(1)
            else:
                failures.append(str(err))

        while not stop.is_set():
            producer.produce(topic, b"steady", on_delivery=report)
            producer.poll(0.01)
        producer.flush(30)

    worker = threading.Thread(target=keep_producing)
    worker.start()
    try:
        time.sleep(1.0)
        for name, payload in MALFORMED.items():
            host, port = next(iter(gateway_addresses(gateway)))
            with socket.create_connection((host, port), timeout=10) as bad:
                bad.sendall(payload)
                if name == "truncated":
                    bad.shutdown(socket.SHUT_WR)  # the rest of the frame never comes
                assert _closed_within(bad, 10), f"{name}: connection left open"
        before = len(delivered)
        deadline = time.monotonic() + 30  # progress, not speed: a busy machine is slow
        while len(delivered) <= before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(delivered) > before, "the healthy producer kept going"
    finally:
        stop.set()
        worker.join(60)
    assert failures == []
    consumed = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": "malformed-check",
                         "auto.offset.reset": "earliest"})
    consumed.subscribe([topic])
    seen = 0
    deadline = time.monotonic() + 60
    while seen < len(delivered) and time.monotonic() < deadline:
        seen += len(consumed.consume(1000, 1.0))
    consumed.close()
    assert seen == len(delivered)
