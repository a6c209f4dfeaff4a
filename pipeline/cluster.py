"""A Spark standalone cluster on this machine, from the pyspark wheel's own scripts.

A Master and `workers` Workers (each a JVM with its cores and memory; the executors
they launch are JVMs of their own with their own Python workers): what the tests
(tests/pipeline/test_cluster.py) and the benchmark (benchmarks/pipeline) run keg's
jobs on to show the cluster path. Not a deployment tool: a real cluster is started by
its operator, and keg's jobs only need its `spark://` URL.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from pipeline.errors import PipelineError


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LocalCluster:
    """`with LocalCluster(workers=2, cores=1) as cluster:` then `cluster.master`."""

    def __init__(self, workers: int = 1, cores: int = 2, memory: str = "2g",
                 base: Path | None = None, timeout: float = 120.0) -> None:
        self.workers, self.cores, self.memory, self.timeout = workers, cores, memory, timeout
        self.base = base or Path(tempfile.mkdtemp(prefix="keg-spark-cluster-"))
        self.port, self.ui_port = _free_port(), _free_port()
        self.master = f"spark://127.0.0.1:{self.port}"
        self.env = {**os.environ, "SPARK_HOME": str(spark_home()),
                    "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(self.base),
                    "SPARK_WORKER_DIR": str(self.base / "work"),
                    "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        self._processes: list[subprocess.Popen[bytes]] = []

    def alive_workers(self) -> int:
        """Workers the Master counts alive; 0 while its web UI is not up yet.

        While the UI starts, Jetty may serve `/json/` from the page handler attached
        first (an HTML page): that answer means "not yet", like a refused connection.
        """
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/",
                                        timeout=2) as response:
                return int(json.loads(response.read()).get("aliveworkers", 0))
        except (OSError, ValueError, AttributeError):
            return 0

    def logs(self) -> str:
        return "".join(path.read_text(errors="replace")[-3000:]
                       for path in sorted(self.base.glob("*.log")))

    def start(self) -> LocalCluster:
        spark_class = str(spark_home() / "bin" / "spark-class")
        commands = {"master": [spark_class, "org.apache.spark.deploy.master.Master",
                               "--host", "127.0.0.1", "--port", str(self.port),
                               "--webui-port", str(self.ui_port)]}
        for n in range(self.workers):
            commands[f"worker-{n}"] = [
                spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--cores", str(self.cores), "--memory", self.memory, "--webui-port",
                str(_free_port()), self.master]
        self.base.mkdir(parents=True, exist_ok=True)
        try:
            for name, command in commands.items():
                with (self.base / f"{name}.log").open("wb") as log:
                    self._processes.append(subprocess.Popen(
                        command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                        start_new_session=True))
            deadline = time.monotonic() + self.timeout
            while self.alive_workers() < self.workers:
                if any(p.poll() is not None for p in self._processes):
                    raise PipelineError(f"the Spark cluster did not start: {self.logs()}")
                if time.monotonic() > deadline:
                    raise PipelineError(f"{self.workers} Spark worker(s) did not register "
                                        f"within {self.timeout:.0f} s")
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for process in reversed(self._processes):  # workers first: they stop executors
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        self._processes.clear()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()


__all__ = ["LocalCluster", "spark_home"]
