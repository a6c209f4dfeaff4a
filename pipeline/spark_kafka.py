"""Spark's Kafka source: its jars, fetched once with Maven into keg's cache.

Spark would resolve `spark.jars.packages` with Ivy, but one of the source's
dependencies is not published for Spark 4 where this project fetches from (see
maven/spark-kafka-pom.xml); Maven with that pom fetches a set that works, and the
session gets the jars by path (`spark.jars`). KEG_SPARK_JARS (comma-separated jar
paths) overrides the whole set.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Final

from pipeline.errors import PipelineError

POM: Final = Path(__file__).resolve().parent / "maven" / "spark-kafka-pom.xml"
_MARKER: Final = ".complete"


def cache_root() -> Path:
    base = os.environ.get("KEG_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "keg")
    return Path(base)


def spark_kafka_jars(timeout: float = 600.0) -> list[Path]:
    """The jars of Spark's Kafka source, fetched on first use (PipelineError if not)."""
    override = os.environ.get("KEG_SPARK_JARS")
    if override:
        return [Path(p) for p in override.split(",") if p]
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:16]
    target = cache_root() / f"spark-kafka-{digest}"
    if (target / _MARKER).exists():
        return sorted(target.glob("*.jar"))
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PipelineError("Spark's Kafka source is fetched with Maven: install maven "
                            "(apt-get install maven) or set KEG_SPARK_JARS")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".spark-kafka-", dir=target.parent))
    try:
        done = subprocess.run(
            [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
             f"-DoutputDirectory={staging}", "-DincludeScope=runtime"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
            check=False)
        if done.returncode != 0 or not any(staging.glob("*.jar")):
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
            raise PipelineError(f"Maven could not fetch Spark's Kafka source: {tail}")
        (staging / _MARKER).write_text(digest + "\n")
        with contextlib.suppress(OSError):  # another process got there first: theirs is as good
            staging.rename(target)
    except subprocess.TimeoutExpired:
        raise PipelineError(f"Maven did not fetch Spark's Kafka source in {timeout:.0f} s") \
            from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(target.glob("*.jar"))
