"""`keg up` fronting a secured cluster from the command line alone: the broker's SASL_SSL
listener (SCRAM-SHA-512, the session CA), TLS on the gateway's listeners, the SASL
password from the environment. Clients log in end to end (the broker checks their
SCRAM proof through the gateway), their principal shows in the audit log, and the
password is in no log, no command line and no environment of a child that does not
need it."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from keg.embedded.certs import DevCa
from keg.embedded.kafka import EmbeddedKafka
from keg.security import SASL_PASSWORD_ENV
from tests.integration.conftest import SASL_USERS, create_topic
from tests.integration.runtime.test_keg_up import KegUp, keg_up
from tests.integration.security.tls_clients import librdkafka_conf, produce_records

pytestmark = pytest.mark.integration

RULES = """
rules:
  - id: watch-produce
    match: {apis: [Produce]}
    action: {observe: {audit: true}}
"""


READER_TOKEN = "reader-token-7f3a9c"


@contextmanager
def secure_keg_up(kafka: EmbeddedKafka, ca: DevCa, tmp_path: Path) -> Iterator[KegUp]:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "watch.yaml").write_text(RULES)
    server = ca.server("keg-up-gateway")
    tokens = tmp_path / "tokens"
    tokens.write_text(f"reader:{READER_TOKEN}\n")
    with keg_up(kafka, tmp_path, tmp_path / "cache", rules,
                # Two ext_proc workers, each with its own audit log: both are read.
                "--ext-proc-workers", "2", "--api-tokens", str(tokens),
                "--upstream-tls-ca", str(ca.cert_file),
                "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", "keg",
                "--tls-cert", str(server.cert), "--tls-key", str(server.key),
                "--log-level", "INFO",  # the most the logs say: no secret in them either
                bootstrap=kafka.sasl_ssl_bootstrap,
                environment={SASL_PASSWORD_ENV: SASL_USERS["keg"]}) as up:
        yield up


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def authentication_errors(conf: dict[str, str], timeout: float = 30.0) -> list[str]:
    """The authentication errors librdkafka reports for `conf` (waits for the first)."""
    from confluent_kafka import KafkaError, Producer

    seen: list[KafkaError] = []
    producer = Producer({**conf, "error_cb": seen.append})
    deadline = time.monotonic() + timeout
    while not any(e.code() == KafkaError._AUTHENTICATION for e in seen):
        assert time.monotonic() < deadline, [str(e) for e in seen]
        producer.poll(0.2)
    del producer
    return [e.str() for e in seen if e.code() == KafkaError._AUTHENTICATION]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_keg_up_fronts_a_sasl_ssl_scram_cluster_from_the_command_line(
        kafka: EmbeddedKafka, dev_ca: DevCa, tmp_path: Path) -> None:
    password = SASL_USERS["keg"].encode()
    topic = create_topic(kafka.bootstrap)
    with secure_keg_up(kafka, dev_ca, tmp_path) as up:
        bootstrap = up.bootstrap
        audits = [Path(p) for p in up.wait_for(r"audit log: (.+?)   metrics").group(1).split()]
        assert len(audits) == 2, audits  # one file per ext_proc worker
        for user in ("alice", "bob"):
            conf = librdkafka_conf(bootstrap, dev_ca,
                                   sasl=("SCRAM-SHA-512", user, SASL_USERS[user]))
            assert produce_records(conf, topic, 1) == [None], user
        # A wrong password is refused by the broker itself, through the gateway.
        assert authentication_errors(
            librdkafka_conf(bootstrap, dev_ca, sasl=("SCRAM-SHA-512", "alice", "nope")))
        deadline = time.monotonic() + 30
        while True:
            events = [json.loads(line) for audit in audits
                      for line in _read(audit).decode().splitlines() if line]
            principals = {e["principal"] for e in events if e["rule_id"] == "watch-produce"}
            if {"User:alice", "User:bob"} <= principals or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert {"User:alice", "User:bob"} <= principals
        assert {e["security_protocol"] for e in events} == {"SASL_SSL"}
        # The console's audit tail shows every worker's events, not only the first's.
        api = re.search(r"REST API: (http://\S+)/docs", up.output)
        assert api is not None, up.output
        request = urllib.request.Request(f"{api.group(1)}/v1/audit?limit=1000",
                                         headers={"Authorization": f"Bearer {READER_TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            tail = json.load(response)
        assert {e["principal"] for e in tail["events"]} == principals
        # The password: in no argv, and only in the environment of the ext_proc service
        # (its `copy` producer logs in as keg); never in Envoy's.
        processes = [up.process.pid, *_descendants(up.process.pid)]
        holders = []
        for pid in processes:
            proc = Path(f"/proc/{pid}")
            cmdline = _read(proc / "cmdline")
            assert password not in cmdline, cmdline
            if pid != up.process.pid and password in _read(proc / "environ"):
                holders.append(cmdline.split(b"\0")[:4])
        envoys = [pid for pid in processes if b"envoy" in _read(Path(f"/proc/{pid}/cmdline"))
                  .split(b"\0")[0]]
        assert envoys, "no Envoy among keg up's children"
        assert all(b"ext-proc" in b" ".join(h) for h in holders), holders
        state = Path(up.wait_for(r"state: (\S+)").group(1))
    # Nor in any log or file keg wrote: its output, Envoy's log, the audit log.
    assert password.decode() not in up.output
    for path in state.rglob("*"):
        if path.is_file() and path.suffix not in (".sqlite", ".db"):
            assert password not in _read(path), path
