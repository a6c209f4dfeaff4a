"""The grpc.aio adapter: Envoy's network ext_proc stream in, KafkaSession in between.

Facts this adapter is built on (measured against Envoy's network ext_proc filter):
Envoy sends every TCP read as `read_data` (client -> broker) and every write as
`write_data` (broker -> client) without waiting for replies; replies are injected in
arrival order, so every chunk gets exactly one reply, an empty one while a frame is
being held; a reply without data would lose the chunk. Half-close arrives as an empty
chunk with end_of_stream and is echoed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

import grpc
from envoy.service.network_ext_proc.v3 import network_external_processor_pb2 as pb
from envoy.service.network_ext_proc.v3 import network_external_processor_pb2_grpc as pb_grpc
from google.protobuf.json_format import MessageToDict

import kafka_wire
from ext_proc.audit import (
    AuditEvent,
    AuditLog,
    JsonlAuditLog,
    NullAuditLog,
    TeeAuditLog,
    current_request,
)
from ext_proc.audit_kafka import KafkaAuditLog, KafkaAuditSettings
from ext_proc.connection import ConnectionInfo
from ext_proc.defaults import DEFAULT_POLL_INTERVAL_S
from ext_proc.filters.order import connection_filters
from ext_proc.filters.rates import SharedRates
from ext_proc.filters.rules import RuleDecision, RuleEngine
from ext_proc.frames import (
    DEFER_HEADER,
    FRAMES_MODE,
    METADATA_NAMESPACE,
    MODE_HEADER,
    FramesSession,
)
from ext_proc.grpc_listen import exclusive_server, listen
from ext_proc.identity import IdentityTracker
from ext_proc.metrics import (
    DEFAULT_MAX_CLIENTS,
    DEFAULT_MAX_PRINCIPALS,
    DEFAULT_MAX_SERIES,
    DEFAULT_MAX_TOPICS,
    ConnectionMeter,
    Metrics,
)
from ext_proc.private_files import private_dir
from ext_proc.rule_source import RuleDirectory
from ext_proc.rule_subscription import MAX_RULE_SET_BYTES, RuleSubscription, default_node_id
from ext_proc.sasl.login import SaslCredentials
from ext_proc.sasl.termination import (
    ALLOWED,
    SASL_AUTHENTICATION_FAILED,
    Attempt,
    Authenticator,
    SaslTerminationFilter,
    TerminationConfig,
    TerminationConfigError,
    TerminationState,
)
from ext_proc.sequences import SharedSequenceLedger
from ext_proc.session import KafkaSession, ProtocolViolation
from ext_proc.shared_topic_ids import SharedTopicIds
from ext_proc.tls_principal import MappingRuleError, NoMatchingRule, certificate_principal
from filter_rules import CompiledRuleSet, RuleSet
from interceptors import BuildContext, NoSideEffects
from interceptors.engine import DEFAULT_LIMITS, RecordLimits
from interceptors.side_effects import DataPathSideEffects
from kafka_wire import ApiKey
from kafka_wire.errors import KafkaWireError
from kafka_wire.framing import DEFAULT_MAX_FRAME_SIZE, HeldBytes
from kafka_wire.topic_ids import TopicIds

log = logging.getLogger(__name__)

_T = TypeVar("_T")

_CLOSE_RST = pb.ProcessingResponse(connection_status=pb.ProcessingResponse.CLOSE_RST)
NO_RULES_YET = "no rule set yet (the control plane has not answered, and none was kept)"


@dataclass(frozen=True)
class ProcessorSettings:
    host: str = "127.0.0.1"
    port: int = 0
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    # The most all connections together hold in frames being assembled (requests a
    # rule must read, responses a filter rewrites); a frame past it closes its
    # connection. Envoy bounds what it buffers per connection on its side.
    max_held_bytes: int = HeldBytes.DEFAULT_LIMIT
    rules_dir: Path | None = None
    rules_poll_interval_s: float = DEFAULT_POLL_INTERVAL_S  # how often rules_dir is looked at
    audit_log: Path | None = None
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None  # None: no /metrics endpoint
    # Label bounds: the first N distinct values get their own series, the rest "other".
    metrics_max_topics: int = DEFAULT_MAX_TOPICS
    metrics_max_clients: int = DEFAULT_MAX_CLIENTS
    metrics_max_principals: int = DEFAULT_MAX_PRINCIPALS
    metrics_max_series: int = DEFAULT_MAX_SERIES
    metrics_topics: bool = True  # topic labels: read the topics of passing Produce requests
    # The JWT claim an OAUTHBEARER token's principal is, as the broker reads it (its
    # sasl.oauthbearer.sub.claim.name): rules judge the principal the broker acts as.
    oauth_principal_claim: str = "sub"
    # Longest a throttled request is held. Chunks queue behind a held one and Envoy's
    # message_timeout (5 s by default) runs for each, so holds stay short: clients
    # back off by themselves on the answer's throttle_time_ms (KIP-219).
    max_delay_s: float = 0.25
    # The most record rules do for one frame (record-count and decompression bombs).
    record_limits: RecordLimits = DEFAULT_LIMITS
    # Rules from the control plane (host:port of its xDS server) instead of rules_dir.
    control_plane: str | None = None
    node_id: str | None = None  # the xDS node id (default: ext-proc-<host>-<port>-<pid>)
    # Where the last good distributed rule set is kept across restarts; None: not kept.
    rules_cache: Path | None = None
    # The largest rule set (xDS response) accepted from the control plane.
    max_rule_set_bytes: int = MAX_RULE_SET_BYTES
    # A directory of state the processes of one pool (workers on one host) share: rate
    # buckets and the sequences of idempotent producers whose records rules dropped.
    # None: this process's own.
    shared_state: Path | None = None
    # Rules from the control plane and none kept from before (first start, lost cache):
    # no connection is served without rules. A new one is held up to this long for the
    # first rule set, then refused (closed; keg's module answers a retriable error).
    first_rules_wait_s: float = 5.0
    # Where `copy` rules produce (librdkafka: bootstrap servers plus any properties,
    # e.g. SASL); None: copies to topics are counted as dropped.
    side_effects_bootstrap: str | None = None
    side_effects_config: tuple[tuple[str, str], ...] = ()
    # The audit stream on Kafka (with its local spool); None: the file alone, if any.
    audit_kafka: KafkaAuditSettings | None = None
    # SASL termination (ext_proc.sasl.termination): what terminating listeners accept,
    # and the service account the gateway logs in to the brokers as.
    sasl_termination: Path | None = None
    service_sasl: SaslCredentials | None = None
    # TLS to the control plane's xDS server: the CA to trust, and a client certificate
    # when it asks for one (mutual TLS).
    control_plane_ca: Path | None = None
    control_plane_cert: Path | None = None
    control_plane_key: Path | None = None

    def control_plane_credentials(self) -> grpc.ChannelCredentials | None:
        if self.control_plane_ca is None:
            return None
        key, cert = self.control_plane_key, self.control_plane_cert
        return grpc.ssl_channel_credentials(
            self.control_plane_ca.read_bytes(), key.read_bytes() if key is not None else None,
            cert.read_bytes() if cert is not None else None)

    def __post_init__(self) -> None:
        if self.control_plane is not None and self.rules_dir is not None:
            raise ValueError("rules come from a rule directory or from the control plane, "
                             "not both: give rules_dir or control_plane")


# keg's Kafka filter keeps its streams to this service alive with an HTTP/2 ping every
# 30 s while a connection is quiet. gRPC's server default takes a ping without data
# between more often than every 5 minutes as abuse: after two it sent GOAWAY
# ("too_many_pings"), every stream of that Envoy worker broke, and the next request a
# quiet Kafka connection handed off failed (fail-closed: the connection was closed).
KEEPALIVE_ACCEPTED: Final = (
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
)


def shared_state(directory: Path | None) -> dict[str, Any]:
    """The engine's state the pool's workers share (RuleEngine's arguments), in
    `directory`, made by the first worker that needs it."""
    if directory is None:
        return {}
    private_dir(directory)
    return {"rates": SharedRates(directory / "rates"),
            "sequences": SharedSequenceLedger(directory / "sequences"),
            "topic_ids": TopicIds(shared=SharedTopicIds(directory / "topic-ids"))}


class DataPath:
    """What every connection shares: the rule engine, audit log and metrics."""

    def __init__(self, settings: ProcessorSettings) -> None:
        self.metrics = Metrics(max_principals=settings.metrics_max_principals,
                               max_topics=settings.metrics_max_topics,
                               max_clients=settings.metrics_max_clients,
                               max_series=settings.metrics_max_series,
                               read_topics=settings.metrics_topics)
        self.held_bytes = HeldBytes(settings.max_held_bytes)
        self.metrics.watch_held_bytes(self.held_bytes)
        self._oauth_principal_claim = settings.oauth_principal_claim
        self.audit = audit_sinks(settings, self.metrics)
        self._auditing = not isinstance(self.audit, NullAuditLog)
        self.side_effects = (
            DataPathSideEffects(settings.side_effects_bootstrap, dict(settings.side_effects_config))
            if settings.side_effects_bootstrap else None)
        if self.side_effects is not None:
            self.metrics.watch_side_effects(self.side_effects.counters)
        context = BuildContext(side_effects=self.side_effects or NoSideEffects())
        self.engine = RuleEngine(
            CompiledRuleSet(RuleSet()), self._record, context, settings.record_limits,
            on_over_budget=lambda topic: self.metrics.record_budget_refusals.inc(),
            **shared_state(settings.shared_state))
        # Set once the engine runs the rule set it was given: the empty set it starts
        # with is nobody's when the rules come from a control plane (serving with it
        # would let everything through). A rule directory is read before serving.
        self.rules_ready = asyncio.Event()
        if settings.control_plane is None:
            self.rules_ready.set()
        self.metrics.topic_ids = self.engine.topic_ids  # names Produce v13's topic ids
        self.rules = (RuleDirectory(settings.rules_dir, self.engine, self.metrics,
                                    settings.rules_poll_interval_s)
                      if settings.rules_dir else None)
        self.termination: Authenticator | None = None
        if settings.sasl_termination is not None:
            if settings.service_sasl is None:
                raise TerminationConfigError("SASL termination needs the service account "
                                             "the gateway logs in to the brokers as")
            self.termination = Authenticator(TerminationConfig.load(settings.sasl_termination),
                                             settings.service_sasl, self._login_attempt)

    def _login_attempt(self, attempt: Attempt) -> None:
        """A client's login at a terminating listener: counted and audited."""
        self.metrics.sasl_logins.labels(attempt.mechanism, attempt.outcome).inc()
        self.audit.emit(AuditEvent.for_connection(
            attempt.conn, principal=f"User:{attempt.user}" if attempt.user else None,
            client_id=attempt.client_id,
            security_protocol="SASL_SSL" if attempt.conn.tls else "SASL_PLAINTEXT",
            api_key=ApiKey.SASL_AUTHENTICATE,
            api_name=kafka_wire.api_name(ApiKey.SASL_AUTHENTICATE),
            action="authenticate", outcome=attempt.outcome, reason=attempt.reason,
            error_code=None if attempt.outcome == ALLOWED else SASL_AUTHENTICATION_FAILED,
            extra={"mechanism": attempt.mechanism}))

    def close(self) -> None:
        """Flush what outlives connections: captures, copies queued, the audit log."""
        self.engine.records.close()
        if self.side_effects is not None:
            self.side_effects.close()
        self.audit.close()
        log.info("ext_proc stopped: captures, copies and the audit log flushed")

    def identity(self, conn: ConnectionInfo) -> IdentityTracker:
        """A connection's identity as it starts: TLS or not, and with mutual TLS the
        principal its client certificate names. NoMatchingRule / MappingRuleError when
        no principal can be given (the connection is refused, as a broker would)."""
        return IdentityTracker(tls=conn.tls, certificate_principal=certificate_principal(conn),
                               oauth_principal_claim=self._oauth_principal_claim)

    def frames_session(self, conn: ConnectionInfo) -> FramesSession:
        identity = self.identity(conn)
        meter = ConnectionMeter(self.metrics, conn.broker_id, lambda: identity.principal,
                                handed_off=True)
        return FramesSession(conn, self.engine, identity, meter)

    def session(self, conn: ConnectionInfo, max_frame_size: int) -> KafkaSession:
        identity = self.identity(conn)
        meter = ConnectionMeter(self.metrics, conn.broker_id, lambda: identity.principal)
        filters = connection_filters(self.engine, identity)
        termination = None
        if conn.sasl_termination:
            if self.termination is None:
                raise TerminationConfigError("the listener terminates SASL but this ext_proc "
                                             "service has no --sasl-termination")
            termination = TerminationState(self.termination, identity, conn)
            filters = [SaslTerminationFilter(termination), *filters]
        return KafkaSession(conn, filters, max_frame_size, meter, self.held_bytes,
                            termination)

    def _record(self, d: RuleDecision) -> None:
        mode = "dry-run" if d.rule.dry_run else "enforce"
        self.metrics.decision(d.rule.id, d.rule.kind, mode, d.outcome, d.records,
                              d.header.api_key, d.error_code)
        if d.error_code and not d.rule.dry_run:
            self.metrics.refusal(d.header.api_key, d.topic, d.header.client_id, d.principal,
                                 d.rule.id, d.error_code)
        if not d.answered:
            # Nothing tells the client (Produce acks=0): never let it pass unseen.
            self.metrics.unanswered_refusal(d.header.api_key, d.rule.id)
        if not self._auditing or not (d.rule.audited or not d.answered):
            return
        request = current_request()
        if request is None:  # outside a request's processing (no answer to wait for)
            self._write_event(d, None, None)
        else:  # written when the request's answer leaves the gateway, with its latency
            request.hold(partial(self._write_event, d))

    def _write_event(self, d: RuleDecision, latency_ms: float | None,
                     request_bytes: int | None) -> None:
        nbytes, records = d.volume if d.volume is not None else (request_bytes, 0)
        self.audit.emit(AuditEvent.for_connection(
            d.conn, principal=d.principal, client_id=d.header.client_id,
            security_protocol=d.security_protocol, api_key=d.header.api_key,
            api_name=kafka_wire.api_name(d.header.api_key),
            api_version=d.header.api_version, correlation_id=d.header.correlation_id,
            topic=d.topic, partition=d.partition, rule_id=d.rule.id,
            rule_version=d.rule_version, action=d.rule.kind,
            mode="dry-run" if d.rule.dry_run else "enforce", outcome=d.outcome,
            # 0: the gateway refused nothing (the broker's own errors are not read).
            error_code=d.error_code or 0, bytes=nbytes, records=records,
            latency_ms=latency_ms, reason=d.reason,
            extra=None if d.answered else {"answered": False},
        ))
        self.metrics.audit_event()


def audit_sinks(settings: ProcessorSettings, metrics: Metrics) -> AuditLog:
    """The audit sinks `settings` ask for, as one. The Kafka sink (its spool) comes
    first: an event in the file is always in the spool too, whenever the process dies."""
    sinks: list[AuditLog] = []
    if settings.audit_kafka is not None:
        kafka = KafkaAuditLog(settings.audit_kafka)
        metrics.watch_audit_sink(kafka.counters)
        sinks.append(kafka)
    if settings.audit_log is not None:
        sinks.append(JsonlAuditLog(settings.audit_log))
    if not sinks:
        return NullAuditLog()
    return sinks[0] if len(sinks) == 1 else TeeAuditLog(sinks)


def rule_free_session(conn: ConnectionInfo) -> KafkaSession:
    """A session as a processor without rules makes it (tests)."""
    return DataPath(ProcessorSettings()).session(conn, DEFAULT_MAX_FRAME_SIZE)


class NetworkProcessor(pb_grpc.NetworkExternalProcessorServicer):
    def __init__(self, settings: ProcessorSettings, data_path: DataPath) -> None:
        self._settings = settings
        self._data_path = data_path

    async def _run(self, step: Callable[[bytes], _T], data: bytes) -> _T:
        """One chunk (or handed-off frame) through its session: inline, or in a worker
        thread while the rule set has record rules. Record work is bounded per frame
        (RecordLimits) but can take up to its budget, and custom interceptors may block:
        the event loop keeps serving every other connection meanwhile. A connection's
        chunks stay in order: its stream awaits each."""
        if self._data_path.engine.records.active:
            return await asyncio.to_thread(step, data)
        return step(data)

    async def _rules_ready(self, conn: ConnectionInfo) -> bool:
        """Whether the engine runs its rule set, waiting for the first one at most
        `first_rules_wait_s`: a connection is never served by the empty set it starts
        with (that would let everything through)."""
        ready = self._data_path.rules_ready
        if ready.is_set():
            return True
        try:
            await asyncio.wait_for(ready.wait(), self._settings.first_rules_wait_s)
            return True
        except TimeoutError:
            log.warning("refusing connection: %s (%s)", NO_RULES_YET, conn.describe())
            self._data_path.metrics.no_rules_refusals.inc()
            return False

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProcessingResponse]:
        metadata = context.invocation_metadata() or ()
        conn = ConnectionInfo.from_metadata(metadata)
        frames_mode = any(key == MODE_HEADER and value == FRAMES_MODE for key, value in metadata)
        if not await self._rules_ready(conn):
            if frames_mode:  # keg's module then answers as its fail mode says
                await context.abort(grpc.StatusCode.UNAVAILABLE, NO_RULES_YET)
            yield _CLOSE_RST
            return
        try:
            if frames_mode:
                frames = self._data_path.frames_session(conn)
                frames.module_defers = any(key == DEFER_HEADER and value == "1"
                                           for key, value in metadata)
            else:
                session = self._data_path.session(conn, self._settings.max_frame_size)
        except (NoMatchingRule, MappingRuleError, TerminationConfigError) as err:
            log.warning("refusing connection: %s (%s)", err, conn.describe())
            self._data_path.metrics.decode_error(-1, "stream")
            yield _CLOSE_RST
            return
        if frames_mode:
            async for reply in self._frames(request_iterator, conn, frames):
                yield reply
            return
        metrics = self._data_path.metrics
        self._data_path.metrics.connection_opened()
        log.debug("connection opened %s", conn.describe())
        try:
            async for request in request_iterator:
                if request.HasField("read_data"):
                    data = request.read_data
                    started = time.perf_counter()
                    out = await self._run(session.from_client, data.data) if data.data else b""
                    metrics.frame_latency_observe(time.perf_counter() - started)
                    delay = session.take_delay()
                    if delay:
                        await asyncio.sleep(min(delay, self._settings.max_delay_s))
                    yield pb.ProcessingResponse(
                        read_data=pb.Data(data=out, end_of_stream=data.end_of_stream)
                    )
                    # A request the gateway answered itself: the answer goes to the
                    # client unsolicited, once nothing the broker owes comes first.
                    answers = session.take_client_bytes()
                    if answers:
                        yield pb.ProcessingResponse(write_data=pb.Data(data=answers))
                elif request.HasField("write_data"):
                    data = request.write_data
                    started = time.perf_counter()
                    out = await self._run(session.from_broker, data.data) if data.data else b""
                    metrics.frame_latency_observe(time.perf_counter() - started)
                    yield pb.ProcessingResponse(
                        write_data=pb.Data(data=out, end_of_stream=data.end_of_stream)
                    )
                    # SASL termination: the service account's next login step, or the
                    # requests that waited for the login, go to the broker unasked.
                    to_broker = session.take_broker_bytes()
                    if to_broker:
                        yield pb.ProcessingResponse(read_data=pb.Data(data=to_broker))
        except ProtocolViolation as err:
            log.warning("closing connection: %s (%s)", err, conn.describe())
            metrics.decode_error(-1, "stream")
            yield _CLOSE_RST
        except Exception:
            # A bug in a filter must cost one connection, never the service.
            log.exception("closing connection after an internal error (%s)", conn.describe())
            yield _CLOSE_RST
        finally:
            self._data_path.metrics.connection_closed()
            session.close()
            if session.pending_bytes():
                log.debug("connection ended mid-frame %s", conn.describe())


    async def _frames(self, requests: AsyncIterator[pb.ProcessingRequest],
                      conn: ConnectionInfo,
                      session: FramesSession) -> AsyncIterator[pb.ProcessingResponse]:
        """A connection's frames handed over by keg's native filter (ext_proc.frames):
        one whole frame per message, one reply each, in order."""
        data_path = self._data_path
        data_path.metrics.connection_opened()
        try:
            async for request in requests:
                keg = _keg_metadata(request)
                started = time.perf_counter()
                if request.HasField("read_data"):
                    reply = await self._run(partial(
                        session.request, principal=keg.get("principal"),
                        security_protocol=keg.get("security_protocol"),
                        topic_ids=keg.get("topic_ids")), request.read_data.data)
                    response = pb.ProcessingResponse(
                        read_data=pb.Data(data=reply.to_broker))
                    if reply.answer is not None:
                        response.write_data.data = reply.answer
                    reply_keg: dict[str, Any] = {"want_response": reply.want_response}
                    if reply.vouched:
                        reply_keg["vouched"] = [v.to_json() for v in reply.vouched]
                    if reply.throttle_ms:
                        reply_keg["throttle_ms"] = reply.throttle_ms
                    if reply.defer_ms:
                        reply_keg["defer_ms"] = reply.defer_ms
                    response.dynamic_metadata.update({METADATA_NAMESPACE: reply_keg})
                elif request.HasField("write_data"):
                    out = await self._run(partial(
                        session.response, api_key=int(keg["api_key"]),
                        api_version=int(keg["api_version"]), topic_ids=keg.get("topic_ids")),
                        request.write_data.data)
                    response = pb.ProcessingResponse(write_data=pb.Data(data=out))
                    vouched = session.take_vouched()
                    if vouched:
                        response.dynamic_metadata.update({METADATA_NAMESPACE: {
                            "vouched": [v.to_json() for v in vouched]}})
                else:
                    continue
                data_path.metrics.frame_latency_observe(time.perf_counter() - started)
                yield response
        except (KafkaWireError, KeyError, ValueError) as err:
            log.warning("closing connection: handed-off frame refused: %s (%s)", err,
                        conn.describe())
            data_path.metrics.decode_error(-1, "stream")
            yield _CLOSE_RST
        except Exception:
            log.exception("closing connection after an internal error (%s)", conn.describe())
            yield _CLOSE_RST
        finally:
            data_path.metrics.connection_closed()
            session.close()


