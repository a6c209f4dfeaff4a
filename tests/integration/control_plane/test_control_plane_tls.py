"""The control plane over TLS: Envoy and the ext_proc service get their configuration and
rules over mutual TLS (a plaintext or certificate-less client gets nothing), the REST API
answers over HTTPS only, and write tokens are never taken over plaintext on a network
address."""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from control_plane.service import free_port
from control_plane.snapshot import LISTENER
from control_plane.tls import ClientTls, ServerTls
from keg.embedded.certs import DevCa
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import ApiOptions, ControlPlaneApp, Gateway
from keg.security import PlaintextTokens
from tests.integration.conftest import create_topic, gateway_settings, produce_one

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token-over-tls"


@pytest.fixture(scope="module")
def secured(kafka: EmbeddedKafka, dev_ca: DevCa,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, int]]:
    base = tmp_path_factory.mktemp("cp-tls")
    server = dev_ca.server("control-plane")
    node = dev_ca.client("gateway-node", "keg-node", "nodes")
    tokens = base / "tokens"
    tokens.write_text(f"ci:{TOKEN}\n")
    api_port = free_port()
    settings = gateway_settings(
        kafka, base / "work",
        control_plane_tls=ServerTls(server.cert, server.key, dev_ca.cert_file),
        control_plane_client_tls=ClientTls(dev_ca.cert_file, node.cert, node.key),
        api=ApiOptions(data_dir=base, port=api_port, tokens_file=tokens,
                       tls=ServerTls(server.cert, server.key)))
    with Gateway(settings) as gateway:
        yield gateway, api_port


def test_envoy_and_the_ext_proc_service_are_served_over_mutual_tls(
        secured: tuple[Gateway, int], kafka: EmbeddedKafka) -> None:
    gateway, _ = secured
    # Envoy got its listeners, the ext_proc service its rules, both over TLS.
    nodes = {n["role"]: n for n in gateway.fleet_status()}
    assert nodes["ext_proc"]["connected"] and nodes["envoy"]["connected"]
    assert produce_one(gateway.bootstrap, create_topic(kafka.bootstrap)) is None


def _discover(channel: grpc.Channel) -> discovery_pb2.DiscoveryResponse:
    stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
    request = discovery_pb2.DiscoveryRequest(type_url=LISTENER)
    request.node.id = "intruder"
    return next(iter(stub.StreamAggregatedResources(iter([request]), timeout=5)))


def test_xds_refuses_plaintext_and_clients_without_a_certificate(
        secured: tuple[Gateway, int], dev_ca: DevCa) -> None:
    gateway, _ = secured
    target = f"127.0.0.1:{gateway.xds_port}"
    with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError):
        _discover(channel)
    no_cert = grpc.ssl_channel_credentials(dev_ca.cert_file.read_bytes())
    with grpc.secure_channel(target, no_cert) as channel, pytest.raises(grpc.RpcError):
        _discover(channel)


def test_the_rest_api_answers_over_https_only(secured: tuple[Gateway, int],
                                              dev_ca: DevCa) -> None:
    _, port = secured
    context = ssl.create_default_context(cafile=str(dev_ca.cert_file))
    request = urllib.request.Request(f"https://127.0.0.1:{port}/v1/rules",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        assert response.status == 200 and isinstance(json.loads(response.read()), dict | list)
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/rules", timeout=10)


def test_tokens_over_plaintext_on_a_network_address_are_refused(
        tmp_path: Path, kafka: EmbeddedKafka) -> None:
    from control_plane.service import ControlPlaneSettings

    tokens = tmp_path / "tokens"
    tokens.write_text(f"ci:{TOKEN}\n")
    settings = ControlPlaneSettings(bootstrap_servers=kafka.bootstrap,
                                    ext_proc_host="127.0.0.1", ext_proc_port=1)
    app = ControlPlaneApp(settings, ApiOptions(data_dir=tmp_path, host="0.0.0.0",
                                               port=free_port(), tokens_file=tokens))
    with pytest.raises(PlaintextTokens, match="over plaintext HTTP"):
        asyncio.run(app.start())
    asyncio.run(app.stop())
