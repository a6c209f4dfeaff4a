"""SASL termination: the gateway authenticates Kafka clients itself, then reaches the
brokers as its own service account.

On a listener that terminates SASL (`ConnectionInfo.sasl_termination`) the client's
SaslHandshake and SaslAuthenticate never reach the broker: `SaslTerminationFilter`
answers them, checking

- PLAIN and SCRAM-SHA-256/512 against a credential file of salted, iterated keys
  (ext_proc.sasl.credentials; no password is stored),
- OAUTHBEARER JWTs against a JWKS (ext_proc.sasl.oauth: signature, expiry, issuer,
  audience, key rotation).

A refused login is answered SASL_AUTHENTICATION_FAILED with a message and the
connection serves nothing after it (as a broker, which closes it). Every attempt is
audited and counted; failures are rate-limited per client address and per user
(`FailureLimiter`): past the limit, logins are refused without being checked.

Once the client is in, the session (ext_proc.session) logs the connection in to the
broker as the service account (`UpstreamLogin`, its frames on the client's own broker
connection) and holds the client's requests until the broker said yes. Every rule
and audit event sees the principal the gateway authenticated.

Before authentication a client may only send ApiVersions (passed to the broker, which
answers it before a login as it does for every client) and SASL requests; anything
else closes the connection, as a broker's SASL listener does.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from ext_proc.connection import ConnectionInfo
from ext_proc.filters import REQUEST, BaseFilter, Direction, RequestContext
from ext_proc.identity import (
    OAUTHBEARER,
    PLAIN,
    SCRAM_MECHANISMS,
    IdentityTracker,
    SaslParseError,
    parse_oauthbearer_token,
)
from ext_proc.sasl.credentials import CredentialFileError, CredentialStore
from ext_proc.sasl.login import BrokerLogin, LoginFailed, SaslCredentials
from ext_proc.sasl.oauth import OAuthSettings, TokenRejected, TokenValidator
from ext_proc.sasl.scram import ScramError, ScramServer
from filter_rules.errors import ERROR_CODES
from kafka_wire import ApiKey
from kafka_wire.errors import FrameError

log = logging.getLogger(__name__)

SASL_AUTHENTICATION_FAILED: Final = ERROR_CODES["SASL_AUTHENTICATION_FAILED"]
UNSUPPORTED_SASL_MECHANISM: Final = ERROR_CODES["UNSUPPORTED_SASL_MECHANISM"]
ALL_MECHANISMS: Final = (PLAIN, "SCRAM-SHA-256", "SCRAM-SHA-512", OAUTHBEARER)
ALLOWED = "allowed"
DENIED = "denied"


class TerminationConfigError(ValueError):
    """A termination config that does not load; the message says where."""


class AuthenticationFailed(Exception):
    """A refused login; the message is what the client is told (and the audit says)."""


class SaslRequired(FrameError):
    """A request a client sent before authenticating (or after a refused login)."""


# -- configuration ---------------------------------------------------------------------


@dataclass(frozen=True)
class RateLimit:
    """Failed logins allowed per user and per client address in a sliding window; past
    them, logins are refused unchecked (a password is not guessed, a JWKS not hammered)."""

    user_failures: int = 5
    address_failures: int = 20
    window_s: float = 60.0


@dataclass(frozen=True)
class TerminationConfig:
    """What a terminating listener accepts (YAML, see docs/production.md)."""

    mechanisms: tuple[str, ...]
    credentials: Path | None = None
    oauth: OAuthSettings | None = None
    rate_limit: RateLimit = field(default_factory=RateLimit)

    @classmethod
    def load(cls, path: Path) -> TerminationConfig:
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as err:
            raise TerminationConfigError(f"cannot read {path}: {err.strerror}") from None
        except yaml.YAMLError:
            raise TerminationConfigError(f"{path}: not YAML") from None
        if not isinstance(data, dict):
            raise TerminationConfigError(f"{path}: expected a mapping")
        unknown = set(data) - {"mechanisms", "credentials", "oauthbearer", "rate_limit"}
        if unknown:
            raise TerminationConfigError(f"{path}: unknown keys {sorted(unknown)}")
        base = path.parent
        credentials = data.get("credentials")
        oauth = data.get("oauthbearer")
        default = [m for m in ALL_MECHANISMS if (m == OAUTHBEARER and oauth)
                   or (m != OAUTHBEARER and credentials)]
        mechanisms = data.get("mechanisms", default)
        if not isinstance(mechanisms, list) or not mechanisms or any(
                m not in ALL_MECHANISMS for m in mechanisms):
            raise TerminationConfigError(f"{path}: mechanisms: a list of "
                                         f"{', '.join(ALL_MECHANISMS)}")
        if any(m != OAUTHBEARER for m in mechanisms) and not credentials:
            raise TerminationConfigError(f"{path}: PLAIN and SCRAM need 'credentials' (a "
                                         "credential file: keg credentials add)")
        if OAUTHBEARER in mechanisms and not isinstance(oauth, dict):
            raise TerminationConfigError(f"{path}: OAUTHBEARER needs 'oauthbearer' "
                                         "(jwks_file or jwks_url, issuer, audience)")
        settings = None
        if isinstance(oauth, dict):
            allowed = {"jwks_file", "jwks_url", "issuer", "audience", "principal_claim",
                       "leeway_s", "jwks_cache_s"}
            if set(oauth) - allowed:
                raise TerminationConfigError(f"{path}: oauthbearer: unknown keys "
                                             f"{sorted(set(oauth) - allowed)}")
            try:
                settings = OAuthSettings(**{**oauth, "jwks_file": base / oauth["jwks_file"]}
                                         if "jwks_file" in oauth else oauth)
            except (TypeError, ValueError) as err:
                raise TerminationConfigError(f"{path}: oauthbearer: {err}") from None
        limit = data.get("rate_limit") or {}
        try:
            rate_limit = RateLimit(**limit)
        except TypeError:
            raise TerminationConfigError(f"{path}: rate_limit: user_failures, "
                                         "address_failures, window_s") from None
        return cls(tuple(mechanisms), base / credentials if credentials else None, settings,
                   rate_limit)


# -- the process-wide authenticator -------------------------------------------------------


class FailureLimiter:
    """Failed logins per key (a client address, a user name) in a sliding window."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, key: str) -> deque[float]:
        now = self._clock()
        failures = self._failures.setdefault(key, deque())
        while failures and failures[0] <= now - self.limit.window_s:
            failures.popleft()
        if not failures:
            del self._failures[key]
            return deque()
        return failures

    def blocked(self, key: str, limit: int) -> bool:
        return len(self._recent(key)) >= limit

    def failed(self, *keys: str) -> None:
        now = self._clock()
        for key in keys:
            self._failures.setdefault(key, deque()).append(now)


