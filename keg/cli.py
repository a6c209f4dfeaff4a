"""`keg`: one command line for the gateway, its parts and its tools."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from keg.logs import setup_logging
from keg.paths import SIDE_EFFECTS_PASSWORD_ENV

app = typer.Typer(
    help="keg, the Kafka Envoy Gateway: govern Kafka traffic without touching brokers or clients.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console(stderr=True)

LogLevel = Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING or ERROR.")]
LogFormat = Annotated[str, typer.Option("--log-format", help="text or json (one object a line).")]
RulesDir = Annotated[Path | None, typer.Option(
    help="Rule directory (YAML files), watched: valid changes apply to live connections.")]
AuditLogPath = Annotated[Path | None, typer.Option(
    help="Audit log file (JSON Lines, rotated); none: no audit log.")]
MetricsPort = Annotated[int | None, typer.Option(
    help="Serve Prometheus metrics on this port (0: a free one).")]


def _default_data_dir() -> Path:
    from keg.embedded.kafka import cache_dir

    return cache_dir() / "up" / "kafka-data"


def _wait_for_ctrl_c() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()


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
    envoy_concurrency: Annotated[int, typer.Option(help="Envoy worker threads.")] = 1,
    data_path: Annotated[str, typer.Option(
        help="ext-proc: every byte through the ext_proc service; native: keg's Kafka filter "
             "inside Envoy (a dynamic module built by make setup; Envoys of another version "
             "get ext-proc). The native filter does not enforce rules yet.")] = "ext-proc",
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
        help="Serve the REST API on this port, the rules kept in a SQLite store in the user "
             "cache (the rule directory applied to it and watched); 0: no API.")] = 8080,
    api_tokens: Annotated[Path | None, typer.Option(
        help="File of name:token lines allowed to write (also KEG_API_TOKENS).")] = None,
    log_level: LogLevel = "INFO",
    log_format: LogFormat = "text",
) -> None:
    """Run the gateway: (embedded Kafka +) control plane + ext_proc + Envoy, until Ctrl-C."""
    api_port = api_port or None
    setup_logging(log_level, log_format)
    if data_path not in ("ext-proc", "native"):
        console.print(f"[red]error:[/] --data-path is ext-proc or native, not {data_path!r}")
        raise typer.Exit(2)
    if rules_delivery not in ("control-plane", "directory"):
        console.print(f"[red]error:[/] --rules-delivery is control-plane or directory, "
                      f"not {rules_delivery!r}")
        raise typer.Exit(2)
    from filter_rules import DEFAULT_RULES_DIR
    from keg.embedded.kafka import EmbeddedKafka, EmbeddedKafkaError, cache_dir, ensure_kafka
    from keg.gateway import ApiOptions, Gateway, GatewaySettings

    kafka = None
    try:
        if bootstrap_servers is None:
            ensure_kafka(progress=lambda m: console.print(f"[dim]{m}[/]"))
            kafka = EmbeddedKafka(data_dir=data_dir or _default_data_dir()).start()
            bootstrap_servers = kafka.bootstrap
            console.print(f"embedded Kafka broker on {bootstrap_servers} (data: {kafka.data_dir})")
        gateway = Gateway(
            GatewaySettings(
                bootstrap_servers=bootstrap_servers,
                listen_host=listen_host,
                advertised_host=advertised_host,
                listen_port_base=listen_port_base,
                envoy_concurrency=envoy_concurrency,
                failure_mode_allow=failure_mode_allow,
                message_timeout_s=message_timeout,
                ext_proc_log_level=log_level,
                rules_dir=rules or DEFAULT_RULES_DIR,
                audit_log=audit_log or cache_dir() / "up" / "audit.jsonl",
                metrics_port=metrics_port,
                rules_delivery=rules_delivery,
                data_path=data_path,
                work_dir=cache_dir() / "up",
                api=None if api_port is None else ApiOptions(
                    data_dir=cache_dir() / "up", port=api_port, tokens_file=api_tokens),
            )
        )
        with gateway:
            console.print(
                f"[bold green]keg is up.[/] Kafka clients: "
                f"bootstrap.servers=[bold]{gateway.bootstrap}[/]   (Ctrl-C stops)"
            )
            s = gateway.settings
            console.print(f"rules: {s.rules_dir}   audit log: {s.audit_log}   "
                          f"metrics: http://127.0.0.1:{s.metrics_port}/metrics")
            if gateway.app is not None and gateway.app.api_server is not None:
                console.print(f"REST API: http://127.0.0.1:{gateway.app.api_server.port}/docs "
                              "(writes need a token: --api-tokens or KEG_API_TOKENS)")
            _wait_for_ctrl_c()
            console.print("stopping…")
    except EmbeddedKafkaError as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2) from None
    finally:
        if kafka is not None:
            kafka.stop()


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
        console.print("[red]error:[/] give --rules or --control-plane, not both")
        raise typer.Exit(2)
    producer_config: list[tuple[str, str]] = []
    for item in side_effects_config or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            console.print(f"[red]error:[/] --side-effects-config wants key=value, not {item!r}")
            raise typer.Exit(2)
        producer_config.append((key, value))
    password = os.environ.get(SIDE_EFFECTS_PASSWORD_ENV)
    if password:
        producer_config.append(("sasl.password", password))
    server = ExtProcServer(ProcessorSettings(
        host=host, port=port, max_frame_size=max_frame_size, rules_dir=rules,
        audit_log=audit_log, metrics_port=metrics_port, metrics_host=metrics_host,
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
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2) from None
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
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2) from None


@app.command()
def kafka(
    port: Annotated[int, typer.Option(help="Broker port (0: a free one).")] = 9092,
    data_dir: Annotated[Path | None, typer.Option(help="Data directory (kept).")] = None,
    log_level: LogLevel = "INFO",
) -> None:
    """Run the embedded Kafka broker alone, until Ctrl-C."""
    setup_logging(log_level)
    from keg.embedded.kafka import EmbeddedKafka, ensure_kafka

    ensure_kafka(progress=lambda m: console.print(f"[dim]{m}[/]"))
    with EmbeddedKafka(data_dir=data_dir or _default_data_dir(), port=port) as broker:
        console.print(f"Kafka broker on [bold]{broker.bootstrap}[/] (Ctrl-C stops)")
        _wait_for_ctrl_c()


@app.command()
def setup() -> None:
    """Fetch what keg runs on (the Kafka jars from Maven Central) into the user cache."""
    setup_logging("WARNING")
    from keg.embedded.envoy import envoy_binary
    from keg.embedded.kafka import EmbeddedKafkaError, ensure_kafka

    try:
        libs = ensure_kafka(progress=lambda m: console.print(f"[dim]{m}[/]"))
    except EmbeddedKafkaError as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2) from None
    console.print(f"Kafka jars: {libs}")
    console.print(f"Envoy: {envoy_binary()}")
    from keg.embedded.native import NativeModuleUnavailable, module_dir

    try:
        console.print(f"keg's Envoy filter: {module_dir()}")
    except NativeModuleUnavailable as err:
        console.print(f"[yellow]keg's Envoy filter not built:[/] {err}")


@app.command()
def validate(
    directory: Annotated[Path, typer.Argument(help="Rule directory (YAML files).")]
        = Path("filter_rules/rules"),
) -> None:
    """Check a rule directory against the rule schema; exit 1 with file:line errors.

    Usable in any CI: prints one line per problem and exits 0 only when every file
    in the directory validates.
    """
    from filter_rules import CompiledRuleSet, RuleSetInvalid, load_rule_dir

    try:
        compiled = CompiledRuleSet(load_rule_dir(directory))
    except RuleSetInvalid as err:
        for error in err.errors:
            typer.echo(str(error), err=True)
        typer.echo(f"{directory}: {len(err.errors)} problem(s)", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{directory}: {len(compiled.ruleset.rules)} rules valid "
               f"({len(compiled.rules)} enabled), version {compiled.version}")
from keg import cli_pipeline as _cli_pipeline  # noqa: E402,F401  (registers capture, backtest, analyze)
from keg import cli_rules as _cli_rules  # noqa: E402,F401  (registers diff, apply)
