"""Side effects on the data path: copies of records to Kafka topics and HTTP endpoints.

Neither ever blocks the caller. A Kafka copy goes to librdkafka's queue
(`Producer.produce`, which raises BufferError when full); an HTTP copy goes to a
bounded queue drained by one daemon thread per URL. A full queue loses the copy:
`to_topic` / `to_http` answer False and `dropped` counts it. Deliveries are
best-effort: a copy the broker or endpoint refuses is counted in `failed`, not retried
beyond the producer's own retries.

Counters are plain attributes, each written by one thread only (the caller for
`queued`/`dropped`, the worker for `sent`/`failed`), so reading them for metrics
needs no lock.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import queue
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from interceptors.contract import InterceptedRecord

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS: Final[Mapping[str, Any]] = {
    "client.id": "keg-copy",
    "linger.ms": 20,
    # A copy that cannot be delivered in 30 s is lost rather than held for librdkafka's
    # default of 5 minutes, which would fill the queue and drop fresh copies instead.
    "message.timeout.ms": 30_000,
}
HTTP_TIMEOUT_S: Final = 5.0


class KafkaCopySink:
    """Copies to Kafka topics through one librdkafka producer, polled by a thread."""

    def __init__(
        self, bootstrap_servers: str, config: Mapping[str, Any] | None = None
    ) -> None:
        settings = {**PRODUCER_DEFAULTS, **(config or {}), "bootstrap.servers": bootstrap_servers}
        settings.setdefault("logger", log)
        self._producer = Producer(settings)
        self.queued = 0
        self.dropped = 0
        self.sent = 0
        self.failed = 0
        self.unflushed = 0
        self._closing = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="keg-copy-kafka", daemon=True)
        self._poller.start()

    def send(self, topic: str, record: InterceptedRecord) -> bool:
        if self._closing.is_set():
            self.dropped += 1
            return False
        try:
            self._producer.produce(
                topic,
                value=record.value,
                key=record.key,
                headers=list(record.headers),
                timestamp=max(record.timestamp, 0),  # 0: librdkafka stamps the send time
                on_delivery=self._delivered,
            )
        except (BufferError, KafkaException) as exc:
            self.dropped += 1
            if not isinstance(exc, BufferError):
                log.warning("copy to topic %s refused: %s", topic, exc)
            return False
        self.queued += 1
        return True

    def close(self, timeout: float = 5.0) -> int:
        """Stop, deliver what is queued within `timeout` s; returns the copies lost."""
        if not self._closing.is_set():
            self._closing.set()
            self._poller.join()
            self.unflushed = self._producer.flush(timeout)
        return self.unflushed

    def _poll(self) -> None:
        while not self._closing.is_set():
            self._producer.poll(0.1)

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.sent += 1
        else:
            self.failed += 1
            if self.failed == 1:
                log.warning("copy to topic %s failed: %s (further failures counted)",
                            msg.topic(), err.str())


_STOP: Final = object()


class HttpCopySink:
    """POSTs each copy as JSON (see `record_json`) to one URL from a daemon thread."""

    def __init__(self, url: str, queue_size: int, timeout: float = HTTP_TIMEOUT_S) -> None:
        self.url = url
        self.timeout = timeout
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self.queued = 0
        self.dropped = 0
        self.sent = 0
        self.failed = 0
        self._closing = False
        self._worker = threading.Thread(target=self._run, name="keg-copy-http", daemon=True)
        self._worker.start()

    def send(self, record: InterceptedRecord) -> bool:
        if self._closing:
            self.dropped += 1
            return False
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1
            return False
        self.queued += 1
        return True

    def close(self, timeout: float = 5.0) -> int:
        """Stop taking copies, send what is queued within `timeout` s; returns the
        number left unsent (the daemon thread then dies with the process)."""
        self._closing = True
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout)
        self._worker.join(timeout)
        return self._queue.qsize() if self._worker.is_alive() else 0

    def _run(self) -> None:
        while True:
            record = self._queue.get()
            if record is _STOP:
                return
            if self._post(record_json(record)):
                self.sent += 1
            else:
                self.failed += 1

    def _post(self, body: bytes) -> bool:
        request = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read()
                return 200 <= response.status < 300
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            if self.failed == 0:
                log.warning("copy to %s failed: %s (further failures counted)", self.url, exc)
            return False


def record_json(record: InterceptedRecord) -> bytes:
    """The JSON body of an HTTP copy.

    `key_b64` is the key in base64 (null for none); the value is `value` (text) when
    it is UTF-8, else `value_b64`; each header is {"name", "value"} likewise (or
    "value_b64"; "name_b64" for a name that is not UTF-8). `offset` is null at produce
    time.
    """
    body: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key_b64": _b64(record.key),
    }
    body.update(text_or_b64("value", record.value))
    body["headers"] = [
        {**_header_name(name), **text_or_b64("value", value)} for name, value in record.headers
    ]
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _header_name(name: str) -> dict[str, str | None]:
    """`{"name": text}`, or `{"name_b64": ...}` for a name that is not UTF-8 (decoded with
    surrogateescape, as kafka_wire reads header names): JSON text cannot carry it."""
    raw = name.encode("utf-8", "surrogateescape")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"name_b64": _b64(raw)}
    return {"name": name}


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def text_or_b64(field: str, data: bytes | None) -> dict[str, str | None]:
    """A key, value or header value as JSON: `{field: text}` when it is UTF-8, else
    `{field_b64: ...}` (null stays null under `field`). Side-effect messages and the
    control plane's dry runs show records the same way."""
    if data is None:
        return {field: None}
    try:
        return {field: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{field}_b64": base64.b64encode(data).decode()}


class DataPathSideEffects:
    """The SideEffects of a running gateway: one Kafka sink, one HTTP sink per URL,
    each made on first use (no threads for rule sets without copies)."""

    def __init__(
        self,
        bootstrap_servers: str,
        producer_config: Mapping[str, Any] | None = None,
        http_timeout: float = HTTP_TIMEOUT_S,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.producer_config = dict(producer_config or {})
        self.http_timeout = http_timeout
        self.kafka: KafkaCopySink | None = None
        self.http: dict[str, HttpCopySink] = {}
        self._lock = threading.Lock()

    def to_topic(self, topic: str, record: InterceptedRecord) -> bool:
        sink = self.kafka
        if sink is None:
            with self._lock:
                if self.kafka is None:
                    self.kafka = KafkaCopySink(self.bootstrap_servers, self.producer_config)
                sink = self.kafka
        return sink.send(topic, record)

    def to_http(self, url: str, record: InterceptedRecord, queue_size: int) -> bool:
        sink = self.http.get(url)
        if sink is None:
            with self._lock:
                sink = self.http.get(url)
                if sink is None:
                    # The first rule to name a URL sizes its queue.
                    sink = self.http[url] = HttpCopySink(url, queue_size, self.http_timeout)
        return sink.send(record)

    def counters(self) -> dict[str, dict[str, int]]:
        """queued/sent/failed/dropped per target ("kafka" or the URL), for metrics."""
        out: dict[str, dict[str, int]] = {}
        sinks: list[tuple[str, KafkaCopySink | HttpCopySink]] = list(self.http.items())
        if self.kafka is not None:
            sinks.insert(0, ("kafka", self.kafka))
        for name, sink in sinks:
            out[name] = {"queued": sink.queued, "sent": sink.sent,
                         "failed": sink.failed, "dropped": sink.dropped}
        return out

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what is queued, each sink within `timeout` s."""
        with self._lock:
            if self.kafka is not None:
                self.kafka.close(timeout)
            for sink in self.http.values():
                sink.close(timeout)
