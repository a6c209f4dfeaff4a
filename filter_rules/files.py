"""Reading rule files and the files rules name: regular files only, and bounded.

The control plane, the ext_proc service and `keg validate` read a rule directory's
files and the files its rules name (a key's `{file: ...}`, a keyring, a JSON Schema or
Avro schema file, a CA bundle) while they run. A named pipe there would block the
reading thread forever, and a device such as /dev/zero (its st_size is 0) never ends:
so a file is read only if it is a regular file (symlinks followed), and at most
`limit` bytes of it, counted on what is read, whatever its st_size said.

Both refusals are an `UnusableFile`, an OSError whose `strerror` is the reason, so
every caller's `except OSError` reports them as it reports a missing file.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Final

#: The most a rule file, or a file a rule names, may hold.
MAX_FILE_BYTES: Final = 8 * 1024 * 1024

StrPath = str | os.PathLike[str]

# Opening a FIFO without O_NONBLOCK waits for a writer: should a regular file be swapped
# for one between the stat and the open, the open must not wait (fstat then refuses it).
_OPEN_FLAGS: Final = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
                      | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0))
_CHUNK: Final = 1 << 20


class UnusableFile(OSError):
    """A file keg will not read: not a regular file, or larger than the limit."""

    def __init__(self, path: StrPath, reason: str) -> None:
        super().__init__(errno.EINVAL, reason, os.fspath(path))

    def __str__(self) -> str:
        return str(self.strerror)


def check_regular_file(path: StrPath, limit: int = MAX_FILE_BYTES) -> os.stat_result:
    """`path`'s stat (symlinks followed) if it is a regular file of at most `limit`
    bytes; UnusableFile if not, OSError if it cannot be stat'ed. For a file that is
    handed on by name (a CA bundle for OpenSSL): `read_regular_file` when keg reads it."""
    status = os.stat(path)
    _check(path, status, limit)
    return status


def read_regular_file(path: StrPath, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of `path`, a regular file (symlinks followed) of at most `limit` bytes.

    Raises UnusableFile for anything else (a FIFO, a device, a directory, a socket, a
    file larger than `limit` however small its st_size), OSError when it cannot be read.
    Never blocks on a FIFO and never reads more than `limit` + 1 bytes.
    """
    check_regular_file(path, limit)
    fd = os.open(path, _OPEN_FLAGS)
    try:
        _check(path, os.fstat(fd), limit)  # the file opened: it may have been swapped
        chunks: list[bytes] = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, _CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        if remaining <= 0:
            raise UnusableFile(path, _too_large(limit))
        return b"".join(chunks)
    finally:
        os.close(fd)


def _check(path: StrPath, status: os.stat_result, limit: int) -> None:
    if not stat.S_ISREG(status.st_mode):
        raise UnusableFile(path, f"not a regular file ({_kind(status.st_mode)})")
    if status.st_size > limit:
        raise UnusableFile(path, _too_large(limit))


def _too_large(limit: int) -> str:
    return f"file is larger than {limit} bytes"


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return f"file type {stat.S_IFMT(mode):o}"
