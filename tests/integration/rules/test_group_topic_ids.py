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

import pytest

from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from keg.gateway import Gateway
from tests.integration.conftest import (
    HIDE_HIDDEN_RULES,
    create_topic,
    gateway_with_static_rules,
    produce_one,
)

pytestmark = [pytest.mark.integration, pytest.mark.one_data_path]  # both paths, in the first pass

CONSUMERS = 6  # each on fresh topics: a worker that never saw them named serves some


@pytest.fixture(scope="module", params=["ext-proc", "native"])
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory,
            request: pytest.FixtureRequest) -> Iterator[Gateway]:
    with gateway_with_static_rules(kafka, tmp_path_factory.mktemp("group-ids"),
                                   HIDE_HIDDEN_RULES, data_path=request.param,
                                   ext_proc_workers=2, envoy_concurrency=2) as gw:
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
