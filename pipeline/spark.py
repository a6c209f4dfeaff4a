"""A SparkSession for keg's jobs: tuned for one machine, or pointed at a cluster.

Local mode (`local[*]`) is the default: few shuffle partitions, no UI, no console
progress (rich draws ours), UTC, Arrow on, quiet logs. `master` points anywhere
Spark can go (`spark://`, `yarn`, `k8s://`); then keg's own packages ship to the
executors as one zip (`addPyFile`) built from the installed sources, and the
executors need keg's third-party dependencies installed (docs/pipeline.md).

Java problems and Spark's JVM errors are turned into `PipelineError` with the first
meaningful line, never a Java stack trace.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pipeline.errors import PipelineError
from pipeline.spark_kafka import spark_kafka_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_MASTER: Final = "local[*]"
MIN_JAVA: Final = 17
# What executors import: the rule engine, its codec and the job functions.
SHIPPED_PACKAGES: Final = ("kafka_wire", "filter_rules", "interceptors", "pipeline")
ENGINE_ZIP: Final = "keg-engine.zip"

_LOG4J2: Final = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = spark: %p %c{1}: %m%n
# PySpark counts as a REPL: Spark announces the REPL logger's level unless it matches.
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.pygateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.pygateway.level = error
"""


def java_version() -> int:
    """The major version of the `java` Spark will start; PipelineError when unusable."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise PipelineError(
            "Spark needs Java 17 or newer and none was found: install a JDK or JRE "
            "(Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PipelineError(f"cannot run {java}: {exc}") from None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not found:
        raise PipelineError(f"cannot tell the version of {java}: {out.stderr.strip()[:200]}")
    major = int(found.group(1))
    if major == 1 and found.group(2):  # "1.8.0" is Java 8
        major = int(found.group(2))
    if major < MIN_JAVA:
        raise PipelineError(f"Spark needs Java {MIN_JAVA} or newer; {java} is Java {major}")
    return major


def package_zip(directory: Path) -> Path:
    """keg's engine packages (sources and their data files) as one zip for executors."""
    target = directory / ENGINE_ZIP
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in SHIPPED_PACKAGES:
            spec = importlib.util.find_spec(name)
            if spec is None or not spec.submodule_search_locations:
                raise PipelineError(f"cannot find package {name} to ship to executors")
            root = Path(next(iter(spec.submodule_search_locations)))
            for path in sorted(root.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                    archive.write(path, Path(name) / path.relative_to(root))
    return target


def build_session(master: str | None = DEFAULT_MASTER, *, app_name: str = "keg",
                  kafka: bool = False, driver_memory: str = "2g",
                  shuffle_partitions: int | None = None,
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """Start (or reuse) the SparkSession; `kafka` adds Spark's Kafka source from Maven.

    `master=None` takes the master (and driver settings) `spark-submit` was given:
    a driver program run by spark-submit must not override them. `conf` (Spark
    properties, as `spark-submit --conf`) comes last and wins over keg's tuning.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise PipelineError(
            "the data pipeline needs PySpark: pip install 'keg[pipeline]'"
        ) from None
    java_version()
    work = Path(tempfile.mkdtemp(prefix="keg-spark-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    (work / "log4j2.properties").write_text(_LOG4J2)
    java_opts = f"-Dlog4j2.configurationFile={work / 'log4j2.properties'}"
    local = master is not None and master.startswith("local")
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
        .config("spark.local.dir", str(work))
    )
    if local or shuffle_partitions:
        # Spark's 200 suit a cluster; one machine runs a few tasks at a time.
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions or 4))
    if local:
        # Python workers must be this interpreter (keg's environment), whatever
        # `python3` on PATH is.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = (builder.config("spark.driver.memory", driver_memory)
                   .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"]))
    if kafka:
        builder = builder.config("spark.jars", ",".join(str(j) for j in spark_kafka_jars()))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    try:
        with _jvm_started_without_python_in_the_child():
            session = builder.getOrCreate()
    except Exception as exc:
        raise PipelineError(f"Spark did not start: {first_line(exc)}") from None
    context = session.sparkContext
    context.setLogLevel("ERROR")
    # Once per SparkContext: Spark refuses a second file of the same name.
    if not any(f.endswith("/" + ENGINE_ZIP) for f in context.listFiles):
        context.addPyFile(str(package_zip(work)))
    return session


def gateway_popen(command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """PySpark's launch of its JVM, minus the Python code it runs between fork and exec.

    PySpark starts the JVM with a `preexec_fn` (to ignore SIGINT there). That makes
    CPython fork() and run Python in the child, which crashes now and then (SIGSEGV)
    in a process with gRPC's threads: measured here, 38 of 300 such launches died
    while gRPC calls ran in other threads, and the JVM never came up
    (JAVA_GATEWAY_EXITED). A process group of its own keeps the terminal's Ctrl-C away
    from the JVM just as well, and CPython sets it without running Python in the child
    (vfork, then setpgid, then exec)."""
    kwargs.pop("preexec_fn", None)
    kwargs.setdefault("process_group", 0)
    return subprocess.Popen(command, **kwargs)


_LAUNCH = threading.Lock()


@contextlib.contextmanager
def _jvm_started_without_python_in_the_child() -> Iterator[None]:
    """PySpark's gateway launcher uses `gateway_popen` while the session starts."""
    from pyspark import java_gateway

    with _LAUNCH:
        original = java_gateway.Popen
        setattr(java_gateway, "Popen", gateway_popen)  # noqa: B010 (a function for a class)
        try:
            yield
        finally:
            setattr(java_gateway, "Popen", original)  # noqa: B010


@contextlib.contextmanager
def spark_errors(doing: str) -> Iterator[None]:
    """Turn Spark's errors (JVM or Python worker) into one PipelineError line."""
    try:
        yield
    except PipelineError:
        raise
    except Exception as exc:
        if type(exc).__module__.startswith(("pyspark", "py4j")):
            raise PipelineError(f"{doing} failed: {first_line(exc)}") from None
        raise


_NOISE = re.compile(r"^(Traceback|\s+File |\s+at |Caused by|org\.apache|java\.|py4j|JVM stack|"
                    r"\s*\^|\s*$)")


def first_line(exc: BaseException) -> str:
    """The message that explains `exc`: a Python worker's last error line when the
    JVM wrapped one, else the first line that is not a stack frame."""
    text = str(exc)
    worker = re.findall(r"^(\w+(?:\.\w+)*(?:Error|Exception|Invalid)\b: .+)$", text, re.M)
    if worker:
        return worker[-1].strip()[:500]
    for line in text.splitlines():
        if not _NOISE.match(line):
            return line.strip()[:500]
    return type(exc).__name__


__all__ = [
    "DEFAULT_MASTER",
    "PipelineError",
    "build_session",
    "first_line",
    "gateway_popen",
    "java_version",
    "package_zip",
    "spark_errors",
]
