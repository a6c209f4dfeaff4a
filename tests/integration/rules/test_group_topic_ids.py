"""Consumers of the new group protocol (KIP-848) through a pool of Python workers, on
both data paths, with the real Envoy, the real broker and Kafka's Java consumer.

Such a consumer's heartbeat (ConsumerGroupHeartbeat) names its partitions by topic id.
With any topic rule the heartbeats go to the Python service, whose workers learned ids
only from the Metadata answers each saw; the consumer asks Metadata on another
connection, often served by another worker, which then refused the heartbeat
UNKNOWN_TOPIC_ID. Java's consumer takes that as fatal: about half of the Java consumers
died within a second of starting (`keg up` runs a worker per core). The workers now
share the ids they learn (`ext_proc.shared_topic_ids`), and on the native path the
module names the ids it knows in every hand-off of an API that carries them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.providers import StaticRuleProvider
from filter_rules import load_rule_text
from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from keg.gateway import Gateway, GatewaySettings
from tests.integration.conftest import create_topic, produce_one

pytestmark = pytest.mark.integration

# A topic rule on every API: heartbeats go to the Python service.
RULES = """
rules:
  - id: hide-hidden
    match: {topics: {prefix: [hidden.]}}
    action: {deny: {}}
"""
CONSUMERS = 6  # each on fresh topics: a worker that never saw them named serves some


@pytest.fixture(scope="module", params=["ext-proc", "native"])
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory,
            request: pytest.FixtureRequest) -> Iterator[Gateway]:
    work: Path = tmp_path_factory.mktemp("group-ids")
    settings = GatewaySettings(
        bootstrap_servers=kafka.bootstrap, listen_port_base=0,
        rules_provider=StaticRuleProvider(load_rule_text(RULES, "rules.yaml"), version="1"),
        work_dir=work, ext_proc_log_level="WARNING", data_path=request.param,
        ext_proc_workers=2, envoy_concurrency=2)
    with Gateway(settings) as gw:
        yield gw


def test_java_consumers_of_the_new_group_protocol_start_whatever_worker_they_meet(
        gateway: Gateway, kafka: EmbeddedKafka) -> None:
    failures = []
    for n in range(CONSUMERS):
        topic = create_topic(kafka.bootstrap, name=f"kip848-ids-{n}-{uuid.uuid4().hex[:6]}")
        for i in range(3):
            assert produce_one(kafka.bootstrap, topic) is None, i
        done = run_java_tool(
            "console-consumer", "--bootstrap-server", gateway.bootstrap, "--topic", topic,
            "--group", f"g-{topic}", "--from-beginning", "--max-messages", "3",
            "--timeout-ms", "30000", "--consumer-property", "group.protocol=consumer",
            timeout=90)
        if done.stdout.splitlines() != ["v"] * 3:
            failures.append((topic, done.stdout[-300:], done.stderr[-1500:]))
    assert failures == [], failures
