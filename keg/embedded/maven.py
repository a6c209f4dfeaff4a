"""A directory of artifacts fetched once with Maven into keg's cache, then used offline.

The directory is complete or absent: Maven writes into a temporary directory, a marker
holding the pom's digest is written last, and the directory is renamed into place under
a file lock (so concurrent callers neither see a partial set nor fetch twice). A changed
pom fetches again. Maven runs on a copy of the pom in a scratch directory of the cache:
what it writes beside its pom (`target/`, the dependency plugin's unpack markers) never
lands in keg's package.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from keg.embedded.kafka import (
    EmbeddedKafkaError,
    _mvn_executable,
    _replace_dir,
    _tail_text,
    java_executable,
)

log = logging.getLogger(__name__)

_MARKER = ".keg-complete"


def maven_dir_ready(target: Path, pom: Path) -> bool:
    try:
        return (target / _MARKER).read_text().strip() == _digest(pom)
    except OSError:
        return False


def ensure_maven_dir(pom: Path, target: Path, goal: Sequence[str], what: str,
                     progress: Callable[[str], None] | None = None,
                     timeout: float = 1800.0) -> Path:
    """`target`, filled by `mvn -f pom <goal> -DoutputDirectory=<tmp>` unless it already
    is (for this pom). EmbeddedKafkaError (with Maven's output) when Maven fails."""
    if maven_dir_ready(target, pom):
        return target

    def say(message: str) -> None:
        log.info("%s", message)
        if progress is not None:
            progress(message)

    java_executable()  # mvn needs it too: report the root cause first
    mvn = _mvn_executable()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if maven_dir_ready(target, pom):  # fetched by another process meanwhile
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}-mvn-", dir=target.parent))
        try:
            say(f"fetching {what} from Maven Central into {target}")
            started = time.monotonic()
            shutil.copyfile(pom, work / "pom.xml")
            cmd = [mvn, "-q", "-B", "-f", str(work / "pom.xml"), *goal,
                   f"-DoutputDirectory={tmp}"]
            try:
                done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                                      text=True, timeout=timeout, check=False)
            except subprocess.TimeoutExpired as exc:
                raise EmbeddedKafkaError(f"mvn did not fetch {what} within {timeout:.0f} s"
                                         ) from exc
            if done.returncode != 0 or not any(tmp.iterdir()):
                tail = _tail_text((done.stdout or "") + (done.stderr or ""), 30)
                raise EmbeddedKafkaError(f"mvn {' '.join(goal)} failed for {what} (exit "
                                         f"{done.returncode}); is Maven Central reachable?"
                                         f"\n{tail}")
            (tmp / _MARKER).write_text(_digest(pom) + "\n")
            tmp.chmod(0o755)
            _replace_dir(tmp, target)
            say(f"fetched {what} in {time.monotonic() - started:.1f} s")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
    return target


def _digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()
