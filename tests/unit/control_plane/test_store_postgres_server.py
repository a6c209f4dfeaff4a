"""A throwaway PostgreSQL server for the store tests (Debian's `postgresql` package).

Not a test module of its own (it holds no tests): the fixture is imported by
test_store.py. The server runs from a temporary directory on a free loopback port
with trust authentication and fsync off, and is stopped at the end of the session.
As root (CI), PostgreSQL refuses to run, so it runs as the `postgres` user the
package creates. When the binaries are missing and we are root with apt-get, they
are installed (a fresh machine): the tests never quietly skip PostgreSQL.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def _bin_dir() -> Path | None:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    found = shutil.which("pg_ctl")
    return Path(found).resolve().parent if found else None


def _install() -> Path | None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return None
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print("\nPostgreSQL is not installed: installing Debian's postgresql package ...")
    subprocess.run(["apt-get", "update", "-q"], check=False, env=env,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "postgresql"],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    return _bin_dir()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(command: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *command]
    return command


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    bin_dir = _bin_dir() or _install()
    if bin_dir is None:
        pytest.fail("PostgreSQL binaries not found and cannot be installed here "
                    "(apt-get install postgresql): the store must be tested on PostgreSQL")
    root = Path(tempfile.mkdtemp(prefix="keg-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    data, port = root / "data", _free_port()
    subprocess.run(_as_postgres([str(bin_dir / "initdb"), "-D", str(data), "-U", "keg",
                                 "--auth=trust", "-E", "UTF8", "--no-sync"]),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    started = subprocess.run(
        _as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options,
                      "-l", str(root / "server.log"), "-w", "-t", "60", "start"]),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if started.returncode != 0:
        log = (root / "server.log").read_text() if (root / "server.log").exists() else ""
        pytest.fail(f"PostgreSQL did not start: {started.stderr}\n{log}")
    try:
        yield f"postgresql://keg@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data),
                                     "-m", "immediate", "stop"]),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        shutil.rmtree(root, ignore_errors=True)
