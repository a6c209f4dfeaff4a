"""SASL termination: the gateway authenticates clients itself and reaches the broker as
its own service account.

The clients (dora with a password known to keg only, erin with a JWT signed by a key of
keg's JWKS) are no users of the broker: the broker's SASL_SSL listener knows keg's
service account, which the gateway logs in as (SCRAM-SHA-512) on each client's broker
connection. Wrong passwords, expired tokens and tokens for another audience are refused
with SASL_AUTHENTICATION_FAILED and a message; every attempt is audited; rules see the
principal keg authenticated; failures are rate-limited.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from cryptography.hazmat.primitives.asymmetric import ec
from kafka import KafkaProducer

from control_plane.tls import ListenerTls, UpstreamTls
from ext_proc.connection import split_host_port
from ext_proc.sasl.credentials import add_user
from ext_proc.sasl.login import BrokerLogin, LoginFailed, SaslCredentials
from keg.embedded.certs import DevCa
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway, GatewaySettings
from tests.integration.conftest import SASL_USERS, create_topic
from tests.integration.security.tls_clients import (
    kafka_python_conf,
    librdkafka_conf,
    produce_records,
)

pytestmark = pytest.mark.integration

ISSUER, AUDIENCE = "https://id.example", "kafka-gateway"
RULES = """
rules:
  - id: reports-only-dora
    match:
      apis: [Produce]
      topics: {prefix: [reports.]}
      not: {principals: {exact: ["User:dora"]}}
    action: {deny: {error: TOPIC_AUTHORIZATION_FAILED, message: only dora files reports}}
