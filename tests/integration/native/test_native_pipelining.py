"""A client pipelining thousands of requests a rule needs, through the real Envoy with
keg's module, the real Python service and the real broker.

A broker reads a connection's next request only once it answered the last one, so a
client may queue as many as it likes. The module read them all and handed every one to
the service at once; the service answers one frame at a time, so the last ones outwaited
the hand-off timeout (counted from when each is sent) and the connection was closed
(fail-closed) with thousands unanswered. The module now stops reading from the client
while a connection has 64 hand-offs unanswered: every request is answered, in order.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

import kafka_wire
from kafka_wire import ApiKey
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import HIDE_HIDDEN_RULES, create_topic, gateway_with_static_rules
from tests.integration.raw_kafka import RawConnection, pipelined_metadata, produce_frame, read_frame
from tests.integration.rules.records_io import consume

pytestmark = pytest.mark.integration

REQUESTS = 10_000
MASK_EMAIL_RULE = """
  - id: mask-email
    match: {topics: {prefix: [masked.]}}
    action: {mask: {fields: [$.email]}}
"""
WINDOW = 64  # core::handoff::MAX_PENDING_PER_CONNECTION


@pytest.fixture(scope="module")
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    # The hand-off timeout, short: a queue of thousands outwaits it on any machine, 64
    # frames (a few ms of the service's work) on none.
    with gateway_with_static_rules(kafka, tmp_path_factory.mktemp("native-pipelining"),
                                   HIDE_HIDDEN_RULES + MASK_EMAIL_RULE, data_path="native",
                                   message_timeout_s=0.5) as gw:
        yield gw


def test_thousands_of_pipelined_requests_a_rule_needs_are_all_answered(
        gateway: Gateway, kafka: EmbeddedKafka) -> None:
    topic = create_topic(kafka.bootstrap, name="pipelined.metadata")
    create_topic(kafka.bootstrap, name="hidden.pipelined")
    connection = RawConnection(gateway.bootstrap, timeout=60)
    # All topics: the service judges each answer too (it hides the denied topics).
    frames = pipelined_metadata(REQUESTS, "pipeliner")
    # Sent from a thread: the gateway may stop reading until answers are read here.
    sender = threading.Thread(target=connection.sock.sendall, args=(frames,), daemon=True)
    sender.start()
    answered = 0
    try:
        for correlation in range(1, REQUESTS + 1):
            frame = read_frame(connection.sock)
            assert frame is not None, f"closed after {answered} answers of {REQUESTS}"
            got, response = kafka_wire.decode_response(frame, ApiKey.METADATA, 12)
            assert got == correlation
            names = {t["Name"] for t in response["Topics"]}
            assert topic in names and not any(n.startswith("hidden.") for n in names)
            answered += 1
    finally:
        connection.close()
        sender.join(10)
    assert answered == REQUESTS


def test_a_client_that_never_reads_cannot_queue_work_past_the_window(
        gateway: Gateway, kafka: EmbeddedKafka) -> None:
    """A new user's flood: connections pipelining Metadata requests (each one judged by
    the service) without reading a single answer. The module took whatever Envoy had
    read, up to its 1 MiB buffer: 41,943 requests per read, each a hand-off, and kept
    the service busy for minutes after the client had gone (a healthy producer's p99
    went from 6 ms to 5 s meanwhile). A broker stops reading such a client; the module
    now stops taking its requests past the window, and the rest stays in Envoy's buffer
    (bounded, and read again once answers come back). The worker is stopped here, so
    no answer comes back: what the module took is all it will ever take."""
    worker = gateway.workers[0]
    pid = worker.current_pid()
    assert pid is not None
    before = gateway.module_counter("handoff_requests")
    connection = RawConnection(gateway.bootstrap, timeout=60)
    flood = pipelined_metadata(20_000, "never-reads")
    os.kill(pid, signal.SIGSTOP)
    try:
        sender = threading.Thread(target=connection.sock.sendall, args=(flood,), daemon=True)
        sender.start()
        # Whatever the module takes, it takes as Envoy reads: wait until that settles.
        taken, quiet_since = -1, time.monotonic()
        while time.monotonic() - quiet_since < 2.0:
            now = gateway.module_counter("handoff_requests") - before
            if now != taken:
                taken, quiet_since = now, time.monotonic()
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        connection.close()
    assert 0 < taken <= WINDOW + 1, f"{taken} of {len(flood):,} bytes' requests handed off"



def _record(seq: int) -> bytes:
    """A JSON record whose `email` the fixture's rule masks."""
    return json.dumps({"seq": seq, "email": f"u{seq}@example.com"}).encode()


def test_a_client_that_half_closes_after_pipelining_gets_every_answer_and_the_end(
        gateway: Gateway, kafka: EmbeddedKafka) -> None:
    """A new user's client: 2,000 pipelined Produce requests a record rule needs, then
    shutdown(SHUT_WR), then it reads. A broker answers every request it read before the
    end, then closes. The module took the window's worth, left the rest in Envoy's
    buffer to be handed over again, and passed no end of stream; but Envoy raises a
    connection's end of stream once and hands over nothing after it. The client got
    65-98 answers, then nothing; the rest never reached the broker, and Envoy held the
    socket and its broker connection half open. At the end of stream the module now
    takes every byte Envoy holds."""
    requests = 2_000
    topic = create_topic(kafka.bootstrap, name="masked.half-closed")
    connection = RawConnection(gateway.bootstrap, timeout=30)
    answered = 0
    try:
        connection.sock.sendall(b"".join(produce_frame(topic, c, "half-closer", _record(c))
                                         for c in range(1, requests + 1)))
        connection.sock.shutdown(socket.SHUT_WR)
        for correlation in range(1, requests + 1):
            try:
                frame = read_frame(connection.sock)
            except TimeoutError:
                frame = None
            assert frame is not None, f"{answered} answers of {requests}, then nothing"
            got, response = kafka_wire.decode_response(frame, ApiKey.PRODUCE, 9)
            assert got == correlation
            [partition] = response["Responses"][0]["PartitionResponses"]
            assert partition["ErrorCode"] == 0
            answered += 1
        # Then the gateway closes, as the broker does once it has answered.
        assert read_frame(connection.sock) is None
    finally:
        connection.close()
    assert answered == requests
    stored = [json.loads(value or b"{}") for value, _ in consume(kafka.bootstrap, topic)]
    assert [r["seq"] for r in stored] == list(range(1, requests + 1))
    assert not [r for r in stored if "@" in r["email"]], "every address masked"
