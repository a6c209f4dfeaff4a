"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka speaks them, sans-IO.

Both ends: `ScramClient` is keg logging in to a broker (the control plane's broker
discovery, the gateway's service account when it terminates SASL); `ScramServer` is
keg authenticating a client itself against a `ScramCredential`, the salted and
iterated keys a server keeps instead of the password (what Kafka stores in its
metadata: salt, iterations, StoredKey, ServerKey).

Messages (no channel binding, as Kafka):

    client-first   n,,n=<user>,r=<client nonce>[,<extensions>]
    server-first   r=<client nonce><server nonce>,s=<base64 salt>,i=<iterations>
    client-final   c=biws,r=<nonce>,p=<base64 ClientProof>
    server-final   v=<base64 ServerSignature>   (or e=<error>)

Errors are `ScramError`, whose messages are fixed texts and never quote a password,
a proof or a key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from ext_proc.identity import SaslParseError, parse_scram_client_first

SCRAM_SHA_256: Final = "SCRAM-SHA-256"
SCRAM_SHA_512: Final = "SCRAM-SHA-512"
HASHES: Final = {SCRAM_SHA_256: "sha256", SCRAM_SHA_512: "sha512"}
MIN_ITERATIONS: Final = 4096  # Kafka's minimum for both mechanisms
_GS2_HEADER: Final = "n,,"
_CHANNEL_BINDING: Final = base64.b64encode(_GS2_HEADER.encode()).decode()  # "biws"


class ScramError(Exception):
    """The exchange failed; the message is safe to log and to tell the client."""


def _hash_name(mechanism: str) -> str:
    try:
        return HASHES[mechanism]
    except KeyError:
        raise ScramError(f"unknown SCRAM mechanism {mechanism!r}") from None


def _hmac(name: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, name).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i): PBKDF2-HMAC (RFC 5802 section 2.2)."""
    return hashlib.pbkdf2_hmac(_hash_name(mechanism), password.encode("utf-8"), salt,
                               iterations)


@dataclass(frozen=True)
class ScramCredential:
    """What a SCRAM server keeps for a user: never the password (RFC 5802 section 5)."""

    mechanism: str
    salt: bytes = field(repr=False)
    iterations: int
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)

    @classmethod
    def derive(cls, mechanism: str, password: str, iterations: int = MIN_ITERATIONS,
               salt: bytes | None = None) -> ScramCredential:
        """A new credential for `password` (a random 32-byte salt unless given)."""
        if iterations < MIN_ITERATIONS:
            raise ScramError(f"{mechanism} needs at least {MIN_ITERATIONS} iterations")
        name = _hash_name(mechanism)
        salt = salt if salt is not None else secrets.token_bytes(32)
        salted = salted_password(mechanism, password, salt, iterations)
        client_key = _hmac(name, salted, b"Client Key")
        return cls(mechanism, salt, iterations, hashlib.new(name, client_key).digest(),
                   _hmac(name, salted, b"Server Key"))

    def matches_password(self, password: str) -> bool:
        """Whether `password` is the one this credential was derived from (SASL/PLAIN
        against stored SCRAM keys), compared in constant time."""
        name = _hash_name(self.mechanism)
        salted = salted_password(self.mechanism, password, self.salt, self.iterations)
        stored = hashlib.new(name, _hmac(name, salted, b"Client Key")).digest()
        return hmac.compare_digest(stored, self.stored_key)


def escape_saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _attributes(message: str, what: str) -> dict[str, str]:
    attributes: dict[str, str] = {}
    for item in message.split(","):
        key, sep, value = item.partition("=")
        if not sep or len(key) != 1:
            raise ScramError(f"malformed SCRAM {what}")
        attributes.setdefault(key, value)
    return attributes


def _b64decode(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ScramError(f"SCRAM {what} is not base64") from None


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError(f"SCRAM {what} is not UTF-8") from None


class ScramClient:
    """One client login: `first()`, then `final(server_first)`, then `verify(server_final)`."""

    def __init__(self, mechanism: str, username: str, password: str,
                 nonce: str | None = None) -> None:
        self._hash = _hash_name(mechanism)
        self.mechanism = mechanism
        self.username = username
        self._password = password
        self._nonce = nonce or secrets.token_urlsafe(24)
        self._bare = f"n={escape_saslname(username)},r={self._nonce}"
        self._server_signature: bytes | None = None

    def __repr__(self) -> str:
        return f"ScramClient({self.mechanism}, {self.username!r})"

    def first(self) -> bytes:
        return (_GS2_HEADER + self._bare).encode()

    def final(self, server_first: bytes) -> bytes:
        text = _utf8(server_first, "server-first-message")
        if text.startswith("e="):
            raise ScramError(f"the server refused the login: {text[2:]}")
        attributes = _attributes(text, "server-first-message")
        nonce, salt, iterations = attributes.get("r"), attributes.get("s"), attributes.get("i")
        if nonce is None or salt is None or iterations is None or not iterations.isdigit():
            raise ScramError("SCRAM server-first-message lacks r=, s= or i=")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise ScramError("SCRAM server nonce does not extend the client's")
        if int(iterations) < MIN_ITERATIONS:
            raise ScramError("SCRAM server asks for too few iterations")
        salted = salted_password(self.mechanism, self._password, _b64decode(salt, "salt"),
                                 int(iterations))
        without_proof = f"c={_CHANNEL_BINDING},r={nonce}"
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        client_key = _hmac(self._hash, salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        proof = _xor(client_key, _hmac(self._hash, stored_key, auth_message))
        self._server_signature = _hmac(self._hash, _hmac(self._hash, salted, b"Server Key"),
                                       auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        """The server proved it knows the credential too (ScramError if not)."""
        text = _utf8(server_final, "server-final-message")
        if text.startswith("e="):
            raise ScramError(f"the server refused the login: {text[2:]}")
        attributes = _attributes(text, "server-final-message")
        signature = attributes.get("v")
        if signature is None or self._server_signature is None:
            raise ScramError("SCRAM server-final-message lacks v=")
        if not hmac.compare_digest(_b64decode(signature, "server signature"),
                                   self._server_signature):
            raise ScramError("the server's SCRAM signature is wrong: not the real broker?")


CredentialLookup = Callable[[str, str], "ScramCredential | None"]  # (mechanism, user)


class ScramServer:
    """One client's exchange: `first(client_first)` -> server-first, then
    `final(client_final)` -> server-final; `username` once the client is known."""

    def __init__(self, mechanism: str, lookup: CredentialLookup,
                 nonce: str | None = None) -> None:
        self._hash = _hash_name(mechanism)
        self.mechanism = mechanism
        self._lookup = lookup
        self._server_nonce = nonce or secrets.token_urlsafe(24)
        self.username: str | None = None
        self._credential: ScramCredential | None = None
        self._auth_prefix = ""
        self._nonce = ""

    def first(self, client_first: bytes) -> bytes:
        text = _utf8(client_first, "client-first-message")
        try:
            username, token_auth = parse_scram_client_first(client_first)
        except SaslParseError as err:
            raise ScramError(str(err)) from None
        if not text.startswith(_GS2_HEADER):
            raise ScramError("SCRAM channel binding and authorization ids are not supported")
        if token_auth:
            raise ScramError("delegation tokens are not accepted by the gateway")
        self.username = username
        bare = text[len(_GS2_HEADER):]
        client_nonce = _attributes(bare, "client-first-message").get("r", "")
        credential = self._lookup(self.mechanism, username)
        if credential is None:
            raise ScramError("authentication failed: invalid credentials")
        self._credential = credential
        self._nonce = client_nonce + self._server_nonce
        server_first = (f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},"
                        f"i={credential.iterations}")
        self._auth_prefix = f"{bare},{server_first}"
        return server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        if self._credential is None:
            raise ScramError("SCRAM client-final-message before the client-first-message")
        text = _utf8(client_final, "client-final-message")
        without_proof, sep, proof_attr = text.rpartition(",p=")
        if not sep:
            raise ScramError("SCRAM client-final-message lacks p=")
        attributes = _attributes(without_proof, "client-final-message")
        if attributes.get("c") != _CHANNEL_BINDING:
            raise ScramError("SCRAM channel binding is not supported")
        if attributes.get("r") != self._nonce:
            raise ScramError("SCRAM nonce mismatch")
        proof = _b64decode(proof_attr, "proof")
        auth_message = f"{self._auth_prefix},{without_proof}".encode()
        credential = self._credential
        signature = _hmac(self._hash, credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramError("authentication failed: invalid credentials")
        client_key = _xor(proof, signature)
        if not hmac.compare_digest(hashlib.new(self._hash, client_key).digest(),
                                   credential.stored_key):
            raise ScramError("authentication failed: invalid credentials")
        server_signature = _hmac(self._hash, credential.server_key, auth_message)
        return f"v={base64.b64encode(server_signature).decode()}".encode()


__all__ = [
    "HASHES",
    "MIN_ITERATIONS",
    "SCRAM_SHA_256",
    "SCRAM_SHA_512",
    "ScramClient",
    "ScramCredential",
    "ScramError",
    "ScramServer",
    "escape_saslname",
    "salted_password",
]
