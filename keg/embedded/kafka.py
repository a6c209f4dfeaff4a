"""A real Apache Kafka broker (KRaft, single node) run from its Maven Central jars.

The jars (broker, command-line tools and a log4j2 binding, as listed in ``pom.xml`` next to
this module) are fetched once with Maven into a per-user cache::

    $KEG_CACHE_DIR | $XDG_CACHE_HOME/keg | ~/.cache/keg  /  kafka-<version>/libs/*.jar

after which everything runs offline. :class:`EmbeddedKafka` writes a ``server.properties``
for a combined broker+controller node, formats its storage once, starts the JVM and waits
until the broker answers a real request::

    with EmbeddedKafka() as kafka:
        run_java_tool("topics", "--bootstrap-server", kafka.bootstrap, "--list")

Only the Python standard library is used here: clients such as confluent-kafka are for the
callers (tests, benchmarks), not for this module.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, Self

from kafka_wire import ApiKey
from keg.children import JAVA, HoldsProcess, child_environment, die_with_parent
from keg.lifecycle import Service
from keg.state import DirectoryLock, StateInUse

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
POM_PATH = _HERE / "pom.xml"
BROKER_LOG4J2 = _HERE / "log4j2-broker.properties"
TOOLS_LOG4J2 = _HERE / "log4j2-tools.properties"

_MARKER = ".keg-complete"  # written last into a fetched directory; holds the pom's sha256
_PORTS_FILE = "keg-ports.json"  # remembers the ports of a data dir across restarts
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
_SCRAM_ITERATIONS = 4096  # Kafka's minimum (and default) for both mechanisms
# Log4j ERROR/FATAL lines, and Java exception lines ("x.y.FooException: ...", "Caused by: ...").
_ERROR_LINE = re.compile(
    r"^\[[^\]]+\] (ERROR|FATAL) |^(Caused by: )?[A-Za-z_$][\w.$]*(Exception|Error)(: |$)"
)
_USER_RE = re.compile(r"^[A-Za-z0-9._-]+$")

JAVA_INSTALL_HINT = (
    "install a JDK 17+ (Debian/Ubuntu: apt-get install openjdk-17-jre-headless; "
    "macOS: brew install openjdk@17)"
)
MAVEN_INSTALL_HINT = (
    "install Apache Maven 3.6+ to fetch the Kafka jars once "
    "(Debian/Ubuntu: apt-get install maven; macOS: brew install maven)"
)

# Short names (as the bin/kafka-<name>.sh scripts) -> main classes, checked in the 4.1.1 jars.
JAVA_TOOLS: dict[str, str] = {
    "console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "console-share-consumer": "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
    "producer-perf": "org.apache.kafka.tools.ProducerPerformance",
    "consumer-perf": "org.apache.kafka.tools.ConsumerPerformance",
    "share-consumer-perf": "org.apache.kafka.tools.ShareConsumerPerformance",
    "e2e-latency": "org.apache.kafka.tools.EndToEndLatency",
    "topics": "org.apache.kafka.tools.TopicCommand",
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "share-groups": "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
    "streams-groups": "org.apache.kafka.tools.streams.StreamsGroupCommand",
    "groups": "org.apache.kafka.tools.GroupsCommand",
    "configs": "kafka.admin.ConfigCommand",
    "acls": "org.apache.kafka.tools.AclCommand",
    "get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "log-dirs": "org.apache.kafka.tools.LogDirsCommand",
    "reassign-partitions": "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
    "leader-election": "org.apache.kafka.tools.LeaderElectionCommand",
    "transactions": "org.apache.kafka.tools.TransactionsCommand",
    "features": "org.apache.kafka.tools.FeatureCommand",
    "metadata-quorum": "org.apache.kafka.tools.MetadataQuorumCommand",
    "cluster": "org.apache.kafka.tools.ClusterTool",
    "broker-api-versions": "org.apache.kafka.tools.BrokerApiVersionsCommand",
    "client-metrics": "org.apache.kafka.tools.ClientMetricsCommand",
    "verifiable-producer": "org.apache.kafka.tools.VerifiableProducer",
    "verifiable-consumer": "org.apache.kafka.tools.VerifiableConsumer",
    "storage": "kafka.tools.StorageTool",
    "dump-log": "kafka.tools.DumpLogSegments",
}


class EmbeddedKafkaError(RuntimeError):
    """The embedded Kafka broker could not be set up, started or used."""


class ToolMissing(EmbeddedKafkaError):
    """A required external program (java, mvn) is not installed; the message says what to do."""


# --------------------------------------------------------------------------- the jars


@cache
def kafka_version() -> str:
    """The Kafka version pinned by ``pom.xml`` (its ``kafka.version`` property)."""
    root = ET.parse(POM_PATH).getroot()
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = root.find("m:properties/m:kafka.version", ns)
    if node is None or not (node.text or "").strip():
        raise EmbeddedKafkaError(f"{POM_PATH}: no <kafka.version> property")
    return (node.text or "").strip()


def cache_dir() -> Path:
    """keg's per-user cache: ``$KEG_CACHE_DIR``, ``$XDG_CACHE_HOME/keg`` or ``~/.cache/keg``."""
    if env := os.environ.get("KEG_CACHE_DIR"):
        return Path(env).expanduser()
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "keg"
    return Path.home() / ".cache" / "keg"


