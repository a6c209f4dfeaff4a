"""Live rule impact end to end: the real gateway streams its audit events to the real
broker, `keg analyze --follow`'s streaming query (a real SparkSession with Spark's
Kafka source) aggregates them, and the control plane's REST API serves the result.

Duplicates (the same event ids again) and late events (older than the watermark) do
not change the counts; the impact equals what the audit files say (one per ext_proc
worker: the gateway runs two, both streaming to the topic), per rule.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from control_plane.service import free_port
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import ApiOptions, AuditStream, Gateway
from pipeline.inputs import KafkaInput
from tests.integration.conftest import create_topic, gateway_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The streaming query is the subject, not the data path: once, on the default path.
pytestmark = [pytest.mark.integration, pytest.mark.one_data_path]

RULES = """\
apiVersion: keg/v1
kind: RuleSet
rules:
  - id: mask-emails
    match: {topics: {prefix: [impact-]}}
    action: {mask: {fields: ["$.email"]}}
  - id: no-secrets
    match: {apis: [Produce], topics: {prefix: [impact-secret-]}}
    action: {deny: {message: no secrets here}}
  - id: watch-produce
    match: {apis: [Produce], topics: {prefix: [impact-]}}
    action: {observe: {}}
"""


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    from pyspark.sql import SparkSession

    from pipeline.spark import build_session

    active = SparkSession.getActiveSession()
    if active is not None:  # one without the Kafka source's jars cannot get them
        active.stop()
    session = build_session("local[2]", app_name="keg-impact-test", kafka=True,
                            shuffle_partitions=1, driver_memory="1g")
    yield session
    session.stop()


@pytest.fixture
def gateway(kafka: EmbeddedKafka, tmp_path: Path) -> Iterator[tuple[Gateway, str, Path, str]]:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "rules.yaml").write_text(RULES)
    topic = f"_keg_audit_{uuid.uuid4().hex[:6]}"
    api_port = free_port()
    settings = gateway_settings(
        kafka, tmp_path / "work", rules_dir=rules,
        audit_log=tmp_path / "audit" / "audit.jsonl", ext_proc_workers=2, envoy_concurrency=2,
        audit_kafka=AuditStream(topic=topic, spool_dir=tmp_path / "spool"),
        api=ApiOptions(data_dir=tmp_path / "api", port=api_port, public_reads=True,
                       impact_dir=tmp_path / "impact"))
    with Gateway(settings) as gw:
        yield gw, topic, tmp_path, f"http://127.0.0.1:{api_port}"


def wait_for(check: Callable[[], Any], timeout: float, what: str,
             seen: Callable[[], Any] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, (
            f"timed out waiting for {what}" + (f"; seen: {seen()}" if seen else ""))
        time.sleep(0.2)


def produce(bootstrap: str, topic: str, values: list[bytes], retries: bool = True) -> int:
    """Records through the gateway; the number the broker took."""
    taken: list[int] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         **({} if retries else {"retries": 0})})
    for value in values:
        producer.produce(topic, value, on_delivery=lambda err, _m: taken.append(err is None))
    producer.flush(60)
    return sum(taken)


def impact_rows(api: str, **params: str) -> list[dict[str, Any]]:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    with urllib.request.urlopen(f"{api}/v1/impact?{query}", timeout=10) as response:
        body = json.loads(response.read())
    assert body["available"]
    rows: list[dict[str, Any]] = body["rows"]
    return rows


def file_events(gw: Gateway) -> list[dict[str, Any]]:
    """Every event the workers wrote to their audit files."""
    return [json.loads(line) for path in gw.audit_logs if path.exists()
            for line in path.read_text().splitlines() if line]


def settled(api: str, gw: Gateway) -> dict[str, int]:
    """Decisions per rule once the impact counts every event of the audit files once."""
    expected = totals([{**e, "decisions": 1} for e in file_events(gw)], "decisions")
    wait_for(lambda: totals(impact_rows(api), "decisions") == expected, 120,
             f"the impact to reach {expected}", lambda: totals(impact_rows(api), "decisions"))
    return expected


def totals(rows: list[dict[str, Any]], key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in rows:
        out[row["rule_id"]] = out.get(row["rule_id"], 0) + row[key]
    return out


def test_follow_shows_a_rules_impact_and_counts_each_event_once(
        spark: SparkSession, kafka: EmbeddedKafka,
        gateway: tuple[Gateway, str, Path, str]) -> None:
    from pipeline.impact import follow

    gw, topic, base, api = gateway
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    wait_for(lambda: topic in admin.list_topics(timeout=10).topics, 60, "the audit topic")
    query, sink = follow(spark, KafkaInput(kafka.bootstrap, topic), base / "impact",
                         trigger="1 second")
    try:
        wait_for(lambda: "Waiting" in query.status["message"], 120, "the query to start")
        orders = create_topic(kafka.bootstrap, partitions=2,
                              name=f"impact-orders-{uuid.uuid4().hex[:6]}")
        secret = create_topic(kafka.bootstrap, name=f"impact-secret-{uuid.uuid4().hex[:6]}")

        started = time.monotonic()
        docs = [json.dumps({"n": i, **({"email": f"u{i}@x"} if i % 3 == 0 else {})}).encode()
                for i in range(300)]
        assert produce(gw.bootstrap, orders, docs) == 300
        assert produce(gw.bootstrap, secret, [b"{}"] * 20, retries=False) == 0
        wait_for(lambda: impact_rows(api, rule_id="mask-emails"), 120, "the impact")
        visible = time.monotonic() - started
        print(f"\nimpact of mask-emails visible {visible:.1f} s after traffic started")

        # Every event of the audit files, counted once, with its bytes and records.
        reference = file_events(gw)
        expected = totals([{**e, "decisions": 1} for e in reference], "decisions")
        wait_for(lambda: totals(impact_rows(api), "decisions") == expected, 120,
                 f"the impact to reach {expected}",
                 lambda: totals(impact_rows(api), "decisions"))
        rows = impact_rows(api)
        assert totals(rows, "records") == totals(reference, "records")
        assert totals(rows, "bytes") == totals(reference, "bytes")
        assert expected["mask-emails"] >= 1 and totals(rows, "records")["mask-emails"] == 100
        denied = [r for r in rows if r["rule_id"] == "no-secrets"]
        assert {(r["topic"], r["outcome"]) for r in denied} == {(secret, "denied")}
        assert sum(r["errors"] for r in denied) == expected["no-secrets"]
        assert all(r["p99_latency_ms"] >= r["p50_latency_ms"] > 0 for r in rows)
        assert {r["principal"] for r in rows} == {"User:ANONYMOUS"}

        # The same events again (a spool delivering twice), with newer traffic.
        resend = Producer({"bootstrap.servers": kafka.bootstrap})
        for event in reference[:50]:
            resend.produce(topic, json.dumps(event).encode())
        assert resend.flush(30) == 0
        assert produce(gw.bootstrap, orders, docs[:30]) == 30
        expected = settled(api, gw)

        # An event an hour old: older than the watermark (Spark drops an event older than
        # the watermark the previous micro-batch ended with), with newer traffic again.
        late = {**reference[0], "event_id": uuid.uuid4().hex, "rule_id": "late-rule",
                "ts": (datetime.now(UTC) - timedelta(hours=1)).strftime(
                    "%Y-%m-%dT%H:%M:%S.000Z")}
        resend.produce(topic, json.dumps(late).encode())
        assert resend.flush(30) == 0
        assert produce(gw.bootstrap, orders, docs[:30]) == 30
        after = settled(api, gw)
        assert after["mask-emails"] > expected["mask-emails"]
        assert not impact_rows(api, rule_id="late-rule")

        def dropped() -> int:
            return sum(o.get("numRowsDroppedByWatermark", 0) for p in query.recentProgress
                       for o in p["stateOperators"])

        # A batch's progress is reported once it committed, after its sink wrote the rows
        # the API already serves: wait for it.
        wait_for(lambda: dropped() == 1, 30, "the late event to be reported dropped",
                 lambda: [(p["batchId"], p["numInputRows"], p["stateOperators"])
                          for p in query.recentProgress])
    finally:
        query.stop()
    # The follower kept the live page (written with the first rows, then every 10 s).
    assert sink.rows_written > 0
    assert "mask-emails" in (base / "impact" / "report.html").read_text()
