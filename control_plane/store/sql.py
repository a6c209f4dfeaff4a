"""Versions in SQL: one backend for SQLite (stdlib) and PostgreSQL (psycopg 3).

Tables (every name prefixed `keg_`):
- `keg_versions`: one row per version, never updated: number, created_at, author,
  reason, operation, parent, ruleset_hash, rule_count and `manifest`, the ordered
  list of {id, etag, owner, source};
- `keg_rule_bodies`: each distinct rule body once, keyed by its ETag (content hash),
  so a thousand versions of a large rule set cost a thousand manifests, not copies;
- `keg_head`: the single row naming the current version. A write locks it
  (`SELECT ... FOR UPDATE`; SQLite: `BEGIN IMMEDIATE`), so control-plane instances
  sharing one PostgreSQL database serialise their writes and never lose one;
- `keg_verdicts`: what the fleet answered to a version (applied or rejected, which
  node, its error), one row per version that has an answer. A store written before
  verdicts existed gets the table on first use; its versions are pending.

Version rows are immutable, so versions and bodies read once are cached in memory;
verdicts change (pending -> applied -> rejected) and are always read from the database.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Container, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from control_plane.store.entries import (
    APPLIED,
    REJECTED,
    Change,
    Operation,
    StoredRule,
    Verdict,
    Version,
    VersionInfo,
    canonical_json,
    manifest_json,
    ruleset_hash,
)
from control_plane.store.errors import StoreError, StoreUnavailable
from ext_proc.heap import building
from ext_proc.private_files import create_private, narrow_private, private_dir
from ext_proc.rule_set_json import loads_pieces
from filter_rules import RuleSet

SCHEMA_VERSION = 1
_CACHED_VERSIONS = 256
_IN_CHUNK = 500  # etags per `IN (...)` query


@dataclass(frozen=True, slots=True)
class Pending:
    """A version to write: the whole rule list and what made it."""

    rules: tuple[StoredRule, ...]
    change: Change
    operation: Operation
    parent: int | None = None
    # The rules as a RuleSet, if the writer built it already (validation does): the
    # version keeps it instead of building it again.
    ruleset: RuleSet | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A pending version turned into what its rows hold (the JSON, the hash): work done
    before the write lock is taken."""

    pending: Pending
    bodies: list[tuple[str, str]]  # (etag, body JSON) of bodies the store may lack
    ruleset_hash: str
    manifest: str

    @classmethod
    def of(cls, pending: Pending, known: Container[str]) -> _Prepared:
        bodies = {rule.etag: rule.body for rule in pending.rules if rule.etag not in known}
        return cls(pending, [(etag, canonical_json(body)) for etag, body in bodies.items()],
                   ruleset_hash(pending.rules), manifest_json(pending.rules))


class Backend(Protocol):
    def head(self) -> Version | None: ...

    def version(self, number: int) -> Version | None: ...

    def versions(self, limit: int, before: int | None) -> list[VersionInfo]: ...

    def commit(self, expected: int, pending: Pending) -> Version | None: ...

    def verdicts(self, numbers: Sequence[int]) -> dict[int, Verdict]: ...

    def record_verdict(self, verdict: Verdict) -> bool: ...

    def served_number(self) -> int: ...

    def live_number(self) -> int: ...

    def close(self) -> None: ...


_TABLES = """
CREATE TABLE IF NOT EXISTS keg_schema (
    id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS keg_rule_bodies (etag TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS keg_versions (
    number BIGINT PRIMARY KEY,
    created_at TEXT NOT NULL,
    author TEXT NOT NULL,
    reason TEXT NOT NULL,
    operation TEXT NOT NULL,
    parent BIGINT,
    ruleset_hash TEXT NOT NULL,
    rule_count INTEGER NOT NULL,
    manifest TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS keg_head (
    id INTEGER PRIMARY KEY CHECK (id = 1), number BIGINT NOT NULL);
INSERT INTO keg_head (id, number) VALUES (1, 0) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS keg_verdicts (
    number BIGINT PRIMARY KEY,
    status TEXT NOT NULL,
    node TEXT NOT NULL,
    detail TEXT NOT NULL,
    at TEXT NOT NULL);
"""


def _statements() -> list[str]:
    stmts = [s.strip() for s in _TABLES.split(";") if s.strip()]
    stmts.append(
        f"INSERT INTO keg_schema (id, version) VALUES (1, {SCHEMA_VERSION}) ON CONFLICT DO NOTHING"
    )
    return stmts