@dataclass(frozen=True)
class Attempt:
    """One login attempt, as audited: never a password or token."""

    conn: ConnectionInfo
    mechanism: str
    user: str | None
    outcome: str
    reason: str | None = None
    client_id: str | None = None


class Authenticator:
    """What every terminating connection shares: the users, the token validator, the
    rate limiter, the service account and where attempts are reported."""

    def __init__(self, config: TerminationConfig, service: SaslCredentials,
                 on_attempt: Callable[[Attempt], None] | None = None) -> None:
        self.config = config
        self.service = service
        try:
            self.credentials = (CredentialStore(config.credentials)
                                if config.credentials is not None else None)
        except CredentialFileError as err:
            raise TerminationConfigError(str(err)) from None
        self.tokens = TokenValidator(config.oauth) if config.oauth is not None else None
        self.limiter = FailureLimiter(config.rate_limit)
        self.on_attempt = on_attempt or (lambda attempt: None)

    def exchange(self, mechanism: str) -> _Exchange:
        if mechanism == PLAIN:
            return _Plain(self)
        if mechanism in SCRAM_MECHANISMS:
            return _Scram(self, mechanism)
        return _OAuth(self)


class _Exchange:
    """One client login; `step(bytes)` -> (challenge, principal name once done)."""

    user: str | None = None

    def step(self, data: bytes) -> tuple[bytes, str | None]:
        raise NotImplementedError


