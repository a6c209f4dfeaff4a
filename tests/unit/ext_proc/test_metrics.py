"""Metrics: the series appear after increments, label values stay bounded, /metrics serves."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from ext_proc.metrics import LATENCY_BUCKETS, OTHER, BoundedLabel, Metrics, api_label
from kafka_wire import ApiKey


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def exercised() -> Metrics:
    m = Metrics()
    m.request(ApiKey.PRODUCE, 9, "User:alice", "orders")
    m.request(ApiKey.PRODUCE, 9, "User:alice", "orders")
    m.request(ApiKey.METADATA, 12, "User:ANONYMOUS")
    m.frame_bytes(ApiKey.PRODUCE, "request", 1500)
    m.frame_bytes(ApiKey.PRODUCE, "response", 60)
    m.decision("no-pii", "deny", "enforce", "denied")
    m.decision("no-pii", "deny", "dry-run", "would-deny")
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
                 topic="orders") == 2
    assert value(m, "keg_requests_total", api="Metadata", version="12",
                 principal="User:ANONYMOUS", topic="") == 1
    assert value(m, "keg_request_bytes_total", api="Produce", direction="request") == 1500
    assert value(m, "keg_decisions_total", rule="no-pii", action="deny", mode="dry-run",
                 outcome="would-deny") == 1
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
        'keg_requests_total{api="Produce",principal="User:alice",topic="orders",version="9"} 2.0',
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


def test_principals_and_topics_are_bounded() -> None:
    m = Metrics(max_principals=2, max_topics=1)
    for name in ("User:a", "User:b", "User:c", "User:d", "User:a"):
        m.request(ApiKey.PRODUCE, 9, name, "t1")
    m.request(ApiKey.PRODUCE, 9, "User:a", "t2")
    assert value(m, "keg_requests_total", api="Produce", version="9", principal="User:a",
                 topic="t1") == 2
    assert value(m, "keg_requests_total", api="Produce", version="9", principal=OTHER,
                 topic="t1") == 2
    assert value(m, "keg_requests_total", api="Produce", version="9", principal="User:a",
                 topic=OTHER) == 1
    assert len(m.principal_label) == 2


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
        assert 'keg_decisions_total{action="deny",mode="enforce",outcome="denied",' \
            'rule="no-pii"} 1.0' in body
        assert "keg_connections_total 2.0" in body
        m.connection_opened()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert "keg_connections_total 3.0" in response.read().decode()
    finally:
        m.stop_http_server()
    m.stop_http_server()  # idempotent


def test_connection_meters_count_exactly_and_flush_at_scrape() -> None:
    from ext_proc.metrics import ConnectionMeter

    metrics = Metrics()
    meter = ConnectionMeter(metrics, 1, lambda: "User:alice")
    for _ in range(3):
        meter.request(ApiKey.PRODUCE, 9, 100)
        meter.forwarded()
    meter.bytes(0, "response", 40)
    text = metrics.exposition().decode()  # the scrape flushes the pending counts
    assert 'keg_requests_total{api="Produce",principal="User:alice",topic="",version="9"} 3.0' \
        in text
    assert 'keg_forwarded_requests_total{broker="1"} 3.0' in text
    assert 'keg_request_bytes_total{api="Produce",direction="request"} 300.0' in text
    meter.request(ApiKey.PRODUCE, 9, 100)
    meter.close()  # a closing connection flushes too, and leaves the registry of meters
    assert 'principal="User:alice",topic="",version="9"} 4.0' in metrics.exposition().decode()
    assert len(metrics.meters) == 0
