"""keg's Spark jobs on a real Spark standalone cluster (a Master and a Worker started
from the pyspark wheel's own scripts; executors are separate JVMs with their own
Python workers): `spark-submit` of a driver program and `keg backtest --master
spark://...` give the same results as the plain-Python engine, and the executors run
the engine from the zip the driver shipped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from control_plane.service import free_port
from pipeline.spark import ENGINE_ZIP
from tests.pipeline.conftest import (
    actual_row,
    expected_row,
    live_inputs,
    plain_outcomes,
    sample_records,
)

CLUSTER_JOB = Path(__file__).with_name("cluster_job.py")
SHUFFLE = 4  # a few hundred records: Spark's 200 tasks per stage would be the run


@dataclass
class Cluster:
    master: str
    env: dict[str, str]
    logs: Path


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
            return int(json.loads(r.read()).get("aliveworkers", 0))
    except OSError:
        return 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = _spark_home()
    base = tmp_path_factory.mktemp("spark-cluster")
    port, ui_port = free_port(), free_port()
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOG_DIR": str(base), "SPARK_WORKER_DIR": str(base / "work"),
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    spark_class = str(home / "bin" / "spark-class")
    commands = {
        "master": [spark_class, "org.apache.spark.deploy.master.Master", "--host",
                   "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)],
        "worker": [spark_class, "org.apache.spark.deploy.worker.Worker", "--host",
                   "127.0.0.1", "--cores", "2", "--memory", "2g", "--webui-port",
                   str(free_port()), f"spark://127.0.0.1:{port}"],
    }
    processes = []
    try:
        for name, command in commands.items():
            with (base / f"{name}.log").open("wb") as log:
                processes.append(subprocess.Popen(command, env=env, stdout=log,
                                                  stderr=subprocess.STDOUT,
                                                  start_new_session=True))
        deadline = time.monotonic() + 120
        while _alive_workers(ui_port) < 1:
            for process in processes:
                assert process.poll() is None, (base / "master.log").read_text()[-3000:] + (
                    base / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no Spark worker registered within 120 s"
            time.sleep(0.5)
        yield Cluster(f"spark://127.0.0.1:{port}", env, base)
    finally:
        for process in reversed(processes):  # the worker stops its executors
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


def _run(command: list[str], cluster: Cluster) -> None:
    done = subprocess.run(command, env=cluster.env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]


def _assert_equals_plain_python(out: Path, rules: Path, count: int) -> None:
    rows = pq.read_table(out / "records").to_pylist()
    reference = plain_outcomes(sample_records(count), rules)
    assert len(rows) == count
    for row in rows:
        rid = (row["topic"], row["partition"], row["offset"])
        assert actual_row(row) == expected_row(reference[rid]), rid
    summary = json.loads((out / "summary.json").read_text())
    assert summary["totals"]["dropped"] == sum(o.status == "dropped"
                                               for o in reference.values()) > 0


def test_spark_submit_runs_the_backtest_on_the_cluster(cluster: Cluster, tmp_path: Path) -> None:
    capture, rules = live_inputs(tmp_path, 120)
    out = tmp_path / "out"
    spark_submit = str(_spark_home() / "bin" / "spark-submit")
    _run([spark_submit, "--master", cluster.master, "--executor-memory", "1g",
          "--conf", f"spark.sql.shuffle.partitions={SHUFFLE}", str(CLUSTER_JOB),
          str(capture), str(rules), str(out)], cluster)
    _assert_equals_plain_python(out, rules, 120)
    job = json.loads((out / "cluster.json").read_text())
    assert job["master"] == cluster.master
    # The executors ran the engine the driver shipped, not an installed copy.
    assert job["engine_origins"] and all(ENGINE_ZIP in origin
                                         for origin in job["engine_origins"]), job
    # ... in executor processes the worker launched.
    assert any((cluster.logs / "work").glob("app-*/*/stderr"))


def test_keg_backtest_master_takes_the_cluster(cluster: Cluster, tmp_path: Path) -> None:
    capture, rules = live_inputs(tmp_path, 90)
    out = tmp_path / "out"
    _run([sys.executable, "-m", "keg", "backtest", "--rules", str(rules), "--input",
          str(capture), "--out", str(out), "--master", cluster.master, "-q",
          "--conf", f"spark.sql.shuffle.partitions={SHUFFLE}"], cluster)
    _assert_equals_plain_python(out, rules, 90)
