"""Metrics: the series appear after increments, label values stay bounded, /metrics serves."""

from __future__ import annotations

import itertools
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

import kafka_wire
from ext_proc.metrics import (
    LATENCY_BUCKETS,
    OTHER,
    BoundedLabel,
    BoundedSeries,
    ConnectionMeter,
    Metrics,
    api_label,
)
from kafka_wire import ApiKey
from kafka_wire.framing import REQUEST_HEAD_SIZE
from kafka_wire.produce_topics import ProduceTopics, client_id_of


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def samples(m: Metrics, name: str) -> list[dict[str, str]]:
    """The label sets of `name`'s samples."""
    return [sample.labels for family in m.registry.collect() for sample in family.samples
            if sample.name == name]


def exercised() -> Metrics:
    m = Metrics()
    m.request(ApiKey.PRODUCE, 9, "User:alice", "billing-app")
    m.request(ApiKey.PRODUCE, 9, "User:alice", "billing-app")
    m.request(ApiKey.METADATA, 12, "User:ANONYMOUS")
    m.topic_request(ApiKey.PRODUCE, "orders", "billing-app", "User:alice", record_bytes=700)
    m.frame_bytes(ApiKey.PRODUCE, "request", 1500)
    m.frame_bytes(ApiKey.PRODUCE, "response", 60)
    m.decision("no-pii", "deny", "enforce", "denied", api_key=ApiKey.PRODUCE, error_code=29)
    m.decision("no-pii", "deny", "dry-run", "would-deny")
    m.refusal(ApiKey.PRODUCE, "orders", "billing-app", "User:alice", "no-pii", 29)
    m.decode_error(ApiKey.FETCH, "response")
    m.connection_opened()
    m.connection_opened()
    m.connection_closed()
    m.frame_latency_observe(0.00007)
    m.forwarded_request(2)
    m.set_rule_set_version("sha256:abc")
    m.rule_reload("ok")
    m.rule_reload("invalid")
    return m


def test_series_after_increments() -> None:
    m = exercised()
    assert value(m, "keg_requests_total", api="Produce", version="9", principal="User:alice",
                 client_id="billing-app") == 2
    assert value(m, "keg_requests_total", api="Metadata", version="12",
                 principal="User:ANONYMOUS", client_id="") == 1
    orders = {"api": "Produce", "topic": "orders", "client_id": "billing-app",
              "principal": "User:alice"}
    assert value(m, "keg_topic_requests_total", **orders) == 1
    assert value(m, "keg_topic_record_bytes_total", **orders) == 700
    assert value(m, "keg_refusals_total", **orders, rule="no-pii",
                 error="TOPIC_AUTHORIZATION_FAILED") == 1
    assert value(m, "keg_decisions_total", rule="no-pii", action="deny", mode="enforce",
                 outcome="denied", api="Produce", error="TOPIC_AUTHORIZATION_FAILED") == 1
    assert value(m, "keg_request_bytes_total", api="Produce", direction="request") == 1500
    assert value(m, "keg_decisions_total", rule="no-pii", action="deny", mode="dry-run",
                 outcome="would-deny", api="", error="") == 1
    assert value(m, "keg_decode_errors_total", api="Fetch", direction="response") == 1
    assert value(m, "keg_connections_active") == 1
    assert value(m, "keg_connections_total") == 2
    assert value(m, "keg_frame_latency_seconds_bucket", le="5e-05") == 0
    assert value(m, "keg_frame_latency_seconds_bucket", le="0.0001") == 1
    assert value(m, "keg_frame_latency_seconds_count") == 1
    assert value(m, "keg_forwarded_requests_total", broker="2") == 1
    assert value(m, "keg_rule_set_version_info", version="sha256:abc") == 1
    assert value(m, "keg_rule_reloads_total", result="invalid") == 1

    text = m.exposition().decode()
    for series in (
        'keg_requests_total{api="Produce",client_id="billing-app",principal="User:alice",'
        'version="9"} 2.0',
        'keg_connections_active 1.0',
        'keg_frame_latency_seconds_bucket{le="1.0"} 1.0',
        'keg_rule_set_version_info{version="sha256:abc"} 1.0',
    ):
        assert series in text
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"keg_requests", "keg_request_bytes", "keg_decisions", "keg_decode_errors",
            "keg_connections_active", "keg_connections", "keg_frame_latency_seconds",
            "keg_forwarded_requests", "keg_rule_set_version_info", "keg_rule_reloads"} <= names


