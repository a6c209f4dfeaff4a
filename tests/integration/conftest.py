"""Real parts for integration tests: one Kafka broker and one gateway per test session."""

from __future__ import annotations

import contextlib
import functools
import os
import random
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from control_plane.service import EXT_PROC_PATH
from filter_rules import DEFAULT_RULES_DIR
from keg.embedded.certs import DevCa
from keg.embedded.kafka import BrokerTls, EmbeddedKafka, ensure_kafka, run_java_tool
from keg.embedded.local_kms import LocalKms
from keg.embedded.registry import EmbeddedRegistry
from keg.gateway import Gateway, GatewaySettings
from tests.integration.relay import RecordingRelay, gateway_listener

# One broker for the session: a PLAINTEXT listener (`bootstrap`) and a SASL_PLAINTEXT one
# (`sasl_bootstrap`, PLAIN and SCRAM) with these users; "keg" is the gateway's own.
SASL_USERS = {"alice": "alice-secret", "bob": "bob-secret", "carol": "carol-secret",
              "analytics": "analytics-secret", "billing": "billing-secret",
              "keg": "keg-secret"}


@pytest.fixture(scope="session")
def dev_ca(tmp_path_factory: pytest.TempPathFactory) -> DevCa:
    """A throw-away CA for the session: the broker's TLS listeners, gateways, clients."""
    return DevCa(tmp_path_factory.mktemp("dev-ca"))


# Members of KIP-848 consumer groups and KIP-932 share groups learn their assignment at
# their next heartbeat, 5 s apart by default: a test's consumer waited up to 5 s for it,
# twice for a test that compares with the broker directly. The same protocol, sooner.
FAST_GROUPS: dict[str, str] = {
    f"group.{kind}.{name}heartbeat.interval.ms": "1000"
    for kind in ("consumer", "share") for name in ("", "min.")}


@pytest.fixture(scope="session")
def kafka(dev_ca: DevCa) -> Iterator[EmbeddedKafka]:
    """The session's broker: PLAINTEXT, SASL_PLAINTEXT, SSL and SASL_SSL listeners (the
    TLS ones with a certificate of `dev_ca` for 127.0.0.1 and localhost)."""
    ensure_kafka()
    server = dev_ca.server("broker")
    tls = BrokerTls(server.cert, server.key, dev_ca.cert_file, client_auth="requested")
    with EmbeddedKafka(sasl_users=SASL_USERS, tls=tls, extra_config=FAST_GROUPS) as broker:
        yield broker


def sasl_conf(bootstrap: str, user: str, mechanism: str = "PLAIN") -> dict[str, str]:
    """librdkafka settings for `user` of SASL_USERS."""
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": SASL_USERS[user]}


def java_sasl(user: str) -> list[str]:
    """Kafka Java client properties for `user` of SASL_USERS (PLAIN)."""
    jaas = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{user}" password="{SASL_USERS[user]}";')
    return ["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN", f"sasl.jaas.config={jaas}"]


def share_console_consume(kafka: EmbeddedKafka, bootstrap: str, topic: str, expected: int,
                          *options: str, user: str = "alice"
                          ) -> subprocess.CompletedProcess[str]:
    """Kafka's console share consumer (a share group, KIP-932: it reads with ShareFetch)
    as SASL `user` through `bootstrap`, from the topic's start (the new group's
    share.auto.offset.reset, set on the broker directly), `expected` records at most
    within 15 s. `options`: more of the tool's (--property print.key=true, ...)."""
    group = f"share-{uuid.uuid4().hex[:8]}"
    run_java_tool("configs", "--bootstrap-server", kafka.bootstrap, "--entity-type", "groups",
                  "--entity-name", group, "--alter", "--add-config",
                  "share.auto.offset.reset=earliest", check=True)
    args = ["--bootstrap-server", bootstrap, "--topic", topic, "--group", group,
            "--max-messages", str(expected), "--timeout-ms", "15000", *options]
    for prop in java_sasl(user):
        args += ["--consumer-property", prop]
    return run_java_tool("console-share-consumer", *args)