class _Plain(_Exchange):
    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    def step(self, data: bytes) -> tuple[bytes, str | None]:
        parts = data.split(b"\0")
        if len(parts) != 3 or not parts[1]:
            raise AuthenticationFailed("malformed PLAIN credentials")
        try:
            authzid, user = parts[0].decode(), parts[1].decode()
            password = parts[2].decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("PLAIN credentials are not UTF-8") from None
        self.user = user
        if authzid and authzid != user:
            raise AuthenticationFailed("authorization id differs from the user")
        _check_limit(self.auth, user)
        store = self.auth.credentials
        if store is None or not store.check_password(user, password):
            raise AuthenticationFailed("invalid username or password")
        return b"", user


class _Scram(_Exchange):
    def __init__(self, auth: Authenticator, mechanism: str) -> None:
        self.auth = auth
        store = auth.credentials

        def lookup(mech: str, user: str) -> Any:
            _check_limit(auth, user)
            return store.lookup(mech, user) if store is not None else None

        self.server = ScramServer(mechanism, lookup)
        self.first = True

    def step(self, data: bytes) -> tuple[bytes, str | None]:
        try:
            if self.first:
                self.first = False
                try:
                    return self.server.first(data), None
                finally:
                    self.user = self.server.username
            return self.server.final(data), self.server.username
        except ScramError as err:
            raise AuthenticationFailed(str(err)) from None


class _OAuth(_Exchange):
    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    def step(self, data: bytes) -> tuple[bytes, str | None]:
        assert self.auth.tokens is not None
        try:
            authzid, token = parse_oauthbearer_token(data)
        except SaslParseError as err:
            raise AuthenticationFailed(str(err)) from None
        try:
            subject = self.auth.tokens.principal(token)
        except TokenRejected as err:
            raise AuthenticationFailed(str(err)) from None
        self.user = subject
        if authzid and authzid != subject:
            raise AuthenticationFailed("authorization id differs from the token's principal")
        return b"", subject


def _check_limit(auth: Authenticator, user: str) -> None:
    if auth.limiter.blocked(f"user:{user}", auth.config.rate_limit.user_failures):
        raise AuthenticationFailed("too many failed logins for this user: retry later")


# -- one connection -----------------------------------------------------------------------


class UpstreamLogin:
    """The service account's login on one broker connection, once the client is in."""

    def __init__(self, credentials: SaslCredentials) -> None:
        self._login = BrokerLogin(credentials, client_id="keg-gateway")
        self.started = False

    @property
    def done(self) -> bool:
        return self._login.done

    def start(self) -> bytes:
        self.started = True
        return self._login.start()

    def expects(self, correlation_id: int) -> bool:
        return self.started and self._login.expects(correlation_id)

    def on_response(self, frame: bytes) -> bytes | None:
        """The next login request, or None once done; LoginFailed if refused."""
        return self._login.on_response(frame)


class TerminationState:
    """A terminating connection: who the gateway let in, and its broker login."""

    def __init__(self, auth: Authenticator, identity: IdentityTracker,
                 conn: ConnectionInfo) -> None:
        self.auth = auth
        self.identity = identity
        self.conn = conn
        self.mechanism: str | None = None
        self.exchange: _Exchange | None = None
        self.authenticated = False
        self.refused = False
        self.upstream = UpstreamLogin(auth.service)

    @property
    def login_due(self) -> bool:
        """The client is in and the broker connection is not logged in yet."""
        return self.authenticated and not self.upstream.started

    @property
    def login_pending(self) -> bool:
        """The service account's login is under way: client bytes must wait."""
        return self.upstream.started and not self.upstream.done


