"""The users the gateway authenticates itself (SASL termination): a credential file.

YAML, one entry per user and SCRAM mechanism, holding what RFC 5802 lets a server keep
instead of the password (salt, iterations, StoredKey, ServerKey, base64), the same
facts Kafka keeps for SCRAM users:

    users:
      alice:
        SCRAM-SHA-256: {salt: ..., iterations: 4096, stored_key: ..., server_key: ...}
        SCRAM-SHA-512: {salt: ..., iterations: 4096, stored_key: ..., server_key: ...}

`keg credentials add FILE USER` writes entries (the password from a file or stdin,
never an argument). SASL/PLAIN logins are checked against the same keys: the password
the client sends is salted and iterated and compared with StoredKey, so no password is
stored anywhere. The file is re-read when it changes (`CredentialStore.current()`);
a file that does not load keeps the last good users, logged. Errors name the file
and the user, never a key.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ext_proc.sasl.scram import HASHES, MIN_ITERATIONS, ScramCredential

log = logging.getLogger(__name__)

_FIELDS = ("salt", "iterations", "stored_key", "server_key")


class CredentialFileError(ValueError):
    """A credential file that does not load; the message says where."""


def _b64(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise CredentialFileError(f"{where}: expected a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise CredentialFileError(f"{where}: not base64") from None


def parse_credentials(data: Any, source: str) -> dict[str, dict[str, ScramCredential]]:
    """user -> mechanism -> credential, from the YAML document of a credential file."""
    if data is None:
        return {}
    users = data.get("users") if isinstance(data, dict) else None
    if not isinstance(users, dict):
        raise CredentialFileError(f"{source}: expected a mapping with a 'users' mapping")
    out: dict[str, dict[str, ScramCredential]] = {}
    for user, entries in users.items():
        if not isinstance(user, str) or not user:
            raise CredentialFileError(f"{source}: user names must be non-empty strings")
        if not isinstance(entries, dict) or not entries:
            raise CredentialFileError(f"{source}: users.{user}: expected SCRAM entries")
        out[user] = {}
        for mechanism, entry in entries.items():
            where = f"{source}: users.{user}.{mechanism}"
            if mechanism not in HASHES:
                raise CredentialFileError(f"{where}: not a SCRAM mechanism "
                                          f"({', '.join(HASHES)})")
            if not isinstance(entry, dict) or set(entry) != set(_FIELDS):
                raise CredentialFileError(f"{where}: needs exactly {', '.join(_FIELDS)}")
            iterations = entry["iterations"]
            if not isinstance(iterations, int) or iterations < MIN_ITERATIONS:
                raise CredentialFileError(f"{where}.iterations: at least {MIN_ITERATIONS}")
            out[user][mechanism] = ScramCredential(
                mechanism, _b64(entry["salt"], f"{where}.salt"), iterations,
                _b64(entry["stored_key"], f"{where}.stored_key"),
                _b64(entry["server_key"], f"{where}.server_key"))
    return out


def credential_entry(credential: ScramCredential) -> dict[str, Any]:
    b64 = base64.b64encode
    return {"salt": b64(credential.salt).decode(), "iterations": credential.iterations,
            "stored_key": b64(credential.stored_key).decode(),
            "server_key": b64(credential.server_key).decode()}


def add_user(path: Path, user: str, password: str, iterations: int = MIN_ITERATIONS) -> None:
    """Add or replace `user` in the credential file (both SCRAM mechanisms); written
    atomically with mode 0600."""
    data: dict[str, Any] = {"users": {}}
    if path.exists():
        loaded = yaml.safe_load(path.read_text())
        parse_credentials(loaded, str(path))  # refuse to rewrite a broken file
        if loaded:
            data = loaded
    data["users"][user] = {mechanism: credential_entry(ScramCredential.derive(
        mechanism, password, iterations)) for mechanism in HASHES}
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(data, fh, sort_keys=True)
    tmp.replace(path)


class CredentialStore:
    """The users of a credential file, re-read when the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._users: dict[str, dict[str, ScramCredential]] = {}
        self._load(strict=True)  # CredentialFileError at start: nothing is served

    def _stat(self) -> tuple[int, int] | None:
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return (stat.st_mtime_ns, stat.st_size)

    def _load(self, strict: bool) -> None:
        stamp = self._stat()
        try:
            try:
                text = self.path.read_text()
            except OSError as err:
                raise CredentialFileError(f"cannot read {self.path}: "
                                          f"{err.strerror or type(err).__name__}") from None
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as err:
                mark = getattr(err, "problem_mark", None)
                line = f":{mark.line + 1}" if mark is not None else ""
                raise CredentialFileError(f"{self.path}{line}: not YAML") from None
            users = parse_credentials(data, str(self.path))
        except CredentialFileError as err:
            if strict:
                raise
            log.error("credential file not reloaded, keeping the last good users: %s", err)
            self._stamp = stamp
            return
        self._users, self._stamp = users, stamp
        log.info("credential file %s: %d user(s)", self.path, len(users))

    def current(self) -> Mapping[str, Mapping[str, ScramCredential]]:
        with self._lock:
            if self._stat() != self._stamp:
                self._load(strict=False)
            return self._users

    def lookup(self, mechanism: str, user: str) -> ScramCredential | None:
        return self.current().get(user, {}).get(mechanism)

    def check_password(self, user: str, password: str) -> bool:
        """SASL/PLAIN: whether `password` is `user`'s (against the stored SCRAM keys)."""
        entries = self.current().get(user)
        if not entries:
            return False
        credential = entries.get("SCRAM-SHA-512") or next(iter(entries.values()))
        return credential.matches_password(password)


__all__ = ["CredentialFileError", "CredentialStore", "add_user", "parse_credentials"]
