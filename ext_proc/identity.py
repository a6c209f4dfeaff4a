"""Who is on a connection: the principal a broker will attribute its requests to.

KIP-590 names the facts a broker knows about a request's sender (principal, client
id, client address, listener, security protocol); this module learns the first of
them from the SASL exchange, which the gateway can read because SaslHandshake (17)
and SaslAuthenticate (36) are ordinary Kafka frames (KIP-152), and whose
SaslAuthenticate responses say whether the broker accepted (ErrorCode 0).

`IdentityTracker` is pure and per connection: the data path feeds it the decoded
SASL requests and responses and every request header's client id. A name read from
the client's bytes is only a *candidate* until the broker answers; it becomes the
principal only when authentication succeeds, and a failure leaves User:ANONYMOUS.

What the gateway can and cannot know
------------------------------------
* PLAIN (``authzid NUL authcid NUL passwd``): the principal is the authcid. Only the
  authcid is ever copied out of the bytes; the password is never decoded, stored or
  logged, and no reference to the auth bytes is kept.
* SCRAM-SHA-256/512: the principal is the client-first-message's username
  (``n,[a=authzid],n=<user>,r=<nonce>``), with ``=2C``/``=3D`` unescaped. The
  client-final message (a proof) is not read. Authentication completes with the
  server-final message (``v=...``), not with the server-first one. A delegation-token
  login (``tokenauth=true`` extension) authenticates the token's *owner*, whom only
  the broker knows: the principal stays ANONYMOUS and `opaque_token` is set.
* OAUTHBEARER (RFC 7628, ``n,,\\x01auth=Bearer <token>\\x01...\\x01\\x01``): if the
  token is a JWT, the principal is its ``sub`` claim (`oauth_principal_claim`), read
  from the base64url payload WITHOUT verifying the signature: the broker verifies
  the token (and rejects the login if it is bad); the gateway only reads it, after
  the broker said yes. A token that is not a JWT is opaque: ANONYMOUS, with
  `opaque_token` set. The token itself is never stored.
* GSSAPI (Kerberos) and other mechanisms are opaque tokens: the principal is
  ``User:unknown`` once authenticated. GSSAPI takes several round trips whose last
  one is not recognisable from outside, so every accepted step counts as
  authenticated (as User:unknown) while the exchange stays open: a later failure
  still makes the connection ANONYMOUS again. No request but SASL ones is served
  before the exchange completes, so the early flag attributes nothing wrongly.

The principal is Kafka's ``Type:name`` form as DefaultKafkaPrincipalBuilder builds
it; a broker with a custom ``principal.builder.class`` (or Kerberos name rules) may
attribute the connection differently.

Security protocol: on a TLS listener Envoy terminates TLS and tells the data path so
(`ConnectionInfo.tls`): ``SSL``, or ``SASL_SSL`` once a SaslHandshake passed; on a
plaintext listener ``PLAINTEXT`` / ``SASL_PLAINTEXT``.

Mutual TLS: a client certificate names a principal (its subject mapped through
Kafka's ssl.principal.mapping.rules, ext_proc.tls_principal), which holds until a SASL
exchange authenticates another one, as on a broker's SASL_SSL listener, where the SASL
principal wins.

Malformed SASL bytes never raise: the principal stays ANONYMOUS and `reason` says
why (reasons are fixed texts and never quote the client's bytes).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any

from kafka_wire import ApiKey
from kafka_wire.envelope import Principal

ANONYMOUS = "User:ANONYMOUS"
UNKNOWN_NAME = "unknown"
UNKNOWN = f"User:{UNKNOWN_NAME}"

PLAIN = "PLAIN"
SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
OAUTHBEARER = "OAUTHBEARER"
GSSAPI = "GSSAPI"
SCRAM_MECHANISMS = frozenset({SCRAM_SHA_256, SCRAM_SHA_512})

# Kafka's default sasl.server.max.receive.size: bigger auth bytes are not parsed.
MAX_AUTH_BYTES = 512 * 1024

_IN_PROGRESS = "authentication in progress"
_JWT_PART = re.compile(r"[-_A-Za-z0-9]*\Z")
_BEARER = re.compile(r"([A-Za-z0-9_]+) +([-_.A-Za-z0-9]+)\Z")


class SaslParseError(Exception):
    """Auth bytes that do not parse; the message is a fixed text, never the bytes."""


# -- mechanism parsers (pure; the message of every SaslParseError is safe to log) ---------


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        # The exception object holds the whole input: never let it escape.
        raise SaslParseError(f"{what} is not UTF-8") from None


def parse_plain(data: bytes) -> str:
    """PLAIN's authcid (RFC 4616: ``[authzid] NUL authcid NUL passwd``).

    The password is neither copied nor decoded: only the bytes between the two NULs
    are sliced out.
    """
    first = data.find(b"\0")
    second = data.find(b"\0", first + 1) if first >= 0 else -1
    if second < 0:
        raise SaslParseError("PLAIN auth bytes lack the two NUL separators")
    authcid = _utf8(data[first + 1 : second], "PLAIN authcid")
    if not authcid:
        raise SaslParseError("PLAIN authcid is empty")
    if first > 0:
        authzid = _utf8(data[:first], "PLAIN authzid")
        if authzid != authcid:
            # Kafka's PlainSaslServer refuses this; the broker's answer will say so.
            raise SaslParseError("PLAIN authzid differs from authcid")
    return authcid


def unescape_saslname(name: str) -> str:
    """RFC 5802 saslname: ``=2C`` is ``,`` and ``=3D`` is ``=``; any other ``=`` is bad."""
    out: list[str] = []
    i = 0
    while i < len(name):
        ch = name[i]
        if ch == "=":
            code = name[i + 1 : i + 3]
            if code == "2C":
                out.append(",")
            elif code == "3D":
                out.append("=")
            else:
                raise SaslParseError("SCRAM username has a bad '=' escape")
            i += 3
        elif ch == ",":
            raise SaslParseError("SCRAM username has an unescaped ','")
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def parse_scram_client_first(data: bytes) -> tuple[str, bool]:
    """(username, token_authenticated) of a SCRAM client-first-message (RFC 5802).

    ``gs2-cbind-flag "," [a=authzid] "," [m=reserved ","] n=user "," r=nonce [,ext...]``
    """
    text = _utf8(data, "SCRAM client-first-message")
    parts = text.split(",")
    if len(parts) < 4:
        raise SaslParseError("SCRAM client-first-message has too few attributes")
    flag, authzid_attr, *bare = parts
    if flag not in ("n", "y") and not flag.startswith("p="):
        raise SaslParseError("SCRAM client-first-message has a bad gs2 header")
    if authzid_attr and not authzid_attr.startswith("a="):
        raise SaslParseError("SCRAM client-first-message has a bad authzid")
    if bare and bare[0].startswith("m="):
        bare = bare[1:]
    if len(bare) < 2 or not bare[0].startswith("n=") or not bare[1].startswith("r="):
        raise SaslParseError("SCRAM client-first-message lacks n= and r=")
    user = unescape_saslname(bare[0][2:])
    if not user:
        raise SaslParseError("SCRAM username is empty")
    if len(bare[1]) <= 2:
        raise SaslParseError("SCRAM nonce is empty")
    if authzid_attr and unescape_saslname(authzid_attr[2:]) != user:
        raise SaslParseError("SCRAM authzid differs from username")
    extensions = {}
    for item in bare[2:]:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SaslParseError("SCRAM client-first-message has a bad extension")
        extensions[key] = value
    return user, extensions.get("tokenauth", "").lower() == "true"


def jwt_claims(token: str) -> dict[str, Any] | None:
    """The payload of a JWS compact token (``header.payload.signature``), unverified.

    None when `token` is not one (JWE, opaque reference tokens, ...).
    """
    parts = token.split(".")
    if len(parts) != 3 or not all(_JWT_PART.match(p) for p in parts):
        return None
    decoded: list[Any] = []
    for part in parts[:2]:
        try:
            raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
            decoded.append(json.loads(raw))
        except (binascii.Error, ValueError, RecursionError):
            return None
    header, payload = decoded
    if not isinstance(header, dict) or not isinstance(payload, dict):
        return None
    return payload


def parse_oauthbearer_token(data: bytes) -> tuple[str, str]:
    """(authzid, bearer token) of an OAUTHBEARER client initial response (RFC 7628).

    ``gs2-header \\x01 (key=value \\x01)* \\x01`` with ``auth=Bearer <token>``."""
    text = _utf8(data, "OAUTHBEARER initial response")
    gs2, sep, rest = text.partition("\x01")
    if not sep:
        raise SaslParseError("OAUTHBEARER initial response has no 0x01 separator")
    gs2_parts = gs2.split(",")
    if len(gs2_parts) != 3 or gs2_parts[0] not in ("n", "y") or gs2_parts[2]:
        raise SaslParseError("OAUTHBEARER initial response has a bad gs2 header")
    if gs2_parts[1] and not gs2_parts[1].startswith("a="):
        raise SaslParseError("OAUTHBEARER initial response has a bad authzid")
    if not rest.endswith("\x01"):
        raise SaslParseError("OAUTHBEARER initial response is not 0x01-terminated")
    pairs: dict[str, str] = {}
    for item in rest[:-1].split("\x01"):
        if not item:
            continue
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SaslParseError("OAUTHBEARER initial response has a bad key=value pair")
        pairs[key] = value
    auth = pairs.get("auth")
    if auth is None:
        raise SaslParseError("OAUTHBEARER initial response has no auth=")
    match = _BEARER.match(auth)
    if match is None or match.group(1).lower() != "bearer":
        raise SaslParseError("OAUTHBEARER auth= is not 'Bearer <token>'")
    return gs2_parts[1][2:], match.group(2)


def parse_oauthbearer(data: bytes, principal_claim: str = "sub") -> str | None:
    """The principal claim of an OAUTHBEARER client initial response (RFC 7628).

    Returns None when the token is not a JWT (opaque). The signature is NOT verified:
    the broker verifies the token; the gateway only reads it.
    """
    authzid, token = parse_oauthbearer_token(data)
    claims = jwt_claims(token)
    if claims is None:
        return None
    subject = claims.get(principal_claim)
    if not isinstance(subject, str) or not subject:
        raise SaslParseError(f"OAUTHBEARER JWT has no string {principal_claim!r} claim")
    if authzid and authzid != subject:
        raise SaslParseError("OAUTHBEARER authzid differs from the token's principal")
    return subject


# -- envelopes ------------------------------------------------------------------------------


def principal_for_envelope(principal: Principal | None) -> str:
    """The principal an EnvelopeRequest (API 58, KIP-590) is attributed to.

    An envelope arrives from a broker, whose own connection is authenticated as the
    broker; the request inside is the forwarded client's, so rules and audit must see
    the *inner* principal that the envelope carries. None (a custom
    KafkaPrincipalSerde the gateway cannot read) gives User:unknown.
    """
    if principal is None:
        return UNKNOWN
    return f"{principal.type or 'User'}:{principal.name}"


# -- the tracker ----------------------------------------------------------------------------


class IdentityTracker:
    """One connection's identity, learned from what passes; see the module docstring.

    Never holds auth bytes, passwords, SCRAM proofs or bearer tokens: only the name
    read from them, until the broker accepts or refuses it.
    """

    def __init__(self, *, oauth_principal_claim: str = "sub", tls: bool = False,
                 certificate_principal: str | None = None) -> None:
        self.oauth_principal_claim = oauth_principal_claim
        self.tls = tls
        # The client certificate's principal ("User:alice"), mutual TLS only.
        self.certificate_principal = certificate_principal
        self.mechanism: str | None = None
        self.authenticated = False
        self.client_id: str | None = None
        self.reason: str | None = None  # why the principal is not (or not yet) known
        self.opaque_token = False  # token login whose owner only the broker knows
        self.handshake_seen = False
        self.session_lifetime_ms: int | None = None  # KIP-368 re-authentication deadline
        self._name: str | None = None  # the authenticated principal's name
        self._in_exchange = False
        self._steps = 0  # SaslAuthenticate requests in the current exchange
        self._candidate: str | None = None  # name parsed from the exchange, unconfirmed
        self._candidate_opaque = False

    # -- what the data path tells it ---------------------------------------------------------

    def observe_client_id(self, client_id: str | None) -> None:
        """Every request header's client id (null ones keep the last one seen)."""
        if client_id is not None:
            self.client_id = client_id

    def observe_request(self, api_key: int, api_version: int, body: Mapping[str, Any]) -> None:
        """A decoded request; SaslHandshake and SaslAuthenticate teach it something."""
        try:
            if api_key == ApiKey.SASL_HANDSHAKE:
                self._on_handshake(api_version, body)
            elif api_key == ApiKey.SASL_AUTHENTICATE:
                self._on_authenticate(body)
        except Exception:  # never into the data path
            self._fail_candidate("SASL request could not be read")

    def observe_response(self, api_key: int, api_version: int, body: Mapping[str, Any]) -> None:
        """A decoded response to a SaslHandshake or SaslAuthenticate request."""
        try:
            if api_key == ApiKey.SASL_HANDSHAKE:
                error = body.get("ErrorCode", 0)
                if error:
                    self._in_exchange = False
                    self.reason = f"SaslHandshake failed with error code {error}"
            elif api_key == ApiKey.SASL_AUTHENTICATE:
                self._on_authenticate_response(body)
        except Exception:  # never into the data path
            self._end_exchange(success=False, reason="SASL response could not be read")

    def authenticated_by_gateway(self, mechanism: str, name: str) -> None:
        """The gateway itself authenticated the client (SASL termination) as `name`."""
        self.handshake_seen = True
        self.mechanism = mechanism
        self.authenticated = True
        self._name = name
        self.reason = None

    def learned_elsewhere(self, principal: str | None, security_protocol: str | None) -> None:
        """What another observer of the connection learned (the native module, which
        reads the SASL exchange itself and hands the Python chain only some frames):
        `principal` "User:alice" once authenticated, None while it is not known."""
        if security_protocol is not None:
            self.handshake_seen = security_protocol.startswith("SASL")
            self.tls = security_protocol.endswith("SSL")
        if principal is None:
            return
        self.authenticated = True
        self._name = principal.split(":", 1)[1] if ":" in principal else principal
        self.reason = None

    # -- what it knows ------------------------------------------------------------------

    @property
    def principal(self) -> str:
        """Kafka's form: ``User:alice``; ``User:ANONYMOUS`` until authenticated."""
        if not self.authenticated or self._name is None:
            return self.certificate_principal or ANONYMOUS
        return f"User:{self._name}"

    @property
    def principal_known(self) -> bool:
        """Authenticated (by SASL or a client certificate) and the gateway could read who
        (not ANONYMOUS/unknown)."""
        if self.authenticated:
            return self._name not in (None, UNKNOWN_NAME)
        return self.certificate_principal is not None

    @property
    def security_protocol(self) -> str:
        if self.handshake_seen:
            return "SASL_SSL" if self.tls else "SASL_PLAINTEXT"
        return "SSL" if self.tls else "PLAINTEXT"

    def __repr__(self) -> str:
        return (
            f"IdentityTracker(principal={self.principal!r}, mechanism={self.mechanism!r}, "
            f"authenticated={self.authenticated}, security_protocol={self.security_protocol!r}, "
            f"client_id={self.client_id!r}, reason={self.reason!r})"
        )

    # -- the exchange ---------------------------------------------------------------------

    def _on_handshake(self, api_version: int, body: Mapping[str, Any]) -> None:
        mechanism = body.get("Mechanism")
        self.handshake_seen = True
        self.mechanism = mechanism.upper() if isinstance(mechanism, str) else None
        # A new handshake on an authenticated connection is KIP-368 re-authentication:
        # the current principal holds until the new exchange ends (Kafka refuses a
        # change of principal, and closes the connection when re-authentication fails).
        self._in_exchange = True
        self._forget_exchange()
        if api_version == 0:
            # v0: the SASL tokens that follow are raw, not SaslAuthenticate frames.
            self.reason = "SaslHandshake v0: SASL tokens are not Kafka frames"
        elif self.mechanism is None:
            self.reason = "SaslHandshake without a mechanism"
        elif not self.authenticated:
            self.reason = _IN_PROGRESS

    def _on_authenticate(self, body: Mapping[str, Any]) -> None:
        if not self._in_exchange:
            self.reason = "SaslAuthenticate outside a SASL exchange"
            return
        self._steps += 1
        if self._steps > 1:
            return  # SCRAM's client-final message, GSSAPI tokens, OAUTHBEARER's \x01
        data = body.get("AuthBytes")
        if not isinstance(data, bytes | bytearray | memoryview):
            self._fail_candidate("SaslAuthenticate without auth bytes")
            return
        if len(data) > MAX_AUTH_BYTES:
            self._fail_candidate("SASL auth bytes too large to read")
            return
        mechanism = self.mechanism
        try:
            if mechanism == PLAIN:
                self._candidate = parse_plain(bytes(data))
            elif mechanism in SCRAM_MECHANISMS:
                user, token_auth = parse_scram_client_first(bytes(data))
                if token_auth:
                    self._candidate_opaque = True
                    self.reason = "SCRAM delegation token: its owner is known to the broker only"
                else:
                    self._candidate = user
            elif mechanism == OAUTHBEARER:
                subject = parse_oauthbearer(bytes(data), self.oauth_principal_claim)
                if subject is None:
                    self._candidate_opaque = True
                    self.reason = "OAUTHBEARER token is not a JWT: principal unknown"
                else:
                    self._candidate = subject
            else:
                self._candidate = UNKNOWN_NAME
                self.reason = f"{mechanism or 'unknown'} tokens are opaque: principal unknown"
        except SaslParseError as err:
            self._fail_candidate(str(err))
        finally:
            del data  # keep no reference to the auth bytes

    def _fail_candidate(self, reason: str) -> None:
        self._candidate = None
        self._candidate_opaque = False
        self.reason = reason

    def _on_authenticate_response(self, body: Mapping[str, Any]) -> None:
        if not self._in_exchange:
            return
        error = body.get("ErrorCode", 0)
        if error:
            self._end_exchange(
                success=False, reason=f"authentication failed with error code {error}"
            )
            return
        lifetime = body.get("SessionLifetimeMs")
        if isinstance(lifetime, int) and lifetime > 0:
            self.session_lifetime_ms = lifetime
        challenge = body.get("AuthBytes") or b""
        mechanism = self.mechanism
        if mechanism == PLAIN:
            self._end_exchange(success=True)
        elif mechanism in SCRAM_MECHANISMS:
            if bytes(challenge[:2]) == b"v=":  # server-final-message: the broker verified
                self._end_exchange(success=True)
            elif bytes(challenge[:2]) == b"e=":
                self._end_exchange(success=False, reason="SCRAM server-final error")
            # else server-first-message: the exchange goes on
        elif mechanism == OAUTHBEARER:
            if not challenge:
                self._end_exchange(success=True)
            else:  # RFC 7628 error challenge; the broker fails the next step
                self.reason = "OAUTHBEARER token rejected by the broker"
        else:  # GSSAPI and others: the last step is not recognisable; see the docstring
            self._accept()

    def _accept(self) -> None:
        """The broker accepted the exchange so far: the candidate is the principal."""
        self.authenticated = True
        self._name = self._candidate
        self.opaque_token = self._candidate_opaque
        if self._name not in (None, UNKNOWN_NAME) and not self._candidate_opaque:
            self.reason = None
        elif self.reason == _IN_PROGRESS:
            self.reason = "authenticated, but the SASL request was not read"

    def _end_exchange(self, success: bool, reason: str | None = None) -> None:
        self._in_exchange = False
        if success:
            self._accept()
        else:
            self.authenticated = False
            self._name = None
            self.opaque_token = False
            self.reason = reason
        self._forget_exchange()

    def _forget_exchange(self) -> None:
        """Forget what the current exchange said so far: its steps, its unconfirmed name."""
        self._steps = 0
        self._candidate = None
        self._candidate_opaque = False


__all__ = [
    "ANONYMOUS",
    "GSSAPI",
    "MAX_AUTH_BYTES",
    "OAUTHBEARER",
    "PLAIN",
    "SCRAM_MECHANISMS",
    "SCRAM_SHA_256",
    "SCRAM_SHA_512",
    "UNKNOWN",
    "IdentityTracker",
    "SaslParseError",
    "jwt_claims",
    "parse_oauthbearer",
    "parse_oauthbearer_token",
    "parse_plain",
    "parse_scram_client_first",
    "principal_for_envelope",
    "unescape_saslname",
]
