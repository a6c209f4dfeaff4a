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

The token file is re-read when it changes (`TokenFile`, what the control plane
serves with): a removed token is refused within about a second, without a restart.
The request path looks at the file at most once a second (a `stat`: inode, mtime,
size); a file that becomes unreadable or invalid keeps the last good tokens, with a
warning that names the file and the problem, never a token.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry

from control_plane.store import EVERY_OWNER, REST_OWNED, OwnerScope

log = logging.getLogger(__name__)

TOKENS_ENV: Final = "KEG_API_TOKENS"
# How often the request path looks at the token file (a stat), at most.
RELOAD_INTERVAL_S: Final = 1.0
# A file written this recently may change again within its mtime's granularity with
# the same size: it is read again at the next look until it is older.
_RACY_S: Final = 2.0
# The scope of a token name that is no longer there (the file changed between
# `match` and `scope`): no rule at all.
_NO_OWNER: Final = OwnerScope(())
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


# The file as `stat` saw it: device, inode, mtime, ctime, size (None: not there).
_Stamp = tuple[int, int, int, int, int] | None


class TokenFile:
    """The tokens of a token file (and of KEG_API_TOKENS, read once), re-read when the
    file changes: `match` looks at the file at most once every `interval` seconds (a
    `stat`; the file is read only when its inode, mtime, ctime or size changed), so a
    token removed from the file is refused within about a second. A file that becomes
    unreadable or invalid keeps the last good tokens, logged as a warning (the
    message names the file and the problem, never a token). Thread-safe: the tokens
    are swapped whole, readers never lock."""

    def __init__(self, path: Path | None = None, environ: Mapping[str, str] | None = None,
                 *, interval: float = RELOAD_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Raises TokenError when the file or the variable cannot be used at start."""
        env = os.environ if environ is None else environ
        self.path = path
        self._environ = {TOKENS_ENV: env[TOKENS_ENV]} if env.get(TOKENS_ENV) else {}
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp, racy = self._stat()
        self._tokens = Tokens.load(path, environ=self._environ)
        self._racy = racy
        self._failed: str | None = None  # the problem of the file last warned about
        self._next_look = clock() + interval

    @property
    def current(self) -> Tokens:
        """The tokens now, after a look at the file if it is time for one."""
        if self.path is not None and self._clock() >= self._next_look:
            self._look(due_only=True)
        return self._tokens

    def refresh(self) -> Tokens:
        """Look at the file now (whenever the last look was) and re-read it if it
        changed."""
        return self._look(due_only=False)

    def _look(self, due_only: bool) -> Tokens:
        with self._lock:
            now = self._clock()
            if due_only and now < self._next_look:
                return self._tokens  # another request looked while this one waited
            self._next_look = now + self._interval
            stamp, racy = self._stat()
            if self._racy or stamp != self._stamp:
                self._stamp, self._racy = stamp, racy
                self._reload()
            return self._tokens

    def _stat(self) -> tuple[_Stamp, bool]:
        if self.path is None:
            return None, False
        try:
            st = self.path.stat()
        except OSError:
            return None, False
        stamp = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        return stamp, abs(time.time() - st.st_mtime) < _RACY_S

    def _reload(self) -> None:
        try:
            tokens = Tokens.load(self.path, environ=self._environ)
        except TokenError as err:
            if str(err) != self._failed:  # once per problem, not at every look
                log.warning("API token file not reloaded, keeping the last good tokens "
                            "(%d): %s", len(self._tokens.names), err)
            self._failed = str(err)
            return
        self._failed = None
        if tokens == self._tokens:
            return
        before, after = set(self._tokens.names), set(tokens.names)
        self._tokens = tokens
        log.info("API token file %s reloaded: %d token(s); added %s, removed %s",
                 self.path, len(after), sorted(after - before) or "none",
                 sorted(before - after) or "none")

    def match(self, presented: str) -> str | None:
        """The name of the token `presented` is, or None (Tokens.match)."""
        return self.current.match(presented)

    def scope(self, name: str) -> OwnerScope:
        """Whose rules the token `name` may change; no rule at all when the name is
        gone (the file changed since `match` named it)."""
        tokens = self._tokens
        return tokens.scope(name) if name in tokens.names else _NO_OWNER

    @property
    def names(self) -> tuple[str, ...]:
        return self.current.names

    def __bool__(self) -> bool:
        return bool(self.current)

    def __repr__(self) -> str:
        return f"TokenFile(path={str(self.path)!r}, names={list(self._tokens.names)})"


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
    # Tokens (fixed) or TokenFile (re-read when the token file changes).
    tokens: Tokens | TokenFile = field(default_factory=Tokens)
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
    # Where `keg analyze --follow` writes the live rule impact (/v1/impact); None: none.
    impact_dir: Path | None = None
    # The owner of the rules a rule directory holds (`dir:<path>`, `keg up --rules`): the
    # directory is their source of truth, so a rollback keeps them as they are now.
    directory_owner: str | None = None
