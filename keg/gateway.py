"""The whole gateway on one machine: control plane, ext_proc service and Envoy.

The control plane runs on a background event loop in this process; the ext_proc
service (the hot path, which wants a core of its own) and Envoy are child
processes, restarted by a supervisor (keg.supervisor) whenever they exit, each with
only the environment it needs (keg.children). `Gateway` is what `keg up`, the tests
and the benchmarks all use.

Rules reach the ext_proc service one of two ways (`rules_delivery`): "directory",
where it watches the rule directory itself, or "control-plane", where the control
plane owns them (a watched directory or a `RuleProvider` such as the store) and
distributes them over xDS; then Envoy starts only after the ext_proc service has
ACKed the rule set, so no connection is served without rules.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import CollectorRegistry, Gauge

from control_plane.defaults import BROKER_ORDER_FILE, DEFAULT_REFRESH_INTERVAL_S
from control_plane.fleet import EXT_PROC, NodeStatus
from control_plane.native_filter import METRICS_KEY
from control_plane.providers import RuleProvider
from control_plane.service import (
    DATA_PATHS,
    EXT_PROC_PATH,
    FIRST_REFRESH_TIMEOUT_S,
    NATIVE,
    ControlPlane,
    ControlPlaneSettings,
    free_port,
)
from control_plane.snapshot import RULES
from control_plane.tls import ClientTls, ListenerTls, ServerTls, TlsConfigError, UpstreamTls
from control_plane.topology import DiscoveryError, SaslCredentials
from ext_proc.defaults import DEFAULT_POLL_INTERVAL_S
from keg.children import PYTHON, child_environment, die_with_parent
from keg.embedded.envoy import EmbeddedEnvoy
from keg.lifecycle import Service
from keg.paths import AUDIT_KAFKA_PASSWORD_ENV
from keg.security import (
    PlaintextTokens,
    SecretMissing,
    control_plane_client_args,
    ext_proc_security,
    librdkafka_security,
    refuse_plaintext_tokens,
)
from keg.supervisor import HUNG_AFTER_S, Child, Supervisor

if TYPE_CHECKING:
    from filter_rules import RuleSet

log = logging.getLogger(__name__)

# The parts of the gateway its supervisor watches (the `component` label of
# keg_component_restarts_total and keg_component_up).
EXT_PROC_COMPONENT, ENVOY_COMPONENT, KAFKA_COMPONENT = "ext_proc", "envoy", "kafka"

CLOSE_THROUGH_FILTER_MANAGER = "envoy.reloadable_features.connection_close_through_filter_manager"


class GatewayError(RuntimeError):
    """The gateway could not start: a part exited, did not come up, or refused the rules."""


@dataclass(frozen=True)
class ApiOptions:
    """The REST API and the rule store behind it (SQLite in `data_dir` unless `store_url`).

    With `rules_dir` the directory is applied to the store at start and whenever its
    files change (it owns those rules: REST writes to them are refused)."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8080
    store_url: str | None = None
    tokens_file: Path | None = None
    public_reads: bool = False
    rules_dir: Path | None = None
    # Where `keg analyze --follow` writes the live rule impact, served as /v1/impact.
    impact_dir: Path | None = None
    # What the console's decisions and audit pages read (control_plane/api/routes_observe):
    # ext_proc /metrics URLs, and an audit log file this process can read.
    ext_proc_metrics: tuple[str, ...] = ()
    audit_logs: tuple[Path, ...] = ()  # one per ext_proc process
    tls: ServerTls | None = None  # HTTPS (mutual with a client CA)
    # Serve tokens over plaintext on a non-loopback address anyway (a TLS proxy in front).
    insecure_tokens: bool = False


