"""SASL termination without a network: a terminating KafkaSession between a client and a
fake broker that knows keg's service account only, both streams split at every offset;
the rate limiter; the config and credential files' errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kafka_wire
from ext_proc.connection import ConnectionInfo
from ext_proc.identity import IdentityTracker
from ext_proc.sasl.credentials import CredentialFileError, CredentialStore, add_user
from ext_proc.sasl.login import SaslCredentials
from ext_proc.sasl.scram import ScramCredential
from ext_proc.sasl.termination import (
    Attempt,
    Authenticator,
    FailureLimiter,
    RateLimit,
    SaslTerminationFilter,
    TerminationConfig,
    TerminationConfigError,
    TerminationState,
)
from ext_proc.session import KafkaSession, ProtocolViolation
from kafka_wire import ApiKey
from tests.unit.ext_proc.test_sasl_scram import FakeBroker

CONN = ConnectionInfo(client_host="10.0.0.9", gateway_address="gw:19092",
                      routes={1: ("gw", 19092)}, sasl_termination=True)
SERVICE = SaslCredentials("keg", "service-pw", "SCRAM-SHA-512")


def request(api_key: int, version: int, correlation_id: int, body: dict[str, Any]) -> bytes:
    return kafka_wire.encode_request(
        kafka_wire.RequestHeader(api_key, version, correlation_id, "client", {}), body)


def frames(data: bytes) -> list[bytes]:
    out = []
    while data:
        size = int.from_bytes(data[:4], "big") + 4
        out.append(data[:size])
        data = data[size:]
    return out


@pytest.fixture
def authenticator(tmp_path: Path) -> Authenticator:
    users = tmp_path / "users.yaml"
    add_user(users, "dora", "dora-pw")
    (tmp_path / "t.yaml").write_text("credentials: users.yaml\n"
                                     "rate_limit: {user_failures: 2}\n")
    attempts: list[Attempt] = []
    auth = Authenticator(TerminationConfig.load(tmp_path / "t.yaml"), SERVICE, attempts.append)
    auth.attempts = attempts  # type: ignore[attr-defined]
    return auth


def terminating_session(auth: Authenticator) -> KafkaSession:
    identity = IdentityTracker()
    state = TerminationState(auth, identity, CONN)
    return KafkaSession(CONN, [SaslTerminationFilter(state)], termination=state)


CLIENT = b"".join([
    request(ApiKey.API_VERSIONS, 3, 1, {"ClientSoftwareName": "t", "ClientSoftwareVersion": "1"}),
    request(ApiKey.SASL_HANDSHAKE, 1, 2, {"Mechanism": "PLAIN"}),
    request(ApiKey.SASL_AUTHENTICATE, 2, 3, {"AuthBytes": b"\0dora\0dora-pw"}),
    request(ApiKey.METADATA, 12, 4, {"Topics": None, "AllowAutoTopicCreation": False,
                              "IncludeTopicAuthorizedOperations": False}),
])


def broker_exchange(session: KafkaSession, client_bytes: bytes,
                    cut: int) -> tuple[list[bytes], bytes]:
    """Run the client's bytes (split at `cut`) through `session` against a broker that
    knows only keg's service account; (frames the broker got, bytes the client got)."""
    broker = FakeBroker("SCRAM-SHA-512", ScramCredential.derive("SCRAM-SHA-512",
                                                                SERVICE.password), user="keg")
    to_broker = session.from_client(client_bytes[:cut]) + session.from_client(
        client_bytes[cut:])
    to_client = session.take_client_bytes()
    received: list[bytes] = []
    pending = frames(to_broker)
    while pending:
        frame = pending.pop(0)
        received.append(frame)
        header, _ = kafka_wire.decode_request(memoryview(frame)[4:])
        if header.api_key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
            answer = broker.answer(frame)
        elif header.api_key == ApiKey.API_VERSIONS:
            answer = kafka_wire.encode_response(header.correlation_id, ApiKey.API_VERSIONS, 3, {
                "ErrorCode": 0, "ApiKeys": [], "ThrottleTimeMs": 0})
        else:
            answer = kafka_wire.encode_response(header.correlation_id, ApiKey.METADATA, 12, {
                "Brokers": [], "ClusterId": "c", "ControllerId": 1, "Topics": []})
        to_client += session.from_broker(answer)
        pending += frames(session.take_broker_bytes())
    return received, to_client