def kafka_home() -> Path:
    """Where this Kafka version lives in the cache (``<cache>/kafka-<version>``)."""
    return cache_dir() / f"kafka-{kafka_version()}"


def java_executable() -> str:
    """``$JAVA_HOME/bin/java`` if there is one, else ``java`` from PATH; ToolMissing if none."""
    if java_home := os.environ.get("JAVA_HOME"):
        candidate = Path(java_home) / "bin" / "java"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise ToolMissing(f"java not found: {JAVA_INSTALL_HINT}")
    return found


def _mvn_executable() -> str:
    found = shutil.which("mvn")
    if found is None:
        raise ToolMissing(f"mvn not found: {MAVEN_INSTALL_HINT}")
    return found


def ensure_kafka(
    offline_ok: bool = True,
    progress: Callable[[str], None] | None = None,
    timeout: float = 1800.0,
) -> Path:
    """Return the directory holding the Kafka jars, fetching them with Maven if needed.

    With ``offline_ok`` (the default) a complete cache is returned at once, with no network,
    Maven or Java involved. ``offline_ok=False`` resolves the jars again with Maven and
    replaces the cache. ``progress`` receives one-line, human-readable status messages.
    """
    return ensure_maven_dir(POM_PATH, kafka_home() / "libs",
                            ["dependency:copy-dependencies", "-DincludeScope=runtime"],
                            f"Apache Kafka {kafka_version()} jars", progress, timeout,
                            refresh=not offline_ok)


def maven_dir_ready(target: Path, pom: Path) -> bool:
    """Whether `target` holds what `pom` fetches (its marker names the pom's digest)."""
    try:
        return (target / _MARKER).read_text().strip() == _digest(pom)
    except OSError:
        return False