class ControlPlaneApp:
    """The control plane process: xDS (ControlPlane), and with `api` the store + REST API,
    all on the running event loop. The store is then the rule source of the fleet."""

    def __init__(self, settings: ControlPlaneSettings, api: ApiOptions | None = None,
                 registry: CollectorRegistry | None = None,
                 problems: Callable[[], list[str]] | None = None,
                 check: Callable[[RuleSet], None] | None = None) -> None:
        """`registry`: more series for the API's /metrics (the supervisor's); `problems`:
        parts of the gateway that are down, which make /readyz answer 503; `check`: what
        else a rule set must pass before the store takes it (RuleSetInvalid)."""
        self.settings = settings
        self.api = api
        self.registry = registry
        self.problems = problems
        self.check = check
        self.store: Any = None
        self.plane: ControlPlane | None = None
        self.api_server: Any = None
        self._directory: Any = None
        # Why the served directory's files are not in force (the store refused them).
        self._store_refusal: str | None = None
        self._watch: asyncio.Task[None] | None = None
        self._reconciling: set[asyncio.Future[None]] = set()

    async def start(self) -> ControlPlane:
        if self.api is None:
            self.plane = ControlPlane(self.settings)
            await self.plane.start()
            return self.plane
        from control_plane.api import (
            ApiSettings,
            Observability,
            TokenFile,
            create_app,
            ruleset_validator,
            serve_api,
        )
        from control_plane.providers import DirectoryRuleProvider, StoreRuleProvider
        from control_plane.store import StoreError, open_store
        from filter_rules import RuleSetInvalid

        api = self.api
        # Before anything binds: a bad file stops here. Re-read when it changes, so a
        # removed token is refused without a restart.
        tokens = TokenFile(api.tokens_file)
        # A token file counts even while empty: tokens may be added to it at any time.
        refuse_plaintext_tokens(api.host, bool(tokens) or api.tokens_file is not None,
                                api.tls is not None, api.insecure_tokens)
        validate, check = ruleset_validator(), self.check

        def validator(ruleset: RuleSet) -> None:
            validate(ruleset)
            if check is not None:
                check(ruleset)

        self.store = open_store(api.store_url, api.data_dir, validator=validator)
        if api.rules_dir is not None:
            # Files made invalid while the last run served them (a bad commit the running
            # gateway refused) do not keep it from starting again: the directory's rules
            # in the store's served version stand, as they did before the restart.
            try:
                self._directory = DirectoryRuleProvider(api.rules_dir,
                                                        self.settings.rules_poll_interval_s,
                                                        kept=self._kept_directory_rules())
            except RuleSetInvalid as err:
                raise StoreError(f"{api.rules_dir}: {len(err.errors)} problem(s), and the rule "
                                 f"store has no version to serve meanwhile") from None
            self._apply_directory(at_start=True)
            self._directory.subscribe(lambda *_: self._apply_directory())
            self._watch = asyncio.create_task(self._directory.watch())
            # The directory is the source of truth for its rules: a change of the store
            # that altered them (a rollback to a version before them) is undone.
            loop = asyncio.get_running_loop()
            self.store.subscribe(lambda *_: loop.call_soon_threadsafe(self._reconcile))
        settings = replace(self.settings, rules_dir=None)
        self.plane = ControlPlane(settings, rules=StoreRuleProvider(self.store))
        await self.plane.start()
        plane = self.plane
        registry = self.registry if self.registry is not None else CollectorRegistry()
        if self._directory is not None:
            Gauge("keg_rule_directory_refused", "1 while the served rule directory's files "
                  "are not in force (invalid, or refused by the store: see the log); the "
                  "last good rules serve meanwhile.", registry=registry).set_function(
                lambda: float(self.directory_error is not None))
        app = create_app(self.store, ApiSettings(tokens=tokens, public_reads=api.public_reads,
                                                 ready=lambda: plane.plan is not None,
                                                 impact_dir=api.impact_dir,
                                                 registry=registry,
                                                 problems=self._problems,
                                                 directory_owner=self._directory_owner),
                         plane.fleet_status,
                         Observability(metrics_urls=api.ext_proc_metrics,
                                       audit_logs=api.audit_logs))
        self.api_server = await serve_api(app, api.host, api.port, api.tls)
        return plane

    def _problems(self) -> list[str]:
        """What keeps the gateway from serving: its parts' (the supervisor's) and the
        listeners an Envoy could not bind."""
        mine = self.plane.unbound.problems() if self.plane is not None else []
        return [*(self.problems() if self.problems is not None else []), *mine]

    @property
    def directory_error(self) -> str | None:
        """Why the served rule directory's files are not in force, if they are not."""
        if self._directory is None:
            return None
        return self._directory.last_error or self._store_refusal

    def _kept_directory_rules(self) -> RuleSet | None:
        """The served directory's rules in the store's served version; None when the store
        has no version yet (a first start has nothing to fall back on)."""
        from control_plane.store.entries import to_ruleset

        number, _ = self.store.current()
        if not number:
            return None
        return to_ruleset(r for r in self.store.version(number).rules
                          if r.owner == self._directory_owner)

    @property
    def _directory_owner(self) -> str | None:
        """The owner of the rule directory's rules in the store, if one is served."""
        rules_dir = self.api.rules_dir if self.api is not None else None
        return None if rules_dir is None else f"dir:{rules_dir}"

    def _reconcile(self) -> None:
        """Apply the directory again, off the loop (the store calls its subscribers
        inside the write that published; an apply that changes nothing writes nothing)."""
        task = asyncio.ensure_future(asyncio.to_thread(self._apply_directory, reconcile=True))
        self._reconciling.add(task)
        task.add_done_callback(self._reconciling.discard)

    def _apply_directory(self, at_start: bool = False, reconcile: bool = False) -> None:
        """Make the store hold the directory's rules. At start a refusal stops the start
        (serving other rules than the directory's would mislead); later it is logged and
        the last applied set stays."""
        from control_plane.store import Change, StoreError
        from filter_rules import RuleSetInvalid

        assert self.api is not None and self.api.rules_dir is not None
        _, ruleset = self._directory.current()
        owner = self._directory_owner
        assert owner is not None
        try:
            # At start a version the fleet once rejected is tried again: the ext_proc
            # environment (a key, a module) may be fixed since.
            result = self.store.apply(owner, ruleset, Change("keg", "rule directory changed"),
                                      adopt=True, retry_rejected=at_start)
        except (StoreError, RuleSetInvalid) as err:  # (the workers could not run it)
            if at_start:
                raise StoreError(f"cannot apply {self.api.rules_dir} to the rule store: "
                                 f"{err}") from None
            self._store_refusal = str(err)
            log.error("could not apply %s to the store, keeping version %s: %s",
                      self.api.rules_dir, self.store.current()[0], err)
            return
        self._store_refusal = None
        if result.version is None:
            return
        if result.diff.owners_changed:
            log.warning("%s took over rules written through the REST API with the ids of "
                        "its own: %s", self.api.rules_dir, ", ".join(result.diff.owners_changed))
        if reconcile:
            log.warning("the rules of %s were changed in the store, not in the directory "
                        "(a rollback?): applied the directory again as store version %s",
                        self.api.rules_dir, result.current)
        else:
            log.info("applied %s as store version %s", self.api.rules_dir, result.current)

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        await asyncio.gather(*self._reconciling, return_exceptions=True)  # before the store closes
        if self.api_server is not None:
            await self.api_server.stop()
            self.api_server = None
        if self.plane is not None:
            await self.plane.stop()
        if self.store is not None:
            self.store.close()
            self.store = None


