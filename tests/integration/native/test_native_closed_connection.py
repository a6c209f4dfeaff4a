"""Clients that go away while their requests are with the Python service, through the
real Envoy with keg's module, the real Python service and the real broker.

A new user's Envoy died once of a segmentation fault inside the module's injection of
bytes (`inject_write_data`, faulting address 0): the first connection of `keg capture`,
whose Metadata requests a match-all observe rule held. The module ignored Envoy's
close events, so an answer that came back as a scheduled event after the connection
closed (Envoy runs it while the filter lives, until the connection's deferred
deletion) was injected into a closed connection. The module now marks a connection
closed on its close events and drops later answers, and never injects into a
connection that is not open (`ffi::tests::an_answer_for_a_connection_envoy_closed_is_
dropped_not_injected` fails without that). The crash itself has not been reproduced
here (the window is one turn of Envoy's event loop); this test drives the situation
through the real Envoy: hundreds of hand-offs left behind by clients that reset or
close, after which Envoy still runs, in the same process, and serves.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import HIDE_HIDDEN_RULES, create_topic, gateway_with_static_rules
from tests.integration.raw_kafka import pipelined_metadata

pytestmark = pytest.mark.integration

PIPELINED = 200  # requests a client leaves behind, each with the service
CLIENTS = 40


@pytest.fixture(scope="module")
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with gateway_with_static_rules(kafka, tmp_path_factory.mktemp("native-closed"),
                                   HIDE_HIDDEN_RULES, data_path="native") as gw:
        yield gw


def leave_with_requests_pending(bootstrap: str, reset: bool) -> None:
    """Pipelines Metadata requests the service must judge, then closes at once: with a
    reset (SO_LINGER 0) or a FIN."""
    frames = pipelined_metadata(PIPELINED, "leaver")
    host, port = bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    if reset:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    try:
        sock.sendall(frames)
        sock.recv(64)  # the first answer is on its way: the others are with the service
    finally:
        sock.close()


def test_clients_leaving_while_the_service_holds_their_requests_leave_envoy_running(
        gateway: Gateway, kafka: EmbeddedKafka) -> None:
    topic = create_topic(kafka.bootstrap, name="closed.healthy")
    assert gateway.envoy is not None
    pid = gateway.envoy.pid
    leavers = [threading.Thread(target=leave_with_requests_pending,
                                args=(gateway.bootstrap, i % 2 == 0)) for i in range(CLIENTS)]
    for leaver in leavers:
        leaver.start()
    for leaver in leavers:
        leaver.join(60)
    time.sleep(2)  # the service's last answers come back to closed connections
    assert gateway.envoy.poll() is None and gateway.envoy.pid == pid, "Envoy died"
    producer = Producer({"bootstrap.servers": gateway.bootstrap, "message.timeout.ms": 15000})
    delivered: list[object] = []
    producer.produce(topic, b"after", on_delivery=lambda err, _m: delivered.append(err))
    producer.flush(20)
    assert delivered == [None]
    assert gateway.envoy.pid == pid
