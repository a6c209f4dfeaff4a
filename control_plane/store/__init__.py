"""The control plane's rule store: versioned, audited, shared by control-plane instances.

    store = open_store(None, data_dir)                 # SQLite file, zero config
    store = open_store("postgresql://keg@db/keg", data_dir)   # highly available
    number, ruleset = store.current()                  # the version the fleet is to run
    store.subscribe(lambda number, ruleset: ...)       # whenever that version changes
    store.record_verdict(number, node_id, error)       # the fleet's ACK (None) or NACK

Every change (REST write, `keg apply`, rollback) appends a version of the whole rule
set with who, when and why; rules carry ETags (content hashes) for optimistic
concurrency; rules applied from a rule directory are owned by it (GitOps) and REST
writes to them are refused. See docs/control-plane-api.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from control_plane.store import entries, errors
from control_plane.store.entries import *  # noqa: F403  (the store's values)
from control_plane.store.errors import *  # noqa: F403  (the store's exceptions)
from control_plane.store.errors import StoreError
from control_plane.store.rule_store import (
    ApplyResult,
    RuleStore,
    RuleWrite,
    Subscriber,
    Validator,
)
from control_plane.store.sql import PostgresDialect, SqlBackend, SqliteDialect

SQLITE_FILE: Final = "control-plane.sqlite3"

__all__ = [
    "SQLITE_FILE",
    "ApplyResult",
    "RuleStore",
    "RuleWrite",
    "Subscriber",
    "Validator",
    "describe_url",
    "open_store",
]
__all__ += entries.__all__ + errors.__all__


def open_store(url: str | None, data_dir: str | os.PathLike[str] | None = None,
               validator: Validator | None = None) -> RuleStore:
    """A RuleStore on `url`: None (SQLite file in `data_dir`), `sqlite:///path`,
    `sqlite://:memory:` or `postgresql://...` / `postgres://...` (libpq URL).

    Raises StoreUnavailable when the database cannot be reached.
    """
    backend: SqlBackend
    if url is None or url == "":
        if data_dir is None:
            raise StoreError("the SQLite store needs a data directory (or a sqlite:/// URL)")
        backend = SqlBackend(SqliteDialect(Path(data_dir) / SQLITE_FILE))
    elif url.startswith("sqlite://"):
        path = url.removeprefix("sqlite://")
        if path != ":memory:":
            path = path.removeprefix("/") if path.startswith("//") else path
        if not path:
            raise StoreError(f"no file in store URL {url!r}: sqlite:///path/to/file")
        backend = SqlBackend(SqliteDialect(Path(path)))
    elif url.startswith(("postgresql://", "postgres://")):
        backend = SqlBackend(PostgresDialect(url))
    else:
        raise StoreError(
            f"unknown store URL {describe_url(url)!r}: use sqlite:///path or postgresql://..."
        )
    return RuleStore(backend, validator)


def describe_url(url: str | None) -> str:
    """The URL with any password masked: safe to log."""
    if not url:
        return "sqlite (data directory)"
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else url
