"""kill -9 of the ext_proc worker a pipelining connection's hand-offs go to, through the
real Envoy with keg's module, the real broker and a pool of two real Python workers.

The module's gRPC client opens a stream without reaching the service (tonic connects at
the first call), so the killed worker's endpoint opened fine and each stream on it
failed at once; the connection's next stream went to the same endpoint, and a client
that had pipelined 20,000 Produce requests had 16,000 of them failed in 0.2 s (its whole
backlog), while the other worker was there and the killed one was back 1.3 s later. A
stream that fails now puts its endpoint last: the kill costs the frames the dead worker
held, and the connection goes on with the other worker at once.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

import kafka_wire
from kafka_wire import ApiKey
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, gateway_with_static_rules
from tests.integration.raw_kafka import RawConnection, produce_frame, read_frame
from tests.integration.runtime.faults import stored_values

pytestmark = pytest.mark.integration

REQUESTS = 20_000
KILL_AFTER = 2_000  # answers read before the kill
WINDOW = 64  # core::handoff::MAX_PENDING_PER_CONNECTION: what a worker may hold
REQUEST_TIMED_OUT = 7
RULES = """
rules:
  - id: mask-email
    match: {topics: {prefix: [masked.]}}
    action: {mask: {fields: [$.email]}}
"""


@pytest.fixture(scope="module")
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with gateway_with_static_rules(kafka, tmp_path_factory.mktemp("native-failover"), RULES,
                                   data_path="native", ext_proc_workers=2, metrics_port=0,
                                   envoy_concurrency=2) as gw:
        yield gw


def _connections_served(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return sum(float(line.split()[-1]) for line in response.read().decode().splitlines()
                   if line.startswith("keg_connections_total"))


def _value(seq: int) -> bytes:
    return json.dumps({"seq": seq, "email": f"u{seq}@example.com"}).encode()


def test_a_pipelining_connection_whose_worker_is_killed_goes_on_with_the_other_one(
        gateway: Gateway, kafka: EmbeddedKafka) -> None:
    topic = create_topic(kafka.bootstrap, name=f"masked.{uuid.uuid4().hex[:8]}")
    served = [_connections_served(w.metrics_port or 0) for w in gateway.workers]
    connection = RawConnection(gateway.bootstrap, timeout=60)
    errors: list[int] = []
    try:
        # The first request opens the connection's stream: to the worker it is served by.
        connection.sock.sendall(produce_frame(topic, 0, "failover", _value(0)))
        frame = read_frame(connection.sock)
        assert frame is not None
        [victim] = [w for w, before in zip(gateway.workers, served, strict=True)
                    if _connections_served(w.metrics_port or 0) > before]
        pid = victim.current_pid()
        assert pid is not None
        frames = b"".join(produce_frame(topic, c, "failover", _value(c))
                          for c in range(1, REQUESTS + 1))
        sender = threading.Thread(target=connection.sock.sendall, args=(frames,), daemon=True)
        sender.start()
        for correlation in range(1, REQUESTS + 1):
            if correlation == KILL_AFTER:
                os.kill(pid, signal.SIGKILL)
            frame = read_frame(connection.sock)
            assert frame is not None, f"closed after {correlation - 1} answers"
            got, response = kafka_wire.decode_response(frame, ApiKey.PRODUCE, 9)
            assert got == correlation
            [partition] = response["Responses"][0]["PartitionResponses"]
            errors.append(partition["ErrorCode"])
        sender.join(10)
    finally:
        connection.close()
    failed = [c for c, error in enumerate(errors, start=1) if error]
    assert set(errors) <= {0, REQUEST_TIMED_OUT}
    # The frames the dead worker held, and those of the stream that met it dead, at most.
    assert len(failed) <= 2 * WINDOW, f"{len(failed):,} of {REQUESTS:,} failed"
    assert failed, "the worker was killed with frames in flight: some failed"
    # Every record answered stored is stored once, masked.
    stored = stored_values(kafka.bootstrap, topic)
    assert sum(stored.values()) == 1 + REQUESTS - len(failed)
    assert max(stored.values()) == 1
    assert not [v for v in stored if "@" in json.loads(v)["email"]]
    assert Counter(json.loads(v)["seq"] for v in stored).keys() == \
        {0} | set(range(1, REQUESTS + 1)) - set(failed)
