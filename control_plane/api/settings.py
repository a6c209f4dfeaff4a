"""The API's settings and its bearer tokens.

Tokens are named: a change is recorded as made by the token's name, never by the
token. A token file (or `KEG_API_TOKENS`) holds `name:token` entries, one a line
(the variable: separated by commas or newlines); `#` starts a comment line. Only a
SHA-256 digest of each token is kept in memory, and a presented token is compared
with every digest by `hmac.compare_digest`, so timing tells nothing of which token
or how much of it matched.

An entry may scope its token to the rules of some owners: `name:token owner=dir:payments
owner=dir:team-*` (names or globs; `owner=@rest` for the rules written through REST,
which have no owner). A scoped token changes only those owners' rules (403 otherwise);
a token without `owner=` changes every rule. Every token reads everything.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry

from control_plane.store import EVERY_OWNER, REST_OWNED, OwnerScope

TOKENS_ENV: Final = "KEG_API_TOKENS"
MIN_TOKEN_LENGTH: Final = 16
_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
# What an owner is (schemas.OWNER_PATTERN), plus glob characters, or REST_OWNED.
_OWNER: Final = re.compile(
    rf"^({re.escape(REST_OWNED)}|[A-Za-z0-9*?\[][A-Za-z0-9._@:/*?\[\]!-]{{0,199}})$")


class TokenError(ValueError):
    """A token file or variable that cannot be used (the message never quotes a token)."""


@dataclass(frozen=True)
class Tokens:
    """Named bearer tokens, kept as digests, each with the owners whose rules it may
    change."""

    _digests: tuple[tuple[str, bytes], ...] = ()
    _scopes: Mapping[str, OwnerScope] = field(default_factory=dict)

    @classmethod
    def of(cls, named: Iterable[tuple[str, str]],
           scopes: Mapping[str, OwnerScope] | None = None) -> Tokens:
        """Tokens by name; a name without an entry in `scopes` may change every rule."""
        entries: list[tuple[str, bytes]] = []
        seen: set[str] = set()
        for name, token in named:
            if not _NAME.fullmatch(name):
                raise TokenError(f"invalid token name {name!r}: letters, digits, . _ @ -")
            if name in seen:
                raise TokenError(f"token name {name!r} is given twice")
            if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() for c in token):
                raise TokenError(f"the token of {name!r} must be at least {MIN_TOKEN_LENGTH} "
                                 "characters without spaces")
            seen.add(name)
            entries.append((name, _digest(token)))
        scopes = dict(scopes or {})
        unknown = scopes.keys() - seen
        if unknown:
            raise TokenError(f"scopes for unknown token names {sorted(unknown)}")
        return cls(tuple(entries), scopes)

    @classmethod
    def parse(cls, text: str, where: str, *, commas: bool = False) -> Tokens:
        """Entries one a line (a file: a comment may hold commas), or also separated by
        commas (`commas`: the variable)."""
        named = []
        scopes = {}
        for number, raw in enumerate(re.split(r"[\n,]" if commas else r"\n", text), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, rest = line.partition(":")
            if not sep:
                raise TokenError(f"{where}: entry {number} is not name:token")
            token, *attributes = rest.split() or [""]
            named.append((name.strip(), token))
            if attributes:
                scopes[name.strip()] = _scope(attributes, f"{where}: entry {number}")
        try:
            return cls.of(named, scopes)
        except TokenError as err:
            raise TokenError(f"{where}: {err}") from None

    @classmethod
    def load(cls, path: Path | None = None, environ: dict[str, str] | None = None) -> Tokens:
        """Tokens from `path` and from KEG_API_TOKENS (both when both are given)."""
        env = os.environ if environ is None else environ
        parts: list[Tokens] = []
        if path is not None:
            try:
                parts.append(cls.parse(path.read_text(encoding="utf-8"), str(path)))
            except OSError as err:
                raise TokenError(f"cannot read token file {path}: {err.strerror}") from None
        if env.get(TOKENS_ENV):
            parts.append(cls.parse(env[TOKENS_ENV], TOKENS_ENV, commas=True))
        merged = tuple(entry for part in parts for entry in part._digests)
        names = [name for name, _ in merged]
        if len(set(names)) != len(names):
            raise TokenError("a token name is given twice (token file and KEG_API_TOKENS)")
        return cls(merged, {name: scope for part in parts for name, scope in part._scopes.items()})

    def match(self, presented: str) -> str | None:
        """The name of the token `presented` is, or None. Every digest is compared."""
        digest = _digest(presented)
        found: str | None = None
        for name, expected in self._digests:
            if hmac.compare_digest(digest, expected) and found is None:
                found = name
        return found

    def scope(self, name: str) -> OwnerScope:
        """Whose rules the token `name` may change."""
        return self._scopes.get(name, EVERY_OWNER)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._digests)

    def __bool__(self) -> bool:
        return bool(self._digests)

    def __repr__(self) -> str:
        return f"Tokens(names={list(self.names)})"


def _scope(attributes: list[str], where: str) -> OwnerScope:
    """`owner=<name or glob>` attributes of a token entry (nothing else is one)."""
    patterns = []
    for attribute in attributes:
        key, sep, value = attribute.partition("=")
        if key != "owner" or not sep or not _OWNER.fullmatch(value):
            raise TokenError(f"{where}: {attribute!r} is not owner=<owner> (an owner name, "
                             f"a glob such as dir:team-*, or {REST_OWNED})")
        patterns.append(value)
    return OwnerScope(tuple(patterns))


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True)
class ApiSettings:
    tokens: Tokens = field(default_factory=Tokens)
    # Reads (rules, versions, fleet, validate, dry-run) without a token; writes always
    # need one. Health, readiness, metrics and the OpenAPI document are always public.
    public_reads: bool = False
    max_body_bytes: int = 8 * 1024 * 1024
    max_dry_run_items: int = 1000
    # Where /metrics reads from; None: a registry of the app's own.
    registry: CollectorRegistry | None = None
    # Extra readiness (e.g. "the xDS server is up"); the store is always checked.
    ready: Callable[[], bool] | None = None
    # Parts of the gateway that are down, one sentence each (`keg up`'s supervised
    # children: "ext_proc restarting (...)"): not ready while there are any.
    problems: Callable[[], list[str]] | None = None
    title: str = "keg control plane"
