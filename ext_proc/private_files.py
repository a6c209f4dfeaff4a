"""Files only the gateway's own user may read: the rule store, the rule cache, audit logs.

They hold rules (with the names of keys and principals), audited requests and the
fleet's history, so they are created 0600 and the directories keg creates for them
0700, whatever the umask -- and files of an older keg found 0644 are narrowed when
opened again. Directories that already exist are the operator's and left as they are
(except keg's own state directories, `private_dir(..., own=True)`).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Final

FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700
_OPEN_TO_OTHERS: Final = stat.S_IRWXG | stat.S_IRWXO


def private_dir(path: Path, *, own: bool = False) -> Path:
    """`path` as a directory, created 0700 if missing (its missing parents get the
    default mode: they hold only directories); with `own`, an existing one is narrowed
    to 0700 too."""
    existed = path.is_dir()
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    if not existed or own:
        _narrow(path, DIR_MODE)
    return path


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """os.open with O_CREAT, mode 0600; an existing file open to others is narrowed."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        if os.fstat(fd).st_mode & _OPEN_TO_OTHERS:
            os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def create_private(path: str | os.PathLike[str]) -> None:
    """Make sure `path` exists 0600 before another library creates it (SQLite makes
    its -wal and -shm files with the mode of the database file)."""
    os.close(open_private(path, os.O_RDONLY))


def narrow_private(path: str | os.PathLike[str]) -> None:
    """Narrow an existing file to 0600 if it is open to others (nothing if absent)."""
    with contextlib.suppress(FileNotFoundError):
        _narrow(Path(path), FILE_MODE)


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (a temporary file renamed over it), 0600."""
    tmp = path.with_name(path.name + ".tmp")
    fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    os.replace(tmp, path)  # readers never see half a file


def _narrow(path: Path, mode: int) -> None:
    if path.stat().st_mode & _OPEN_TO_OTHERS:
        path.chmod(mode)