def ensure_maven_dir(pom: Path, target: Path, goal: Sequence[str], what: str,
                     progress: Callable[[str], None] | None = None,
                     timeout: float = 1800.0, refresh: bool = False) -> Path:
    """`target`, filled by `mvn -f pom <goal> -DoutputDirectory=<tmp>` unless it already
    is (for this pom) and no `refresh` is asked. EmbeddedKafkaError (with Maven's output)
    when Maven fails.

    The directory is complete or absent: Maven writes into a temporary directory, the
    marker holding the pom's digest is written last, and the directory is renamed into
    place under a file lock (so concurrent callers neither see a partial set nor fetch
    twice). Maven runs on a copy of the pom in a scratch directory of the cache: what it
    writes beside its pom (`target/`, the dependency plugin's unpack markers) never lands
    in keg's package."""
    if not refresh and maven_dir_ready(target, pom):
        return target

    def say(message: str) -> None:
        log.info("%s", message)
        if progress is not None:
            progress(message)

    java_executable()  # mvn needs it too: report the root cause first
    mvn = _mvn_executable()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not refresh and maven_dir_ready(target, pom):  # fetched by another process
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}-mvn-", dir=target.parent))
        try:
            say(f"fetching {what} from Maven Central into {target}")
            started = time.monotonic()
            shutil.copyfile(pom, work / "pom.xml")
            cmd = [mvn, "-q", "-B", "-f", str(work / "pom.xml"), *goal,
                   f"-DoutputDirectory={tmp}"]
            try:
                done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                                      text=True, timeout=timeout, check=False)
            except subprocess.TimeoutExpired as exc:
                raise EmbeddedKafkaError(f"mvn did not fetch {what} within {timeout:.0f} s"
                                         ) from exc
            if done.returncode != 0 or not any(tmp.iterdir()):
                tail = _tail_text((done.stdout or "") + (done.stderr or ""), 30)
                raise EmbeddedKafkaError(f"mvn {' '.join(goal)} failed for {what} (exit "
                                         f"{done.returncode}); is Maven Central reachable?"
                                         f"\n{tail}")
            size_mb = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file()) / 1e6
            (tmp / _MARKER).write_text(_digest(pom) + "\n")
            tmp.chmod(0o755)
            _replace_dir(tmp, target)
            say(f"fetched {what} ({size_mb:.0f} MB) in {time.monotonic() - started:.1f} s")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
    return target


def _digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def _replace_dir(new: Path, target: Path) -> None:
    """Atomically move ``new`` to ``target``, first moving any existing ``target`` aside."""
    try:
        new.rename(target)
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise
    old = target.with_name(f".{target.name}-old-{os.getpid()}-{time.monotonic_ns()}")
    target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------- java tools


def _check_tool_name(name: str) -> str:
    if name in JAVA_TOOLS:
        return JAVA_TOOLS[name]
    if "." in name:  # a fully-qualified main class
        return name
    known = ", ".join(sorted(JAVA_TOOLS))
    raise ValueError(f"unknown Kafka tool {name!r}; known: {known}")


def java_tool_command(
    name: str, *args: str, heap: str = "512m", jvm_options: Sequence[str] = ()
) -> list[str]:
    """The full ``java`` command line running Kafka tool ``name`` (a JAVA_TOOLS key or a
    fully-qualified main class) with ``args``, logging only WARN and above to stderr;
    ``jvm_options`` go to the JVM before the main class."""
    main_class = _check_tool_name(name)
    libs = ensure_kafka()
    return [
        java_executable(),
        *jvm_options,
        f"-Xmx{heap}",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={TOOLS_LOG4J2}",
        "-cp",
        f"{libs}{os.sep}*",
        main_class,
        *args,
    ]


