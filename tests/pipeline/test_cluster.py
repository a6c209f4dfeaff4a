"""keg's Spark jobs on a real Spark standalone cluster (a Master and a Worker started
from the pyspark wheel's own scripts; executors are separate JVMs with their own
Python workers): `spark-submit` of a driver program and `keg backtest --master
spark://...` give the same results as the plain-Python engine, and the executors run
the engine from the zip the driver shipped."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.cluster import LocalCluster, spark_home
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(workers=1, cores=2, memory="2g",
                      base=tmp_path_factory.mktemp("spark-cluster")) as running:
        yield running


def _run(command: list[str], cluster: LocalCluster) -> None:
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


def test_spark_submit_runs_the_backtest_on_the_cluster(cluster: LocalCluster,
                                                       tmp_path: Path) -> None:
    capture, rules = live_inputs(tmp_path, 120)
    out = tmp_path / "out"
    spark_submit = str(spark_home() / "bin" / "spark-submit")
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
    assert any((cluster.base / "work").glob("app-*/*/stderr"))


def test_keg_backtest_master_takes_the_cluster(cluster: LocalCluster, tmp_path: Path) -> None:
    capture, rules = live_inputs(tmp_path, 90)
    out = tmp_path / "out"
    _run([sys.executable, "-m", "keg", "backtest", "--rules", str(rules), "--input",
          str(capture), "--out", str(out), "--master", cluster.master, "-q",
          "--conf", f"spark.sql.shuffle.partitions={SHUFFLE}"], cluster)
    _assert_equals_plain_python(out, rules, 90)
