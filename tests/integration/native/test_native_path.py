"""The native data path: keg's Kafka filter inside the real Envoy, real broker, real clients.

The client-facing tests of the ext_proc path run here again against `native_gateway`
(this module's `gateway` fixture is the native one), plus what only the native path
promises: ApiVersions passes untouched (no API or version the broker offers is hidden),
Produce v12+ (transaction.version=2) passes, and the module reports what it did.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
from confluent_kafka import Consumer, Producer

from control_plane.topology import Topology
from kafka_wire import ApiKey
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.dashboard import (
    ENVOY_PREFIX,
    NATIVE_PREFIX,
    dashboard_queries,
    exposed,
    referenced,
    unknown_references,
)
from tests.integration.conftest import create_topic
from tests.integration.protocol.test_gateway_protocol import (  # noqa: F401  (collected here too)
    RawConnection,
    broker_versions,
    gateway_addresses,
    test_coordinator_and_cluster_answers_name_only_gateway_listeners,
    test_malformed_frames_close_only_their_connection,
    test_real_clients_only_learn_gateway_addresses,
)
from tests.integration.protocol.test_passthrough import (  # noqa: F401  (collected here too)
    make_records,
    produce_confluent,
    test_consumer_group_of_two_commits_through_gateway,
    test_java_console_clients_through_gateway,
    test_produce_and_consume_byte_exact,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def gateway(native_gateway: Gateway) -> Iterator[Gateway]:
    """Every imported test of this module runs against the native data path."""
    yield native_gateway


def envoy_stats(gateway: Gateway) -> dict[str, int]:
    assert gateway.envoy is not None
    stats: dict[str, int] = {}
    for line in gateway.envoy.admin("/stats").splitlines():
        name, _, value = line.partition(": ")
        if "keg_kafka" in name and value.isdigit():
            stats[name.split("keg_kafka.", 1)[1]] = int(value)
    return stats


def test_the_node_runs_keg_filter_not_ext_proc(gateway: Gateway) -> None:
    assert gateway.envoy is not None
    listeners = gateway.envoy.admin("/config_dump?resource=dynamic_listeners")
    assert "DynamicModuleNetworkFilter" in listeners  # by ECDS
    assert "envoy.filters.network.ext_proc" not in listeners
    assert "keg_kafka_filter" in gateway.envoy.admin("/config_dump?resource=ecds_filters")
    statuses = [n for n in gateway.fleet_status() if n["role"] == "envoy"]
    assert [n["data_path"] for n in statuses] == ["native"]


def test_api_versions_pass_untouched(gateway: Gateway, kafka: EmbeddedKafka) -> None:
    assert broker_versions(gateway.bootstrap) == broker_versions(kafka.bootstrap)


def test_metadata_every_version_names_only_gateway_listeners(
        gateway: Gateway, kafka: EmbeddedKafka) -> None:
    topic = create_topic(gateway.bootstrap)
    expected = gateway_addresses(gateway)
    low, high = broker_versions(kafka.bootstrap)[ApiKey.METADATA]
    conn = RawConnection(gateway.bootstrap)
    try:
        for version in range(low, high + 1):
            body = conn.request(ApiKey.METADATA, version, {"Topics": [{"Name": topic}]})
            assert {(b["Host"], b["Port"]) for b in body["Brokers"]} == expected, f"v{version}"
    finally:
        conn.close()
    assert envoy_stats(gateway)["addresses_rewritten"] > 0


def test_transactional_producer_and_read_committed(gateway: Gateway) -> None:
    """Kafka 4.1's transaction.version=2: Produce v12+ carries the transaction itself."""
    topic = create_topic(gateway.bootstrap, partitions=2)
    producer = Producer({"bootstrap.servers": gateway.bootstrap,
                         "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(100):
        producer.produce(topic, f"committed-{i}".encode(), partition=i % 2)
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"aborted", partition=0)
    producer.abort_transaction(30)
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": f"tx-{topic}",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    values: list[bytes | None] = []
    for _ in range(60):
        values += [m.value() for m in consumer.consume(200, 1.0) if m.error() is None]
        if len(values) >= 100:
            break
    consumer.close()
    assert sorted(v or b"" for v in values) == sorted(f"committed-{i}".encode() for i in range(100))
    produce_versions = broker_versions(gateway.bootstrap)[0]
    assert produce_versions[1] >= 12, "the broker's Produce v12+ reaches clients"


def test_requests_and_bytes_are_counted_per_api(gateway: Gateway) -> None:
    topic = create_topic(gateway.bootstrap)
    produce_confluent(gateway.bootstrap, topic, make_records(100, "stats"), "none")
    stats = envoy_stats(gateway)
    assert stats["api.produce.requests"] > 0
    assert stats["api.produce.request_bytes"] > 100 * 20
    assert stats["api.metadata.response_bytes"] > 0
    assert stats.get("panics", 0) == 0


def test_api_versions_request_count_is_an_envoy_stat(gateway: Gateway) -> None:
    conn = RawConnection(gateway.bootstrap)
    try:
        conn.request(
            ApiKey.API_VERSIONS, 3, {"ClientSoftwareName": "t", "ClientSoftwareVersion": "1"}
        )
    finally:
        conn.close()
    assert gateway.envoy is not None
    prometheus = gateway.envoy.admin("/stats/prometheus")
    assert re.search(r"keg_kafka_api_api_versions_requests\S*\s+[1-9]", prometheus), \
        "per-API counters are visible on /stats/prometheus"


def test_the_dashboard_queries_what_the_native_envoy_exposes(
        gateway: Gateway, kafka: EmbeddedKafka) -> None:
    """The Grafana dashboard's native-path panels (keg_kafka_*) and Envoy panels
    (envoy_*) name series and labels this real Envoy, with keg's module, exposes on
    /stats/prometheus after a produce and a consume."""
    topic = create_topic(gateway.bootstrap)
    produce_confluent(gateway.bootstrap, topic, make_records(20, "dash"), "none")
    consumer = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": f"d-{topic}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got = 0
    for _ in range(60):
        got += sum(1 for m in consumer.consume(50, 1.0) if m.error() is None)
        if got >= 20:
            break
    consumer.close()
    assert got == 20
    assert gateway.envoy is not None
    series = exposed(gateway.envoy.admin("/stats/prometheus"))
    assert unknown_references(series, [NATIVE_PREFIX, ENVOY_PREFIX]) == []
    queried = {n for _, e in dashboard_queries() for n in referenced(e)[0]}
    assert any(n.startswith(NATIVE_PREFIX) for n in queried)


def _advertised_listeners(conn: RawConnection) -> str:
    body = conn.request(ApiKey.DESCRIBE_CONFIGS, 4, {
        "Resources": [{"ResourceType": 4, "ResourceName": "1",
                       "ConfigurationKeys": ["advertised.listeners"]}],
        "IncludeSynonyms": False, "IncludeDocumentation": False})
    return str(body["Results"][0]["Configs"][0]["Value"])


def test_route_changes_reach_live_connections_without_a_listener_change(
        gateway: Gateway) -> None:
    """Routes come by ECDS into the module's process-wide route table: a change updates
    a connection that is already open, and no listener changes (none is drained)."""
    plane = gateway.control_plane
    assert plane is not None and plane.topology is not None and gateway.envoy is not None
    original = plane.topology
    # The same broker under another name: its endpoint in the routes changes, so the
    # module no longer recognises 127.0.0.1:<port> in the broker's config values.
    renamed = Topology(original.cluster_id,
                       tuple(replace(b, host="localhost") for b in original.brokers))
    conn = RawConnection(gateway.bootstrap)
    listeners_before = {k: v for k, v in gateway.envoy.dynamic_versions().items()
                        if k.startswith("listener/")}

    async def hold_topology() -> bool:
        return False

    # The brokers are asked again every few seconds, and their answer is the original
    # topology: one asked right after the change undid it before the poll below saw it
    # (a fresh-clone CI run waited 30 s for it). The change stands for this test alone.
    plane.refresh = hold_topology  # type: ignore[method-assign]
    try:
        gateway_address = "{}:{}".format(*next(iter(gateway_addresses(gateway))))
        assert f"PLAINTEXT://{gateway_address}" in _advertised_listeners(conn)
        gateway.call(plane.set_topology, renamed)
        deadline = time.monotonic() + 30
        while "localhost:" not in gateway.envoy.admin("/config_dump?resource=ecds_filters"):
            assert time.monotonic() < deadline, "the new routes never reached Envoy"
            time.sleep(0.1)
        # The same connection answers with the new route table.
        assert _advertised_listeners(conn).startswith("PLAINTEXT://redacted:0")
        listeners_after = {k: v for k, v in gateway.envoy.dynamic_versions().items()
                           if k.startswith("listener/")}
        assert listeners_after == listeners_before
    finally:
        del plane.refresh
        gateway.call(plane.set_topology, original)
        conn.close()
