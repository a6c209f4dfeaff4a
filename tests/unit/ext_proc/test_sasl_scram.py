"""SCRAM both ways (RFC 5802/7677 vectors, client against server), and keg's broker login
as Kafka frames."""

from __future__ import annotations

import base64

import pytest

import kafka_wire
from ext_proc.sasl.login import BrokerLogin, LoginFailed, SaslCredentials
from ext_proc.sasl.scram import ScramClient, ScramCredential, ScramError, ScramServer
from kafka_wire import ApiKey


def test_rfc7677_sha256_vector() -> None:
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert client.final(server_first) == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    client.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")


def _server(credential: ScramCredential, nonce: str = "server-nonce",
            user: str = "alice") -> ScramServer:
    return ScramServer(credential.mechanism,
                       lambda mechanism, name: credential if name == user else None,
                       nonce=nonce)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_client_and_server_agree_and_the_server_keeps_no_password(mechanism: str) -> None:
    credential = ScramCredential.derive(mechanism, "s3cret")
    assert b"s3cret" not in repr(credential).encode()
    server, client = _server(credential), ScramClient(mechanism, "alice", "s3cret")
    final = server.final(client.final(server.first(client.first())))
    client.verify(final)
    assert server.username == "alice"
    assert credential.matches_password("s3cret") and not credential.matches_password("x")


def test_a_wrong_password_or_unknown_user_fails_with_a_fixed_message() -> None:
    credential = ScramCredential.derive("SCRAM-SHA-256", "right")
    server, client = _server(credential), ScramClient("SCRAM-SHA-256", "alice", "wrong")
    server_first = server.first(client.first())
    with pytest.raises(ScramError, match="invalid credentials") as err:
        server.final(client.final(server_first))
    assert "wrong" not in str(err.value)
    with pytest.raises(ScramError, match="invalid credentials"):
        _server(credential).first(ScramClient("SCRAM-SHA-256", "mallory", "x").first())


def test_a_server_that_does_not_know_the_password_is_caught_by_the_client() -> None:
    real = ScramCredential.derive("SCRAM-SHA-256", "pw")
    client = ScramClient("SCRAM-SHA-256", "alice", "pw")
    server_first = _server(real).first(client.first())
    client.final(server_first)
    with pytest.raises(ScramError, match="signature is wrong"):
        client.verify(b"v=" + base64.b64encode(b"x" * 32))


def test_delegation_tokens_and_channel_binding_are_refused() -> None:
    server = _server(ScramCredential.derive("SCRAM-SHA-256", "pw"))
    with pytest.raises(ScramError, match="delegation tokens"):
        server.first(b"n,,n=alice,r=abc,tokenauth=true")
    with pytest.raises(ScramError, match="channel binding"):
        _server(ScramCredential.derive("SCRAM-SHA-256", "pw")).first(b"y,,n=alice,r=abc")


class FakeBroker:
    """Answers keg's login frames as a broker with `credential` for user alice would."""

    def __init__(self, mechanism: str, credential: ScramCredential | None = None,
                 password: str = "pw", user: str = "alice") -> None:
        self.mechanism, self.password = mechanism, password
        self.scram = _server(credential, user=user) if credential is not None else None
        self.steps = 0

    def answer(self, frame: bytes) -> bytes:
        header, body = kafka_wire.decode_request(memoryview(frame)[4:])
        if header.api_key == ApiKey.SASL_HANDSHAKE:
            error = 0 if body["Mechanism"] == self.mechanism else 33
            reply = {"ErrorCode": error, "Mechanisms": [self.mechanism]}
        else:
            self.steps += 1
            data = bytes(body["AuthBytes"])
            reply = {"ErrorCode": 0, "ErrorMessage": None, "AuthBytes": b"",
                     "SessionLifetimeMs": 0}
            if self.scram is not None:
                try:
                    reply["AuthBytes"] = (self.scram.first(data) if self.steps == 1
                                          else self.scram.final(data))
                except ScramError as err:
                    reply.update(ErrorCode=58, ErrorMessage=str(err))
            elif data.split(b"\0")[-1] != self.password.encode():
                reply.update(ErrorCode=58, ErrorMessage="Invalid username or password")
        return kafka_wire.encode_response(header.correlation_id, header.api_key,
                                          header.api_version, reply)


def _log_in(login: BrokerLogin, broker: FakeBroker) -> int:
    request: bytes | None = login.start()
    frames = 0
    while request is not None:
        frames += 1
        answer = broker.answer(request)
        assert login.expects(int.from_bytes(answer[4:8], "big", signed=True))
        request = login.on_response(answer)
    return frames


def test_broker_login_scram_plain_and_refusals() -> None:
    credential = ScramCredential.derive("SCRAM-SHA-512", "pw")
    login = BrokerLogin(SaslCredentials("alice", "pw", "SCRAM-SHA-512"))
    assert _log_in(login, FakeBroker("SCRAM-SHA-512", credential)) == 3 and login.done
    assert _log_in(BrokerLogin(SaslCredentials("alice", "pw")), FakeBroker("PLAIN")) == 2
    with pytest.raises(LoginFailed, match="Invalid username or password") as err:
        _log_in(BrokerLogin(SaslCredentials("alice", "nope")), FakeBroker("PLAIN"))
    assert "nope" not in str(err.value)
    with pytest.raises(LoginFailed, match="does not accept SASL PLAIN"):
        _log_in(BrokerLogin(SaslCredentials("alice", "pw")), FakeBroker("SCRAM-SHA-256"))
    assert "pw" not in repr(SaslCredentials("alice", "pw"))


def test_broker_login_oauthbearer_sends_the_token_and_follows_an_error_challenge() -> None:
    sent: list[bytes] = []

    def answer(frame: bytes, challenge: bytes, error: int) -> bytes:
        header, body = kafka_wire.decode_request(memoryview(frame)[4:])
        if header.api_key == ApiKey.SASL_HANDSHAKE:
            reply: dict[str, object] = {"ErrorCode": 0, "Mechanisms": ["OAUTHBEARER"]}
        else:
            sent.append(bytes(body["AuthBytes"]))
            reply = {"ErrorCode": error, "ErrorMessage": "invalid_token" if error else None,
                     "AuthBytes": challenge, "SessionLifetimeMs": 0}
        return kafka_wire.encode_response(header.correlation_id, header.api_key,
                                          header.api_version, reply)

    login = BrokerLogin(SaslCredentials("", "a.b.c", "OAUTHBEARER"))
    request = login.on_response(answer(login.start(), b"", 0))
    assert request is not None and login.on_response(answer(request, b"", 0)) is None
    assert login.done and sent == [b"n,,\x01auth=Bearer a.b.c\x01\x01"]
    refused = BrokerLogin(SaslCredentials("", "a.b.c", "OAUTHBEARER"))
    request = refused.on_response(answer(refused.start(), b"", 0))
    assert request is not None
    request = refused.on_response(answer(request, b'{"status":"invalid_token"}', 0))
    assert request is not None  # RFC 7628: the client answers the error with 0x01
    with pytest.raises(LoginFailed, match="invalid_token") as err:
        refused.on_response(answer(request, b"", 58))
    assert err.value.error_code == 58 and sent[-1] == b"\x01"
