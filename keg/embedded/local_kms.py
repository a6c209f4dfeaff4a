"""A local server of the AWS KMS API (nsmithuk/local-kms), for `kms.aws` rules.

`local-kms` (MIT) implements the KMS API (CreateKey, aliases, GenerateDataKey, Decrypt,
...) with keys on disk. It is built from source once with the Go toolchain into keg's
cache by `keg setup --test-services` (`go install`, ~15 s), never at each run::

    <cache>/bin/local-kms-<version>

    with LocalKms() as kms:
        kms.endpoint              # http://127.0.0.1:<port>, any credentials are accepted
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Final, Self

from keg.children import BASE, child_environment
from keg.embedded._child import Child, ChildFailed, ChildService
from keg.embedded.kafka import EmbeddedKafkaError, _free_ports, _tail_text, cache_dir

MODULE: Final = "github.com/nsmithuk/local-kms"
VERSION: Final = "v0.0.0-20260228092603-2a5e92d09ab6"
REGION: Final = "eu-west-2"
GO_INSTALL_HINT: Final = ("install Go 1.21+ (Debian/Ubuntu: apt-get install golang; "
                          "https://go.dev/dl) to build local-kms once")


def local_kms_binary() -> Path:
    return cache_dir() / "bin" / f"local-kms-{VERSION.rsplit('-', 1)[-1]}"


def ensure_local_kms(progress: Callable[[str], None] | None = None,
                     timeout: float = 900.0) -> Path:
    """The local-kms binary, built with `go install` first when the cache lacks it."""
    binary = local_kms_binary()
    if binary.exists():
        return binary
    go = shutil.which("go")
    if go is None:
        raise EmbeddedKafkaError(f"go not found: {GO_INSTALL_HINT}")
    binary.parent.mkdir(parents=True, exist_ok=True)
    with open(binary.parent / ".local-kms.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists():
            return binary
        if progress is not None:
            progress(f"building local-kms {VERSION} with go install into {binary}")
        with tempfile.TemporaryDirectory(prefix="keg-gobin-") as gobin:
            env = {**os.environ, "GOBIN": gobin}
            try:
                done = subprocess.run([go, "install", f"{MODULE}@{VERSION}"], env=env,
                                      stdin=subprocess.DEVNULL, capture_output=True,
                                      text=True, timeout=timeout, check=False)
            except subprocess.TimeoutExpired as exc:
                raise EmbeddedKafkaError(f"go install {MODULE} did not finish within "
                                         f"{timeout:.0f} s") from exc
            built = Path(gobin) / "local-kms"
            if done.returncode != 0 or not built.exists():
                raise EmbeddedKafkaError(f"go install {MODULE}@{VERSION} failed (exit "
                                         f"{done.returncode})\n"
                                         f"{_tail_text(done.stderr or '', 20)}")
            shutil.move(str(built), binary)
    return binary


class LocalKms(ChildService):
    """local-kms in a child process, keys in a temporary directory, on a free port."""

    def __init__(self, start_timeout: float = 60.0) -> None:
        self._start_timeout = start_timeout

    @property
    def endpoint(self) -> str:
        """The URL an AWS client is given (`endpoint_url`)."""
        return self.url

    @property
    def region(self) -> str:
        return REGION

    def start(self) -> Self:
        if self._child is not None and self._child.running:
            return self
        binary = ensure_local_kms()
        (self.port,) = _free_ports(1)
        data = self._scratch_dir("keg-local-kms-")
        self._child = Child("local-kms", data / "local-kms.log")
        env = child_environment(BASE, {"PORT": str(self.port), "KMS_REGION": REGION,
                                       "KMS_DATA_PATH": str(data / "keys")})
        try:
            self._child.start([str(binary)], env, self._listens, self._start_timeout,
                              cwd=data)
        except ChildFailed as err:
            self.stop()
            raise EmbeddedKafkaError(str(err)) from None
        return self

    def _listens(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False
