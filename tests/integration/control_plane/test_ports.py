"""keg's gRPC servers refuse a port an Envoy listener already holds.

gRPC and Envoy both bind with SO_REUSEPORT, so before the fix the xDS server (or an
ext_proc service) came up on a Kafka listener's port without an error and the kernel
split connections between the two: Envoys' ADS streams reached a Kafka listener, and
Kafka clients could reach the gRPC server. Found in CI (test_fleet: three Envoys with no
listeners after 90 s, the ext_proc service closing a 0x50524920-byte "frame", which is
the HTTP/2 preface).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from control_plane.service import free_port
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, produce_one

pytestmark = pytest.mark.integration


def _held_by_envoy(gateway: Gateway) -> int:
    host, _, port = gateway.bootstrap.rpartition(":")
    assert host == "127.0.0.1"
    return int(port)


@pytest.mark.parametrize("command", ["control-plane", "ext-proc"])
def test_a_port_an_envoy_listener_holds_is_refused(
        command: str, gateway: Gateway, kafka: EmbeddedKafka) -> None:
    held = _held_by_envoy(gateway)
    args = {
        "control-plane": ["--bootstrap-servers", kafka.bootstrap,
                          "--ext-proc", f"127.0.0.1:{gateway.ext_proc_port}",
                          "--xds-host", "127.0.0.1", "--xds-port", str(held),
                          "--listen-port-base", str(free_port()), "--api-port", "0"],
        "ext-proc": ["--host", "127.0.0.1", "--port", str(held),
                     "--metrics-port", str(free_port())],
    }[command]
    try:
        run = subprocess.run([sys.executable, "-m", "keg", command, *args],
                             capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"keg {command} on Envoy's listener port {held} kept running")
    assert run.returncode != 0
    assert f"cannot listen on 127.0.0.1:{held}: the port is in use" in run.stderr
    assert "Traceback" not in run.stderr
    # The listener it tried to take still serves Kafka.
    assert produce_one(gateway.bootstrap, create_topic(gateway.bootstrap)) is None