class SqliteDialect:
    name = "sqlite"
    placeholder = "?"

    def __init__(self, path: Path) -> None:
        self.path = path

    def connect(self) -> sqlite3.Connection:
        if str(self.path) != ":memory:":
            # 0600 before SQLite opens it: its -wal and -shm files take the same mode.
            private_dir(self.path.parent)
            create_private(self.path)
            for suffix in ("-wal", "-shm"):  # an older keg's, made 0644
                narrow_private(f"{self.path}{suffix}")
        # Autocommit; writes open `BEGIN IMMEDIATE` themselves. One connection is
        # shared by the API's worker threads under the backend's lock.
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=10.0)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def schema(self) -> Sequence[str]:
        return _statements()

    @contextmanager
    def write_transaction(self, conn: sqlite3.Connection) -> Iterator[None]:
        conn.execute("BEGIN IMMEDIATE")  # the database's write lock, across processes
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def driver_errors(self) -> tuple[type[BaseException], ...]:
        return (sqlite3.Error,)

    def is_broken(self, conn: Any) -> bool:
        return False


class PostgresDialect:
    name = "postgresql"
    placeholder = "%s"
    # Any constant: serialises schema creation between instances starting together.
    _SCHEMA_LOCK = 0x6B6567

    def __init__(self, url: str, connect_timeout: float = 10.0) -> None:
        self.url = url
        self.connect_timeout = connect_timeout

    def connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.url, autocommit=True,
                               connect_timeout=max(1, int(self.connect_timeout)))

    def schema(self) -> Sequence[str]:
        return [f"SELECT pg_advisory_xact_lock({self._SCHEMA_LOCK})", *_statements()]

    @contextmanager
    def write_transaction(self, conn: Any) -> Iterator[None]:
        with conn.transaction():
            conn.execute("SELECT number FROM keg_head WHERE id = 1 FOR UPDATE")
            yield

    def driver_errors(self) -> tuple[type[BaseException], ...]:
        import psycopg

        return (psycopg.Error,)

    def is_broken(self, conn: Any) -> bool:
        return bool(conn.closed or conn.broken)


class _Connection:
    """One DB-API connection, opened on first use and again after it broke, shared by
    threads under its lock."""

    def __init__(self, dialect: SqliteDialect | PostgresDialect) -> None:
        self.dialect = dialect
        self.lock = threading.RLock()
        self.conn: Any = None

    @contextmanager
    def use(self) -> Iterator[Any]:
        with self.lock:
            try:
                if self.conn is None or self.dialect.is_broken(self.conn):
                    self.conn = self.dialect.connect()
                yield self.conn
            except self.dialect.driver_errors() as err:
                if self.conn is not None and self.dialect.is_broken(self.conn):
                    self.conn = None  # reconnect on the next call (a database failover)
                raise StoreUnavailable(f"{self.dialect.name}: {_driver_message(err)}") from None

    def close(self) -> None:
        with self.lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None


