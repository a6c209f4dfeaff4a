"""`keg`: one command line for the gateway, its parts and its tools."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final

import typer

from keg.console import error_line, make_console, styled
from keg.logs import setup_logging
from keg.paths import SIDE_EFFECTS_PASSWORD_ENV

if TYPE_CHECKING:  # the commands import what they run lazily: `keg --help` stays fast
    from filter_rules import RuleSet
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
AUDIT_LOG_OFF: Final = ("none", "off")
AuditLogPath = Annotated[Path | None, typer.Option(
    help="Audit log file (JSON Lines, rotated); none or off: no audit log (a file of that "
         "name: ./none).")]
MetricsPort = Annotated[int | None, typer.Option(
    help="Serve Prometheus metrics on this port (0: a free one, printed).")]


def audit_log_setting(value: Path | None, default: Path | None) -> Path | None:
    """The audit log file an --audit-log value means: None is off ("none", "off")."""
    if value is None:
        return default
    return None if str(value) in AUDIT_LOG_OFF else value


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


def _wait_for_ctrl_c() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()


def _fail(message: str, code: int = 2) -> typer.Exit:
    console.print(error_line(message))
    return typer.Exit(code)


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


@app.command()
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
             "/metrics port after --metrics-port's and its own audit log file.")] = 0,
    data_path: Annotated[str, typer.Option(
        help="native: keg's Kafka filter inside Envoy (a dynamic module built by make "
             "setup), which hands the ext_proc service only the frames rules need; "
             "ext-proc: every byte through the ext_proc service (also what an Envoy of "
             "another version gets, and the fallback when the module is not built)."
    )] = "native",
    failure_mode_allow: Annotated[
        bool,
        typer.Option(help="Fail open: if the ext_proc service is down, pass bytes unprocessed."),
    ] = False,
    message_timeout: Annotated[
        float,
        typer.Option(help="Seconds Envoy waits for the ext_proc service per chunk before closing."),
    ] = 2.0,
    rules: RulesDir = None,
    rules_delivery: Annotated[str, typer.Option(
        help="control-plane: the control plane distributes the rules to the ext_proc "
             "service over xDS (ACKed, kept across restarts); directory: the ext_proc "
             "service watches the rule directory itself.")] = "control-plane",
    audit_log: AuditLogPath = None,
    metrics_port: MetricsPort = 9464,
    api_port: Annotated[int | None, typer.Option(
        help="Serve the REST API on this port, the rules kept in a SQLite store of this "
             "rule directory's own (the directory applied to it and watched); 0: no API.")]
        = 8080,
    api_tokens: Annotated[Path | None, typer.Option(
        help="File of name:token lines allowed to write (also KEG_API_TOKENS).")] = None,
    ext_proc_env: Annotated[list[str] | None, typer.Option(
        help="Pass this environment variable to the ext_proc service too (repeatable; "
             "e.g. what a custom interceptor reads). It gets the key variables its "
             "rules name without this; Envoy and the broker get neither.")] = None,
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
    from control_plane.store import StoreError
    from filter_rules import DEFAULT_RULES_DIR, RuleSetInvalid, load_rule_dir
    from keg.embedded.kafka import EmbeddedKafka, EmbeddedKafkaError, cache_dir, ensure_kafka
    from keg.gateway import KAFKA_COMPONENT, ApiOptions, Gateway, GatewayError, GatewaySettings
    from keg.state import DirectoryLock, StateInUse, up_state_dir
    from keg.supervisor import Child

    rules_dir = (rules or DEFAULT_RULES_DIR).resolve()
    try:
        ruleset = load_rule_dir(rules_dir)
    except RuleSetInvalid as err:
        for error in err.errors:
            typer.echo(str(error), err=True)
        raise _fail(f"{rules_dir}: {len(err.errors)} problem(s); keg up serves valid rules "
                    f"only (keg validate {rules_dir})") from None
    taken = _ports_in_use([("--listen-port-base", listen_host, listen_port_base),
                           ("--api-port", "127.0.0.1", api_port),
                           ("--metrics-port", "127.0.0.1", metrics_port)])
    if taken:
        raise _fail(f"port(s) already in use: {', '.join(taken)} (another keg up?); choose "
                    f"others, 0 for free ones (--api-port 0: no API)")
    state = up_state_dir(cache_dir(), rules_dir)
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
                envoy_concurrency=envoy_concurrency or cores,
                ext_proc_workers=ext_proc_workers or cores,
                failure_mode_allow=failure_mode_allow,
                message_timeout_s=message_timeout,
                ext_proc_log_level=log_level,
                rules_dir=rules_dir,
                audit_log=audit_log_setting(audit_log, state / "audit.jsonl"),
                metrics_port=metrics_port,
                rules_delivery=rules_delivery,
                data_path=_usable_data_path(data_path),
                work_dir=state,
                api=None if api_port is None else ApiOptions(
                    data_dir=state, port=api_port, tokens_file=api_tokens),
                ext_proc_env=tuple(ext_proc_env or ()),
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
            s = gateway.settings
            ports = [w.metrics_port for w in gateway.workers if w.metrics_port is not None]
            metrics = ("off" if not ports else
                       " ".join(f"http://127.0.0.1:{port}/metrics" for port in ports))
            console.print(f"audit log: {s.audit_log or 'off'}   metrics: {metrics}   "
                          f"state: {state}")
            if gateway.app is not None and gateway.app.api_server is not None:
                console.print(f"REST API: http://127.0.0.1:{gateway.app.api_server.port}/docs "
                              "(writes need a token: --api-tokens or KEG_API_TOKENS)")
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


def _serving(gateway: Gateway, rules_dir: Path, ruleset: RuleSet) -> str:
    """The start-up line naming the rules served: the directory, its rule count and
    version, and with the store the store version and any rules written through REST."""
    line = f"rules: {rules_dir} ({len(ruleset.rules)} rules, version {ruleset.version})"
    store = gateway.app.store if gateway.app is not None else None
    if store is None:
        return line
    number, served = store.current()
    others = len(served.rules) - len(ruleset.rules)
    line += f", store version {number}"
    if others > 0:
        line += f", plus {others} rule(s) written through the REST API"
    return line


@app.command("ext-proc")
def ext_proc_cmd(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 50051,
    max_frame_size: Annotated[
        int,
        typer.Option(
            help="Largest Kafka frame accepted, in bytes; larger ones close the connection."
        ),
    ] = 100 * 1024 * 1024,
    max_held_bytes: Annotated[
        int,
        typer.Option(
            help="Most bytes all connections together hold in frames being assembled (those "
                 "a rule must read); a frame past it closes its connection."),
    ] = 256 * 1024 * 1024,
    rules: RulesDir = None,
    audit_log: AuditLogPath = None,
    metrics_port: MetricsPort = None,
    metrics_host: Annotated[str, typer.Option(help="Address the metrics endpoint binds.")]
        = "127.0.0.1",
    control_plane: Annotated[str | None, typer.Option(
        help="host:port of the control plane's xDS server: take the rules from it "
             "(instead of --rules).")] = None,
    node_id: Annotated[str | None, typer.Option(
        help="xDS node id in the fleet (default: ext-proc-<host>-<port>-<pid>).")] = None,
    rules_cache: Annotated[Path | None, typer.Option(
        help="File keeping the last good rule set from the control plane, served after a "
             "restart while the control plane is down.")] = None,
    side_effects_bootstrap: Annotated[str | None, typer.Option(
        help="Kafka bootstrap servers `copy` rules produce to (none: copies are dropped).")]
        = None,
    side_effects_config: Annotated[list[str] | None, typer.Option(
        help="A librdkafka property for that producer, key=value (repeatable); the SASL "
             f"password comes from ${SIDE_EFFECTS_PASSWORD_ENV}.")] = None,
    log_level: LogLevel = "INFO",
    log_format: LogFormat = "text",
) -> None:
    """Run the ext_proc service (Envoy's network external processor for Kafka)."""
    setup_logging(log_level, log_format)
    from ext_proc import ExtProcServer, ProcessorSettings

    if control_plane is not None and rules is not None:
        raise _fail("give --rules or --control-plane, not both")
    producer_config: list[tuple[str, str]] = []
    for item in side_effects_config or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _fail(f"--side-effects-config wants key=value, not {item!r}")
        producer_config.append((key, value))
    password = os.environ.get(SIDE_EFFECTS_PASSWORD_ENV)
    if password:
        producer_config.append(("sasl.password", password))
    server = ExtProcServer(ProcessorSettings(
        host=host, port=port, max_frame_size=max_frame_size, max_held_bytes=max_held_bytes,
        rules_dir=rules,
        audit_log=audit_log_setting(audit_log, None), metrics_port=metrics_port,
        metrics_host=metrics_host,
        control_plane=control_plane, node_id=node_id, rules_cache=rules_cache,
        side_effects_bootstrap=side_effects_bootstrap,
        side_effects_config=tuple(producer_config),
    ))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await server.serve_forever()

    asyncio.run(main())


@app.command("control-plane")
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
    groups: Annotated[Path | None, typer.Option(
        help="Envoy groups of a mesh (YAML): which brokers each node cluster fronts, "
             "on which ports (docs/xds.md).")] = None,
    refresh_interval: Annotated[float, typer.Option(
        help="Seconds between topology refreshes.")] = 30.0,
    api_port: Annotated[int | None, typer.Option(
        help="Serve the REST API (and keep the rules in the store) on this port; "
             "without it the rules come from --rules alone.")] = None,
    api_host: Annotated[str, typer.Option(help="Address the REST API binds.")] = "0.0.0.0",
    store: Annotated[str | None, typer.Option(
        envvar="KEG_STORE_URL",
        help="Rule store URL (postgresql://... for several control planes); default: "
             "SQLite in --data-dir.")] = None,
    data_dir: Annotated[Path | None, typer.Option(
        help="Where the SQLite store lives (default: the user cache).")] = None,
    api_tokens: Annotated[Path | None, typer.Option(
        help="File of name:token lines allowed to write (also KEG_API_TOKENS).")] = None,
    public_reads: Annotated[bool, typer.Option(
        help="Let reads of the REST API go without a token.")] = False,
    log_level: LogLevel = "INFO",
    log_format: LogFormat = "text",
) -> None:
    """Run the control plane alone (xDS for a fleet of Envoys and ext_proc instances)."""
    setup_logging(log_level, log_format)
    from control_plane.service import ControlPlaneSettings, load_groups
    from control_plane.store import StoreError
    from ext_proc.connection import split_host_port
    from filter_rules import RuleSetInvalid
    from keg.embedded.kafka import cache_dir
    from keg.gateway import ApiOptions, ControlPlaneApp

    try:
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
            groups=load_groups(groups) if groups is not None else (),
            refresh_interval_s=refresh_interval,
        )
    except (RuleSetInvalid, ValueError, OSError) as err:
        raise _fail(str(err)) from None
    api = None if api_port is None else ApiOptions(
        data_dir=data_dir or cache_dir() / "control-plane", host=api_host, port=api_port,
        store_url=store, tokens_file=api_tokens, public_reads=public_reads, rules_dir=rules)
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
            _wait_for_ctrl_c()
    except EmbeddedKafkaError as err:
        raise _fail(str(err)) from None


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
        help="Also read every secret the rules name (encryption and hash keys: environment "
             "variables, key files) as the ext_proc service will, and report each missing "
             "or unusable one at its line. --no-secrets where rules are validated without "
             "the secrets (a CI job): only the files are checked.")] = True,
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


from keg import cli_pipeline as _cli_pipeline  # noqa: E402,F401  (registers capture, backtest, analyze)
from keg import cli_rules as _cli_rules  # noqa: E402,F401  (registers diff, apply)