@dataclass(frozen=True)
class AuditStream:
    """The audit stream on Kafka (ext_proc.audit_kafka): `bootstrap_servers` None is the
    cluster the gateway fronts, reached as the gateway's own user (`sasl`)."""

    bootstrap_servers: str | None = None
    topic: str = "_keg_audit"
    config: tuple[tuple[str, str], ...] = ()
    format: str = "json"
    spool_dir: Path | None = None  # default: <work_dir>/audit-spool


# The control plane's start: longer than its wait for the brokers, whose error (the last
# broker's answer) then says why rather than a bare timeout.
START_TIMEOUT_S: Final = FIRST_REFRESH_TIMEOUT_S + 30.0

# The ext_proc service's label bounds (keg ext-proc's environment variables): the module
# takes the same ones, so both data paths bound their series alike.
MODULE_METRICS_ENV: Final = {"max_topics": "KEG_METRICS_MAX_TOPICS",
                             "max_clients": "KEG_METRICS_MAX_CLIENTS",
                             "max_principals": "KEG_METRICS_MAX_PRINCIPALS",
                             "max_series": "KEG_METRICS_MAX_SERIES"}


# What of `keg up`'s environment its ext_proc workers get for their metrics.
METRICS_ENV: Final = "KEG_METRICS_*"


def module_metrics_options(address: str, env: Mapping[str, str]) -> dict[str, Any]:
    """The node metadata (`keg.metrics`) asking keg's module to serve its labelled
    metrics on `address`, with the bounds and topic reading `env` sets for ext_proc."""
    options: dict[str, Any] = {"address": address}
    for option, name in MODULE_METRICS_ENV.items():
        if env.get(name, "").strip().isdigit():
            options[option] = int(env[name])
    if env.get("KEG_METRICS_TOPICS", "").strip().lower() in ("0", "false", "no", "off"):
        options["topics"] = False
    return options


# The settings the gateway gives its control plane as they are (ControlPlaneSettings has
# fields of the same names); the others it works out in Gateway.start.
# In a gateway's work directory: the ext_proc pool's shared state, one per cluster.
SHARED_STATE_DIR: Final = "keg-shared-state"
CONTROL_PLANE_SETTINGS: Final = (
    "bootstrap_servers", "listen_host", "advertised_host", "listen_port_base",
    "message_timeout_s", "failure_mode_allow", "sasl", "tls", "upstream_tls", "data_path",
    "max_frame_size", "max_held_bytes", "oauth_principal_claim", "refresh_interval_s",
    "rules_poll_interval_s")


def internal_ports(base: int, workers: int) -> dict[str, int]:
    """The loopback ports of keg's own parts from `base` (none when 0): the xDS server,
    each ext_proc worker's gRPC port (`ext_proc-<i>`), Envoy's admin."""
    if not base:
        return {}
    names = ["xds", *(f"ext_proc-{i}" for i in range(workers)), "envoy-admin"]
    return {name: base + i for i, name in enumerate(names)}