def _keg_metadata(request: pb.ProcessingRequest) -> dict[str, Any]:
    """The native module's per-message fields (ProcessingRequest.metadata)."""
    fields = request.metadata.filter_metadata.get(METADATA_NAMESPACE)
    return MessageToDict(fields) if fields is not None else {}


class ExtProcServer:
    """Owns the grpc.aio server; `start()` binds and returns the port."""

    def __init__(self, settings: ProcessorSettings) -> None:
        self.settings = settings
        self.data_path = DataPath(settings)
        self.processor = NetworkProcessor(settings, self.data_path)
        self._watcher: asyncio.Task[None] | None = None
        self.subscription: RuleSubscription | None = None
        self.metrics_port: int | None = None
        self._server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        server = exclusive_server([
            ("grpc.max_receive_message_length", 256 * 1024 * 1024),
            ("grpc.max_send_message_length", 256 * 1024 * 1024),
            *KEEPALIVE_ACCEPTED,
        ])
        pb_grpc.add_NetworkExternalProcessorServicer_to_server(self.processor, server)
        self.port = listen(server, f"{self.settings.host}:{self.settings.port}",
                           "the ext_proc service")
        rules = self.data_path.rules
        if rules is not None and not rules.reload():
            raise RuntimeError(f"the rule set in {rules.directory} is invalid (see the log)")
        if self.settings.control_plane is not None:
            self.subscription = RuleSubscription(
                self.settings.control_plane, self.data_path.engine,
                self.settings.node_id or default_node_id(self.port),
                cache_file=self.settings.rules_cache, metrics=self.data_path.metrics,
                credentials=self.settings.control_plane_credentials(),
                max_rule_set_bytes=self.settings.max_rule_set_bytes,
                on_installed=self.data_path.rules_ready.set)
            if not self.subscription.restore():  # the last good set, even if the plane is down
                log.info("no rule set kept: connections wait for the control plane's")
        # /metrics is up before the first connection is accepted: whoever sees the
        # gRPC port open (a supervisor, a test) can scrape at once.
        self.data_path.metrics.bind_loop(asyncio.get_running_loop())
        if self.settings.metrics_port is not None:
            self.metrics_port = self.data_path.metrics.start_http_server(
                self.settings.metrics_port, self.settings.metrics_host)
            log.info("metrics on http://%s:%d/metrics", self.settings.metrics_host,
                     self.metrics_port)
        await server.start()
        self._server = server
        if rules is not None:
            self._watcher = asyncio.create_task(rules.watch())
        if self.subscription is not None:
            self._watcher = asyncio.create_task(self.subscription.run())
        log.info("ext_proc listening on %s:%d", self.settings.host, self.port)
        return self.port

    async def stop(self, grace: float = 2.0) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        self.data_path.close()

    async def serve_forever(self) -> None:
        await self.start()
        assert self._server is not None
        try:
            # Not grpc's wait_for_termination: cancelling that cancels the very future
            # the server's shutdown waits on, and stop() would end before flushing.
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # so the waits inside stop() are not cut short
            await self.stop()
            raise
