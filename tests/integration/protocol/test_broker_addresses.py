"""No broker or controller address reaches a client through the gateway, with Kafka's
own admin tools.

Regression tests: DescribeConfigs of a broker returned its real `listeners` and
`advertised.listeners`, and DescribeQuorum v2 its controller endpoints; a client (or a
person) learning them could leave the gateway.
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from keg.gateway import Gateway

pytestmark = pytest.mark.integration


def broker_ports(kafka: EmbeddedKafka) -> list[str]:
    """The broker's own listener ports, as they would appear in an address."""
    ports = [kafka.port, kafka.controller_port] + ([kafka.sasl_port] if kafka.sasl_port else [])
    return [f":{port}" for port in ports]


def test_broker_configs_show_no_broker_address(kafka: EmbeddedKafka, gateway: Gateway) -> None:
    described = run_java_tool("configs", "--bootstrap-server", gateway.bootstrap, "--describe",
                              "--entity-type", "brokers", "--entity-name", "1", "--all",
                              timeout=120)
    assert described.returncode == 0, described.stderr[-2000:]
    output = described.stdout
    assert "advertised.listeners=" in output and "num.partitions=" in output
    leaks = [port for port in broker_ports(kafka) if port in output]
    assert leaks == [], [line for line in output.splitlines() if any(p in line for p in leaks)]
    gateway_port = gateway.bootstrap.rsplit(":", 1)[1]
    advertised = next(line for line in output.splitlines()
                      if line.strip().startswith("advertised.listeners="))
    assert f":{gateway_port}" in advertised
    # Kafka's built-in default is no address of this cluster: it reads as it is (it read
    # `PLAINTEXT://redacted:0`).
    listeners = next(line for line in output.splitlines() if line.strip().startswith("listeners="))
    assert "DEFAULT_CONFIG:listeners=PLAINTEXT://:9092" in listeners, listeners

    # librdkafka's DescribeConfigs: the same answer.
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    resource = ConfigResource(ResourceType.BROKER, "1")
    configs = admin.describe_configs([resource])[resource].result(30)
    values = " ".join(str(c.value) for c in configs.values())
    assert [port for port in broker_ports(kafka) if port in values] == []


def test_the_quorum_description_shows_no_controller_address(kafka: EmbeddedKafka,
                                                            gateway: Gateway) -> None:
    for view in ("--status", "--replication"):
        described = run_java_tool("metadata-quorum", "--bootstrap-server", gateway.bootstrap,
                                  "describe", view, timeout=120)
        assert described.returncode == 0, described.stderr[-2000:]
        assert "LeaderId" in described.stdout or "NodeId" in described.stdout
        assert f":{kafka.controller_port}" not in described.stdout, described.stdout