def _file_name(text: str) -> str:
    """`text` as one safe path component (a Kafka cluster id already is one)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)[:64] or "_"


@dataclass
class GatewaySettings:
    bootstrap_servers: str
    listen_host: str = "127.0.0.1"
    advertised_host: str | None = None
    listen_port_base: int = 19092
    envoy_concurrency: int = 1
    message_timeout_s: float = 5.0
    failure_mode_allow: bool = False
    refresh_interval_s: float = DEFAULT_REFRESH_INTERVAL_S
    max_frame_size: int = 100 * 1024 * 1024
    max_held_bytes: int = 256 * 1024 * 1024  # frames being assembled, all connections
    # The JWT claim an OAUTHBEARER principal is, as the brokers read it (both data paths).
    oauth_principal_claim: str = "sub"
    # Processes of the ext_proc service: a pool spreads connections over cores, and one
    # worker's stall or crash costs only its own connections' frames.
    ext_proc_workers: int = 1
    # A worker whose /metrics page does not answer this long (stopped, deadlocked) is
    # killed, and so restarted (keg.supervisor).
    worker_hung_after_s: float = HUNG_AFTER_S
    ext_proc_log_level: str = "INFO"
    ext_proc_log_format: str = "text"  # or json, as keg up's own --log-format
    rules_dir: Path | None = None
    rules_poll_interval_s: float = DEFAULT_POLL_INTERVAL_S  # how often rules_dir is looked at
    audit_log: Path | None = None
    audit_kafka: AuditStream | None = None
    metrics_port: int | None = None
    # keg's Kafka filter (native path) serves the labelled series (keg_requests_total,
    # keg_topic_*) of all traffic on this port's /metrics; 0: a free port, None: none.
    module_metrics_port: int | None = 0
    # The control plane's login to the brokers (PLAIN, SCRAM, OAUTHBEARER); with SASL
    # termination also the service account the gateway logs in as.
    sasl: SaslCredentials | None = None
    tls: ListenerTls | None = None  # TLS (mutual with a client CA) on the listeners
    upstream_tls: UpstreamTls | None = None  # TLS to the brokers
    # The listeners authenticate clients themselves (YAML: ext_proc.sasl.termination).
    sasl_termination: Path | None = None
    # The control plane's xDS server over TLS, and how Envoy and the ext_proc service
    # reach it (the CA they trust, their certificate for mutual TLS).
    control_plane_tls: ServerTls | None = None
    control_plane_client_tls: ClientTls | None = None
    work_dir: Path | None = None
    # Variables the ext_proc service gets besides its allow-list (keg.children) and
    # the key variables its rules name: `extra_env` as given, `ext_proc_env` by name from
    # this process's environment (what a custom interceptor reads, say).
    extra_env: dict[str, str] = field(default_factory=dict)
    ext_proc_env: tuple[str, ...] = ()
    rules_delivery: str = "directory"  # or "control-plane" (xDS to the ext_proc service)
    rules_provider: RuleProvider | None = None  # e.g. the store; implies "control-plane"
    xds_port: int = 0  # 0: a free port
    # The loopback ports of keg's own parts from here, when not 0 (free ports): the xDS
    # server, then each ext_proc worker's gRPC port, then Envoy's admin (internal_ports).
    internal_port_base: int = 0
    envoy_delta: bool = False  # incremental ADS instead of state of the world
    api: ApiOptions | None = None  # the store + REST API (implies "control-plane")
    # "native": keg's Kafka filter inside Envoy (a dynamic module; Envoys of another
    # version get the ext_proc chain); "ext-proc": every byte through the ext_proc service.
    data_path: str = EXT_PROC_PATH

    def __post_init__(self) -> None:
        if self.ext_proc_workers < 1:
            raise ValueError(f"ext_proc_workers must be 1 or more, not {self.ext_proc_workers}")
        if self.data_path not in DATA_PATHS:
            raise ValueError(f"data_path must be one of {', '.join(DATA_PATHS)}, "
                             f"not {self.data_path!r}")
        if self.rules_delivery not in ("directory", "control-plane"):
            raise ValueError(f"rules_delivery must be 'directory' or 'control-plane', "
                             f"not {self.rules_delivery!r}")
        if self.rules_provider is not None or self.api is not None:
            self.rules_delivery = "control-plane"
        if self.rules_provider is not None and self.api is not None:
            raise ValueError("with the REST API the store is the rule source: no rules_provider")

    @property
    def rules_from_control_plane(self) -> bool:
        return self.rules_delivery == "control-plane"


def wait_for_port(host: str, port: int, timeout: float, alive: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if alive is not None:
                alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s") from None
            time.sleep(0.05)


# The most a worker's /metrics page may take to answer the supervisor's probe.
PROBE_TIMEOUT_S = 2.0


def _answers(metrics_port: int) -> bool:
    """Whether the ext_proc worker on `metrics_port` serves its /metrics page (its
    process runs, not stopped or deadlocked: keg.supervisor kills one that does not)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                    timeout=PROBE_TIMEOUT_S) as response:
            response.read()
            return bool(response.status == 200)
    except (OSError, ValueError):  # refused, timed out, reset (URLError is an OSError)
        return False