class SqlBackend:
    """A Backend over two DB-API connections shared by threads: one for writes, one
    for reads, so that reads go on while a large version is written (SQLite in WAL
    mode and PostgreSQL both let a reader see the last committed state meanwhile).
    An in-memory SQLite database has a single connection."""

    def __init__(self, dialect: SqliteDialect | PostgresDialect) -> None:
        self._dialect = dialect
        self._writer = _Connection(dialect)
        in_memory = isinstance(dialect, SqliteDialect) and str(dialect.path) == ":memory:"
        self._reader = self._writer if in_memory else _Connection(dialect)
        self._cache_lock = threading.Lock()  # the two caches below, read by every thread
        self._bodies: dict[str, dict[str, Any]] = {}
        self._versions: OrderedDict[int, Version] = OrderedDict()
        self._committed = 0  # the newest version this backend saw committed
        with self._writer.use() as conn:
            if isinstance(dialect, PostgresDialect):
                with conn.transaction():
                    for statement in dialect.schema():
                        conn.execute(statement)
            else:
                with dialect.write_transaction(conn):
                    for statement in dialect.schema():
                        conn.execute(statement)
            found = self._one(conn, "SELECT version FROM keg_schema WHERE id = 1")
            if found is None or int(found[0]) != SCHEMA_VERSION:
                raise StoreError(
                    f"the database holds keg store schema {found and found[0]}, "
                    f"this keg reads schema {SCHEMA_VERSION}"
                )

    @property
    def dialect_name(self) -> str:
        return self._dialect.name

    # --- connection and error translation --------------------------------------------

    def _connection(self) -> AbstractContextManager[Any]:
        """The read connection (writes use `self._writer`)."""
        return self._reader.use()

    def _sql(self, statement: str) -> str:
        return statement.replace("?", self._dialect.placeholder)

    def _one(self, conn: Any, statement: str, params: Sequence[Any] = ()) -> Any:
        return conn.execute(self._sql(statement), tuple(params)).fetchone()

    def _all(self, conn: Any, statement: str, params: Sequence[Any] = ()) -> list[Any]:
        return list(conn.execute(self._sql(statement), tuple(params)).fetchall())

    def close(self) -> None:
        self._reader.close()
        self._writer.close()

    # --- reads --------------------------------------------------------------------------

    def head(self) -> Version | None:
        with self._connection() as conn:
            row = self._one(conn, "SELECT number FROM keg_head WHERE id = 1")
        number = int(row[0]) if row else 0
        with self._cache_lock:
            self._committed = max(self._committed, number)
        return self._load(number, committed=True) if number else None

    def version(self, number: int) -> Version | None:
        return self._load(number, committed=False)

    def versions(self, limit: int, before: int | None) -> list[VersionInfo]:
        columns = _INFO_COLUMNS
        with self._connection() as conn:
            if before is None:
                rows = self._all(conn, f"SELECT {columns} FROM keg_versions "
                                       "ORDER BY number DESC LIMIT ?", (limit,))
            else:
                rows = self._all(conn, f"SELECT {columns} FROM keg_versions WHERE number < ? "
                                       "ORDER BY number DESC LIMIT ?", (before, limit))
        return [_info(row) for row in rows]

    def _load(self, number: int, *, committed: bool) -> Version | None:
        """Version `number`, from the cache or the database. `committed`: the number was
        read from the database's head; otherwise a cached version newer than the last
        commit seen here may be one being committed right now, and is not trusted.

        The read connection is held for each query only: parsing 100,000 rules takes
        seconds, and other reads go on meanwhile."""
        with self._cache_lock:
            cached = self._versions.get(number)
            if cached is not None and (committed or number <= self._committed):
                self._versions.move_to_end(number)
                return cached
        with self._connection() as conn:
            row = self._one(conn, f"SELECT {_INFO_COLUMNS}, manifest FROM keg_versions "
                                  "WHERE number = ?", (number,))
        if row is None:
            return None
        with building():  # no garbage collection walking 100,000 rules meanwhile
            manifest: list[dict[str, Any]] = loads_pieces(row[-1])
            bodies = self._load_bodies([entry["etag"] for entry in manifest])
            rules = tuple(
                StoredRule(entry["id"], bodies[entry["etag"]], entry.get("owner"),
                           entry.get("source"), entry["etag"])
                for entry in manifest
            )
        version = Version(_info(row[:-1]), rules)
        self._cache(version)
        return version

    def _cache(self, version: Version) -> None:
        with self._cache_lock:
            self._versions[version.number] = version
            if len(self._versions) > _CACHED_VERSIONS:
                self._versions.popitem(last=False)

    def _load_bodies(self, etags: Sequence[str]) -> dict[str, dict[str, Any]]:
        bodies = self._bodies  # entries are only ever added, never changed
        missing = sorted({e for e in etags if e not in bodies})
        for start in range(0, len(missing), _IN_CHUNK):
            chunk = missing[start:start + _IN_CHUNK]
            marks = ", ".join("?" for _ in chunk)
            with self._connection() as conn:
                rows = self._all(conn, "SELECT etag, body FROM keg_rule_bodies "
                                       f"WHERE etag IN ({marks})", chunk)
            for etag, body in rows:
                bodies[etag] = json.loads(body)
        absent = [e for e in etags if e not in bodies]
        if absent:
            raise StoreError(f"the database is inconsistent: no rule body {absent[0]}")
        return {etag: bodies[etag] for etag in etags}

    # --- the one write ----------------------------------------------------------------

    def commit(self, expected: int, pending: Pending) -> Version | None:
        """Write `pending` as the version after `expected`; None (nothing written) when
        the latest version is no longer `expected` (another writer was first)."""
        prepared = _Prepared.of(pending, self._bodies)  # the JSON work: before the lock
        version: Version | None = None
        with self._writer.use() as conn:
            try:
                with self._dialect.write_transaction(conn):
                    row = self._one(conn, "SELECT number FROM keg_head WHERE id = 1")
                    number = int(row[0]) if row else 0
                    if number != expected:
                        return None
                    version = self._insert(conn, number + 1, prepared)
                    # Cached before the commit: a reader that sees the new head finds it
                    # here instead of loading it from the database (seconds for 100,000
                    # rules). Until then `version()` does not trust it (`_committed`).
                    self._remember(version)
            except BaseException:
                if version is not None:  # the commit failed: nothing of it stays
                    with self._cache_lock:
                        self._versions.pop(version.number, None)
                raise
            with self._cache_lock:
                self._committed = max(self._committed, version.number)
            return version

    # --- verdicts -----------------------------------------------------------------------

    def verdicts(self, numbers: Sequence[int]) -> dict[int, Verdict]:
        found: dict[int, Verdict] = {}
        wanted = sorted(set(numbers))
        with self._connection() as conn:
            for start in range(0, len(wanted), _IN_CHUNK):
                chunk = wanted[start:start + _IN_CHUNK]
                marks = ", ".join("?" for _ in chunk)
                for row in self._all(conn, f"SELECT {_VERDICT_COLUMNS} FROM keg_verdicts "
                                           f"WHERE number IN ({marks})", chunk):
                    verdict = _verdict(row)
                    found[verdict.number] = verdict
        return found

    def record_verdict(self, verdict: Verdict) -> bool:
        """Keep the fleet's answer to a version; True when it changed what is known.

        The first answer is kept: a version an instance applied is good, and a later
        NACK (an instance whose key file, schema file or size limit changed, restarted)
        is that instance's trouble, not the version's. Before, `rejected` replaced
        `applied`: the store fell back to the version before, which the same instance
        refused too, and so on until no version was left (a new user's botched key
        rotation and one worker's crash rejected all six)."""
        statement = ("INSERT INTO keg_verdicts ({c}) VALUES (?, ?, ?, ?, ?) "
                     "ON CONFLICT (number) DO NOTHING")
        with self._writer.use() as conn:
            cursor = conn.execute(self._sql(statement.format(c=_VERDICT_COLUMNS)), (
                verdict.number, verdict.status, verdict.node, verdict.detail,
                verdict.at.isoformat()))
            return bool(cursor.rowcount and cursor.rowcount > 0)

    def served_number(self) -> int:
        """The newest version no instance rejected (0: none)."""
        with self._connection() as conn:
            row = self._one(conn, "SELECT MAX(v.number) FROM keg_versions v WHERE NOT EXISTS "
                                  "(SELECT 1 FROM keg_verdicts r WHERE r.number = v.number "
                                  f"AND r.status = '{REJECTED}')")
        return int(row[0]) if row and row[0] is not None else 0

    def live_number(self) -> int:
        """The newest version the fleet applied and nobody rejected (0: none yet)."""
        with self._connection() as conn:
            row = self._one(conn, "SELECT MAX(number) FROM keg_verdicts "
                                  f"WHERE status = '{APPLIED}'")
        return int(row[0]) if row and row[0] is not None else 0

    def _insert(self, conn: Any, number: int, prepared: _Prepared) -> Version:
        pending = prepared.pending
        if prepared.bodies:
            conn.cursor().executemany(self._sql(
                "INSERT INTO keg_rule_bodies (etag, body) VALUES (?, ?) ON CONFLICT DO NOTHING"),
                prepared.bodies)
        info = VersionInfo(
            number=number,
            created_at=datetime.now(UTC),
            author=pending.change.author,
            reason=pending.change.reason,
            operation=pending.operation,
            ruleset_hash=prepared.ruleset_hash,
            rule_count=len(pending.rules),
            parent=pending.parent,
        )
        self._exec(
            conn,
            f"INSERT INTO keg_versions ({_INFO_COLUMNS}, manifest) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (number, info.created_at.isoformat(), info.author, info.reason, info.operation,
             info.parent, info.ruleset_hash, info.rule_count, prepared.manifest),
        )
        self._exec(conn, "UPDATE keg_head SET number = ? WHERE id = 1", (number,))
        built = [] if pending.ruleset is None else [pending.ruleset]
        return Version(info, pending.rules, _ruleset=built)

    def _remember(self, version: Version) -> None:
        for rule in version.rules:
            self._bodies.setdefault(rule.etag, rule.body)
        self._cache(version)

    def _exec(self, conn: Any, statement: str, params: Sequence[Any]) -> None:
        conn.execute(self._sql(statement), tuple(params))


_INFO_COLUMNS = ("number, created_at, author, reason, operation, parent, ruleset_hash, "
                 "rule_count")


def _info(row: Sequence[Any]) -> VersionInfo:
    number, created, author, reason, operation, parent, digest, count = row
    return VersionInfo(
        number=int(number),
        created_at=datetime.fromisoformat(created),
        author=author,
        reason=reason,
        operation=operation,
        parent=None if parent is None else int(parent),
        ruleset_hash=digest,
        rule_count=int(count),
    )


_VERDICT_COLUMNS = "number, status, node, detail, at"


def _verdict(row: Sequence[Any]) -> Verdict:
    number, status, node, detail, at = row
    return Verdict(int(number), status, node, detail, datetime.fromisoformat(at))


def _driver_message(err: BaseException) -> str:
    # Driver messages may quote the connection string's host and user, never its password.
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
