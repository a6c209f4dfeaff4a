"""Side effects of copy: the HTTP sink against a local server, the Kafka sink's queue."""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from interceptors import InterceptedRecord
from interceptors.side_effects import (
    DataPathSideEffects,
    HttpCopySink,
    KafkaCopySink,
    record_json,
)


class _Collector(http.server.BaseHTTPRequestHandler):
    bodies: list[Any]
    status = 204
    release: threading.Event | None = None

    def do_POST(self) -> None:
        if self.release is not None:
            self.release.wait(10)
        length = int(self.headers["Content-Length"])
        assert self.headers["Content-Type"] == "application/json"
        self.bodies.append(json.loads(self.rfile.read(length)))
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Collector]]]:
    handler: type[_Collector] = type("Handler", (_Collector,), {"bodies": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/copies", handler
    finally:
        if handler.release is not None:
            handler.release.set()
        httpd.shutdown()
        httpd.server_close()


def rec(
    value: bytes | None, key: bytes | None = b"k", offset: int | None = None
) -> InterceptedRecord:
    return InterceptedRecord(
        "orders", 3, key, value, [("h", b"1"), ("bin", b"\xff"), ("n", None)], 1700, offset
    )


def test_record_json() -> None:
    body = json.loads(record_json(rec(b'{"a":1}', offset=42)))
    assert body == {
        "topic": "orders",
        "partition": 3,
        "offset": 42,
        "timestamp": 1700,
        "key_b64": base64.b64encode(b"k").decode(),
        "value": '{"a":1}',
        "headers": [
            {"name": "h", "value": "1"},
            {"name": "bin", "value_b64": base64.b64encode(b"\xff").decode()},
            {"name": "n", "value": None},
        ],
    }
    binary = json.loads(record_json(rec(b"\x00\xff", key=None)))
    assert binary["value_b64"] == "AP8=" and "value" not in binary and binary["key_b64"] is None
    assert json.loads(record_json(rec(None)))["value"] is None


def test_a_header_name_that_is_not_utf8_goes_in_base64() -> None:
    """JSON text cannot carry it: encoding the copy failed, and with it the record."""
    odd = b"\xff\xfebad".decode("utf-8", "surrogateescape")
    record = InterceptedRecord("orders", 0, None, b"v", [(odd, b"1")], 1700, None)
    assert json.loads(record_json(record))["headers"] == [
        {"name_b64": base64.b64encode(b"\xff\xfebad").decode(), "value": "1"}]


def test_http_sink_posts_each_copy(server: tuple[str, type[_Collector]]) -> None:
    url, handler = server
    sink = HttpCopySink(url, queue_size=10)
    assert sink.send(rec(b"one")) and sink.send(rec(b"two"))
    assert sink.close(timeout=10) == 0
    assert [b["value"] for b in handler.bodies] == ["one", "two"]
    assert (sink.queued, sink.sent, sink.failed, sink.dropped) == (2, 2, 0, 0)
    assert not sink.send(rec(b"after close"))
    assert sink.dropped == 1


def test_http_sink_full_queue_drops_without_blocking(server: tuple[str, type[_Collector]]) -> None:
    url, handler = server
    handler.release = threading.Event()  # the endpoint hangs until released
    sink = HttpCopySink(url, queue_size=2)
    results = [sink.send(rec(str(i).encode())) for i in range(10)]
    # One copy is in flight, two wait in the queue: the rest are refused at once.
    assert results.count(True) in (2, 3)
    assert sink.dropped == results.count(False)
    handler.release.set()
    assert sink.close(timeout=10) == 0
    assert sink.sent == results.count(True)


def test_http_sink_counts_refusals_and_unreachable_endpoints(
    server: tuple[str, type[_Collector]],
) -> None:
    url, handler = server
    handler.status = 500
    refused = HttpCopySink(url, queue_size=5)
    refused.send(rec(b"x"))
    refused.close(timeout=10)
    assert (refused.sent, refused.failed) == (0, 1)
    unreachable = HttpCopySink("http://127.0.0.1:1/none", queue_size=5, timeout=2)
    unreachable.send(rec(b"x"))
    unreachable.close(timeout=10)
    assert (unreachable.sent, unreachable.failed) == (0, 1)


def test_kafka_sink_full_queue_drops() -> None:
    # No broker: librdkafka queues locally, so its queue of one fills at once.
    sink = KafkaCopySink("127.0.0.1:1", {"queue.buffering.max.messages": 1, "log_level": 0})
    assert sink.send("copies", rec(b"first"))
    assert not sink.send("copies", rec(b"second"))
    assert (sink.queued, sink.dropped) == (1, 1)
    assert sink.close(timeout=0.1) == 1  # undeliverable: reported, not waited for
    assert not sink.send("copies", rec(b"after close"))


def test_data_path_side_effects_make_sinks_on_first_use(
    server: tuple[str, type[_Collector]],
) -> None:
    url, handler = server
    effects = DataPathSideEffects("127.0.0.1:1", {"log_level": 0})
    assert effects.kafka is None and effects.counters() == {}
    assert effects.to_http(url, rec(b"v"), queue_size=4)
    assert effects.to_http(url, rec(b"w"), queue_size=99)
    assert effects.http[url]._queue.maxsize == 4  # the first rule sizes the queue
    assert effects.to_topic("copies", rec(b"v"))
    effects.http[url].close(timeout=10)
    effects.close(timeout=0.1)  # the Kafka copy has no broker to go to
    counters = effects.counters()
    assert counters[url] == {"queued": 2, "sent": 2, "failed": 0, "dropped": 0}
    assert counters["kafka"]["queued"] == 1
    assert [b["value"] for b in handler.bodies] == ["v", "w"]