def dumped_codecs(kafka: EmbeddedKafka, topic: str) -> set[str]:
    """The codecs of the batches the broker wrote for `topic` (Kafka's DumpLogSegments)."""
    segments = sorted((kafka.data_dir).rglob(f"{topic}-0/*.log"))
    assert segments, f"no log segment for {topic}"
    done = run_java_tool("kafka.tools.DumpLogSegments", "--files", str(segments[0]),
                         check=True)
    # Lines read "baseOffset: 0 ... compresscodec: lz4 crc: ...".
    return {line.split("compresscodec: ", 1)[1].split()[0] for line in done.stdout.splitlines()
            if "compresscodec: " in line}


EXAMPLES = DEFAULT_RULES_DIR.parent / "examples"
# The data path a test's gateway runs unless the test names one: the suite runs once per
# path (`make test`: ext-proc, then native); tests of one path's own behaviour name it.
DATA_PATH_ENV = "KEG_TEST_DATA_PATH"
DATA_PATH = os.environ.get(DATA_PATH_ENV, EXT_PROC_PATH)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With KEG_TEST_DATA_PATH set (the second path's pass), only the tests whose gateway
    follows it run: those using the session's `gateway` fixture or `gateway_settings`.
    The others (a path of their own, `keg up`, no gateway) ran in the first pass."""
    if DATA_PATH_ENV not in os.environ:
        return
    here = Path(__file__).parent
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        path = Path(str(item.path))
        follows = (here in path.parents and path.parent.name != "native"
                   and item.get_closest_marker("one_data_path") is None) and (
            "gateway" in getattr(item, "fixturenames", ())
            or _builds_gateway_settings(path))
        (kept if follows else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@functools.cache
def _builds_gateway_settings(path: Path) -> bool:
    return "gateway_settings(" in path.read_text()


def free_port_run(count: int) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1 (below the ephemeral range)."""
    for _ in range(200):
        base = random.randrange(24000, 32000)
        try:
            with contextlib.ExitStack() as held:
                for port in range(base, base + count):
                    s = held.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports")


def gateway_settings(kafka: EmbeddedKafka, work_dir: Path, **overrides: Any) -> GatewaySettings:
    """A gateway in front of the session's broker: ports picked free, quiet logs."""
    base: dict[str, Any] = {"bootstrap_servers": kafka.bootstrap, "listen_port_base": 0,
                            "work_dir": work_dir, "ext_proc_log_level": "WARNING",
                            "data_path": DATA_PATH}
    return GatewaySettings(**(base | overrides))


def api_get(gateway: Gateway, path: str) -> tuple[int, str]:
    """GET `path` of the gateway's REST API: the status and the body, errors included."""
    assert gateway.app is not None and gateway.app.api_server is not None
    url = f"http://127.0.0.1:{gateway.app.api_server.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


# A topic rule on every API: Metadata, group heartbeats and the rest of a client's
# requests (and Metadata answers) go to the Python service, which hides the topics.
HIDE_HIDDEN_RULES = """
rules:
  - id: hide-hidden
    match: {topics: {prefix: [hidden.]}}
    action: {deny: {}}
"""


@contextlib.contextmanager
def gateway_with_static_rules(kafka: EmbeddedKafka, work_dir: Path, rules: str,
                              **overrides: Any) -> Iterator[Gateway]:
    """A gateway serving `rules` (as one rule file, version 1) from memory, quiet logs;
    `overrides`: more GatewaySettings (data_path, workers, timeouts...)."""
    from control_plane.providers import StaticRuleProvider
    from filter_rules import load_rule_text

    base: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap, "listen_port_base": 0, "work_dir": work_dir,
        "rules_provider": StaticRuleProvider(load_rule_text(rules, "rules.yaml"), version="1"),
        "ext_proc_log_level": "WARNING", "data_path": DATA_PATH}
    settings = GatewaySettings(**(base | overrides))
    with Gateway(settings) as gateway:
        yield gateway


