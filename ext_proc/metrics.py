"""The data path's Prometheus metrics, in a registry of their own.

`Metrics` owns a `CollectorRegistry` (not prometheus_client's global one), so a
process can hold several (tests create one each) and `start_http_server` serves
exactly these series on ``/metrics``.

Series:

    keg_requests_total{api,version,client_id,principal}   requests seen
    keg_handed_off_requests_total{api,version,client_id,principal}
                                                       requests keg's Kafka filter (the native
                                                       path) handed to this service; there the
                                                       module counts keg_requests_total and
                                                       the topic series of all traffic
    keg_topic_requests_total{api,topic,client_id,principal}
                                                       requests naming a topic (Produce)
    keg_topic_record_bytes_total{api,topic,client_id,principal}
                                                       record-batch bytes per topic (Produce)
    keg_request_bytes_total{api,direction}             frame bytes, request/response
    keg_decisions_total{rule,action,mode,outcome,api,error}
                                                       rule decisions; error: the Kafka error
                                                       the client was answered with, or ""
    keg_refusals_total{api,topic,client_id,principal,rule,error}
                                                       requests (or batches) refused with a
                                                       Kafka error code
    keg_unanswered_refusals_total{api,rule}            refusals no answer can carry (acks=0)
    keg_decode_errors_total{api,direction}             frames that did not decode
    keg_connections_active                             open client connections
    keg_connections_total                              client connections opened
    keg_frame_latency_seconds                          time a chunk or frame spent in keg
    keg_forwarded_requests_total{broker}               KIP-590 envelopes, per forwarding broker
    keg_rule_set_version_info{version}                 1 for the active rule set
    keg_rule_reloads_total{result}                     rule reloads by result

Topics are read from Produce requests as they pass (kafka_wire.produce_topics: names, or ids
from v13 on, which are named from what Metadata answers taught the gateway; an id it
was never told stays an id), without holding or decoding the frame. Client ids come
from each request's header.

Cardinality: every distinct label combination is a time series held in this process
and in Prometheus, forever. Principals, client ids and topics come from clients and
are unbounded (one per OAuth subject, per workload, per pod...), so only the first
`max_principals` distinct principals, `max_clients` client ids and `max_topics` topics
get their own label value; later ones are counted as "other". The first ones seen are
kept (not the busiest: a counter's past cannot move to another series), so
established series stay stable; a restart starts over. Rules, actions, APIs and
error codes are bounded by the rule set and the protocol.

Bounding each label does not bound their combinations (1,000 topics x 1,000 client ids
is a million series, which one client can make by changing its client id), so each
series family with labels clients choose admits the first `max_series` (10,000)
combinations; a later one is counted with all of those labels "other".
"""

from __future__ import annotations

import asyncio
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import start_wsgi_server

import kafka_wire
from filter_rules.errors import error_name
from kafka_wire.framing import HeldBytes
from kafka_wire.produce_topics import ProduceTopics, client_id_of, wants_topics
from kafka_wire.topic_ids import TopicIds

OTHER = "other"
DEFAULT_MAX_PRINCIPALS = 1000
DEFAULT_MAX_TOPICS = 1000
DEFAULT_MAX_CLIENTS = 1000
DEFAULT_MAX_SERIES = 10_000  # per series family, of the combinations of clients' labels
NO_CLIENT_ID = ""  # a null client id (or one keg could not read)
# 50 µs to 1 s: a pass-through frame costs tens of µs, a held and rewritten one more.
LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005,
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0,
)


