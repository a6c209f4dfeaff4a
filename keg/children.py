"""How keg starts its child processes: each with an environment of its own, each
ending with keg.

The environment: an explicit allow-list per kind of child.

keg's own environment may hold key material: encryption and hash keys that rules name
(`secret: {env: KEG_CARD_KEY}`), the SASL password of `copy` rules
(`keg.paths.SIDE_EFFECTS_PASSWORD_ENV`), API tokens (`KEG_API_TOKENS`), a store URL
with a password. A child inherits none of it: it gets what every program needs to run
(the search path, home, locale, time zone, temporary directory), what its runtime
needs (Python's or Java's variables), and the variables named for it. The ext_proc
service is named the key variables its rules read (`secret_env_names`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any, Final

# Any program: where programs are, whose home, which locale, time zone and temp dir.
# A name ending in "*" is a prefix.
BASE: Final = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_*", "TZ",
               "TMPDIR")
# keg's Python child (the ext_proc service): the interpreter's own variables, keg's
# cache, TLS trust stores, gRPC's diagnostics, HTTP proxies (the `copy` rules' HTTP
# side effects go through them).
PYTHON: Final = (*BASE, "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED",
                 "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS", "PYTHONFAULTHANDLER",
                 "PYTHONIOENCODING", "PYTHONUTF8", "KEG_CACHE_DIR", "XDG_CACHE_HOME",
                 "SSL_CERT_FILE", "SSL_CERT_DIR", "GRPC_VERBOSITY", "GRPC_TRACE",
                 "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
                 "no_proxy")
# The embedded broker's JVM (and Kafka's storage tool): which Java.
JAVA: Final = (*BASE, "JAVA_HOME")
# Envoy: nothing of its own (its configuration is the bootstrap file).
ENVOY: Final = BASE


def child_environment(allowed: Iterable[str], extra: Mapping[str, str] | None = None,
                      environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of `environ` (default: this process's) that `allowed` names (a
    trailing "*" names a prefix), plus `extra`."""
    source = os.environ if environ is None else environ
    allowed = tuple(allowed)
    names = [n for n in allowed if not n.endswith("*")]
    prefixes = tuple(n[:-1] for n in allowed if n.endswith("*"))
    env = {name: source[name] for name in names if name in source}
    if prefixes:
        env.update({k: v for k, v in source.items() if k.startswith(prefixes)})
    env.update(extra or {})
    return env


@cache
def _setpriv() -> str | None:
    return shutil.which("setpriv") if sys.platform.startswith("linux") else None


def die_with_parent(cmd: list[str]) -> list[str]:
    """`cmd` run so that it gets SIGTERM when the thread that starts it ends (all of keg,
    when keg is killed): util-linux's `setpriv --pdeathsig`, which then execs `cmd` (same
    pid). Where there is no setpriv (not Linux), `cmd` as it is. Start children from a
    thread that lives as long as they should: keg's main thread, or a supervisor's
    watcher thread (which ends only when the child is no longer watched).

    Not a `preexec_fn`: Python code between fork and exec in a process with gRPC's
    threads crashes now and then (SIGSEGV)."""
    setpriv = _setpriv()
    return [setpriv, "--pdeathsig", "TERM", "--", *cmd] if setpriv else cmd


def stop_process(process: subprocess.Popen[Any] | None, grace_s: float = 10) -> None:
    """SIGTERM a child still running, and SIGKILL it if it is not gone after `grace_s`."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class HoldsProcess:
    """What a holder of one child process shows of it (`_proc`: None before it starts and
    once it is stopped): whether it runs, its pid. The embedded broker and `Child`."""

    _proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None