class BackgroundLoop:
    """An asyncio loop on a daemon thread, for the control plane."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="keg-control-plane", daemon=True
        )
        self._thread.start()

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@dataclass
class ExtProcWorker:
    """One process of the ext_proc service, its port, its /metrics and its xDS node."""

    index: int
    port: int = 0
    metrics_port: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    # The environment variables it was started with (None: not started yet).
    env_names: frozenset[str] | None = None

    @property
    def component(self) -> str:
        """Its name in the supervisor (the first worker's is the service's)."""
        return EXT_PROC_COMPONENT if self.index == 0 else f"{EXT_PROC_COMPONENT}-{self.index}"

    @property
    def node_id(self) -> str:
        return "ext-proc-gateway" if self.index == 0 else f"ext-proc-gateway-{self.index}"

    def current_pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def end(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def own_path(self, path: Path) -> Path:
        """A file each worker keeps for itself (audit log): the first keeps `path`."""
        return path if self.index == 0 else path.with_name(f"{path.stem}-{self.index}"
                                                           f"{path.suffix}")


class Gateway(Service):
    """The control plane on a background loop, the ext_proc service and Envoy as child
    processes that its `supervisor` restarts whenever they exit unasked (`supervise`
    adds another, e.g. `keg up`'s embedded broker). Each child gets only the environment
    it needs (keg.children)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.workers = [ExtProcWorker(i) for i in range(settings.ext_proc_workers)]
        self._loop: BackgroundLoop | None = None
        self.xds_port = 0
        # The ports of --internal-port-base by part (internal_ports), chosen at start.
        self.internal_ports: dict[str, int] = {}
        self.control_plane: ControlPlane | None = None
        self.app: ControlPlaneApp | None = None
        self.envoy: EmbeddedEnvoy | None = None
        # Where keg's module serves its labelled metrics (native path; kept across restarts).
        self.module_metrics_port: int | None = None
        # The supervisor's series go out on the REST API's /metrics (with the API).
        self.registry = CollectorRegistry()
        self.supervisor = Supervisor(self.registry, hung_after_s=settings.worker_hung_after_s)

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        s = self.settings
        try:
            internal = self.internal_ports = internal_ports(s.internal_port_base,
                                                            len(self.workers))
            self.xds_port = s.xds_port or internal.get("xds") or free_port()
            for worker in self.workers:
                worker.port = (worker.port or internal.get(f"ext_proc-{worker.index}")
                               or free_port())
                if s.metrics_port is not None:  # known before the control plane starts
                    # Worker i: the port i after the first (stable scrape targets).
                    given = s.metrics_port + worker.index if s.metrics_port else 0
                    worker.metrics_port = given or worker.metrics_port or free_port()
            self._loop = BackgroundLoop()
            settings = ControlPlaneSettings(
                ext_proc_host="127.0.0.1",
                ext_proc_port=self.ext_proc_port,
                ext_proc_more_ports=tuple(w.port for w in self.workers[1:]),
                xds_port=self.xds_port,
                sasl_termination=s.sasl_termination is not None,
                xds_tls=s.control_plane_tls,
                rules_dir=s.rules_dir if s.rules_provider is None else None,
                broker_order_file=(s.work_dir / BROKER_ORDER_FILE if s.work_dir is not None
                                   else None),
                reserved_ports=self._own_ports(),
                **{name: getattr(s, name) for name in CONTROL_PLANE_SETTINGS},
            )
            # The control plane first: the ext_proc service is given the key variables
            # of the rules it will be served, and finds its xDS server up at once.
            if s.api is not None:
                # The console reads this gateway's own ext_proc metrics and audit logs
                # (every worker's).
                metrics = tuple(f"http://127.0.0.1:{w.metrics_port}/metrics"
                                for w in self.workers if w.metrics_port)
                self.app = ControlPlaneApp(settings, replace(
                    s.api, rules_dir=s.rules_dir,
                    audit_logs=s.api.audit_logs or self.audit_logs,
                    ext_proc_metrics=s.api.ext_proc_metrics or metrics),
                    registry=self.registry, problems=self.supervisor.problems,
                    check=self._check_workers_can_build)
                self.control_plane = self._loop.run(self.app.start(), timeout=START_TIMEOUT_S)
            else:
                self.control_plane = ControlPlane(settings, rules=s.rules_provider)
                self._loop.run(self.control_plane.start(), timeout=START_TIMEOUT_S)
            self._prepare_shared_state()
            self.start_ext_proc()
            if s.rules_from_control_plane and self.control_plane.rules is not None:
                self.wait_for_rules()
            self.start_envoy()
        except BaseException as err:
            self.stop()
            if isinstance(err, TimeoutError | DiscoveryError | TlsConfigError | SecretMissing
                                | PlaintextTokens):
                raise GatewayError(str(err) or f"{type(err).__name__} while starting") from err
            raise

    def supervise(self, name: str, child: Child) -> None:
        """Restart `child` (running now) whenever it exits, as the gateway's own parts."""
        self.supervisor.watch(name, child)

    def components(self) -> dict[str, str]:
        """Each supervised part and its state ("up", "restarting")."""
        return {status.name: status.state for status in self.supervisor.status()}

    @property
    def ext_proc_port(self) -> int:
        """The first worker's port (where a single-process service listens)."""
        return self.workers[0].port

    @property
    def metrics_port(self) -> int | None:
        """The first worker's /metrics port (each worker serves its own)."""
        return self.workers[0].metrics_port

    def module_counter(self, name: str) -> int:
        """keg's module counter `keg_kafka.<name>` over Envoy's listeners (0 without
        the module)."""
        return 0 if self.envoy is None else self.envoy.module_counter(name)

    def handed_off_requests(self, api: str, version: int | None = None) -> float:
        """Requests of `api` (and `version`) the Python workers were handed by keg's
        module (their `keg_handed_off_requests_total`), summed over the pool."""
        total = 0.0
        for worker in self.workers:
            if worker.metrics_port is None:
                continue
            url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode()
            total += sum(float(line.split()[-1]) for line in text.splitlines()
                         if line.startswith("keg_handed_off_requests_total{")
                         and f'api="{api}"' in line
                         and (version is None or f'version="{version}"' in line))
        return total

    @property
    def audit_logs(self) -> tuple[Path, ...]:
        """The audit log files the ext_proc workers write, the first worker's first."""
        audit = self.settings.audit_log
        return () if audit is None else tuple(w.own_path(audit) for w in self.workers)

    @property
    def ext_proc_pid(self) -> int | None:
        return self.workers[0].current_pid()

    def start_ext_proc(self) -> None:
        """Start the ext_proc service's workers, each supervised (restarted whenever it
        exits)."""
        for worker in self.workers:
            self.start_ext_proc_worker(worker)

    def start_ext_proc_worker(self, worker: ExtProcWorker) -> None:
        """Start one worker of the ext_proc service, supervised."""
        self._spawn_ext_proc(worker)
        self.supervisor.watch(worker.component, Child(
            poll=worker.poll, restart=partial(self._spawn_ext_proc, worker),
            pid=worker.current_pid,
            answers=partial(_answers, worker.metrics_port) if worker.metrics_port else None))

    def _spawn_ext_proc(self, worker: ExtProcWorker) -> None:
        s = self.settings
        worker.port = worker.port or free_port()
        cmd = [
            sys.executable,
            "-m",
            "keg",
            "ext-proc",
            "--host",
            "127.0.0.1",
            "--port",
            str(worker.port),
            "--max-frame-size",
            str(s.max_frame_size),
            "--max-held-bytes",
            str(s.max_held_bytes),
            "--oauth-principal-claim",
            s.oauth_principal_claim,
            "--log-level",
            s.ext_proc_log_level,
            "--log-format",
            s.ext_proc_log_format,
        ]
        if s.rules_from_control_plane:
            cache = worker.own_path(self.rules_cache_file)
            cmd += ["--control-plane", f"127.0.0.1:{self.xds_port}", "--node-id",
                    worker.node_id, "--rules-cache", str(cache)]
        elif s.rules_dir is not None:
            cmd += ["--rules", str(s.rules_dir),
                    "--rules-poll-interval", str(s.rules_poll_interval_s)]
        cmd += ["--shared-state", str(self.shared_state_dir)]
        if s.audit_log is not None:
            cmd += ["--audit-log", str(worker.own_path(s.audit_log))]
        if worker.metrics_port is not None:  # chosen in start(): this process waits for it
            cmd += ["--metrics-port", str(worker.metrics_port)]
        # `copy` rules produce to the broker the gateway fronts, as the gateway's user.
        cmd += ["--side-effects-bootstrap", s.bootstrap_servers]
        # Secrets by environment, never on the command line (ps shows it).
        args, secrets = ext_proc_security(s.sasl, s.upstream_tls, s.sasl_termination)
        cmd += args
        cmd += control_plane_client_args(s.control_plane_client_tls)
        if s.audit_kafka is not None:
            stream_args, stream_secrets = self._audit_stream_args(s.audit_kafka, worker)
            cmd += stream_args
            secrets = {**secrets, **stream_secrets}
        environment = self._ext_proc_environment(secrets)
        worker.proc = subprocess.Popen(die_with_parent(cmd), env=environment)
        worker.env_names = frozenset(environment)
        try:
            # This worker's own exit alone ends the wait: one that checked them all was
            # aborted while another waited out its backoff (and its backoff doubled), so
            # two workers down at once kept the whole service down until both came back.
            alive = partial(self._check_worker, worker)
            wait_for_port("127.0.0.1", worker.port, 30, alive=alive)
            if worker.metrics_port is not None:  # gRPC listens early; /metrics: started
                wait_for_port("127.0.0.1", worker.metrics_port, 30, alive=alive)
        except BaseException:
            worker.end()
            raise

    def _ext_proc_environment(self, secrets: dict[str, str]) -> dict[str, str]:
        """The allow-list of a Python child, the metrics' bounds (KEG_METRICS_*, which the
        module takes from this process's environment too), the key variables the rules
        name, what the settings add, and `secrets` (the brokers' passwords: never on a
        command line)."""
        s = self.settings
        names = {METRICS_ENV, *s.ext_proc_env, *self._rule_secret_env_names()}
        return child_environment((*PYTHON, *sorted(names)), {**s.extra_env, **secrets})

    def _check_workers_can_build(self, ruleset: RuleSet) -> None:
        """A rule set the local workers could not build for want of a key is refused
        (RuleSetInvalid, at the rule's line) before the store takes it: a key file they
        cannot read (they run here, on this file system), or a key variable the running
        workers were not given. A worker's environment is fixed when it starts, with the
        variables the rules named then. The control plane took such a rule, every worker
        refused it, and so every later version holding it, whatever else they changed
        (a deny written next was never enforced). Before the first worker starts, it is
        given what the rules name."""
        from filter_rules import RuleSetInvalid
        from interceptors.secrets import check_secrets, env_refs_outside

        _checked, errors = check_secrets(ruleset, kinds=("file",))
        started = [w.env_names for w in self.workers if w.env_names is not None]
        if started:
            available = frozenset.intersection(*started)
            errors += env_refs_outside(
                ruleset, available, "the running ext_proc workers (they get the variables "
                "the rules named when they started: restart the gateway with it set)")
        if errors:
            raise RuleSetInvalid(errors)

    def _rule_secret_env_names(self) -> set[str]:
        """The environment variables the served rules read keys from: those of the
        control plane's rule set, or of the directory the ext_proc service reads."""
        from filter_rules import RuleSetInvalid, load_rule_dir
        from interceptors.secrets import secret_env_names

        plane = self.control_plane
        if self.settings.rules_from_control_plane:
            if plane is None or plane.rules is None:
                return set()
            provider = plane.rules
            return secret_env_names(self.call(lambda: provider.current()[1]))
        if self.settings.rules_dir is None:
            return set()
        try:
            return secret_env_names(load_rule_dir(self.settings.rules_dir))
        except RuleSetInvalid:  # the ext_proc service refuses it, with file:line errors
            return set()

    @property
    def rules_cache_file(self) -> Path:
        """Where the first ext_proc worker keeps the last rule set it got (for its
        restarts; the others `own_path` of it): one stable name in the work directory, so
        runs do not pile files up there; removed at stop."""
        if self.settings.work_dir is not None:
            return self.settings.work_dir / "keg-rules.json"
        return Path(tempfile.gettempdir()) / f"keg-rules-{self.xds_port}.json"

    @property
    def shared_state_dir(self) -> Path:
        """What the workers share (`ext_proc.shared_slots`: rate buckets, the sequences
        of producers whose records rules dropped, topic ids): whichever worker judges a
        connection sees the same. In a gateway's own work directory (keg up's state), one
        per cluster, kept across restarts: an idempotent producer outlives the gateway,
        and its batches after a restart must be shifted down by what rules dropped before
        it, or the broker refuses them as out of order (fatal to the producer). Another
        cluster (or the same one made anew) reuses producer ids: it gets its own. Without
        a work directory: a temporary one, removed at stop."""
        assert self.control_plane is not None and self.control_plane.topology is not None
        if self.settings.work_dir is None:
            return Path(tempfile.gettempdir()) / f"keg-shared-state-{self.xds_port}"
        cluster = self.control_plane.topology.cluster_id or "unknown-cluster"
        return self.settings.work_dir / SHARED_STATE_DIR / _file_name(cluster)

    def _own_ports(self) -> frozenset[int]:
        """The ports this gateway's own parts listen on (chosen before the control plane
        starts): no broker listener may take one."""
        s = self.settings
        ports = {self.xds_port, s.module_metrics_port or 0, s.api.port if s.api else 0,
                 self.internal_ports.get("envoy-admin", 0)}
        for worker in self.workers:
            ports |= {worker.port, worker.metrics_port or 0}
        return frozenset(ports - {0})

    def _prepare_shared_state(self) -> None:
        """The shared state of this run: a temporary one made empty; in a work directory
        the cluster's own kept, other clusters' removed."""
        here = self.shared_state_dir
        if self.settings.work_dir is None:
            shutil.rmtree(here, ignore_errors=True)
            return
        for other in here.parent.glob("*"):
            if other != here and other.is_dir():
                shutil.rmtree(other, ignore_errors=True)

    def _audit_stream_args(self, stream: AuditStream, worker: ExtProcWorker
                           ) -> tuple[list[str], dict[str, str]]:
        """The worker's audit stream arguments and secrets: its own spool (a spool is
        one process's: the workers never share one, and a restarted worker ships what it
        left there), the cluster, and without one the cluster the gateway fronts,
        reached as the gateway's own user (like `copy` rules)."""
        s = self.settings
        spool = stream.spool_dir or (s.work_dir / "audit-spool" if s.work_dir is not None else
                                     Path(tempfile.gettempdir()) / f"keg-audit-spool-{worker.port}")
        args = ["--audit-kafka-bootstrap", stream.bootstrap_servers or s.bootstrap_servers,
                "--audit-kafka-topic", stream.topic, "--audit-format", stream.format,
                "--audit-spool", str(worker.own_path(spool))]
        config = list(stream.config)
        secrets: dict[str, str] = {}
        if stream.bootstrap_servers is None and (s.sasl is not None or s.upstream_tls is not None):
            if s.sasl is not None and s.sasl.mechanism == "OAUTHBEARER":
                raise GatewayError("the audit stream cannot log in to the brokers with "
                                   "OAUTHBEARER (librdkafka takes no static token): give "
                                   "--audit-kafka-bootstrap and --audit-kafka-config")
            config = librdkafka_security(s.sasl, s.upstream_tls) + config
            if s.sasl is not None:
                secrets[AUDIT_KAFKA_PASSWORD_ENV] = s.sasl.password
        for key, value in config:
            if key == "sasl.password":  # never on a command line
                secrets[AUDIT_KAFKA_PASSWORD_ENV] = value
                continue
            args += ["--audit-kafka-config", f"{key}={value}"]
        return args, secrets

    def _check_ext_proc(self) -> None:
        for worker in self.workers:
            self._check_worker(worker)

    @staticmethod
    def _check_worker(worker: ExtProcWorker) -> None:
        code = worker.poll()
        if code is not None:
            raise GatewayError(f"the ext_proc service ({worker.component}) exited with "
                               f"{code} (its log is above)")

    def stop_ext_proc(self) -> None:
        """Stop the ext_proc service's workers (and their supervision)."""
        for worker in self.workers:
            self.supervisor.unwatch(worker.component)
            worker.end()

    def wait_for_rules(self, timeout: float = 30.0) -> None:
        """Until the ext_proc service runs the control plane's rule set; GatewayError when
        it refused the rule set the gateway starts with (then the gateway must not serve:
        it would serve other rules than it was given)."""
        assert self.control_plane is not None
        wanted = self.control_plane.rules_version
        deadline = time.monotonic() + timeout
        while not self.call(self._ext_proc_has_rules):
            self._check_ext_proc()
            refusal = self.call(self._refusal, wanted)
            if refusal is not None:
                raise GatewayError(f"the ext_proc service refused the rule set (version "
                                   f"{wanted}): {refusal}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the ext_proc service did not apply the rule set in "
                                   f"{timeout}s")
            time.sleep(0.05)
        refusal = self.call(self._refusal, wanted)  # refused, then served the last good one
        if refusal is not None:
            raise GatewayError(f"the ext_proc service refused the rule set (version "
                               f"{wanted}): {refusal}")

    def _ext_proc_nodes(self) -> list[NodeStatus]:
        assert self.control_plane is not None
        return [n for n in self.control_plane.fleet.nodes.values()
                if n.role == EXT_PROC and n.connected]

    def _ext_proc_has_rules(self) -> bool:
        """Every worker connected and running what it was sent (one not yet connected
        would otherwise go unnoticed)."""
        assert self.control_plane is not None
        workers = {w.node_id for w in self.workers}
        connected = {n.node_id for n in self._ext_proc_nodes()}
        return workers <= connected and self.control_plane.nodes_converged(EXT_PROC, workers)

    def _refusal(self, version: str | None) -> str | None:
        """The error of an ext_proc instance that NACKed rule-set `version`, if one did."""
        for node in self._ext_proc_nodes():
            state = node.of(RULES)
            if version is not None and state.last_nack_version == version:
                return f"{node.node_id}: {state.last_nack}"
        return None

    def call(self, function: Any, *args: Any) -> Any:
        """Run `function(*args)` on the control plane's loop (its state lives there)."""
        assert self._loop is not None

        async def run() -> Any:
            return function(*args)

        return self._loop.run(run(), timeout=10)

    def fleet_status(self) -> list[dict[str, Any]]:
        assert self.control_plane is not None
        return list(self.call(self.control_plane.fleet_status))

    def start_envoy(self) -> None:
        """Start Envoy, supervised (restarted whenever it exits)."""
        assert self.control_plane is not None and self.control_plane.plan is not None
        env: dict[str, str] = {}
        runtime: dict[str, Any] = {}
        if self.settings.data_path == NATIVE:
            from keg.embedded.native import SEARCH_PATH_ENV, module_dir

            env[SEARCH_PATH_ENV] = str(module_dir())
            # The module closes connections it cannot serve; Envoy 1.40 needs this flag
            # for a close from inside a dynamic module's callback.
            runtime[CLOSE_THROUGH_FILTER_MANAGER] = True
        metadata: dict[str, Any] = {}
        if self.settings.data_path == NATIVE and self.settings.module_metrics_port is not None:
            self.module_metrics_port = self.module_metrics_port or (
                self.settings.module_metrics_port or free_port())
            metadata[METRICS_KEY] = module_metrics_options(
                f"127.0.0.1:{self.module_metrics_port}", os.environ)
        self.envoy = EmbeddedEnvoy(
            "127.0.0.1",
            self.control_plane.xds_port,
            concurrency=self.settings.envoy_concurrency,
            work_dir=self.settings.work_dir,
            delta=self.settings.envoy_delta,
            extra_env=env,
            runtime=runtime,
            xds_tls=self.settings.control_plane_client_tls,
            metadata=metadata,
            admin_port=self.internal_ports.get("envoy-admin", 0),
        )
        envoy = self.envoy
        envoy.start()
        self._wait_for_envoy_listeners()
        self.supervisor.watch(ENVOY_COMPONENT, Child(
            poll=envoy.poll, restart=self._restart_envoy, pid=lambda: envoy.pid))

    def _restart_envoy(self) -> None:
        assert self.envoy is not None
        self.envoy.restart()
        self._wait_for_envoy_listeners()

    def _wait_for_envoy_listeners(self) -> None:
        """Until Envoy listens on every broker listener of the plan (over ADS)."""
        assert self.envoy is not None and self.control_plane is not None
        plan = self.control_plane.plan
        assert plan is not None
        self.envoy.wait_for_listeners(len(plan.routes))
        for route in plan.routes:
            wait_for_port(self.settings.listen_host, route.listen_port, 30)

    def stop_envoy(self) -> None:
        self.supervisor.unwatch(ENVOY_COMPONENT)
        if self.envoy is not None:
            self.envoy.stop()
            self.envoy = None

    def stop(self) -> None:
        self.supervisor.stop()  # first: nothing stopped from here on is restarted
        self.stop_envoy()
        if self._loop is not None:
            if self.control_plane is not None:
                try:
                    stopping = self.app if self.app is not None else self.control_plane
                    self._loop.run(stopping.stop(), timeout=10)
                except Exception:  # stopping must go on whatever failed
                    log.exception("control plane did not stop cleanly")
            self._loop.close()
            self._loop = None
        self.stop_ext_proc()
        if self.settings.work_dir is None and self.control_plane is not None \
                and self.control_plane.topology is not None:
            shutil.rmtree(self.shared_state_dir, ignore_errors=True)
        if self.settings.rules_from_control_plane:
            for worker in self.workers:
                worker.own_path(self.rules_cache_file).unlink(missing_ok=True)

    # -- what clients use ----------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        assert self.control_plane is not None
        return self.control_plane.bootstrap_address()
