"""OAUTHBEARER at the gateway: a client's JWT checked against a JWKS (RFC 7628, KIP-255).

The token's signature is verified with a key of the JWKS, by its `kid` (PyJWT with
`cryptography`; asymmetric algorithms only, never `none` or an HMAC secret), and its
claims: `exp` (required), `nbf`/`iat` when present, `iss` and `aud` when configured,
with a small leeway for clocks. The principal is a claim (`sub` by default, as
Kafka's `sasl.oauthbearer.sub.claim.name`).

Key rotation: a JWKS file is re-read when it changes; a JWKS URL is fetched with
PyJWT's `PyJWKClient`, which keeps the keys for `jwks_cache_s` and fetches again when a
token names a `kid` it does not hold (a key the issuer just introduced).

Failures are `TokenRejected` with a fixed, client-safe reason ("token expired", "token
audience is not accepted", ...): never the token, never a claim value.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import jwt

log = logging.getLogger(__name__)

# Asymmetric JWS algorithms only: a JWKS holds public keys.
ALGORITHMS: Final = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
                     "ES512", "EdDSA")


class TokenRejected(Exception):
    """The token is not accepted; the message is safe to tell the client and to log."""


@dataclass(frozen=True)
class OAuthSettings:
    """Where the keys are and what the tokens must say."""

    jwks_file: Path | None = None
    jwks_url: str | None = None
    issuer: str | None = None
    audience: str | None = None
    principal_claim: str = "sub"
    leeway_s: float = 30.0
    jwks_cache_s: float = 300.0

    def __post_init__(self) -> None:
        if (self.jwks_file is None) == (self.jwks_url is None):
            raise ValueError("OAUTHBEARER needs exactly one of jwks_file and jwks_url")


class _FileKeys:
    """A JWKS file's keys by kid, re-read when the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._keys: dict[str, jwt.PyJWK] = {}
        self._load(strict=True)

    def _load(self, strict: bool) -> None:
        try:
            stat = self.path.stat()
            keys = jwt.PyJWKSet.from_dict(json.loads(self.path.read_text()))
        except (OSError, ValueError, jwt.PyJWKSetError) as err:
            reason = err.strerror if isinstance(err, OSError) else type(err).__name__
            if strict:
                raise ValueError(f"JWKS file {self.path} does not load: {reason}") from None
            log.error("JWKS file %s not reloaded, keeping the last keys: %s", self.path, reason)
            return
        self._stamp = (stat.st_mtime_ns, stat.st_size)
        self._keys = {k.key_id: k for k in keys.keys if k.key_id}
        log.info("JWKS %s: %d key(s)", self.path, len(self._keys))

    def key(self, kid: str) -> jwt.PyJWK | None:
        with self._lock:
            try:
                stat = self.path.stat()
                if (stat.st_mtime_ns, stat.st_size) != self._stamp:
                    self._load(strict=False)
            except OSError:
                pass
            return self._keys.get(kid)


class _UrlKeys:
    def __init__(self, url: str, cache_s: float) -> None:
        self._client = jwt.PyJWKClient(url, cache_keys=True, lifespan=int(cache_s))

    def key(self, kid: str) -> jwt.PyJWK | None:
        try:
            return self._client.get_signing_key(kid)  # fetches again for an unknown kid
        except jwt.PyJWKClientConnectionError:
            raise TokenRejected("the signing keys could not be fetched") from None
        except jwt.PyJWKClientError:
            return None


class TokenValidator:
    def __init__(self, settings: OAuthSettings) -> None:
        self.settings = settings
        self._keys: _FileKeys | _UrlKeys = (
            _FileKeys(settings.jwks_file) if settings.jwks_file is not None
            else _UrlKeys(settings.jwks_url or "", settings.jwks_cache_s))

    def principal(self, token: str) -> str:
        """The principal name a valid token names; TokenRejected otherwise."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError:
            raise TokenRejected("the token is not a JWS compact token") from None
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise TokenRejected("the token names no signing key (kid)")
        key = self._keys.key(kid)
        if key is None:
            raise TokenRejected("the token's signing key is not known")
        algorithm = header.get("alg")
        if algorithm not in ALGORITHMS or (key.algorithm_name and algorithm != key.algorithm_name):
            raise TokenRejected("the token's algorithm is not accepted")
        s = self.settings
        claims = self._decode(token, key, algorithm)
        subject = claims.get(s.principal_claim)
        if not isinstance(subject, str) or not subject:
            raise TokenRejected(f"the token has no {s.principal_claim!r} claim")
        return subject

    def _decode(self, token: str, key: jwt.PyJWK, algorithm: str) -> dict[str, Any]:
        s = self.settings
        required = ["exp"] + (["iss"] if s.issuer else []) + (["aud"] if s.audience else [])
        try:
            return dict(jwt.decode(
                token, key.key, algorithms=[algorithm], audience=s.audience, issuer=s.issuer,
                leeway=s.leeway_s,
                options={"require": required, "verify_aud": s.audience is not None}))
        except jwt.ExpiredSignatureError:
            raise TokenRejected("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise TokenRejected("the token is not valid yet") from None
        except jwt.InvalidAudienceError:
            raise TokenRejected("the token's audience is not accepted") from None
        except jwt.InvalidIssuerError:
            raise TokenRejected("the token's issuer is not accepted") from None
        except jwt.MissingRequiredClaimError as err:
            raise TokenRejected(f"the token lacks the {err.claim!r} claim") from None
        except jwt.InvalidSignatureError:
            raise TokenRejected("the token's signature does not verify") from None
        except jwt.InvalidTokenError:
            raise TokenRejected("the token is not valid") from None


__all__ = ["ALGORITHMS", "OAuthSettings", "TokenRejected", "TokenValidator"]