def test_latency_buckets_span_50us_to_1s() -> None:
    assert LATENCY_BUCKETS[0] == 0.00005 and LATENCY_BUCKETS[-1] == 1.0
    assert list(LATENCY_BUCKETS) == sorted(LATENCY_BUCKETS)


def test_rule_set_version_has_one_value() -> None:
    m = Metrics()
    m.set_rule_set_version("v1")
    m.set_rule_set_version("v2")
    assert value(m, "keg_rule_set_version_info", version="v1") is None
    assert value(m, "keg_rule_set_version_info", version="v2") == 1


def test_principals_clients_and_topics_are_bounded() -> None:
    m = Metrics(max_principals=2, max_topics=1, max_clients=1)
    for name in ("User:a", "User:b", "User:c", "User:d", "User:a"):
        m.request(ApiKey.PRODUCE, 9, name, "c1")
    m.request(ApiKey.PRODUCE, 9, "User:a", "c2")
    assert value(m, "keg_requests_total", api="Produce", version="9", principal="User:a",
                 client_id="c1") == 2
    assert value(m, "keg_requests_total", api="Produce", version="9", principal=OTHER,
                 client_id="c1") == 2
    assert value(m, "keg_requests_total", api="Produce", version="9", principal="User:a",
                 client_id=OTHER) == 1
    m.topic_request(ApiKey.PRODUCE, "t1", "c1", "User:a")
    m.topic_request(ApiKey.PRODUCE, "t2", "c1", "User:a")
    assert value(m, "keg_topic_requests_total", api="Produce", topic=OTHER, client_id="c1",
                 principal="User:a") == 1
    assert len(m.principal_label) == 2 and len(m.topic_label) == 1


def test_combinations_of_bounded_labels_are_bounded_too() -> None:
    """Each label under its bound, their combinations were not: one client changing its
    client id per request made topics x client ids series."""
    m = Metrics(max_series=4)
    for n in range(10):
        for t in range(10):
            m.topic_request(ApiKey.PRODUCE, f"t{t}", f"c{n}", "User:a", record_bytes=10)
            m.request(ApiKey.PRODUCE, 9, "User:a", f"c{n * 10 + t}")
    # the first 4 combinations, then one of "other"
    assert len(samples(m, "keg_topic_requests_total")) == 5
    assert value(m, "keg_topic_requests_total", api="Produce", topic=OTHER, client_id=OTHER,
                 principal=OTHER) == 96
    assert value(m, "keg_topic_record_bytes_total", api="Produce", topic=OTHER,
                 client_id=OTHER, principal=OTHER) == 960
    assert len(samples(m, "keg_requests_total")) == 5
    assert value(m, "keg_requests_total", api="Produce", version="9", client_id=OTHER,
                 principal=OTHER) == 96


def test_bounded_series_folds_only_the_labels_clients_choose() -> None:
    series = BoundedSeries(1, (1,))
    assert series("Produce", "t1") == ("Produce", "t1")
    assert series("Fetch", "t2") == ("Fetch", OTHER)
    assert series("Produce", "t1") == ("Produce", "t1")


def test_bounded_label() -> None:
    label = BoundedLabel(3)
    assert [label(v) for v in "abcdab"] == ["a", "b", "c", OTHER, "a", "b"]


def test_api_label() -> None:
    assert (
        api_label(ApiKey.PRODUCE) == "Produce"
        and api_label(ApiKey.SASL_AUTHENTICATE) == "SaslAuthenticate"
    )
    assert api_label(32767) == "32767"


def test_registries_are_independent() -> None:
    a, b = Metrics(), Metrics()
    a.connection_opened()
    assert value(a, "keg_connections_total") == 1
    assert value(b, "keg_connections_total") == 0


