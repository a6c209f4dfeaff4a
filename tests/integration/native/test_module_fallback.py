"""An Envoy of the module's release that cannot load it (no module on its search path)
gets the ext_proc data path: the control plane takes its NACK of the filter's
configuration as the sign, serves it the ext_proc chain, and says why in the fleet view.

Before, the control plane kept serving it the module's configuration: its listeners
(sharing the gateway's ports, as a second Envoy of a fleet does) closed every
connection they took, while the fleet view said "native".
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer

from keg.embedded.envoy import EmbeddedEnvoy
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, gateway_settings, rule_dir
from tests.integration.runtime.faults import stored_values

pytestmark = [pytest.mark.integration, pytest.mark.one_data_path]

RULES = """\
rules:
  - id: watch-produce
    match: {apis: [Produce], topics: {prefix: [fallback.]}}
    action: {observe: {audit: false}}
"""
PRODUCERS = 24  # connections: the kernel spreads them over both Envoys' listeners


@pytest.fixture(scope="module")
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    base = tmp_path_factory.mktemp("fallback")
    settings = gateway_settings(kafka, base / "envoy", data_path="native",
                                rules_dir=rule_dir(base / "rules", {"rules.yaml": RULES}))
    with Gateway(settings) as gw:
        yield gw


def accepted_connections(envoy: EmbeddedEnvoy) -> int:
    """Connections the Envoy's Kafka listeners accepted."""
    return sum(int(line.rsplit(" ", 1)[1]) for line in envoy.admin("/stats").splitlines()
               if line.startswith("listener.") and ".downstream_cx_total:" in line
               and not line.startswith("listener.admin"))


def node_view(gateway: Gateway, node_id: str) -> dict[str, Any] | None:
    plane = gateway.control_plane
    assert plane is not None
    views = gateway.call(plane.fleet.status)
    return next((v for v in views if v["node_id"] == node_id), None)


def test_an_envoy_without_the_module_serves_through_the_ext_proc_path(
        gateway: Gateway, kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory
        ) -> None:
    plane = gateway.control_plane
    assert plane is not None
    bare = EmbeddedEnvoy("127.0.0.1", plane.xds_port, node_id="envoy-without-module",
                         work_dir=tmp_path_factory.mktemp("bare-envoy"))
    bare.start()
    try:
        bare.wait_for_listeners(1, timeout=60)
        deadline = time.monotonic() + 30
        while (view := node_view(gateway, bare.node_id)) is None or (
                view["data_path"] != "ext-proc" or not view["types"].get(
                    "envoy.config.listener.v3.Listener", {}).get("in_sync")):
            assert time.monotonic() < deadline, repr(view)
            time.sleep(0.2)
        assert "libkeg_kafka_filter" in (view["module_error"] or ""), view
        own = node_view(gateway, gateway.envoy.node_id if gateway.envoy else "")
        assert own is not None and own["data_path"] == "native" and own["module_error"] is None

        topic = create_topic(kafka.bootstrap, name=f"fallback.{uuid.uuid4().hex[:6]}")
        values = []
        for n in range(PRODUCERS):  # one connection each, on either Envoy
            producer = Producer({"bootstrap.servers": gateway.bootstrap, "retries": 0,
                                 "message.timeout.ms": 20000})
            errors: list[KafkaError] = []

            def delivered(err: KafkaError | None, _msg: Any, seen: list[KafkaError] = errors
                          ) -> None:
                if err is not None:
                    seen.append(err)

            value = f"record-{n}"
            producer.produce(topic, value.encode(), on_delivery=delivered)
            assert producer.flush(30) == 0
            assert errors == [], (n, errors)
            values.append(value)
        assert stored_values(kafka.bootstrap, topic) == Counter(values)
        assert accepted_connections(bare) > 0, "no connection reached the bare Envoy"
    finally:
        bare.stop()