@pytest.mark.parametrize("cut", range(0, len(CLIENT) + 1, 7))
def test_the_client_logs_in_at_the_gateway_and_the_broker_sees_keg(
        authenticator: Authenticator, cut: int) -> None:
    received, to_client = broker_exchange(terminating_session(authenticator), CLIENT, cut)
    keys = [kafka_wire.decode_request(memoryview(f)[4:])[0].api_key for f in received]
    # ApiVersions passes; keg's own login (handshake, two SCRAM steps); then Metadata.
    assert keys == [ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE,
                    ApiKey.SASL_AUTHENTICATE, ApiKey.METADATA]
    assert all(b"dora" not in f for f in received)
    answers = [int.from_bytes(f[4:8], "big") for f in frames(to_client)]
    assert answers == [1, 2, 3, 4]  # the client's own answers, in its order
    assert [a.outcome for a in authenticator.attempts] == ["allowed"]  # type: ignore[attr-defined]


def test_a_refused_login_is_answered_then_nothing_else_is_served(
        authenticator: Authenticator) -> None:
    session = terminating_session(authenticator)
    out = session.from_client(request(ApiKey.SASL_HANDSHAKE, 1, 1, {"Mechanism": "SCRAM-SHA-256"})
                              + request(ApiKey.SASL_AUTHENTICATE, 2, 2,
                                        {"AuthBytes": b"\0dora\0wrong"}))
    assert out == b""
    answers = frames(session.take_client_bytes())
    _, handshake = kafka_wire.decode_response(memoryview(answers[0])[4:], ApiKey.SASL_HANDSHAKE, 1)
    assert handshake["Mechanisms"] == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    with pytest.raises(ProtocolViolation, match="before SASL authentication"):
        terminating_session(authenticator).from_client(
            request(ApiKey.METADATA, 12, 1, {"Topics": None, "AllowAutoTopicCreation": False,
                                      "IncludeTopicAuthorizedOperations": False}))


def test_wrong_passwords_then_the_user_is_locked_out(authenticator: Authenticator) -> None:
    def login(password: bytes) -> dict[str, Any]:
        session = terminating_session(authenticator)
        session.from_client(request(ApiKey.SASL_HANDSHAKE, 1, 1, {"Mechanism": "PLAIN"})
                            + request(ApiKey.SASL_AUTHENTICATE, 2, 2,
                                      {"AuthBytes": b"\0dora\0" + password}))
        answer = frames(session.take_client_bytes())[1]
        return kafka_wire.decode_response(memoryview(answer)[4:], ApiKey.SASL_AUTHENTICATE, 2)[1]

    for _ in range(2):
        assert login(b"nope")["ErrorMessage"] == \
            "Authentication failed: invalid username or password"
    locked = login(b"dora-pw")
    assert locked["ErrorCode"] == 58 and "too many failed logins" in locked["ErrorMessage"]


def test_the_limiter_forgets_failures_after_its_window() -> None:
    now = [0.0]
    limiter = FailureLimiter(RateLimit(window_s=10), clock=lambda: now[0])
    limiter.failed("host:a")
    limiter.failed("host:a")
    assert limiter.blocked("host:a", 2) and not limiter.blocked("host:b", 2)
    now[0] = 10.5
    assert not limiter.blocked("host:a", 2)


def test_config_and_credential_errors_say_where(tmp_path: Path) -> None:
    config = tmp_path / "t.yaml"
    config.write_text("mechanisms: [PLAIN]\n")
    with pytest.raises(TerminationConfigError, match="PLAIN and SCRAM need 'credentials'"):
        TerminationConfig.load(config)
    config.write_text("mechanisms: [OAUTHBEARER]\n")
    with pytest.raises(TerminationConfigError, match="OAUTHBEARER needs 'oauthbearer'"):
        TerminationConfig.load(config)
    config.write_text("mechanisms: [GSSAPI]\n")
    with pytest.raises(TerminationConfigError, match="mechanisms"):
        TerminationConfig.load(config)
    users = tmp_path / "users.yaml"
    users.write_text("users:\n  dora:\n    SCRAM-SHA-256: {salt: '!!', iterations: 4096, "
                     "stored_key: a, server_key: b}\n")
    with pytest.raises(CredentialFileError, match=r"users\.dora\.SCRAM-SHA-256\.salt"):
        CredentialStore(users)


def test_a_credential_file_keeps_no_password_and_reloads_on_change(tmp_path: Path) -> None:
    users = tmp_path / "users.yaml"
    add_user(users, "dora", "first-pw")
    store = CredentialStore(users)
    assert store.check_password("dora", "first-pw")
    assert b"first-pw" not in users.read_bytes() and oct(users.stat().st_mode)[-3:] == "600"
    add_user(users, "dora", "second-pw")
    assert store.check_password("dora", "second-pw") and not store.check_password(
        "dora", "first-pw")
    users.write_text("users: [broken")  # a broken edit keeps the last good users
    assert store.check_password("dora", "second-pw")