def test_http_endpoint_serves_the_registry() -> None:
    m = exercised()
    port = m.start_http_server(0, "127.0.0.1")
    try:
        assert port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.status == 200
            body = response.read().decode()
        assert 'keg_decisions_total{action="deny",api="Produce",' \
            'error="TOPIC_AUTHORIZATION_FAILED",mode="enforce",outcome="denied",' \
            'rule="no-pii"} 1.0' in body
        assert "keg_connections_total 2.0" in body
        m.connection_opened()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert "keg_connections_total 3.0" in response.read().decode()
    finally:
        m.stop_http_server()
    m.stop_http_server()  # idempotent


def test_connection_meters_count_exactly_and_flush_at_scrape() -> None:
    metrics = Metrics()
    meter = ConnectionMeter(metrics, 1, lambda: "User:alice")
    for _ in range(3):
        meter.request(ApiKey.PRODUCE, 9, 100)
        meter.forwarded()
    meter.bytes(0, "response", 40)
    text = metrics.exposition().decode()  # the scrape flushes the pending counts
    assert 'keg_requests_total{api="Produce",client_id="",principal="User:alice",version="9"} '\
        '3.0' in text
    assert 'keg_forwarded_requests_total{broker="1"} 3.0' in text
    assert 'keg_request_bytes_total{api="Produce",direction="request"} 300.0' in text
    meter.request(ApiKey.PRODUCE, 9, 100)
    meter.close()  # a closing connection flushes too, and leaves the registry of meters
    assert 'principal="User:alice",version="9"} 4.0' in metrics.exposition().decode()
    assert len(metrics.meters) == 0


def produce_frame(version: int, topics: dict[str, list[bytes]], client_id: str = "app",
                  correlation_id: int = 7) -> bytes:
    """A real Produce request frame (the codec's), size prefix included."""
    header = kafka_wire.RequestHeader(ApiKey.PRODUCE, version, correlation_id, client_id, {})
    body = {"TransactionalId": None, "Acks": -1, "TimeoutMs": 1000, "TopicData": [
        {"Name": name, "PartitionData": [{"Index": i, "Records": batch}
                                         for i, batch in enumerate(batches)]}
        for name, batches in topics.items()]}
    return kafka_wire.encode_request(header, body)


def skimmed(frame: bytes, version: int, cuts: list[int]) -> list[tuple[bytes, int, int]]:
    found: list[tuple[bytes, int, int]] = []
    skim = ProduceTopics(version, lambda topic, is_id, parts, size: found.append(
        (topic, parts, size)))
    body = memoryview(frame)[REQUEST_HEAD_SIZE:]
    edges = [0, *cuts, len(body)]
    for start, end in itertools.pairwise(edges):
        skim.feed(body[start:end])
    assert skim.done
    return found


@pytest.mark.parametrize("version", [3, 8, 9, 12])
def test_produce_topics_are_read_from_any_split_of_the_frame(version: int) -> None:
    batches = {"orders": [b"x" * 300, b"y" * 5], "payments.eu": [], "audit": [b"z" * 70]}
    frame = produce_frame(version, batches)
    expected = [(b"orders", 2, 305), (b"payments.eu", 0, 0), (b"audit", 1, 70)]
    body_size = len(frame) - REQUEST_HEAD_SIZE
    assert skimmed(frame, version, []) == expected
    for cut in range(body_size + 1):  # every two-piece split
        assert skimmed(frame, version, [cut]) == expected, cut
    assert skimmed(frame, version, list(range(1, body_size))) == expected  # byte by byte