def run_java_tool(
    name: str,
    *args: str,
    input: str | None = None,
    timeout: float | None = 120.0,
    check: bool = False,
    jvm_options: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Run a Kafka tool (see :func:`java_tool_command`) and capture its text output.

    ``check=True`` raises :class:`EmbeddedKafkaError` (with stderr) on a non-zero exit.
    """
    cmd = java_tool_command(name, *args, jvm_options=jvm_options)
    log.debug("running kafka tool %s %s", name, " ".join(args))
    done = subprocess.run(
        cmd,
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and done.returncode != 0:
        raise EmbeddedKafkaError(
            f"kafka tool {name} failed (exit {done.returncode}):\n{_tail_text(done.stderr, 30)}"
        )
    return done


# --------------------------------------------------------------------------- the broker


def _free_ports(count: int, avoid: set[int] | None = None) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together while picking)."""
    avoid = avoid or set()
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            port = s.getsockname()[1]
            if port not in avoid:
                ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def random_cluster_id() -> str:
    """A Kafka cluster id: a random UUID, base64url without padding (22 chars)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):  # Kafka's Uuid.randomUuid avoids these too
            return text


def scram_credential_spec(
    mechanism: str, name: str, password: str, iterations: int = _SCRAM_ITERATIONS
) -> str:
    """An ``--add-scram`` argument of the storage tool for one user, e.g.
    ``SCRAM-SHA-256=[name=alice,iterations=4096,salt="...",saltedpassword="..."]``.

    The salted password (RFC 5802 ``Hi(password, salt, i)``, i.e. PBKDF2-HMAC) is computed
    here: Kafka's parser cannot escape ``,`` or ``]`` in a clear-text password, and the clear
    text would otherwise be visible in the process list.
    """
    digest = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
    salt = os.urandom(32)
    salted = hashlib.pbkdf2_hmac(digest, password.encode("utf-8"), salt, iterations)
    b64 = base64.b64encode
    return (
        f"{mechanism}=[name={name},iterations={iterations},"
        f'salt="{b64(salt).decode()}",saltedpassword="{b64(salted).decode()}"]'
    )


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _prop_escape(value: str) -> str:
    """Escape a value for a java.util.Properties file."""
    return (
        value.replace("\\", "\\\\")
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
        .replace("\f", "\\f")
    )


def _tail_text(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _tail_file(path: Path, lines: int = 40) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return _tail_text(data, lines)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


def _kafka_request(
    sock: socket.socket, api_key: int, version: int, correlation_id: int, body: bytes
) -> bytes:
    """Send one request (header v1: key, version, correlation id, client id) and return the
    response body after its (v0) header, checking the correlation id."""
    client_id = b"keg-embedded"
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    response = _recv_exact(sock, size)
    (got,) = struct.unpack(">i", response[:4])
    if got != correlation_id:
        raise ConnectionError(f"correlation id {got} != {correlation_id}")
    return response[4:]


def probe_broker(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when the broker at host:port answers ApiVersions v0 without error and a
    Metadata v4 request lists at least one live (unfenced) broker."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            body = _kafka_request(sock, ApiKey.API_VERSIONS, 0, 1, b"")  # ApiVersions v0
            (error_code,) = struct.unpack(">h", body[:2])
            if error_code != 0:
                return False
            # Metadata v4: topics = [] (none), allow_auto_topic_creation = false.
            body = _kafka_request(sock, ApiKey.METADATA, 4, 2, struct.pack(">ib", 0, 0))
            _throttle, brokers = struct.unpack(">ii", body[:8])
            return bool(brokers > 0)
    except (OSError, ConnectionError, struct.error):
        return False


@dataclass(frozen=True)
class BrokerTls:
    """TLS listeners of the embedded broker, from PEM files (Kafka's PEM key stores):
    an `SSL` listener, and with `sasl_users` a `SASL_SSL` one. `key_file` must be an
    unencrypted PKCS#8 key; `client_auth` is Kafka's ssl.client.auth (none, requested,
    required), checked against `ca_file`."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    client_auth: str = "none"


# Features finalized when a data dir is formatted (see EmbeddedKafka).
DEFAULT_FEATURES: dict[str, int] = {"share.version": 1}


class EmbeddedKafka(HoldsProcess, Service):
    """A single-node Apache Kafka (KRaft, combined broker+controller) in a child JVM.

    ``data_dir`` holds the config, the log dirs and the logs; when None a temporary
    directory is used and removed by :meth:`stop`. ``port`` 0 picks a free loopback port
    (remembered in the data dir, so a restart on the same data dir reuses it).
    ``sasl_users`` (name -> password) adds a SASL_PLAINTEXT listener accepting PLAIN,
    SCRAM-SHA-256 and SCRAM-SHA-512 for those users (SCRAM credentials are written when the
    storage is formatted, i.e. on the first start of a data dir). ``extra_config`` entries
    override the generated ``server.properties``. ``features`` are finalized when the
    storage is formatted: by default share groups (KIP-932, `share.version=1`), which
    Kafka 4.1 ships but leaves off, so every group protocol works against this broker.

    ``joins`` makes this a broker-only node (``node_id``) of the cluster another running
    EmbeddedKafka is the controller of: a multi-broker cluster for the tests that need one
    (discovery, leaders on other brokers). Its replication factors stay 1.
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        port: int = 0,
        sasl_users: dict[str, str] | None = None,
        extra_config: dict[str, str] | None = None,
        *,
        start_timeout: float = 60.0,
        heap: str = "1g",
        features: dict[str, int] | None = None,
        tls: BrokerTls | None = None,
        joins: EmbeddedKafka | None = None,
        node_id: int = 1,
    ) -> None:
        if joins is not None and (sasl_users or tls is not None):
            raise ValueError("a joining broker has PLAINTEXT listeners only")
        if joins is not None and node_id == 1:
            raise ValueError("a joining broker needs a node id other than the controller's (1)")
        for name in sasl_users or {}:
            if not _USER_RE.match(name):
                raise ValueError(f"unsupported SASL user name {name!r} (use [A-Za-z0-9._-])")
        self._data_dir: Path | None = Path(data_dir).resolve() if data_dir is not None else None
        self._owns_data_dir = False
        self._requested_port = port
        self._port = port
        self._controller_port = 0
        self._sasl_port = 0
        self._ssl_port = 0
        self._sasl_ssl_port = 0
        self._tls = tls
        self._sasl_users = dict(sasl_users or {})
        self._extra_config = dict(extra_config or {})
        self._features = dict(DEFAULT_FEATURES if features is None else features)
        self._start_timeout = start_timeout
        self._heap = heap
        self._joins = joins
        self._node_id = node_id
        self._proc: subprocess.Popen[bytes] | None = None
        self._console: IO[bytes] | None = None
        self._lock: DirectoryLock | None = None

    # ---- properties

    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            raise EmbeddedKafkaError("EmbeddedKafka has no data dir until started")
        return self._data_dir

    @property
    def port(self) -> int:
        """The PLAINTEXT port (0 until started when a free one is to be picked)."""
        return self._port

    @property
    def controller_port(self) -> int:
        return self._controller_port

    @property
    def node_id(self) -> int:
        return self._node_id

    @property
    def cluster_id(self) -> str:
        """The cluster id its storage was formatted with (after the first start)."""
        meta = (self._kraft_dir / "meta.properties").read_text()
        return next(line.split("=", 1)[1].strip() for line in meta.splitlines()
                    if line.startswith("cluster.id="))

    @property
    def sasl_port(self) -> int:
        return self._sasl_port

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:<port>`` of the PLAINTEXT listener."""
        if not self._port:
            raise EmbeddedKafkaError("EmbeddedKafka is not started")
        return f"127.0.0.1:{self._port}"

    @property
    def sasl_bootstrap(self) -> str:
        """``127.0.0.1:<port>`` of the SASL_PLAINTEXT listener (needs ``sasl_users``)."""
        if not self._sasl_users:
            raise EmbeddedKafkaError("EmbeddedKafka has no SASL listener (no sasl_users given)")
        if not self._sasl_port:
            raise EmbeddedKafkaError("EmbeddedKafka is not started")
        return f"127.0.0.1:{self._sasl_port}"

    @property
    def ssl_bootstrap(self) -> str:
        """``127.0.0.1:<port>`` of the SSL listener (needs ``tls``)."""
        if self._tls is None or not self._ssl_port:
            raise EmbeddedKafkaError("EmbeddedKafka has no SSL listener (no tls given) or "
                                     "is not started")
        return f"127.0.0.1:{self._ssl_port}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        """``127.0.0.1:<port>`` of the SASL_SSL listener (needs ``tls`` and ``sasl_users``)."""
        if self._tls is None or not self._sasl_users or not self._sasl_ssl_port:
            raise EmbeddedKafkaError("EmbeddedKafka has no SASL_SSL listener (needs tls and "
                                     "sasl_users) or is not started")
        return f"127.0.0.1:{self._sasl_ssl_port}"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def log_path(self) -> Path:
        """The broker's own log file (INFO and above)."""
        return self.logs_dir / "server.log"

    @property
    def console_log_path(self) -> Path:
        """The JVM's stdout/stderr (WARN and above, plus anything the JVM itself prints)."""
        return self.logs_dir / "console.log"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "server.properties"

    def poll(self) -> int | None:
        """The broker JVM's exit code once it has exited (reaped), None while it runs."""
        return self._proc.poll() if self._proc is not None else None

    # ---- lifecycle

    def start(self) -> Self:
        """Start the broker and wait until it serves requests; a no-op when running."""
        if self.running:
            return self
        libs = ensure_kafka()
        java = java_executable()
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix="keg-kafka-")).resolve()
            self._owns_data_dir = True
        try:
            self._lock = DirectoryLock(self.data_dir, "a Kafka data directory").start()
        except StateInUse as err:
            raise EmbeddedKafkaError(f"{err}: stop it, or give another data directory") from None
        try:
            self._start(java, libs)
        except BaseException:
            # The error carries the log tails; a temporary data dir is not worth keeping.
            self._shutdown(remove_data=self._owns_data_dir)
            raise
        return self

    def _start(self, java: str, libs: Path) -> None:
        data_dir = self.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self._choose_ports()
        self._write_config()
        if not (self._kraft_dir / "meta.properties").exists():
            self._format_storage(java, libs)

        cmd = [
            java,
            "-Xms256m",
            f"-Xmx{self._heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={BROKER_LOG4J2}",
            f"-Dkafka.logs.dir={self.logs_dir}",
            "-cp",
            f"{libs}{os.sep}*",
            "kafka.Kafka",
            str(self.config_path),
        ]
        log.info("starting Kafka %s on %s (data dir %s)", kafka_version(), self.bootstrap, data_dir)
        started = time.monotonic()
        self._console = self.console_log_path.open("ab")
        self._proc = subprocess.Popen(
            die_with_parent(cmd),
            stdin=subprocess.DEVNULL,
            stdout=self._console,
            stderr=subprocess.STDOUT,
            cwd=data_dir,
            env=child_environment(JAVA),  # nothing of keg's own environment (keys)
        )
        atexit.register(self.stop)
        self._wait_ready(started)
        log.info("Kafka is up on %s after %.1fs", self.bootstrap, time.monotonic() - started)

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 20 s); idempotent. A temporary data
        dir (``data_dir=None``) is removed."""
        self._shutdown(remove_data=self._owns_data_dir)

    def restart(self) -> Self:
        """Stop and start again, keeping the data (even in a temporary data dir)."""
        self._shutdown(remove_data=False)
        return self.start()

    # ---- internals

    @property
    def _kraft_dir(self) -> Path:
        return self.data_dir / "kraft-logs"

    def _choose_ports(self) -> None:
        ports_file = self.data_dir / _PORTS_FILE
        saved: dict[str, int] = {}
        with contextlib.suppress(OSError, ValueError):
            saved = {k: int(v) for k, v in json.loads(ports_file.read_text()).items()}
        want_sasl = bool(self._sasl_users)
        wanted = [("port", True), ("controller_port", self._joins is None),
                  ("sasl_port", want_sasl),
                  ("ssl_port", self._tls is not None),
                  ("sasl_ssl_port", want_sasl and self._tls is not None)]
        for name, needed in wanted:
            attr = f"_{name}"
            port = saved.get(name, 0)
            taken = {getattr(self, f"_{other}") for other, _ in wanted if other != name}
            if needed and not getattr(self, attr) and port and port not in taken \
                    and _port_is_free(port):
                setattr(self, attr, port)
        taken = {getattr(self, f"_{name}") for name, _ in wanted} - {0}
        missing = [f"_{name}" for name, needed in wanted
                   if needed and not getattr(self, f"_{name}")]
        for attr, port in zip(missing, _free_ports(len(missing), taken), strict=True):
            setattr(self, attr, port)
        record = {name: getattr(self, f"_{name}") for name, needed in wanted if needed}
        ports_file.write_text(json.dumps(record) + "\n")

    def server_properties(self) -> dict[str, str]:
        """The broker configuration (ports must have been chosen, i.e. after start)."""
        host = "127.0.0.1"
        listeners = [f"PLAINTEXT://{host}:{self._port}"]
        advertised = [f"PLAINTEXT://{host}:{self._port}"]
        if self._joins is None:
            listeners.append(f"CONTROLLER://{host}:{self._controller_port}")
            advertised.append(f"CONTROLLER://{host}:{self._controller_port}")
        controller_port = (self._joins.controller_port if self._joins is not None
                           else self._controller_port)
        protocols = ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"]
        extra = [("SASL_PLAINTEXT", self._sasl_port)] if self._sasl_users else []
        if self._tls is not None:
            extra.append(("SSL", self._ssl_port))
            if self._sasl_users:
                extra.append(("SASL_SSL", self._sasl_ssl_port))
        for name, port in extra:
            listeners.append(f"{name}://{host}:{port}")
            advertised.append(f"{name}://{host}:{port}")
            protocols.append(f"{name}:{name}")
        props: dict[str, str] = {
            "process.roles": "broker,controller" if self._joins is None else "broker",
            "node.id": str(self._node_id),
            "controller.quorum.bootstrap.servers": f"{host}:{controller_port}",
            "controller.listener.names": "CONTROLLER",
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(protocols),
            "log.dirs": str(self._kraft_dir),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
            "delete.topic.enable": "true",
            "log.segment.bytes": str(64 * 1024 * 1024),
            "log.retention.hours": "168",
            "log.retention.check.interval.ms": "300000",
            "num.recovery.threads.per.data.dir": "1",
        }
        sasl_listeners = [name for name, _ in extra if name.startswith("SASL_")]
        if sasl_listeners:
            plain_users = " ".join(
                f"user_{name}={_jaas_quote(pw)}" for name, pw in sorted(self._sasl_users.items())
            )
            props["sasl.enabled.mechanisms"] = ",".join(_SASL_MECHANISMS)
        for listener in sasl_listeners:
            prefix = f"listener.name.{listener.lower()}"
            props[f"{prefix}.sasl.enabled.mechanisms"] = ",".join(_SASL_MECHANISMS)
            props[f"{prefix}.plain.sasl.jaas.config"] = (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
            )
            for mechanism in _SCRAM_MECHANISMS:
                props[f"{prefix}.{mechanism.lower()}.sasl.jaas.config"] = (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                )
        if self._tls is not None:
            props.update(self._tls_properties())
        props.update(self._extra_config)
        return props

    def _tls_properties(self) -> dict[str, str]:
        """PEM key and trust stores for the TLS listeners (Kafka reads PEM since 2.7:
        KIP-651); the key store is one file, the private key then the chain."""
        assert self._tls is not None
        keystore = self.data_dir / "keystore.pem"
        fd = os.open(keystore, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(Path(self._tls.key_file).read_bytes())
            fh.write(Path(self._tls.cert_file).read_bytes())
        props = {}
        for listener in ("ssl", "sasl_ssl"):
            prefix = f"listener.name.{listener}.ssl"
            props[f"{prefix}.keystore.type"] = "PEM"
            props[f"{prefix}.keystore.location"] = str(keystore)
            props[f"{prefix}.truststore.type"] = "PEM"
            props[f"{prefix}.truststore.location"] = str(self._tls.ca_file)
            props[f"{prefix}.client.auth"] = self._tls.client_auth
        return props

    def _write_config(self) -> None:
        lines = ["# Written by keg.embedded.kafka; regenerated on every start."]
        lines += [f"{key}={_prop_escape(value)}" for key, value in self.server_properties().items()]
        path = self.config_path
        # The file may hold SASL passwords: keep it private.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        os.chmod(path, 0o600)

    def _redact(self, text: str) -> str:
        for password in self._sasl_users.values():
            if password:
                text = text.replace(password, "***")
        return text

    def _format_storage(self, java: str, libs: Path) -> None:
        cluster_id = random_cluster_id() if self._joins is None else self._joins.cluster_id
        cmd = [
            java,
            "-Xmx256m",
            f"-Dlog4j2.configurationFile={TOOLS_LOG4J2}",
            "-cp",
            f"{libs}{os.sep}*",
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            cluster_id,
            "--config",
            str(self.config_path),
            "--standalone" if self._joins is None else "--no-initial-controllers",
        ]
        for feature, level in sorted(self._features.items() if self._joins is None else ()):
            cmd += ["--feature", f"{feature}={level}"]  # the controller's, cluster-wide
        for name, password in sorted(self._sasl_users.items()):
            for mechanism in _SCRAM_MECHANISMS:
                cmd += ["--add-scram", scram_credential_spec(mechanism, name, password)]
        log.info("formatting KRaft storage in %s (cluster id %s)", self._kraft_dir, cluster_id)
        done = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
            check=False, env=child_environment(JAVA),
        )
        if done.returncode != 0:
            output = self._redact(_tail_text(done.stdout + done.stderr, 30))
            self._raise_for_java(output)
            raise EmbeddedKafkaError(
                f"kafka storage format failed (exit {done.returncode}):\n{output}"
            )

    @staticmethod
    def _raise_for_java(output: str) -> None:
        if "UnsupportedClassVersionError" in output:
            raise ToolMissing(f"java is too old for Kafka {kafka_version()}: {JAVA_INSTALL_HINT}")

    def _failure_details(self) -> str:
        parts = []
        errors: list[str] = []
        for path in (self.log_path, self.console_log_path):
            for line in _tail_file(path, 400).splitlines():
                if _ERROR_LINE.search(line) and line not in errors:
                    errors.append(line)
        if errors:
            parts.append("--- errors\n" + "\n".join(errors[:10]))
        if console := _tail_file(self.console_log_path, 20):
            parts.append(f"--- {self.console_log_path} (tail)\n{console}")
        if server := _tail_file(self.log_path, 40):
            parts.append(f"--- {self.log_path} (tail)\n{server}")
        return self._redact("\n".join(parts))

    def _wait_ready(self, started: float) -> None:
        assert self._proc is not None
        deadline = started + self._start_timeout
        delay = 0.1
        while True:
            code = self._proc.poll()
            if code is not None:
                details = self._failure_details()
                self._raise_for_java(details)
                raise EmbeddedKafkaError(
                    f"Kafka broker exited with code {code} during startup\n{details}"
                )
            if probe_broker("127.0.0.1", self._port, timeout=2.0):
                return
            if time.monotonic() > deadline:
                raise EmbeddedKafkaError(
                    f"Kafka broker not ready on {self.bootstrap} after "
                    f"{self._start_timeout:.0f}s\n{self._failure_details()}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _shutdown(self, remove_data: bool) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            atexit.unregister(self.stop)
            if proc.poll() is None:
                log.info("stopping Kafka on %s (pid %d)", self.bootstrap, proc.pid)
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    log.warning("Kafka (pid %d) ignored SIGTERM for 20s: killing it", proc.pid)
                    proc.kill()
                    proc.wait()
        if self._console is not None:
            self._console.close()
            self._console = None
        if self._lock is not None:
            self._lock.stop()
            self._lock = None
        if remove_data and self._owns_data_dir and self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None
            self._owns_data_dir = False
            self._port, self._controller_port, self._sasl_port = self._requested_port, 0, 0
            self._ssl_port = self._sasl_ssl_port = 0

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"EmbeddedKafka({state}, port={self._port}, data_dir={self._data_dir})"


def missing_tool_classes(libs: Path | None = None) -> Mapping[str, str]:
    """JAVA_TOOLS entries whose main class is in none of the jars (should be empty)."""
    libs = libs or ensure_kafka()
    classes: set[str] = set()
    for jar in libs.glob("*.jar"):
        with zipfile.ZipFile(jar) as zf:
            classes.update(n[:-6].replace("/", ".") for n in zf.namelist() if n.endswith(".class"))
    return {name: cls for name, cls in JAVA_TOOLS.items() if cls not in classes}