class BoundedLabel:
    """Admits the first `limit` distinct values; any later one becomes "other"."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
        return OTHER

    def __len__(self) -> int:
        return len(self._seen)


class BoundedSeries:
    """Admits the first `limit` distinct label combinations of one series family; a later
    one has every label at a position in `chosen` (those clients choose) "other"."""

    def __init__(self, limit: int, chosen: tuple[int, ...]) -> None:
        self.limit = limit
        self._chosen = frozenset(chosen)
        self._seen: set[tuple[str, ...]] = set()
        self._lock = threading.Lock()

    def __call__(self, *labels: str) -> tuple[str, ...]:
        if labels in self._seen:
            return labels
        with self._lock:
            if len(self._seen) < self.limit:
                self._seen.add(labels)
                return labels
        return tuple(OTHER if i in self._chosen else label for i, label in enumerate(labels))

    def __len__(self) -> int:
        return len(self._seen)


_api_names: dict[int, str] = {}


def api_label(api_key: int) -> str:
    """"Produce", "Fetch", ...; the number for an API keg has no schema for."""
    name = _api_names.get(api_key)
    if name is None:
        name = _api_names[api_key] = kafka_wire.api_name(api_key) or str(api_key)
    return name


def error_label(code: int | None) -> str:
    """"TOPIC_AUTHORIZATION_FAILED", ...; "" for no error; the number for an unknown one."""
    if code is None or code == 0:
        return ""
    return error_name(code) or str(code)


class Metrics:
    def __init__(
        self,
        max_principals: int = DEFAULT_MAX_PRINCIPALS,
        max_topics: int = DEFAULT_MAX_TOPICS,
        max_clients: int = DEFAULT_MAX_CLIENTS,
        topic_ids: TopicIds | None = None,
        read_topics: bool = True,
        max_series: int = DEFAULT_MAX_SERIES,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.meters: weakref.WeakSet[ConnectionMeter] = weakref.WeakSet()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.registry.register(_FlushMeters(self))
        self.principal_label = BoundedLabel(max_principals)
        self.topic_label = BoundedLabel(max_topics)
        self.client_label = BoundedLabel(max_clients)
        # (api, version, client id, principal); (api, topic, client id, principal);
        # (api, topic, client id, principal, rule, error)
        self.request_series = BoundedSeries(max_series, (2, 3))
        self.handed_off_series = BoundedSeries(max_series, (2, 3))
        self.topic_series = BoundedSeries(max_series, (1, 2, 3))
        self.refusal_series = BoundedSeries(max_series, (1, 2, 3))
        # Read the topics of passing Produce requests (a few µs per request and
        # partition: the one cost of these metrics that grows with traffic).
        self.read_topics = read_topics
        # Produce v13+ names topics by id: named from what the data path learned.
        self.topic_ids = topic_ids if topic_ids is not None else TopicIds()
        r = self.registry
        self.requests = Counter(
            "keg_requests", "Kafka requests seen by the gateway",
            ["api", "version", "client_id", "principal"], registry=r,
        )
        self.handed_off_requests = Counter(
            "keg_handed_off_requests",
            "Requests keg's Kafka filter in Envoy (the native path) handed to this service",
            ["api", "version", "client_id", "principal"], registry=r,
        )
        self.topic_requests = Counter(
            "keg_topic_requests", "Requests naming a topic (Produce), per topic",
            ["api", "topic", "client_id", "principal"], registry=r,
        )
        self.topic_record_bytes = Counter(
            "keg_topic_record_bytes", "Record-batch bytes per topic (Produce requests)",
            ["api", "topic", "client_id", "principal"], registry=r,
        )
        self.refusals = Counter(
            "keg_refusals",
            "Requests (or batches) the gateway refused with a Kafka error code, enforced",
            ["api", "topic", "client_id", "principal", "rule", "error"], registry=r,
        )
        self.request_bytes = Counter(
            "keg_request_bytes", "Kafka frame bytes through the gateway",
            ["api", "direction"], registry=r,
        )
        self.decisions = Counter(
            "keg_decisions", "Rule decisions", ["rule", "action", "mode", "outcome", "api",
                                                "error"], registry=r,
        )
        self.audit_events = Counter(
            "keg_audit_events", "Audit events written (one per audited rule decision)",
            registry=r,
        )
        self.unanswered_refusals = Counter(
            "keg_unanswered_refusals",
            "Requests (or batches) a rule refused that no answer can tell the client of: "
            "a Produce with acks=0",
            ["api", "rule"], registry=r,
        )
        self.record_budget_refusals = Counter(
            "keg_record_budget_refusals",
            "Batches refused (Produce) or withheld (Fetch) because record rules would have "
            "had to do more for one frame than RecordLimits allows (record-count and "
            "decompression bombs)", registry=r,
        )
        self.decode_errors = Counter(
            "keg_decode_errors", "Frames that did not decode", ["api", "direction"], registry=r,
        )
        self.connections_active = Gauge(
            "keg_connections_active", "Open client connections", registry=r,
        )
        self.connections = Counter(
            "keg_connections", "Client connections opened", registry=r,
        )
        self.frame_latency = Histogram(
            "keg_frame_latency_seconds", "Time a held frame spent in the gateway",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.forwarded_requests = Counter(
            "keg_forwarded_requests",
            "Requests the gateway forwarded, by broker (KIP-590's forwarding metric, at the proxy)",
            ["broker"], registry=r,
        )
        self.rule_set_version = Gauge(
            "keg_rule_set_version_info", "The active rule set (value 1)", ["version"], registry=r,
        )
        self.sasl_logins = Counter(
            "keg_sasl_logins", "Client logins at listeners that terminate SASL, by outcome "
            "(allowed, denied)", ["mechanism", "outcome"], registry=r,
        )
        self.rule_reloads = Counter(
            "keg_rule_reloads", "Rule set reloads by result", ["result"], registry=r,
        )
        self.no_rules_refusals = Counter(
            "keg_no_rules_refusals", "Connections refused because no rule set had come "
            "from the control plane yet (and none was kept from before)", registry=r,
        )
        self._server: Any = None
        self._thread: threading.Thread | None = None

    # -- recording --------------------------------------------------------------------

    def request(self, api_key: int, api_version: int, principal: str,
                client_id: str = NO_CLIENT_ID) -> None:
        """One request (connections count theirs in a ConnectionMeter instead)."""
        self.requests.labels(*self.request_series(
            api_label(api_key), str(api_version), self.client_label(client_id),
            self.principal_label(principal))).inc()

    def topic_request(self, api_key: int, topic: str, client_id: str, principal: str,
                      record_bytes: int = 0, count: int = 1) -> None:
        labels = self.topic_series(api_label(api_key), self.topic_label(topic),
                                   self.client_label(client_id), self.principal_label(principal))
        self.topic_requests.labels(*labels).inc(count)
        if record_bytes:
            self.topic_record_bytes.labels(*labels).inc(record_bytes)

    def frame_bytes(self, api_key: int, direction: str, nbytes: int) -> None:
        self.request_bytes.labels(api_label(api_key), direction).inc(nbytes)

    def decision(self, rule: str, action: str, mode: str, outcome: str, count: int = 1,
                 api_key: int | None = None, error_code: int | None = None) -> None:
        api = "" if api_key is None else api_label(api_key)
        self.decisions.labels(rule, action, mode, outcome, api,
                              error_label(error_code)).inc(count)

    def refusal(self, api_key: int, topic: str | None, client_id: str | None, principal: str,
                rule: str, error_code: int, count: int = 1) -> None:
        """A request (or batch) refused with `error_code`; `topic` None: not about one."""
        self.refusals.labels(*self.refusal_series(
            api_label(api_key), "" if topic is None else self.topic_label(topic),
            self.client_label(client_id or NO_CLIENT_ID), self.principal_label(principal),
            rule, error_label(error_code))).inc(count)

    def audit_event(self) -> None:
        self.audit_events.inc()

    def unanswered_refusal(self, api_key: int, rule: str) -> None:
        self.unanswered_refusals.labels(api_label(api_key), rule).inc()

    def decode_error(self, api_key: int, direction: str) -> None:
        self.decode_errors.labels(api_label(api_key), direction).inc()

    def connection_opened(self) -> None:
        self.connections.inc()
        self.connections_active.inc()

    def connection_closed(self) -> None:
        self.connections_active.dec()

    def frame_latency_observe(self, seconds: float) -> None:
        self.frame_latency.observe(seconds)

    def forwarded_request(self, broker: int | str) -> None:
        self.forwarded_requests.labels(str(broker)).inc()

    def set_rule_set_version(self, version: str) -> None:
        """Make `version` the only value of keg_rule_set_version_info."""
        self.rule_set_version.clear()
        self.rule_set_version.labels(version).set(1)

    def rule_reload(self, result: str) -> None:
        self.rule_reloads.labels(result).inc()

    # -- exposition ---------------------------------------------------------------------

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the connections run on: scrapes flush their counts there."""
        self._loop = loop

    def flush_meters(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running() and not _on_loop(loop):
            async def flush() -> None:
                self._flush_all()
            try:
                asyncio.run_coroutine_threadsafe(flush(), loop).result(timeout=2)
            except Exception:  # a scrape must never fail for a busy loop
                return
        else:
            self._flush_all()

    def _flush_all(self) -> None:
        for meter in list(self.meters):
            meter.flush()

    def exposition(self) -> bytes:
        """The text format, as /metrics serves it."""
        return generate_latest(self.registry)

    def watch_held_bytes(self, held: HeldBytes) -> None:
        """keg_held_frame_bytes (frames being assembled, all connections) and
        keg_held_frames_refused_total (frames refused for the budget), read at scrape."""
        Gauge("keg_held_frame_bytes", "Bytes held in frames being assembled, all connections",
              registry=self.registry).set_function(lambda: held.held)
        self.registry.register(_Count(
            "keg_held_frames_refused", "Frames refused (their connection closed) because "
            "holding them would exceed the process's budget", lambda: held.refused))

    def watch_side_effects(self, counters: Callable[[], dict[str, dict[str, int]]]) -> None:
        """Export side-effect copies (`copy` rules) per target and state at each scrape:
        keg_side_effect_records_total{target="kafka"|url, state=queued|sent|failed|dropped}."""
        self.registry.register(_SideEffects(counters))

    def watch_audit_sink(self, counters: Callable[[], dict[str, int]]) -> None:
        """Export the Kafka audit sink's state at each scrape:
        keg_audit_sink_events_total{state=spooled|delivered|dropped|redelivered} and
        keg_audit_spool_bytes (events on disk not yet delivered)."""
        self.registry.register(_AuditSink(counters))

    def start_http_server(self, port: int = 0, host: str = "0.0.0.0") -> int:
        """Serve /metrics for this registry from a daemon thread; returns the bound port.

        Port 0 binds a free port. One server per `Metrics`; `stop_http_server` ends it.
        """
        if self._server is not None:
            raise RuntimeError("the metrics HTTP server is already running")
        self._server, self._thread = start_wsgi_server(port, host, registry=self.registry)
        return int(self._server.server_port)

    def stop_http_server(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)


__all__ = [
    "DEFAULT_MAX_CLIENTS",
    "DEFAULT_MAX_PRINCIPALS",
    "DEFAULT_MAX_SERIES",
    "DEFAULT_MAX_TOPICS",
    "LATENCY_BUCKETS",
    "OTHER",
    "BoundedLabel",
    "BoundedSeries",
    "Metrics",
    "api_label",
    "error_label",
]


class ConnectionMeter:
    """Per-connection counting on the hot path.

    A frame costs a few dict updates on plain ints; the counts reach the Prometheus
    counters when `flush` runs: at every scrape (on the event loop's thread, so no
    count is lost to a race) and when the connection ends. Incrementing the labelled
    counters directly measured ~3 µs per frame, half the session's own cost. Label
    values (client ids, topics) stay raw bytes until the flush.
    """

    def __init__(self, metrics: Metrics, broker_id: int | None,
                 principal: Callable[[], str], handed_off: bool = False) -> None:
        """`handed_off`: the connection's frames come from keg's Kafka filter, which
        counts every request and topic of the connection itself (crate::metrics): its
        requests here are the ones handed off, and topics are not read."""
        self._metrics = metrics
        self._handed_off = handed_off
        self._principal = principal
        self._broker = "unknown" if broker_id is None else str(broker_id)
        self._requests: dict[tuple[int, int, bytes | None, str], int] = {}
        self._bytes: dict[tuple[int, str], int] = {}
        # (api, topic name or id, is id, client id, principal) -> [requests, record bytes]
        self._topics: dict[tuple[int, bytes, bool, bytes | None, str], list[int]] = {}
        self._client: bytes | None = None  # the client id of the request being read
        self._forwarded = 0
        metrics.meters.add(self)

    def request(self, api_key: int, api_version: int, size: int,
                body: memoryview | bytes = b"") -> None:
        """One request; `body`: what of it follows its head (the header's client id first)."""
        client = client_id_of(body)
        if client is not None:  # else the header was cut short: the connection's last one
            self._client = client
        key = (api_key, api_version, self._client, self._principal())
        self._requests[key] = self._requests.get(key, 0) + 1
        slot = (api_key, "request")
        self._bytes[slot] = self._bytes.get(slot, 0) + size

    def topics(self, api_key: int, api_version: int,
               body: memoryview | bytes) -> Callable[[memoryview], None] | None:
        """Read the topics of the request whose `body` (as far as it is there) was just
        counted; the sink for the rest of its bytes when the skim needs them, else None."""
        if not wants_topics(api_key) or not self._metrics.read_topics or self._handed_off:
            return None
        client, principal = self._client, self._principal()
        topics = self._topics

        def counted(topic: bytes, is_id: bool, partitions: int, record_bytes: int) -> None:
            key = (api_key, topic, is_id, client, principal)
            entry = topics.get(key)
            if entry is None:
                topics[key] = [1, record_bytes]
            else:
                entry[0] += 1
                entry[1] += record_bytes

        skim = ProduceTopics(api_version, counted)
        skim.feed(body)
        return None if skim.done else skim.feed

    def forwarded(self) -> None:
        self._forwarded += 1

    def bytes(self, api_key: int, direction: str, size: int) -> None:
        slot = (api_key, direction)
        self._bytes[slot] = self._bytes.get(slot, 0) + size

    def flush(self) -> None:
        m = self._metrics
        requests, self._requests = self._requests, {}
        nbytes, self._bytes = self._bytes, {}
        topics, self._topics = self._topics, {}
        forwarded, self._forwarded = self._forwarded, 0
        series, bound = ((m.handed_off_requests, m.handed_off_series) if self._handed_off
                         else (m.requests, m.request_series))
        for (api_key, version, client, principal), count in requests.items():
            series.labels(*bound(api_label(api_key), str(version), m.client_label(_text(client)),
                                 m.principal_label(principal))).inc(count)
        for (api_key, topic, is_id, client, principal), (count, size) in topics.items():
            m.topic_request(api_key, _topic_label(topic, is_id, m.topic_ids), _text(client),
                            principal, size, count)
        for (api_key, direction), size in nbytes.items():
            m.request_bytes.labels(api_label(api_key), direction).inc(size)
        if forwarded:
            m.forwarded_requests.labels(self._broker).inc(forwarded)

    def close(self) -> None:
        self.flush()
        self._metrics.meters.discard(self)


def _text(raw: bytes | None) -> str:
    return NO_CLIENT_ID if raw is None else raw.decode("utf-8", "replace")


def _topic_label(topic: bytes, is_id: bool, topic_ids: TopicIds) -> str:
    if not is_id:
        return topic.decode("utf-8", "replace")
    topic_id = uuid.UUID(bytes=topic)
    return topic_ids.name(topic_id) or str(topic_id)


class _FlushMeters:
    """A collector that yields nothing: registered first, it brings every connection's
    pending counts into the counters before the registry reads them."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Any]:
        self._metrics.flush_meters()
        return iter(())


class _SideEffects:
    def __init__(self, counters: Callable[[], dict[str, dict[str, int]]]) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Any]:
        family = CounterMetricFamily("keg_side_effect_records",
                                     "Records copied by copy rules, per target and state",
                                     labels=["target", "state"])
        for target, states in self._counters().items():
            for state, value in states.items():
                family.add_metric([target, state], value)
        yield family


class _AuditSink:
    def __init__(self, counters: Callable[[], dict[str, int]]) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Any]:
        counters = self._counters()
        family = CounterMetricFamily("keg_audit_sink_events",
                                     "Audit events of the Kafka sink, per state",
                                     labels=["state"])
        for state in ("spooled", "delivered", "dropped", "redelivered"):
            family.add_metric([state], counters.get(state, 0))
        yield family
        yield GaugeMetricFamily("keg_audit_spool_bytes",
                                "Bytes of audit events spooled on disk, not yet delivered",
                                value=counters.get("spool_bytes", 0))


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class _Count:
    """A counter read from elsewhere at scrape time."""

    def __init__(self, name: str, documentation: str, read: Callable[[], int]) -> None:
        self._name, self._documentation, self._read = name, documentation, read

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self._name, self._documentation, value=self._read())
