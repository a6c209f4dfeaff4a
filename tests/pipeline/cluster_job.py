"""A driver program for `spark-submit` (run by test_cluster.py): the backtest on the
cluster `spark-submit --master` names, then where the executors imported keg's engine
from. Usage: cluster_job.py CAPTURE RULES OUT."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(capture: str, rules: str, out: str) -> None:
    from pipeline.backtest import load_rules, run_backtest
    from pipeline.inputs import parse_input, read_records
    from pipeline.spark import build_session

    spark = build_session(None, app_name="keg-cluster-job")  # spark-submit's --master
    master = spark.sparkContext.master
    # Both routes on the cluster: records through the JVM (arrow), then the executors
    # reading and writing the capture's Parquet themselves (direct, into out).
    run_backtest(spark, read_records(spark, parse_input(capture)), load_rules(Path(rules)),
                 None, Path(out) / "arrow", method="arrow")
    run_backtest(spark, Path(capture), load_rules(Path(rules)), None, Path(out))
    origins = (spark.sparkContext.parallelize(range(4), 4)
               .map(lambda _: __import__("interceptors").__file__).distinct().collect())
    (Path(out) / "cluster.json").write_text(json.dumps({"master": master,
                                                        "engine_origins": origins}))
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
