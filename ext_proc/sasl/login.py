"""keg logging in to a broker over SASL, as Kafka frames (sans-IO).

`BrokerLogin` is one login: `start()` gives the SaslHandshake request frame, each
broker answer fed to `on_response()` gives the next request frame (SaslAuthenticate
steps) until the login is done. It serves the control plane's broker discovery
(over a socket of its own) and the gateway's service account when it terminates
clients' SASL (the login's frames ride the client's broker connection, see
ext_proc.session).

Mechanisms: PLAIN, SCRAM-SHA-256/512 (the broker's signature is verified) and
OAUTHBEARER (the "password" is the bearer token). Errors are `LoginFailed`, whose
message is the broker's or a fixed text, never a credential.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import kafka_wire
from ext_proc.identity import OAUTHBEARER, PLAIN, SCRAM_MECHANISMS
from ext_proc.sasl.scram import ScramClient, ScramError
from kafka_wire import ApiKey

MECHANISMS: Final = (PLAIN, "SCRAM-SHA-256", "SCRAM-SHA-512", OAUTHBEARER)
_HANDSHAKE_VERSION: Final = 1
_AUTHENTICATE_VERSION: Final = 1
# Correlation ids of keg's own requests on a client's connection: far from the small,
# increasing ids clients use, so a login answer is never taken for a client's.
LOGIN_CORRELATION_BASE: Final = -0x4B450000


class LoginFailed(Exception):
    """The broker refused the login (or did not speak SASL as expected); `error_code`
    is the broker's Kafka error code when it answered with one."""

    def __init__(self, message: str, error_code: int | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass(frozen=True)
class SaslCredentials:
    """A SASL login: never logged (repr hides the secret). For OAUTHBEARER `password`
    is the bearer token and `username` is informational."""

    username: str
    password: str = field(repr=False)
    mechanism: str = PLAIN

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"SASL mechanism must be one of {', '.join(MECHANISMS)}, "
                             f"not {self.mechanism!r}")


def oauthbearer_initial_response(token: str) -> bytes:
    """RFC 7628's client initial response carrying `token`."""
    return f"n,,\x01auth=Bearer {token}\x01\x01".encode()


class BrokerLogin:
    """One SASL login to a broker; see the module docstring."""

    def __init__(self, credentials: SaslCredentials, client_id: str = "keg",
                 correlation_base: int = LOGIN_CORRELATION_BASE) -> None:
        self.credentials = credentials
        self.client_id = client_id
        self._next_id = correlation_base
        self._expected: int | None = None
        self._expected_api = ApiKey.SASL_HANDSHAKE
        self._scram: ScramClient | None = None
        self._steps = 0
        self.done = False
        self.session_lifetime_ms = 0

    def __repr__(self) -> str:
        return f"BrokerLogin({self.credentials!r}, done={self.done})"

    def _request(self, api_key: ApiKey, version: int, body: dict[str, object]) -> bytes:
        correlation_id = self._next_id
        self._next_id += 1
        self._expected, self._expected_api = correlation_id, api_key
        return kafka_wire.encode_request(
            kafka_wire.RequestHeader(api_key, version, correlation_id, self.client_id, {}),
            body)

    def start(self) -> bytes:
        """The SaslHandshake request frame (size prefix included)."""
        return self._request(ApiKey.SASL_HANDSHAKE, _HANDSHAKE_VERSION,
                             {"Mechanism": self.credentials.mechanism})

    def expects(self, correlation_id: int) -> bool:
        """Whether a broker answer with this correlation id is this login's."""
        return not self.done and correlation_id == self._expected

    def on_response(self, frame: bytes | memoryview) -> bytes | None:
        """A whole answer frame (size prefix included); the next request frame, or None
        once the login is done. LoginFailed when the broker refused it."""
        api_key = self._expected_api
        version = _HANDSHAKE_VERSION if api_key == ApiKey.SASL_HANDSHAKE else _AUTHENTICATE_VERSION
        try:
            correlation_id, body = kafka_wire.decode_response(memoryview(frame)[4:], api_key,
                                                              version)
        except kafka_wire.KafkaWireError as err:
            raise LoginFailed(f"unreadable SASL answer from the broker: {err}") from None
        if correlation_id != self._expected:
            raise LoginFailed("the broker answered another request than keg's login")
        if api_key == ApiKey.SASL_HANDSHAKE:
            return self._after_handshake(body)
        return self._after_authenticate(body)

    def _after_handshake(self, body: dict[str, object]) -> bytes:
        if body.get("ErrorCode"):
            raise LoginFailed(f"the broker does not accept SASL {self.credentials.mechanism} "
                              f"(error {body.get('ErrorCode')}); it offers "
                              f"{body.get('Mechanisms')}")
        return self._authenticate(self._first_token())

    def _first_token(self) -> bytes:
        creds = self.credentials
        if creds.mechanism == PLAIN:
            return b"\0" + creds.username.encode() + b"\0" + creds.password.encode()
        if creds.mechanism in SCRAM_MECHANISMS:
            self._scram = ScramClient(creds.mechanism, creds.username, creds.password)
            return self._scram.first()
        return oauthbearer_initial_response(creds.password)

    def _authenticate(self, token: bytes) -> bytes:
        self._steps += 1
        return self._request(ApiKey.SASL_AUTHENTICATE, _AUTHENTICATE_VERSION, {"AuthBytes": token})

    def _after_authenticate(self, body: dict[str, object]) -> bytes | None:
        creds = self.credentials
        if body.get("ErrorCode"):
            message = body.get("ErrorMessage") or f"error {body.get('ErrorCode')}"
            raise LoginFailed(f"SASL {creds.mechanism} login as {creds.username!r} refused: "
                              f"{message}", int(body["ErrorCode"]))  # type: ignore[call-overload]
        challenge = bytes(body.get("AuthBytes") or b"")  # type: ignore[call-overload]
        lifetime = body.get("SessionLifetimeMs")
        if isinstance(lifetime, int):
            self.session_lifetime_ms = lifetime
        try:
            if self._scram is not None and self._steps == 1:
                return self._authenticate(self._scram.final(challenge))
            if self._scram is not None:
                self._scram.verify(challenge)
        except ScramError as err:
            raise LoginFailed(str(err)) from None
        if creds.mechanism == OAUTHBEARER and challenge:
            # RFC 7628: an error challenge; the broker fails the login at the next step.
            if self._steps == 1:
                return self._authenticate(b"\x01")
            raise LoginFailed("the broker refused the OAUTHBEARER token")
        self.done = True
        self._expected = None
        return None


__all__ = [
    "LOGIN_CORRELATION_BASE",
    "MECHANISMS",
    "BrokerLogin",
    "LoginFailed",
    "SaslCredentials",
    "oauthbearer_initial_response",
]
