"""Where `keg up` keeps its state, and the locks that keep two processes out of one place.

`keg up` keeps a rule store, the ext_proc rule cache, Envoy's files and the audit log per
rule directory: `<cache>/up/<directory name>-<hash of its absolute path>/`. Each run
serves exactly the directory it is given, whatever ran before, and two runs with
different directories share nothing. A directory in use is locked (an advisory lock,
released by the kernel when the process ends, even killed): a second process refuses
to start and names the first one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
from pathlib import Path
from typing import IO, Final

from ext_proc.private_files import open_private, private_dir
from keg.lifecycle import Service

LOCK_FILE: Final = ".keg.lock"


class StateInUse(RuntimeError):
    """Another process holds the lock of a state directory."""


def up_state_dir(cache: Path, rules_dir: Path) -> Path:
    """`keg up`'s state directory for `rules_dir` under the cache `cache`."""
    resolved = rules_dir.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", resolved.name).strip("._") or "rules"
    return cache / "up" / f"{name}-{digest}"


class DirectoryLock(Service):
    """An exclusive lock on `directory` (its `.keg.lock` holds the owner's pid)."""

    def __init__(self, directory: Path, purpose: str) -> None:
        self.directory = directory
        self.purpose = purpose  # what the directory is, for the refusal
        self._file: IO[str] | None = None

    def start(self) -> DirectoryLock:
        if self._file is not None:
            return self
        private_dir(self.directory)  # 0700 when created here: the store, the audit log
        path = self.directory / LOCK_FILE
        file = os.fdopen(open_private(path, os.O_RDWR | os.O_APPEND), "a+", encoding="utf-8")
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            owner = file.read().strip() or "unknown"
            file.close()
            raise StateInUse(f"{self.directory} ({self.purpose}) is in use by another keg "
                             f"process (pid {owner})") from None
        file.seek(0)
        file.truncate()
        file.write(f"{os.getpid()}\n")
        file.flush()
        self._file = file
        return self

    def stop(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.truncate(0)
            file.close()  # closing releases the lock