def scrape_metrics(gateway: Gateway) -> str:
    """The ext_proc service's exposition (its first worker's), then, on the native path,
    the Kafka filter's (keg_requests_total and the topic series of all traffic)."""
    assert gateway.metrics_port is not None
    text = ""
    for port in (p for p in (gateway.metrics_port, gateway.module_metrics_port) if p is not None):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text += response.read().decode()
    return text


def rule_dir(path: Path, files: Mapping[str, str], examples: Sequence[str] = ()) -> Path:
    """A rule directory at `path`: the shipped examples named, then these files."""
    path.mkdir()
    for name in examples:
        shutil.copy(EXAMPLES / name, path / name)
    for name, text in files.items():
        (path / name).write_text(text)
    return path


@pytest.fixture(scope="session")
def gateway(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with Gateway(gateway_settings(kafka, tmp_path_factory.mktemp("envoy"))) as gw:
        yield gw


@pytest.fixture(scope="session")
def native_gateway(kafka: EmbeddedKafka,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The gateway on the native data path: keg's Kafka filter inside Envoy."""
    work_dir = tmp_path_factory.mktemp("envoy-native")
    with Gateway(gateway_settings(kafka, work_dir, data_path="native")) as gw:
        yield gw


def envoy_data_paths(gateway: Gateway) -> list[str]:
    """The data path each of the gateway's Envoys reports running ("native" only when
    keg's filter really is in Envoy, not its ext_proc fallback)."""
    return [n["data_path"] for n in gateway.fleet_status() if n["role"] == "envoy"]


def create_topic(bootstrap: str, partitions: int = 1, name: str | None = None) -> str:
    """Create a topic (through whatever `bootstrap` is) and wait until it exists."""
    topic = name or f"t-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=30)
    futures[topic].result(30)
    # CreateTopics answers once the controller commits; the broker leads the partitions a
    # moment later. Wait for that, so a raw request (which does not retry) finds a leader.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = admin.list_topics(topic, timeout=10).topics.get(topic)
        if found is not None and found.error is None and len(found.partitions) == partitions \
                and all(p.leader >= 0 for p in found.partitions.values()):
            break
        time.sleep(0.05)
    return topic


def produce_one(bootstrap: str, topic: str) -> str | None:
    """The delivery error of one record produced through `bootstrap` by librdkafka,
    without retries (None: stored)."""
    errors: list[str | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "retries": 0,
                         "message.timeout.ms": 15000})
    producer.produce(topic, b"v", on_delivery=lambda err, _m: errors.append(
        None if err is None else err.name()))
    producer.flush(20)
    del producer  # before the gateway goes: no reconnect attempts into the void
    assert len(errors) == 1, errors
    return errors[0]


def deliver(producer: Producer, topic: str, value: bytes = b"x") -> int:
    """Produce one record on `producer`'s connections and wait for it: its error code
    (0: stored)."""
    codes: list[int] = []
    producer.produce(topic, value, on_delivery=lambda err, _m: codes.append(
        0 if err is None else err.code()))
    producer.flush(30)
    return codes[-1]


@pytest.fixture
def relay(gateway: Gateway) -> Iterator[RecordingRelay]:
    r = RecordingRelay(gateway_listener(gateway))
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="session")
def schema_registry(dev_ca: DevCa,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRegistry]:
    """A real schema registry (Apicurio Registry, in memory): Confluent's API at
    `ccompat_url`, and over HTTPS at `https_ccompat_url` with a certificate of `dev_ca`
    for localhost."""
    server = dev_ca.server("schema-registry")
    with EmbeddedRegistry(tls=(server.cert, server.key),
                          log_dir=tmp_path_factory.mktemp("schema-registry")) as registry:
        yield registry


@pytest.fixture(scope="session")
def local_kms() -> Iterator[LocalKms]:
    """A real server of the AWS KMS API (local-kms; any credentials are accepted)."""
    with LocalKms() as kms:
        yield kms