def test_produce_v13_topic_ids_are_named_from_what_metadata_taught() -> None:
    orders, unknown = uuid.uuid4(), uuid.uuid4()
    header = kafka_wire.RequestHeader(ApiKey.PRODUCE, 13, 1, "app", {})
    body = {"TransactionalId": None, "Acks": 1, "TimeoutMs": 1000, "TopicData": [
        {"TopicId": topic_id, "PartitionData": [{"Index": 0, "Records": b"r" * 10}]}
        for topic_id in (orders, unknown)]}
    frame = kafka_wire.encode_request(header, body)
    metrics = Metrics()
    metrics.topic_ids.add(orders, "orders")
    meter = ConnectionMeter(metrics, 1, lambda: "User:alice")
    meter.request(ApiKey.PRODUCE, 13, len(frame), memoryview(frame)[REQUEST_HEAD_SIZE:])
    assert meter.topics(ApiKey.PRODUCE, 13, memoryview(frame)[REQUEST_HEAD_SIZE:]) is None
    meter.close()
    for topic in ("orders", str(unknown)):
        assert value(metrics, "keg_topic_record_bytes_total", api="Produce", topic=topic,
                     client_id="app", principal="User:alice") == 10


def test_a_malformed_produce_stops_the_skim_without_raising() -> None:
    frame = produce_frame(9, {"orders": [b"x" * 10]})
    broken = bytearray(frame)
    broken[REQUEST_HEAD_SIZE + 2 + 3 + 1 + 1 + 6] = 0  # the topic array's length: null
    found: list[bytes] = []
    skim = ProduceTopics(9, lambda topic, *_: found.append(topic))
    skim.feed(memoryview(bytes(broken))[REQUEST_HEAD_SIZE:])
    assert skim.done and found == []
    assert client_id_of(b"\x00") is None and client_id_of(b"\xff\xff") == b""


def test_a_session_counts_a_passing_produce_per_topic_across_chunks() -> None:
    """Through a real KafkaSession without rules: the Produce frame passes unheld, cut
    into three chunks, and still leaves series naming its topics and client id."""
    from ext_proc.connection import ConnectionInfo
    from ext_proc.server import DataPath, ProcessorSettings

    data_path = DataPath(ProcessorSettings())
    session = data_path.session(ConnectionInfo(), 1 << 20)
    frame = produce_frame(9, {"orders": [b"x" * 5000], "audit": [b"y" * 100]},
                          client_id="billing")
    chunks = [frame[:40], frame[40:3000], frame[3000:]]
    assert b"".join(session.from_client(chunk) for chunk in chunks) == frame
    session.close()
    m = data_path.metrics
    assert value(m, "keg_topic_record_bytes_total", api="Produce", topic="orders",
                 client_id="billing", principal="User:ANONYMOUS") == 5000
    assert value(m, "keg_topic_requests_total", api="Produce", topic="audit",
                 client_id="billing", principal="User:ANONYMOUS") == 1
    assert value(m, "keg_requests_total", api="Produce", version="9", client_id="billing",
                 principal="User:ANONYMOUS") == 1


def test_topic_labels_can_be_turned_off() -> None:
    from ext_proc.connection import ConnectionInfo
    from ext_proc.server import DataPath, ProcessorSettings

    data_path = DataPath(ProcessorSettings(metrics_topics=False))
    session = data_path.session(ConnectionInfo(), 1 << 20)
    frame = produce_frame(9, {"orders": [b"x" * 50]})
    assert session.from_client(frame) == frame
    session.close()
    exposed = data_path.metrics.exposition().decode()
    assert "keg_topic_requests_total{" not in exposed
    assert 'keg_requests_total{api="Produce",client_id="app"' in exposed


def test_frames_handed_off_by_the_kafka_filter_count_apart_from_all_traffic() -> None:
    """On the native path keg's Kafka filter counts keg_requests_total and the topic
    series of every request itself: the ext_proc service counts only what it was handed
    (keg_handed_off_requests_total), so no request is counted twice."""
    metrics = Metrics()
    meter = ConnectionMeter(metrics, 1, lambda: "User:alice", handed_off=True)
    frame = produce_frame(9, {"orders": [b"x" * 10]})
    body = memoryview(frame)[REQUEST_HEAD_SIZE:]
    meter.request(ApiKey.PRODUCE, 9, len(frame), body)
    assert meter.topics(ApiKey.PRODUCE, 9, body) is None
    meter.close()
    assert value(metrics, "keg_handed_off_requests_total", api="Produce", version="9",
                 client_id="app", principal="User:alice") == 1
    text = metrics.exposition().decode()
    assert "keg_requests_total{" not in text
    assert "keg_topic_requests_total{" not in text
