"""`keg`: one command line for the gateway, its parts and its tools."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer
import typer.rich_utils

from control_plane.defaults import (
    BROKER_ORDER_FILE,
    DEFAULT_REFRESH_INTERVAL_S,
    MIN_REFRESH_INTERVAL_S,
)
from ext_proc.defaults import DEFAULT_POLL_INTERVAL_S, MIN_POLL_INTERVAL_S
from keg import cli_pipeline, cli_rules
from keg.cli_options import option_group
from keg.cli_security import (
    NO_SECURITY_OPTIONS,
    SaslTermination,
    SecurityOptions,
    security_options,
)
from keg.console import error_line, make_console, styled
from keg.logs import setup_logging
from keg.paths import AUDIT_KAFKA_PASSWORD_ENV, SIDE_EFFECTS_PASSWORD_ENV
from keg.security import SERVICE_PASSWORD_ENV

log = logging.getLogger(__name__)

# Off a terminal (a pipe, `| less`, a CI log) rich draws help 80 columns wide and cuts
# long option names ("--failure-mode-all…"): give it room, unless a width was chosen.
HELP_WIDTH_OFF_TERMINAL: Final = 160
if not (os.environ.get("COLUMNS") or os.environ.get("TERMINAL_WIDTH")) and \
        not os.isatty(1):
    typer.rich_utils.MAX_WIDTH = HELP_WIDTH_OFF_TERMINAL

if TYPE_CHECKING:  # the commands import what they run lazily: `keg --help` stays fast
    from ext_proc import ExtProcServer, ProcessorSettings
    from ext_proc.audit_kafka import AuditFormat
    from filter_rules import CompiledRuleSet, RuleSet
    from filter_rules.diagnostics import RuleError
    from keg.gateway import Gateway

app = typer.Typer(
    help="keg, the Kafka Envoy Gateway: govern Kafka traffic without touching brokers or clients.",
    no_args_is_help=True,
    add_completion=False,
)
console = make_console()

LogLevel = Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING or ERROR.")]
LogFormat = Annotated[str, typer.Option("--log-format", help="text or json (one object a line).")]
RulesDir = Annotated[Path | None, typer.Option(
    help="Rule directory (YAML files), watched: valid changes apply to live connections.")]
RulesPollInterval = Annotated[float, typer.Option(
    min=MIN_POLL_INTERVAL_S,
    help="Seconds between looks at the rule directory: a change is in force one to two "
         "of them after it was written (the directory must hold still for one).")]
AUDIT_LOG_OFF: Final = ("none", "off")
AuditLogPath = Annotated[Path | None, typer.Option(
    help="Audit log file (JSON Lines, rotated); none or off: no audit log (a file of that "
         "name: ./none).")]
DEFAULT_MAX_FRAME_SIZE: Final = 100 * 1024 * 1024
RefreshInterval = Annotated[float, typer.Option(
    min=MIN_REFRESH_INTERVAL_S,
    help="Seconds between asking the brokers which brokers there are (a broker added gets "
         "its listener then; the bootstrap servers are asked first, then every broker "
         "known).")]
DEFAULT_MAX_HELD_BYTES: Final = 256 * 1024 * 1024
MaxFrameSize = Annotated[int, typer.Option(
    help="Largest Kafka frame accepted, in bytes; larger ones close the connection.")]
MaxHeldBytes = Annotated[int, typer.Option(
    help="Most bytes all connections together hold in frames being assembled (those a rule "
         "must read), per process (ext_proc worker, Envoy); a frame past it closes its "
         "connection.")]
def _claim_name(value: str) -> str:
    if not value.strip():
        raise typer.BadParameter("a JWT claim name, e.g. sub")
    return value


OauthPrincipalClaim = Annotated[str, typer.Option(
    envvar="KEG_OAUTH_PRINCIPAL_CLAIM", callback=_claim_name,
    help="The JWT claim an OAUTHBEARER token's principal is, as the brokers read it (their "
         "sasl.oauthbearer.sub.claim.name): rules judge the principal the broker acts as.")]
MetricsPort = Annotated[int | None, typer.Option(
    help="Serve Prometheus metrics on this port (0: a free one, printed).")]
ImpactDir = Annotated[Path | None, typer.Option(
    help="The directory `keg analyze --follow --out DIR` writes the live rule impact "
         "to, served as /v1/impact (keg up: default <state>/impact).")]
AuditKafkaTopic = Annotated[str, typer.Option(
    help="Topic of the audit stream (created at start when the cluster allows it).")]
AuditKafkaConfig = Annotated[list[str] | None, typer.Option(
    help="A librdkafka property for the audit stream's producer, key=value (repeatable, "
         f"e.g. SASL); the SASL password comes from ${AUDIT_KAFKA_PASSWORD_ENV}.")]
AuditFormatOption = Annotated[str, typer.Option(
    "--audit-format", help="Audit events on Kafka as json (default) or avro "
                           "(docs/audit.md).")]



def _metrics_label_bound(envvar: str, which: str, default: int = 1000) -> Any:
    """The option bounding one label of the ext_proc metrics (its distinct values), or
    their combinations."""
    return typer.Option(envvar=envvar, min=1,
                        help=f"{which}; later ones count as 'other'. Default {default}.")


def audit_log_setting(value: Path | None, default: Path | None) -> Path | None:
    """The audit log file an --audit-log value means: None is off ("none", "off")."""
    if value is None:
        return default
    return None if str(value) in AUDIT_LOG_OFF else value


def _properties(items: list[str] | None, option: str, password_env: str) -> list[tuple[str, str]]:
    """key=value options as pairs; the SASL password from `password_env`, if set."""
    pairs: list[tuple[str, str]] = []
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _fail(f"{option} wants key=value, not {item!r}")
        pairs.append((key, value))
    password = os.environ.pop(password_env, None)  # never inherited by other children
    if password:
        pairs.append(("sasl.password", password))
    return pairs


def _audit_format(value: str) -> AuditFormat:
    if value == "json":
        return "json"
    if value == "avro":
        return "avro"
    raise _fail(f"--audit-format is json or avro, not {value!r}")


@dataclass(frozen=True)
class AuditKafkaOptions:
    """How `keg up` and `keg ext-proc` write the audit stream (its topic, producer
    properties, format); each command says itself where it goes."""

    audit_kafka_topic: str = "_keg_audit"
    audit_kafka_config: list[str] | None = None
    audit_format: str = "json"

    def stream_fields(self) -> dict[str, Any]:
        """The fields of the audit stream's settings these give: the properties checked
        (the SASL password taken from its variable, which is then unset) and the format."""
        return {"topic": self.audit_kafka_topic,
                "config": tuple(_properties(self.audit_kafka_config, "--audit-kafka-config",
                                            AUDIT_KAFKA_PASSWORD_ENV)),
                "format": _audit_format(self.audit_format)}


NO_AUDIT_KAFKA_OPTIONS: Final = AuditKafkaOptions()
audit_kafka_options: Final = option_group(
    AuditKafkaOptions, {"audit_kafka_topic": AuditKafkaTopic,
                        "audit_kafka_config": AuditKafkaConfig,
                        "audit_format": AuditFormatOption}, "audit_stream")


def _default_data_dir() -> Path:
    from keg.embedded.kafka import cache_dir

    return cache_dir() / "up" / "kafka-data"


def _usable_data_path(wanted: str) -> str:
    """`native` when keg's Envoy filter is built; else the ext_proc path, said once."""
    if wanted != "native":
        return wanted
    from keg.embedded.native import NativeModuleUnavailable, module_dir

    try:
        module_dir()
    except NativeModuleUnavailable as err:
        console.print(styled(("keg's Envoy filter is not built", "yellow"),
                             f" ({err}): the ext_proc data path serves instead"))
        return "ext-proc"
    return wanted