class SaslTerminationFilter(BaseFilter):
    """Answers the client's SASL requests; first in a terminating connection's chain."""

    dynamic = True  # wants everything until the client is in

    def __init__(self, state: TerminationState) -> None:
        self.state = state

    def wants(self, api_key: int, api_version: int, direction: Direction) -> bool:
        if direction != REQUEST:
            return False
        if api_key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
            return True
        return not self.state.authenticated and api_key != ApiKey.API_VERSIONS

    def on_request(self, ctx: RequestContext) -> None:
        state = self.state
        api_key = ctx.header.api_key
        if state.refused:
            raise SaslRequired("request after a refused SASL login")
        if api_key == ApiKey.SASL_HANDSHAKE:
            self._handshake(ctx)
        elif api_key == ApiKey.SASL_AUTHENTICATE:
            self._authenticate(ctx)
        else:
            raise SaslRequired(f"request (api {api_key}) before SASL authentication")

    def _handshake(self, ctx: RequestContext) -> None:
        if ctx.header.api_version == 0:
            # v0 is followed by raw SASL tokens, not Kafka frames.
            raise SaslRequired("SaslHandshake v0 is not supported by SASL termination")
        mechanisms = list(self.state.auth.config.mechanisms)
        mechanism = ctx.body.get("Mechanism")
        if mechanism not in mechanisms:
            ctx.answer({"ErrorCode": UNSUPPORTED_SASL_MECHANISM, "Mechanisms": mechanisms})
            return
        self.state.mechanism = mechanism
        self.state.exchange = self.state.auth.exchange(mechanism)
        ctx.answer({"ErrorCode": 0, "Mechanisms": mechanisms})

    def _authenticate(self, ctx: RequestContext) -> None:
        state = self.state
        exchange, mechanism = state.exchange, state.mechanism
        if exchange is None or mechanism is None:
            raise SaslRequired("SaslAuthenticate without a SaslHandshake")
        host_key = f"host:{ctx.conn.client_host}"
        try:
            if state.auth.limiter.blocked(host_key, state.auth.config.rate_limit.address_failures):
                raise AuthenticationFailed("too many failed logins from this address: "
                                           "retry later")
            challenge, name = exchange.step(bytes(ctx.body.get("AuthBytes") or b""))
        except AuthenticationFailed as err:
            keys = [host_key] + ([f"user:{exchange.user}"] if exchange.user else [])
            state.auth.limiter.failed(*keys)
            state.refused = True
            state.exchange = None
            state.auth.on_attempt(Attempt(ctx.conn, mechanism, exchange.user, DENIED,
                                          str(err), ctx.header.client_id))
            ctx.answer(_authenticate_answer(SASL_AUTHENTICATION_FAILED,
                                            f"Authentication failed: {err}"))
            return
        if name is not None:
            if state.authenticated and state.identity.principal != f"User:{name}":
                # KIP-368: a re-authentication may not change the principal.
                state.refused = True
                ctx.answer(_authenticate_answer(SASL_AUTHENTICATION_FAILED,
                                                "Authentication failed: re-authentication "
                                                "may not change the principal"))
                return
            state.exchange = None
            state.authenticated = True
            state.identity.authenticated_by_gateway(mechanism, name)
            state.auth.on_attempt(Attempt(ctx.conn, mechanism, name, ALLOWED,
                                          client_id=ctx.header.client_id))
        ctx.answer(_authenticate_answer(0, None, challenge))


def _authenticate_answer(error: int, message: str | None,
                         challenge: bytes = b"") -> dict[str, Any]:
    # SessionLifetimeMs 0: the gateway asks for no re-authentication (KIP-368).
    return {"ErrorCode": error, "ErrorMessage": message, "AuthBytes": challenge,
            "SessionLifetimeMs": 0}


__all__ = [
    "ALL_MECHANISMS",
    "Attempt",
    "AuthenticationFailed",
    "Authenticator",
    "FailureLimiter",
    "LoginFailed",
    "RateLimit",
    "SaslRequired",
    "SaslTerminationFilter",
    "TerminationConfig",
    "TerminationConfigError",
    "TerminationState",
    "UpstreamLogin",
]