"""


class Env:
    def __init__(self, gateway: Gateway, ca: DevCa, key: ec.EllipticCurvePrivateKey,
                 audit: Path) -> None:
        self.gateway, self.ca, self.key, self.audit = gateway, ca, key, audit

    def token(self, subject: str, *, expires_in: float = 600, audience: str = AUDIENCE,
              kid: str = "key-1") -> str:
        now = int(time.time())
        return jwt.encode({"sub": subject, "iss": ISSUER, "aud": audience, "iat": now,
                           "exp": now + int(expires_in)}, self.key, algorithm="ES256",
                          headers={"kid": kid})

    def logins(self) -> list[dict[str, Any]]:
        if not self.audit.exists():
            return []
        events = [json.loads(line) for line in self.audit.read_text().splitlines() if line]
        return [e for e in events if e["action"] == "authenticate"]

    def raw_login(self, credentials: SaslCredentials) -> None:
        """Log in with keg's own SASL client over TLS: LoginFailed carries the error code
        the gateway answered."""
        host, port = split_host_port(self.gateway.bootstrap)
        context = ssl.create_default_context(cafile=str(self.ca.cert_file))
        with socket.create_connection((host, port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname=host) as sock:
            login = BrokerLogin(credentials, correlation_base=1)
            request: bytes | None = login.start()
            while request is not None:
                sock.sendall(request)
                size = _read(sock, 4)
                request = login.on_response(size + _read(sock, int.from_bytes(size, "big")))


def _read(sock: ssl.SSLSocket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        assert chunk, "the gateway closed the connection"
        data += chunk
    return data


def _jwks(key: ec.EllipticCurvePrivateKey, kid: str) -> dict[str, Any]:
    public = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    return {**public, "kid": kid, "alg": "ES256", "use": "sig"}


@pytest.fixture(scope="module")
def env(kafka: EmbeddedKafka, dev_ca: DevCa,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("termination")
    users = base / "users.yaml"
    # The command users run (password on stdin), and the library call.
    subprocess.run([sys.executable, "-m", "keg", "credentials", "add", str(users), "dora"],
                   input="dora-password\n", text=True, check=True, capture_output=True)
    add_user(users, "frank", "frank-password")
    key = ec.generate_private_key(ec.SECP256R1())
    (base / "jwks.json").write_text(json.dumps({"keys": [_jwks(key, "key-1")]}))
    (base / "termination.yaml").write_text(
        "credentials: users.yaml\n"
        f"oauthbearer: {{jwks_file: jwks.json, issuer: '{ISSUER}', audience: {AUDIENCE}}}\n"
        "rate_limit: {user_failures: 3, address_failures: 1000, window_s: 300}\n")
    rules = base / "rules"
    rules.mkdir()
    (rules / "reports.yaml").write_text(RULES)
    server = dev_ca.server("gateway-termination")
    settings = GatewaySettings(
        bootstrap_servers=kafka.sasl_ssl_bootstrap, listen_port_base=0,
        work_dir=base / "work", ext_proc_log_level="WARNING", rules_dir=rules,
        audit_log=base / "audit.jsonl",
        sasl=SaslCredentials("keg", SASL_USERS["keg"], "SCRAM-SHA-512"),
        tls=ListenerTls(server.cert, server.key), upstream_tls=UpstreamTls(dev_ca.cert_file),
        sasl_termination=base / "termination.yaml")
    with Gateway(settings) as gateway:
        yield Env(gateway, dev_ca, key, base / "audit.jsonl")


def _oauth_conf(env: Env, token: str) -> dict[str, Any]:
    conf: dict[str, Any] = librdkafka_conf(env.gateway.bootstrap, env.ca)
    conf.update({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
                 "oauth_cb": lambda _config: (token, time.time() + 600)})
    return conf


def test_a_client_known_to_keg_only_produces_and_consumes(env: Env,
                                                          kafka: EmbeddedKafka) -> None:
    assert "dora" not in SASL_USERS  # the broker does not know her
    topic = create_topic(kafka.bootstrap)
    for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        conf = librdkafka_conf(env.gateway.bootstrap, env.ca,
                               sasl=(mechanism, "dora", "dora-password"))
        assert produce_records(conf, topic, 5) == [None] * 5, mechanism
    consumer = Consumer({**librdkafka_conf(env.gateway.bootstrap, env.ca,
                                           sasl=("SCRAM-SHA-512", "dora", "dora-password")),
                         "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: list[bytes | None] = []
    deadline = time.monotonic() + 30
    while len(values) < 15 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.close()
    assert len(values) == 15
    # kafka-python, too.
    producer = KafkaProducer(**kafka_python_conf(
        env.gateway.bootstrap, env.ca, sasl=("SCRAM-SHA-256", "dora", "dora-password")))
    producer.send(topic, b"kafka-python").get(timeout=30)
    producer.close()
    allowed = [e for e in env.logins() if e["outcome"] == "allowed"]
    assert {e["principal"] for e in allowed} >= {"User:dora"}
    assert {e["mechanism"] for e in allowed} >= {"PLAIN", "SCRAM-SHA-256",
                                                          "SCRAM-SHA-512"}


def test_a_jwt_signed_by_a_key_of_the_jwks_reaches_the_broker(env: Env,
                                                               kafka: EmbeddedKafka) -> None:
    topic = create_topic(kafka.bootstrap)
    assert produce_records(_oauth_conf(env, env.token("erin")), topic, 3) == [None] * 3
    assert any(e["principal"] == "User:erin" and e["outcome"] == "allowed"
               for e in env.logins())


def test_rules_see_the_principal_keg_authenticated(env: Env, kafka: EmbeddedKafka) -> None:
    topic = create_topic(kafka.bootstrap, name=f"reports.{uuid.uuid4().hex[:8]}")
    dora = librdkafka_conf(env.gateway.bootstrap, env.ca,
                           sasl=("SCRAM-SHA-512", "dora", "dora-password"))
    assert produce_records(dora, topic, 1) == [None]
    assert produce_records(_oauth_conf(env, env.token("erin")), topic, 1) \
        == ["TOPIC_AUTHORIZATION_FAILED"]


@pytest.mark.parametrize(("credentials", "reason"), [
    (SaslCredentials("dora", "wrong-password"), "invalid username or password"),
    (SaslCredentials("dora", "wrong-password", "SCRAM-SHA-512"), "invalid credentials"),
    (SaslCredentials("mallory", "whatever", "SCRAM-SHA-256"), "invalid credentials"),
])
def test_bad_passwords_get_sasl_authentication_failed(env: Env, credentials: SaslCredentials,
                                                      reason: str) -> None:
    with pytest.raises(LoginFailed) as err:
        env.raw_login(credentials)
    assert err.value.error_code == 58  # SASL_AUTHENTICATION_FAILED
    assert reason in str(err.value) and credentials.password not in str(err.value)
    denied = [e for e in env.logins() if e["outcome"] == "denied"
              and e["principal"] == f"User:{credentials.username}"]
    assert denied and denied[-1]["error_code"] == 58 and reason in denied[-1]["reason"]


@pytest.mark.parametrize(("token_args", "reason"), [
    ({"expires_in": -120}, "the token has expired"),
    ({"audience": "another-service"}, "audience is not accepted"),
    ({"kid": "key-unknown"}, "signing key is not known"),
])
def test_bad_tokens_get_sasl_authentication_failed(env: Env, token_args: dict[str, Any],
                                                   reason: str) -> None:
    token = env.token("erin", **token_args)
    with pytest.raises(LoginFailed) as err:
        env.raw_login(SaslCredentials("", token, "OAUTHBEARER"))
    assert err.value.error_code == 58 and reason in str(err.value)
    assert token not in json.dumps(env.logins())


def test_librdkafka_reports_the_refusal_and_its_message(env: Env) -> None:
    conf = librdkafka_conf(env.gateway.bootstrap, env.ca,
                           sasl=("PLAIN", "dora", "not-her-password"))
    seen: list[KafkaError] = []
    producer = Producer({**conf, "error_cb": seen.append})
    deadline = time.monotonic() + 30
    while not any(e.code() == KafkaError._AUTHENTICATION for e in seen):
        assert time.monotonic() < deadline, [str(e) for e in seen]
        producer.poll(0.2)
    del producer
    message = next(e.str() for e in seen if e.code() == KafkaError._AUTHENTICATION)
    assert "Authentication failed: invalid username or password" in message


def test_key_rotation_in_the_jwks_file(env: Env, tmp_path: Path, kafka: EmbeddedKafka) -> None:
    jwks = env.gateway.settings.sasl_termination.parent / "jwks.json"  # type: ignore[union-attr]
    new_key = ec.generate_private_key(ec.SECP256R1())
    jwks.write_text(json.dumps({"keys": [_jwks(env.key, "key-1"), _jwks(new_key, "key-2")]}))
    env.key = new_key
    topic = create_topic(kafka.bootstrap)
    assert produce_records(_oauth_conf(env, env.token("erin", kid="key-2")), topic, 1) == [None]


def test_failed_logins_are_rate_limited_per_user(env: Env) -> None:
    for _ in range(3):
        with pytest.raises(LoginFailed, match="invalid username or password"):
            env.raw_login(SaslCredentials("frank", "guess"))
    # Past the limit even the right password is refused, unchecked.
    with pytest.raises(LoginFailed, match="too many failed logins for this user") as err:
        env.raw_login(SaslCredentials("frank", "frank-password"))
    assert err.value.error_code == 58