def _wait_for_ctrl_c(exited: Callable[[], int | None] | None = None) -> int | None:
    """Until Ctrl-C (or SIGTERM), or until `exited()` says how the process it watches
    ended (returned: the exit code)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        code = exited() if exited is not None else None
        if code is not None:
            return code
    return None


def _fail(message: str, code: int = 2) -> typer.Exit:
    console.print(error_line(message))
    return typer.Exit(code)


def _check_api_tokens(path: Path | None) -> None:
    """The REST API's tokens, read before anything starts: a missing or invalid file
    stopped keg up with a traceback once its broker had started and stopped again."""
    from control_plane.api import TokenError, Tokens

    try:
        Tokens.load(path)
    except TokenError as err:
        raise _fail(f"--api-tokens: {err}") from None
    if path is not None and path.stat().st_mode & 0o077:
        log.warning("the API token file %s can be read by other users (mode %o): chmod 600 "
                    "it", path, path.stat().st_mode & 0o777)


def _dim(message: str) -> None:
    console.print(message, style="dim")


def _ports_in_use(ports: list[tuple[str, str, int | None]]) -> list[str]:
    """Of (option, host, port), the options whose port something already holds (port 0
    and None ask for nothing): said up front, before anything starts."""
    import socket

    taken = []
    for option, host, port in ports:
        if not port:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                taken.append(f"{option} {port}")
    return taken


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The ports the kernel picks for outgoing connections (None where it does not say)."""
    try:
        low, high = (int(n) for n in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def ports_in_ephemeral_range(ports: list[tuple[str, str, int | None]],
                             ephemeral: tuple[int, int] | None) -> list[str]:
    """Of (option, host, port), the options whose port the kernel may also give an
    outgoing connection: its TIME_WAIT then keeps a restarted part from listening there
    (a worker came back after 71 s, another after 115 s, for a new user who chose
    --internal-port-base 49200)."""
    if ephemeral is None:
        return []
    low, high = ephemeral
    return [f"{option} {port}" for option, _host, port in ports
            if port and low <= port <= high]


@app.command()
@security_options()
@audit_kafka_options
def up(
    bootstrap_servers: Annotated[
        str | None,
        typer.Option(
            help="Front this existing Kafka cluster instead of starting the embedded broker."
        ),
    ] = None,
    listen_host: Annotated[
        str, typer.Option(help="Address the broker listeners bind.")
    ] = "127.0.0.1",
    advertised_host: Annotated[
        str | None,
        typer.Option(help="Host clients are told to connect to (default: --listen-host)."),
    ] = None,
    listen_port_base: Annotated[
        int,
        typer.Option(
            help="First broker listener port; one port per broker from here (0: free ports)."
        ),
    ] = 19092,
    data_dir: Annotated[
        Path | None, typer.Option(help="Embedded broker's data directory (kept across runs).")
    ] = None,
    envoy_concurrency: Annotated[int, typer.Option(
        help="Envoy worker threads (0: one per core).")] = 0,
    ext_proc_workers: Annotated[int, typer.Option(
        help="Processes of the ext_proc service (0: one per core); each has its own "
             "/metrics port (worker i: --metrics-port + i) and its own audit log file.")] = 0,
    data_path: Annotated[str, typer.Option(
        help="native: keg's Kafka filter inside Envoy (a dynamic module built by make "
             "setup), which hands the ext_proc service only the frames rules need; "
             "ext-proc: every byte through the ext_proc service (also what an Envoy of "
             "another version gets, and the fallback when the module is not built)."
    )] = "native",
    max_frame_size: MaxFrameSize = DEFAULT_MAX_FRAME_SIZE,
    max_held_bytes: MaxHeldBytes = DEFAULT_MAX_HELD_BYTES,
    refresh_interval: RefreshInterval = DEFAULT_REFRESH_INTERVAL_S,
    internal_port_base: Annotated[int, typer.Option(
        help="Loopback ports of keg's own parts from here: the xDS server, each ext_proc "
             "worker's gRPC port, Envoy's admin (1 + workers + 1 ports; 0: free ports). "
             "Below the kernel's range for outgoing connections (ip_local_port_range, "
             "often 32768-60999), or a restarted part may find its port in TIME_WAIT.")] = 0,
    oauth_principal_claim: OauthPrincipalClaim = "sub",
    failure_mode_allow: Annotated[
        bool,
        typer.Option(help="Fail open: if the ext_proc service is down, pass bytes unprocessed."),
    ] = False,
    message_timeout: Annotated[
        float,
        typer.Option(help="Seconds Envoy waits for the ext_proc service per chunk before closing."),
    ] = 2.0,
    rules: RulesDir = None,
    rules_poll_interval: RulesPollInterval = DEFAULT_POLL_INTERVAL_S,
    rules_delivery: Annotated[str, typer.Option(
        help="control-plane: the control plane distributes the rules to the ext_proc "
             "service over xDS (ACKed, kept across restarts); directory: the ext_proc "
             "service watches the rule directory itself.")] = "control-plane",
    audit_log: AuditLogPath = None,
    audit_kafka: Annotated[bool, typer.Option(
        help="Also stream audit events to a Kafka topic (at least once, through a local "
             "spool in keg up's state; docs/audit.md).")] = False,
    audit_kafka_bootstrap: Annotated[str | None, typer.Option(
        help="The cluster of the audit stream (default: the one keg fronts, as the "
             "gateway's own user).")] = None,
    audit_stream: AuditKafkaOptions = NO_AUDIT_KAFKA_OPTIONS,
    metrics_port: MetricsPort = 9464,
    module_metrics_port: Annotated[int, typer.Option(
        help="With --data-path native: keg's Kafka filter in Envoy serves the labelled "
             "series of all traffic (keg_requests_total, keg_topic_*: API, topic, client "
             "id, principal) on this port's /metrics (0: a free one); the ext_proc "
             "workers' /metrics then count the frames handed to them.")] = 9463,
    api_port: Annotated[int | None, typer.Option(
        help="Serve the REST API on this port, the rules kept in a SQLite store of this "
             "rule directory's own (the directory applied to it and watched); 0: no API.")]
        = 8080,
    api_tokens: Annotated[Path | None, typer.Option(
        help="File of name:token lines allowed to write (also KEG_API_TOKENS).")] = None,
    impact_dir: ImpactDir = None,
    ext_proc_env: Annotated[list[str] | None, typer.Option(
        help="Pass this environment variable to the ext_proc service too (repeatable; "
             "e.g. what a custom interceptor reads). It gets the key variables its "
             "rules name without this; Envoy and the broker get neither.")] = None,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
    log_level: LogLevel = "INFO",
    log_format: LogFormat = "text",
) -> None:
    """Run the gateway: (embedded Kafka +) control plane + ext_proc + Envoy, until Ctrl-C.

    It serves exactly the rule directory it is given (--rules, default filter_rules/rules).
    Its state (rule store, audit log, Envoy's files) lives in the user cache, one
    directory per rule directory; a second keg up on the same rule directory refuses to
    start while the first runs. The ext_proc service, Envoy and the embedded broker are
    restarted whenever they exit (keg_component_restarts_total; /readyz says which part
    is down).
    """
    api_port = api_port or None
    setup_logging(log_level, log_format)
    if data_path not in ("ext-proc", "native"):
        raise _fail(f"--data-path is ext-proc or native, not {data_path!r}")
    if rules_delivery not in ("control-plane", "directory"):
        raise _fail(f"--rules-delivery is control-plane or directory, not {rules_delivery!r}")
    try:  # before anything starts: a missing secret or a bad certificate stops here
        sasl, listener_tls, broker_tls = security.build()
    except ValueError as err:
        raise _fail(str(err)) from None
    if (sasl is not None or broker_tls is not None) and bootstrap_servers is None:
        raise _fail("--sasl-* and --upstream-tls-* are for an existing cluster: give "
                    "--bootstrap-servers")
    if api_port is not None:
        _check_api_tokens(api_tokens)
    from control_plane.store import SQLITE_FILE, StoreError
    from filter_rules import DEFAULT_RULES_DIR, RuleSetInvalid, load_rule_dir
    from keg.embedded.kafka import EmbeddedKafka, EmbeddedKafkaError, cache_dir, ensure_kafka
    from keg.gateway import (
        KAFKA_COMPONENT,
        ApiOptions,
        AuditStream,
        Gateway,
        GatewayError,
        GatewaySettings,
        internal_ports,
    )
    from keg.state import DirectoryLock, StateInUse, up_state_dir
    from keg.supervisor import Child

    rules_dir = (rules or DEFAULT_RULES_DIR).resolve()
    ruleset: RuleSet | None
    try:
        ruleset = load_rule_dir(rules_dir)
    except RuleSetInvalid as err:
        for error in err.errors:
            typer.echo(str(error), err=True)
        if api_port is None or rules_delivery != "control-plane":
            raise _fail(f"{rules_dir}: {len(err.errors)} problem(s); keg up serves valid "
                        f"rules only (keg validate {rules_dir})") from None
        # A bad commit the last run refused must not turn a restart into an outage: the
        # store's last good version serves (below: if there is a store).
        ruleset = None
    workers = ext_proc_workers or os.cpu_count() or 1
    ports: list[tuple[str, str, int | None]] = [
        ("--listen-port-base", listen_host, listen_port_base),
        ("--api-port", "127.0.0.1", api_port),
        *((f"--metrics-port (+{i}: ext_proc worker {i})" if i else "--metrics-port",
           "127.0.0.1", metrics_port + i) for i in range(workers) if metrics_port),
        ("--module-metrics-port", "127.0.0.1", module_metrics_port),
        *((f"--internal-port-base (+{port - internal_port_base}: {name})", "127.0.0.1", port)
          for name, port in internal_ports(internal_port_base, workers).items())]
    owners: dict[int, str] = {}
    for option, _host, port in ports:
        if port and port in owners:
            raise _fail(f"port {port} is both {owners[port]} and {option}: choose ports apart")
        if port:
            owners[port] = option
    ephemeral = ephemeral_range()
    risky = ports_in_ephemeral_range(ports, ephemeral)
    if ephemeral is not None and risky:
        low, high = ephemeral
        typer.echo(f"warning: {', '.join(risky)}: in the kernel's range for outgoing "
                   f"connections ({low}-{high}); one left in TIME_WAIT on such a port keeps a "
                   f"restarted part from listening there for up to a minute: choose ports "
                   f"below {low}", err=True)
    taken = _ports_in_use(ports)
    if taken:
        raise _fail(f"port(s) already in use: {', '.join(taken)} (another keg up?); choose "
                    f"others, 0 for free ones (--api-port 0: no API)")
    state = up_state_dir(cache_dir(), rules_dir)
    if ruleset is None:
        if not (state / SQLITE_FILE).exists():
            raise _fail(f"{rules_dir}: invalid, and no earlier run of keg up on it kept rules "
                        f"to serve meanwhile (keg validate {rules_dir})")
        typer.echo(f"{rules_dir}: invalid: the rules keg up served last serve until the files "
                   f"are fixed (keg validate {rules_dir})", err=True)
    stream = AuditStream(
        bootstrap_servers=audit_kafka_bootstrap, spool_dir=state / "audit-spool",
        **audit_stream.stream_fields(),
    ) if audit_kafka else None
    lock = DirectoryLock(state, f"keg up's state for the rules in {rules_dir}")
    kafka = None
    try:
        lock.start()
        if bootstrap_servers is None:
            ensure_kafka(progress=_dim)
            kafka = EmbeddedKafka(data_dir=data_dir or _default_data_dir()).start()
            bootstrap_servers = kafka.bootstrap
            console.print(f"embedded Kafka broker on {bootstrap_servers} (data: {kafka.data_dir})")
        cores = os.cpu_count() or 1
        gateway = Gateway(
            GatewaySettings(
                bootstrap_servers=bootstrap_servers,
                listen_host=listen_host,
                advertised_host=advertised_host,
                listen_port_base=listen_port_base,
                refresh_interval_s=refresh_interval,
                internal_port_base=internal_port_base,
                envoy_concurrency=envoy_concurrency or cores,
                ext_proc_workers=ext_proc_workers or cores,
                failure_mode_allow=failure_mode_allow,
                message_timeout_s=message_timeout,
                ext_proc_log_level=log_level,
                ext_proc_log_format=log_format,
                rules_dir=rules_dir,
                rules_poll_interval_s=rules_poll_interval,
                # A directory of its own: one file per ext_proc worker, and rotated ones,
                # which `keg analyze --audit <directory>` reads together.
                audit_log=audit_log_setting(audit_log, state / "audit" / "audit.jsonl"),
                audit_kafka=stream,
                metrics_port=metrics_port,
                module_metrics_port=module_metrics_port,
                rules_delivery=rules_delivery,
                data_path=_usable_data_path(data_path),
                max_frame_size=max_frame_size,
                max_held_bytes=max_held_bytes,
                oauth_principal_claim=oauth_principal_claim,
                work_dir=state,
                api=None if api_port is None else ApiOptions(
                    data_dir=state, port=api_port, tokens_file=api_tokens,
                    impact_dir=impact_dir or state / "impact"),
                ext_proc_env=tuple(ext_proc_env or ()),
                sasl=sasl,
                tls=listener_tls,
                upstream_tls=broker_tls,
                sasl_termination=security.sasl_termination,
            )
        )
        with gateway:
            if kafka is not None:
                gateway.supervise(KAFKA_COMPONENT, Child(
                    poll=kafka.poll, restart=kafka.restart, pid=lambda: kafka.pid))
            console.print(styled(("keg is up.", "bold green"),
                                 " Kafka clients: bootstrap.servers=",
                                 (gateway.bootstrap, "bold"), "   (Ctrl-C stops)"))
            console.print(_serving(gateway, rules_dir, ruleset))
            terminated = security.sasl_termination is not None
            if listener_tls is not None or terminated:
                console.print(_security_line(listener_tls is not None,
                                             listener_tls is not None and listener_tls.mutual,
                                             terminated))
            scraped = [w.metrics_port for w in gateway.workers if w.metrics_port is not None]
            metrics = ("off" if not scraped else
                       " ".join(f"http://127.0.0.1:{port}/metrics" for port in scraped))
            if gateway.module_metrics_port is not None:
                metrics += f" (Kafka filter: http://127.0.0.1:{gateway.module_metrics_port}/metrics)"
            audits = " ".join(str(path) for path in gateway.audit_logs) or "off"
            console.print(f"audit log: {audits}   metrics: {metrics}   state: {state}")
            if stream is not None:
                spools = " ".join(str(w.own_path(stream.spool_dir)) for w in gateway.workers
                                  if stream.spool_dir is not None)
                console.print(f"audit stream: topic {stream.topic} on "
                              f"{stream.bootstrap_servers or bootstrap_servers} "
                              f"({stream.format}; spool {spools})")
            if gateway.app is not None and gateway.app.api_server is not None:
                api = f"http://127.0.0.1:{gateway.app.api_server.port}"
                console.print(f"REST API: {api}/docs   console: {api}/console "
                              "(reads and writes need a token: --api-tokens or KEG_API_TOKENS)")
            _wait_for_ctrl_c()
            console.print("stopping…")
    except StateInUse as err:
        raise _fail(f"{err}: stop it first") from None
    except (EmbeddedKafkaError, GatewayError, StoreError) as err:
        raise _fail(str(err)) from None
    finally:
        if kafka is not None:
            kafka.stop()
        lock.stop()


def _security_line(tls: bool, mutual: bool, terminated: bool) -> str:
    """What Kafka clients must speak to the listeners."""
    protocol = ("SASL_SSL" if terminated else "SSL or SASL_SSL") if tls else "SASL_PLAINTEXT"
    notes = []
    if mutual:
        notes.append("client certificates required")
    if terminated:
        notes.append("SASL logins checked by keg")
    return f"clients: security.protocol={protocol}" + (f" ({', '.join(notes)})" if notes else "")


def _serving(gateway: Gateway, rules_dir: Path, ruleset: RuleSet | None) -> str:
    """The start-up line naming the rules served: the directory, its rule count and
    version (None: its files are invalid), and with the store the store version and any
    rules written through REST."""
    line = (f"rules: {rules_dir} ({len(ruleset.rules)} rules, version {ruleset.version})"
            if ruleset is not None else f"rules: {rules_dir} (invalid: not in force)")
    store = gateway.app.store if gateway.app is not None else None
    if store is None:
        return line
    number, served = store.current()
    others = len(served.rules) - (len(ruleset.rules) if ruleset is not None else 0)
    line += f", store version {number}"
    if others > 0:
        line += f", plus {others} rule(s) written through the REST API or keg apply"
    return line


@app.command("ext-proc")
@audit_kafka_options
def ext_proc_cmd(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 50051,
    max_frame_size: MaxFrameSize = DEFAULT_MAX_FRAME_SIZE,
    max_held_bytes: MaxHeldBytes = DEFAULT_MAX_HELD_BYTES,
    oauth_principal_claim: OauthPrincipalClaim = "sub",
    rules: RulesDir = None,
    rules_poll_interval: RulesPollInterval = DEFAULT_POLL_INTERVAL_S,
    audit_log: AuditLogPath = None,
    metrics_port: MetricsPort = None,
    metrics_host: Annotated[str, typer.Option(help="Address the metrics endpoint binds.")]
        = "127.0.0.1",
    metrics_max_topics: Annotated[int | None, _metrics_label_bound(
        "KEG_METRICS_MAX_TOPICS",
        "Topics with a series of their own in the metrics (the first ones seen)")] = None,
    metrics_max_clients: Annotated[int | None, _metrics_label_bound(
        "KEG_METRICS_MAX_CLIENTS", "Client ids with a series of their own")] = None,
    metrics_topics: Annotated[bool, typer.Option(
        envvar="KEG_METRICS_TOPICS",
        help="Label Produce traffic by topic: read the topics of every Produce request "
             "as it passes (a few µs per request; off: no keg_topic_* series).")] = True,
    metrics_max_principals: Annotated[int | None, _metrics_label_bound(
        "KEG_METRICS_MAX_PRINCIPALS", "Principals with a series of their own")] = None,
    metrics_max_series: Annotated[int | None, _metrics_label_bound(
        "KEG_METRICS_MAX_SERIES", "Series per labelled family (its combinations of topic, "
        "client id and principal)", 10_000)] = None,  # ext_proc.metrics.DEFAULT_MAX_SERIES
    control_plane: Annotated[str | None, typer.Option(
        help="host:port of the control plane's xDS server: take the rules from it "
             "(instead of --rules).")] = None,
    node_id: Annotated[str | None, typer.Option(
        help="xDS node id in the fleet (default: ext-proc-<host>-<port>-<pid>).")] = None,
    rules_cache: Annotated[Path | None, typer.Option(
        help="File keeping the last good rule set from the control plane, served after a "
             "restart while the control plane is down.")] = None,
    shared_state: Annotated[Path | None, typer.Option(
        help="Directory of the state every process given the same one shares (a pool of "
             "workers on one host): rate buckets, so a rate is the host's, and the "
             "sequences of idempotent producers whose records rules dropped, which follow "
             "a producer to any worker. Default: this process's own.")] = None,
    first_rules_wait: Annotated[float, typer.Option(
        min=0.0, help="With --control-plane and no rule set kept: seconds a new "
                      "connection waits for the first rule set before it is refused "
                      "(none is served without rules).")] = 5.0,
    max_rule_set_bytes: Annotated[int, typer.Option(
        min=1, help="Largest rule set accepted from the control plane, in bytes of its "
                    "xDS response (100,000 rules: about 50 MB); the control plane NACKs "
                    "larger ones for this instance instead of sending them.")]
        = 128 * 1024 * 1024,
    side_effects_bootstrap: Annotated[str | None, typer.Option(
        help="Kafka bootstrap servers `copy` rules produce to (none: copies are dropped).")]
        = None,
    side_effects_config: Annotated[list[str] | None, typer.Option(
        help="A librdkafka property for that producer, key=value (repeatable); the SASL "
             f"password comes from ${SIDE_EFFECTS_PASSWORD_ENV}.")] = None,
    audit_kafka_bootstrap: Annotated[str | None, typer.Option(
        help="Stream audit events to this Kafka cluster (bootstrap servers), at least "
             "once through a local spool (docs/audit.md).")] = None,
    audit_stream: AuditKafkaOptions = NO_AUDIT_KAFKA_OPTIONS,
    audit_spool: Annotated[Path | None, typer.Option(
        help="The audit stream's spool directory: events wait there until Kafka has "
             "them, across restarts (default: the user cache, per port).")] = None,
    audit_spool_max_bytes: Annotated[int, typer.Option(
        help="The spool's bound: events beyond it are dropped (and counted) while Kafka "
             "is unreachable.")] = 1 << 30,
    sasl_termination: SaslTermination = None,
    service_sasl_mechanism: Annotated[str | None, typer.Option(
        help="With --sasl-termination: the mechanism of the service account the gateway "
             f"logs in to the brokers as (its password from ${SERVICE_PASSWORD_ENV}).")] = None,
    service_sasl_username: Annotated[str | None, typer.Option(
        help="The service account's user name.")] = None,
    control_plane_ca: Annotated[Path | None, typer.Option(
        help="Reach --control-plane over TLS, trusting this CA.")] = None,
    control_plane_cert: Annotated[Path | None, typer.Option(
        help="Client certificate for a control plane that asks for one (mutual TLS).")] = None,
    control_plane_key: Annotated[Path | None, typer.Option(help="Its private key.")] = None,
    log_level: LogLevel = "INFO",
    log_format: LogFormat = "text",
) -> None:
    """Run the ext_proc service (Envoy's network external processor for Kafka)."""
    setup_logging(log_level, log_format)
    from ext_proc import ProcessorSettings

    if control_plane is not None and rules is not None:
        raise _fail("give --rules or --control-plane, not both")
    producer_config = _properties(side_effects_config, "--side-effects-config",
                                  SIDE_EFFECTS_PASSWORD_ENV)
    audit_settings = None
    if audit_kafka_bootstrap is not None:
        from ext_proc.audit_kafka import KafkaAuditSettings
        from keg.embedded.kafka import cache_dir

        audit_settings = KafkaAuditSettings(
            bootstrap_servers=audit_kafka_bootstrap,
            spool_dir=audit_spool or cache_dir() / "audit-spool" / f"ext-proc-{port}",
            spool_max_bytes=audit_spool_max_bytes, **audit_stream.stream_fields())
    from ext_proc.sasl.login import SaslCredentials
    from ext_proc.sasl.termination import TerminationConfigError

    service = None
    if service_sasl_mechanism is not None:
        service_password = os.environ.pop(SERVICE_PASSWORD_ENV, None)
        if not service_password:
            raise _fail(f"--service-sasl-mechanism needs ${SERVICE_PASSWORD_ENV}")
        service = SaslCredentials(service_sasl_username or "", service_password,
                                  service_sasl_mechanism.upper())
    default = ProcessorSettings()  # the label bounds not given keep their defaults
    try:
        server = _ext_proc_server(ProcessorSettings(
        host=host, port=port, max_frame_size=max_frame_size, max_held_bytes=max_held_bytes,
        oauth_principal_claim=oauth_principal_claim,
        rules_dir=rules, rules_poll_interval_s=rules_poll_interval,
        audit_log=audit_log_setting(audit_log, None), metrics_port=metrics_port,
        metrics_host=metrics_host,
        control_plane=control_plane, node_id=node_id, rules_cache=rules_cache,
        shared_state=shared_state, first_rules_wait_s=first_rules_wait,
        max_rule_set_bytes=max_rule_set_bytes,
        side_effects_bootstrap=side_effects_bootstrap,
        side_effects_config=tuple(producer_config),
        metrics_max_topics=metrics_max_topics or default.metrics_max_topics,
        metrics_max_clients=metrics_max_clients or default.metrics_max_clients,
        metrics_max_principals=metrics_max_principals or default.metrics_max_principals,
        metrics_max_series=metrics_max_series or default.metrics_max_series,
        metrics_topics=metrics_topics,
        sasl_termination=sasl_termination,
        service_sasl=service,
        control_plane_ca=control_plane_ca,
        control_plane_cert=control_plane_cert,
        control_plane_key=control_plane_key,
        audit_kafka=audit_settings,
        ))
    except (TerminationConfigError, ValueError) as err:
        raise _fail(str(err)) from None

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await server.serve_forever()

    from ext_proc.grpc_listen import PortInUse

    try:
        asyncio.run(main())
    except PortInUse as err:
        raise _fail(str(err)) from None


def _ext_proc_server(settings: ProcessorSettings) -> ExtProcServer:
    from ext_proc import ExtProcServer

    return ExtProcServer(settings)


@app.command("control-plane")
@security_options(sasl_termination=False)
def control_plane_cmd(
    bootstrap_servers: Annotated[str, typer.Option(help="Kafka bootstrap servers to front.")],
    ext_proc: Annotated[str, typer.Option(help="host:port of the ext_proc service.")],
    xds_host: Annotated[str, typer.Option(help="Address the ADS server binds.")] = "0.0.0.0",
    xds_port: Annotated[int, typer.Option(help="ADS port Envoys connect to.")] = 18000,
    listen_host: Annotated[
        str, typer.Option(help="Address Envoy's broker listeners bind.")
    ] = "0.0.0.0",
    advertised_host: Annotated[
        str, typer.Option(help="Host clients are sent back to.")
    ] = "127.0.0.1",
    listen_port_base: Annotated[int, typer.Option(help="First broker listener port.")] = 19092,
    rules: Annotated[Path | None, typer.Option(
        help="Rule directory (watched) whose rule set goes to every ext_proc instance.")]
        = None,
    rules_poll_interval: RulesPollInterval = DEFAULT_POLL_INTERVAL_S,
    groups: Annotated[Path | None, typer.Option(
        help="Envoy groups of a mesh (YAML): which brokers each node cluster fronts, "
             "on which ports (docs/xds.md).")] = None,
    refresh_interval: RefreshInterval = DEFAULT_REFRESH_INTERVAL_S,
    data_path: Annotated[str, typer.Option(
        help="ext-proc, or native: Envoys of the module's version get keg's Kafka filter "
             "(a dynamic module on their ENVOY_DYNAMIC_MODULES_SEARCH_PATH), others the "
             "ext_proc chain.")] = "ext-proc",
    max_frame_size: MaxFrameSize = DEFAULT_MAX_FRAME_SIZE,
    max_held_bytes: MaxHeldBytes = DEFAULT_MAX_HELD_BYTES,
    oauth_principal_claim: OauthPrincipalClaim = "sub",
    api_port: Annotated[int | None, typer.Option(
        help="Serve the REST API (and keep the rules in the store) on this port; "
             "without it the rules come from --rules alone.")] = None,
    api_host: Annotated[str, typer.Option(help="Address the REST API binds.")] = "0.0.0.0",
    store: Annotated[str | None, typer.Option(
        envvar="KEG_STORE_URL",
        help="Rule store URL (postgresql://... for several control planes); default: "
             "SQLite in --data-dir.")] = None,
    data_dir: Annotated[Path | None, typer.Option(
        help="Where the SQLite store lives (default: the user cache), and the order brokers "
             "were first seen in (their listener ports, kept across restarts).")] = None,
    api_tokens: Annotated[Path | None, typer.Option(
        help="File of name:token lines allowed to write (also KEG_API_TOKENS).")] = None,
    public_reads: Annotated[bool, typer.Option(
        help="Let reads of the REST API go without a token.")] = False,
    impact_dir: ImpactDir = None,
    ext_proc_metrics: Annotated[list[str] | None, typer.Option(
        help="An ext_proc /metrics URL the console's decision counts are read from "
             "(repeatable; a name with several addresses is read at each).")] = None,
    audit_log: Annotated[list[Path] | None, typer.Option(
        help="An audit log file (JSON Lines) this process can read: the console's audit "
             "tail (repeatable: one per ext_proc process, merged by time).")] = None,
    xds_tls_cert: Annotated[Path | None, typer.Option(
        help="Serve xDS over TLS with this certificate (it carries the listeners' keys).")]
        = None,
    xds_tls_key: Annotated[Path | None, typer.Option(help="Its private key.")] = None,
    xds_tls_client_ca: Annotated[Path | None, typer.Option(
        help="Envoys and ext_proc instances must present a certificate this CA signed.")]
        = None,
    api_tls_cert: Annotated[Path | None, typer.Option(
        help="Serve the REST API over HTTPS with this certificate.")] = None,
    api_tls_key: Annotated[Path | None, typer.Option(help="Its private key.")] = None,
    api_tls_client_ca: Annotated[Path | None, typer.Option(
        help="REST clients must present a certificate this CA signed.")] = None,
    api_insecure_tokens: Annotated[bool, typer.Option(
        help="Take write tokens over plaintext HTTP on a non-loopback address anyway (a "
             "TLS-terminating proxy in front); refused otherwise.")] = False,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
    terminate_sasl: Annotated[bool, typer.Option(
        help="The listeners authenticate clients themselves (the ext_proc instances run "
             "with --sasl-termination).")] = False,
    log_level: LogLevel = "INFO",
    log_format: LogFormat = "text",
) -> None:
    """Run the control plane alone (xDS for a fleet of Envoys and ext_proc instances)."""
    setup_logging(log_level, log_format)
    if api_port is not None:
        _check_api_tokens(api_tokens)
    from control_plane.service import ControlPlaneSettings, load_groups
    from control_plane.store import StoreError
    from control_plane.tls import ServerTls
    from ext_proc.connection import split_host_port
    from filter_rules import RuleSetInvalid
    from keg.embedded.kafka import cache_dir
    from keg.gateway import ApiOptions, ControlPlaneApp

    def server_tls(cert: Path | None, key: Path | None, ca: Path | None,
                   what: str) -> ServerTls | None:
        if cert is None and key is None and ca is None:
            return None
        if cert is None or key is None:
            raise ValueError(f"--{what}-tls-cert and --{what}-tls-key go together")
        return ServerTls(cert, key, ca)

    try:
        sasl, listener_tls, broker_tls = security.build()
        xds_tls = server_tls(xds_tls_cert, xds_tls_key, xds_tls_client_ca, "xds")
        api_tls = server_tls(api_tls_cert, api_tls_key, api_tls_client_ca, "api")
        host, port = split_host_port(ext_proc)
        settings = ControlPlaneSettings(
            bootstrap_servers=bootstrap_servers,
            ext_proc_host=host,
            ext_proc_port=port,
            xds_host=xds_host,
            xds_port=xds_port,
            listen_host=listen_host,
            advertised_host=advertised_host,
            listen_port_base=listen_port_base,
            rules_dir=rules,
            rules_poll_interval_s=rules_poll_interval,
            groups=load_groups(groups) if groups is not None else (),
            refresh_interval_s=refresh_interval,
            data_path=data_path,
            max_frame_size=max_frame_size,
            max_held_bytes=max_held_bytes,
            oauth_principal_claim=oauth_principal_claim,
            sasl=sasl,
            tls=listener_tls,
            upstream_tls=broker_tls,
            sasl_termination=terminate_sasl,
            xds_tls=xds_tls,
            broker_order_file=(data_dir or cache_dir() / "control-plane") / BROKER_ORDER_FILE,
        )
    except (RuleSetInvalid, ValueError, OSError) as err:
        raise _fail(str(err)) from None
    api = None if api_port is None else ApiOptions(
        data_dir=data_dir or cache_dir() / "control-plane", host=api_host, port=api_port,
        store_url=store, tokens_file=api_tokens, public_reads=public_reads, rules_dir=rules,
        ext_proc_metrics=tuple(ext_proc_metrics or ()), audit_logs=tuple(audit_log or ()),
        tls=api_tls, impact_dir=impact_dir, insecure_tokens=api_insecure_tokens)
    process = ControlPlaneApp(settings, api)

    async def main() -> None:
        try:
            await process.start()
            await asyncio.Event().wait()
        finally:
            await process.stop()

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(main())
    except (RuleSetInvalid, ValueError, RuntimeError, OSError, StoreError) as err:
        # Invalid rules, a bad token file, an unreachable store, a taken port.
        raise _fail(str(err)) from None


@app.command()
def kafka(
    port: Annotated[int, typer.Option(help="Broker port (0: a free one).")] = 9092,
    data_dir: Annotated[Path | None, typer.Option(help="Data directory (kept).")] = None,
    log_level: LogLevel = "INFO",
) -> None:
    """Run the embedded Kafka broker alone, until Ctrl-C."""
    setup_logging(log_level)
    from keg.embedded.kafka import EmbeddedKafka, EmbeddedKafkaError, ensure_kafka

    try:
        ensure_kafka(progress=_dim)
        with EmbeddedKafka(data_dir=data_dir or _default_data_dir(), port=port) as broker:
            console.print(styled("Kafka broker on ", (broker.bootstrap, "bold"),
                                 " (Ctrl-C stops)"))
            # A broker that dies ends this command (before, it waited on as if the broker
            # ran, with the JVM a zombie, so whatever supervises it never knew).
            code = _wait_for_ctrl_c(broker.poll)
    except EmbeddedKafkaError as err:
        raise _fail(str(err)) from None
    if code is not None:
        from keg.supervisor import describe_exit

        raise _fail(f"the Kafka broker exited with {describe_exit(code)}", 1)


@app.command("schema-registry")
def schema_registry(
    port: Annotated[int, typer.Option(help="HTTP port (0: a free one).")] = 8081,
    log_level: LogLevel = "INFO",
) -> None:
    """Run a schema registry (Apicurio Registry, in memory, with the Confluent-compatible
    API the `schema` rule asks), until Ctrl-C. Fetched by `keg setup --test-services`."""
    setup_logging(log_level)
    from keg.embedded.kafka import EmbeddedKafkaError
    from keg.embedded.registry import EmbeddedRegistry, ensure_registry

    try:
        ensure_registry(progress=_dim)
        with EmbeddedRegistry(port=port) as registry:
            console.print(styled("Schema registry (Confluent API) on ",
                                 (registry.ccompat_url, "bold"), " (Ctrl-C stops)"))
            _wait_for_ctrl_c()
    except EmbeddedKafkaError as err:
        raise _fail(str(err)) from None


credentials_app = typer.Typer(help="The users listeners that terminate SASL authenticate "
                                    "(salted SCRAM keys, never passwords).",
                               no_args_is_help=True)
app.add_typer(credentials_app, name="credentials")


@credentials_app.command("add")
def credentials_add(
    file: Annotated[Path, typer.Argument(help="Credential file (YAML; created if absent).")],
    user: Annotated[str, typer.Argument(help="User name (the principal is User:<name>).")],
    password_file: Annotated[Path | None, typer.Option(
        help="File holding the password; else it is read from standard input.")] = None,
    iterations: Annotated[int, typer.Option(help="SCRAM iterations (4096 at least).")] = 8192,
) -> None:
    """Add or replace a user: SCRAM-SHA-256 and SCRAM-SHA-512 keys (PLAIN checks them too)."""
    import sys

    from ext_proc.sasl.credentials import CredentialFileError, add_user
    from ext_proc.sasl.scram import ScramError
    from keg.security import SecretMissing, read_secret

    try:
        if password_file is not None:
            password = read_secret(password_file, "")
        else:
            password = sys.stdin.readline().rstrip("\n")
        if not password:
            raise SecretMissing("an empty password")
        add_user(file, user, password, iterations)
    except (CredentialFileError, ScramError, SecretMissing, OSError, ValueError) as err:
        raise _fail(str(err)) from None
    console.print(f"{file}: {user} (SCRAM-SHA-256, SCRAM-SHA-512, {iterations} iterations)")


@app.command("dev-certs")
def dev_certs(
    directory: Annotated[Path, typer.Argument(help="Where the CA and certificates go.")],
    server: Annotated[list[str] | None, typer.Option(
        help="A server certificate <name>[=host,host...] (repeatable; default hosts: the "
             "name, localhost, 127.0.0.1); <name>-keystore.pem holds key and chain for "
             "Kafka.")] = None,
    client: Annotated[list[str] | None, typer.Option(
        help="A client certificate <name> with subject CN=<name> (repeatable).")] = None,
    readable_keys: Annotated[bool, typer.Option(
        help="Keys readable by every user (containers running as other users).")] = False,
) -> None:
    """Throw-away certificates for trying TLS out: a CA and certificates it signed.
    Never for anything real."""
    from keg.embedded.certs import DevCa

    ca = DevCa(directory, key_mode=0o644 if readable_keys else 0o600)
    for entry in server or []:
        name, _, hosts = entry.partition("=")
        names = [h for h in hosts.split(",") if h] or [name, "localhost", "127.0.0.1"]
        ca.keystore(ca.server(name, names))
    for name in client or []:
        ca.client(name, name)
    console.print(f"{directory}: ca.pem, {len(server or [])} server and "
                  f"{len(client or [])} client certificate(s)")


@app.command()
def setup(
    test_services: Annotated[bool, typer.Option(
        "--test-services",
        help="Also fetch the services the tests run against: Apicurio Registry (a schema "
             "registry, from Maven Central) and local-kms (the AWS KMS API, built with "
             "go install).")] = False,
) -> None:
    """Fetch what keg runs on (the Kafka jars from Maven Central) into the user cache."""
    setup_logging("WARNING")
    from keg.embedded.envoy import envoy_binary
    from keg.embedded.kafka import EmbeddedKafkaError, ensure_kafka

    try:
        libs = ensure_kafka(progress=_dim)
        if test_services:
            from keg.embedded.local_kms import ensure_local_kms
            from keg.embedded.registry import ensure_registry

            console.print(f"Schema registry: {ensure_registry(progress=_dim)}")
            console.print(f"local-kms: {ensure_local_kms(progress=_dim)}")
    except EmbeddedKafkaError as err:
        raise _fail(str(err)) from None
    console.print(f"Kafka jars: {libs}")
    console.print(f"Envoy: {envoy_binary()}")
    from keg.embedded.native import NativeModuleUnavailable, module_dir

    try:
        console.print(f"keg's Envoy filter: {module_dir()}")
    except NativeModuleUnavailable as err:
        console.print(styled(("keg's Envoy filter not built:", "yellow"), " ", str(err)))


@app.command()
def validate(
    directory: Annotated[Path, typer.Argument(help="Rule directory (YAML files).")]
        = Path("filter_rules/rules"),
    secrets: Annotated[bool, typer.Option(
        "--secrets/--no-secrets",
        help="Also build the record rules as the ext_proc service will: read every secret "
             "the rules name (encryption and hash keys: environment variables, key files), "
             "every JSON Schema file, import every custom interceptor, and report each "
             "problem at its line. --no-secrets where rules are validated without the "
             "secrets (a CI job): only the rule files are checked.")] = True,
) -> None:
    """Check a rule directory against the rule schema; exit 1 with file:line errors.

    Usable in any CI: prints one line per problem and exits 0 only when every file
    in the directory validates and every secret it names is there (--no-secrets: the
    files only).
    """
    from filter_rules import CompiledRuleSet, RuleSetInvalid, load_rule_dir
    from interceptors.secrets import check_secrets

    try:
        compiled = CompiledRuleSet(load_rule_dir(directory))
        checked, missing = check_secrets(compiled.ruleset) if secrets else (0, [])
        if secrets:
            missing += _unbuildable(compiled, {e.field_path.split(".", 1)[0] for e in missing})
        if missing:
            raise RuleSetInvalid(missing)
    except RuleSetInvalid as err:
        for error in err.errors:
            typer.echo(str(error), err=True)
        typer.echo(f"{directory}: {len(err.errors)} problem(s)", err=True)
        raise typer.Exit(1) from None
    checked_text = f"{checked} secret(s) found" if secrets else "secrets not checked"
    typer.echo(f"{directory}: {len(compiled.ruleset.rules)} rules valid "
               f"({len(compiled.rules)} enabled), version {compiled.version}; {checked_text}")
    if not compiled.ruleset.rules and (unread := _unread_files(directory)):
        typer.echo(f"warning: {directory} has no rules; not read as rule files (only "
                   f"*.yaml and *.yml directly in it are): {', '.join(unread)}", err=True)


def _unread_files(directory: Path, shown: int = 5) -> list[str]:
    """Files under `directory` that look like rules but are not read as rule files (in
    a subdirectory, or .json): `keg validate` said "0 rules valid" of a wrong path."""
    from filter_rules.loader import RULE_FILE_SUFFIXES

    found = sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                   if p.is_file() and p.suffix in (*RULE_FILE_SUFFIXES, ".json")
                   and (p.parent != directory or p.suffix == ".json"))
    return [*found[:shown], *([f"... {len(found) - shown} more"] if len(found) > shown else [])]


def _unbuildable(compiled: CompiledRuleSet, reported: set[str]) -> list[RuleError]:
    """Why record rules cannot be built as the ext_proc service builds them (a JSON
    Schema file that is not there, a custom interceptor that does not import), but for
    the rules in `reported` (their secrets are missing: said already). Before, `keg
    validate` said valid what the gateway then refused: it read secrets, not files."""
    from control_plane.api.dry_run import record_engine
    from filter_rules import RuleSetInvalid

    try:
        record_engine(compiled).close()
    except RuleSetInvalid as err:
        return [e for e in err.errors if e.field_path.split(".", 1)[0] not in reported]
    return []


# The commands of their own modules, after keg's own in `keg --help`.
for _module in (cli_pipeline, cli_rules):
    app.registered_commands.extend(_module.commands.registered_commands)
