"""``python -m benchmarks.pipeline``: the backtest and the audit analysis, measured.

Backtest (`--records`, default 1,000,000 records, 4 record rules), records/s:

1. the data path: `RecordEngine.run` over 500-record batches of one topic;
2. the plain-Python loop: `RecordEngine.evaluate` per record over the capture file
   (the reference `keg backtest` is held to);
3. `keg backtest`'s direct route on Spark local[1] and local[2], its mapInArrow and
   mapInPandas routes on local[2], and the direct route on a standalone cluster of two
   workers of one core each (pipeline.cluster), each after a warm-up run so JVM and
   Python-worker start-up are not counted (the direct route: the better of two runs);
   the time includes reading the capture and writing the per-record results.

Audit analysis (`--audit-events`, default 5,000,000 events, ~2.8 GB of JSON lines):
`keg analyze` (pipeline.analyze.run_analyze) on local[2], local[1] and the two-worker
cluster, and the same tables in DuckDB (benchmarks.pipeline.audit_data) with two
threads and one; both read the JSON lines, warm. Prints spark_best_vs_plain_loop and
the DuckDB comparison; writes benchmarks/results/pipeline.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.pipeline.audit_data import duckdb_analysis, write_audit
from filter_rules import CompiledRuleSet, MatchContext, load_rule_dir
from interceptors.capture import CaptureWriter, read_capture, to_row
from interceptors.contract import InterceptedRecord
from kafka_wire import ApiKey
from pipeline.analyze import run_analyze
from pipeline.backtest import evaluate_direct, evaluate_frame, load_rules
from pipeline.cluster import LocalCluster
from pipeline.evaluate import backtest_engine, records_from_arrow
from pipeline.inputs import read_records
from pipeline.spark import build_session

RESULTS = Path(__file__).resolve().parents[1] / "results" / "pipeline.json"
RULES = """\
apiVersion: keg/v1
kind: RuleSet
rules:
  - id: mask-email
    match: {topics: {exact: [orders]}}
    action: {mask: {fields: ["$.customer.email"]}}
  - id: drop-test-keys
    match: {topics: {prefix: [ord]}}
    action: {drop: {when: {key: {prefix: [test-]}}}}
  - id: require-id
    match: {topics: {exact: [events]}}
    action: {validate: {json_schema: {type: object, required: [id]}}}
  - id: tag
    match: {topics: {exact: [events]}}
    action: {headers: {set: {x-checked: "1"}}}
"""
BATCH = 500  # records per Produce batch in the data-path measurement


def make_records(n: int) -> list[InterceptedRecord]:
    out = []
    for i in range(n):
        topic = "orders" if i % 2 else "events"
        email = f',"email":"user{i}@example.com"' if i % 3 == 0 else ""
        ident = "" if i % 50 == 0 else f'"id":{i},'
        value = f'{{{ident}"customer":{{"name":"n{i}"{email}}},"amount":{i % 1000}}}'.encode()
        key = (b"test-%d" if i % 101 == 0 else b"k-%d") % i
        out.append(InterceptedRecord(topic, i % 4, key, value, [("trace", b"%d" % i)],
                                     1_700_000_000_000 + i, i, "User:alice", "produce"))
    return out


def write_capture(root: Path, records: list[InterceptedRecord]) -> None:
    writer = CaptureWriter(root, rotate_bytes=32 << 20)
    for start in range(0, len(records), 50_000):
        writer.write([to_row(r, include_value=True, now_ms=1_800_000_000_000)
                      for r in records[start:start + 50_000]])
    writer.close()


def data_path_rate(rules_dir: Path, records: list[InterceptedRecord]) -> float:
    """Records/s through RecordEngine.run, batch by batch, one plan per batch."""
    engine = backtest_engine(CompiledRuleSet(load_rule_dir(rules_dir)))
    by_topic: dict[str, list[InterceptedRecord]] = {}
    for record in records:
        by_topic.setdefault(record.topic, []).append(record)
    start = time.perf_counter()
    for topic, items in by_topic.items():
        for offset in range(0, len(items), BATCH):
            ctx = MatchContext(api_key=ApiKey.PRODUCE, api_version=9, principal="User:alice")
            engine.run(items[offset:offset + BATCH], engine.plan("produce", topic, ctx))
    return len(records) / (time.perf_counter() - start)


def plain_loop_rate(rules_dir: Path, capture: Path) -> float:
    """Records/s of the reference loop: read the capture, evaluate() each record."""
    engine = backtest_engine(CompiledRuleSet(load_rule_dir(rules_dir)))
    start = time.perf_counter()
    table = read_capture(capture)
    count = 0
    for batch in table.to_batches(max_chunksize=10_000):
        for record in records_from_arrow(batch):
            engine.evaluate(record)
            count += 1
    return count / (time.perf_counter() - start)


def spark_rate(spark: Any, rules_dir: Path, capture: Path, out: Path, method: str,
               expected: int) -> float:
    """Records/s of one backtest route: read the capture, evaluate, write the results."""
    rules = load_rules(rules_dir)
    start = time.perf_counter()
    if method == "direct":
        written = evaluate_direct(spark, capture, rules, None, out)
    else:
        evaluate_frame(read_records(spark, capture), rules, None, method  # type: ignore[arg-type]
                       ).write.mode("overwrite").parquet(str(out))
        written = -1
    seconds = time.perf_counter() - start
    if written < 0:
        written = spark.read.parquet(str(out)).count()
    assert written == expected, (written, expected)
    return expected / seconds


CLUSTER_CONF = {"spark.executor.memory": "1g", "spark.executor.cores": "1",
                "spark.cores.max": "2"}


def backtest(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    rules_dir = work / "rules"
    rules_dir.mkdir()
    (rules_dir / "rules.yaml").write_text(RULES)
    records = make_records(args.records)
    write_capture(work / "capture", records)
    write_capture(work / "warmup", records[:20_000])
    del records

    data_path = data_path_rate(rules_dir, make_records(args.records))
    print(f"data path (RecordEngine.run, {BATCH}-record batches): {data_path:,.0f} records/s")
    plain = plain_loop_rate(rules_dir, work / "capture")
    print(f"plain Python loop (evaluate per record): {plain:,.0f} records/s")

    rates: dict[str, float] = {}

    def measure(name: str, spark: Any, methods: tuple[str, ...]) -> None:
        for method in methods:  # warm-up: JVM, Python workers, engines
            spark_rate(spark, rules_dir, work / "warmup", work / f"w-{method}", method, 20_000)
        for method in methods:
            # Best of two for the direct route (the one compared with the plain loop): one
            # run on a machine shared with other jobs can lose half its cores.
            rate = max(spark_rate(spark, rules_dir, work / "capture", work / f"o-{method}",
                                  method, args.records)
                       for _ in range(2 if method == "direct" else 1))
            rates[f"{name} {method}"] = rate
            print(f"Spark {name} {method}: {rate:,.0f} records/s", flush=True)

    for master, methods in (("local[1]", ("direct",)),
                            ("local[2]", ("direct", "arrow", "pandas"))):
        spark = build_session(master, app_name="keg-bench")
        measure(master, spark, methods)
        spark.stop()
    if not args.no_cluster:
        with LocalCluster(workers=2, cores=1, memory="1500m") as cluster:
            spark = build_session(cluster.master, app_name="keg-bench", conf=CLUSTER_CONF)
            measure("cluster 2x1", spark, ("direct",))
            spark.stop()

    local2 = {m: rates[f"local[2] {m}"] for m in ("direct", "arrow", "pandas")}
    best = max(local2, key=lambda m: local2[m])
    result: dict[str, Any] = {
        "records": args.records,
        "rules": 4,
        "records_per_s": {"data_path": round(data_path), "plain_loop": round(plain),
                          **{k: round(v) for k, v in rates.items()}},
        "best_local2_route": best,
        "ratios": {
            "spark_best_vs_plain_loop": round(local2[best] / plain, 2),
            "spark_best_vs_data_path": round(local2[best] / data_path, 2),
            "direct_local2_vs_local1": round(local2["direct"] / rates["local[1] direct"], 2),
            "direct_vs_mapInArrow": round(local2["direct"] / local2["arrow"], 2),
            "mapInArrow_vs_mapInPandas": round(local2["arrow"] / local2["pandas"], 2),
        },
    }
    if "cluster 2x1 direct" in rates:
        result["ratios"]["cluster_2x1_vs_local1"] = round(
            rates["cluster 2x1 direct"] / rates["local[1] direct"], 2)
    return result


def analyze(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    log, warmup = work / "audit.jsonl", work / "audit-warmup.jsonl"
    seconds = write_audit(log, args.audit_events)
    write_audit(warmup, 50_000)
    size = log.stat().st_size
    print(f"{args.audit_events:,} audit events ({size / 1e9:.2f} GB) written in "
          f"{seconds:.0f} s", flush=True)

    duck: dict[str, float] = {}
    reference: dict[str, Any] = {}
    for threads in (2, 1):
        runs = 2 if threads == 2 else 1
        times = []
        for _ in range(runs):
            took, reference = duckdb_analysis(log, threads)
            times.append(took)
        duck[f"{threads} threads"] = min(times)
        print(f"DuckDB ({threads} threads): {min(times):.1f} s", flush=True)

    spark_s: dict[str, float] = {}

    def measure(name: str, spark: Any, runs: int) -> None:
        run_analyze(spark, warmup, work / "analyze-warmup")
        times = []
        for _ in range(runs):
            result = run_analyze(spark, log, work / "analyze-out")
            times.append(result.seconds)
            totals = result.summary["totals"]
            assert totals["events"] == reference["totals"][0][0] == args.audit_events
            topics = {r["topic"]: r["events"] for r in result.summary["topics"]}
            assert topics == {r[0]: r[1] for r in reference["topics"]}
        spark_s[name] = min(times)
        print(f"keg analyze, Spark {name}: {min(times):.1f} s", flush=True)

    for master, runs in (("local[2]", 2), ("local[1]", 1)):
        spark = build_session(master, app_name="keg-bench-analyze")
        measure(master, spark, runs)
        spark.stop()
    if not args.no_cluster:
        with LocalCluster(workers=2, cores=1, memory="1500m") as cluster:
            spark = build_session(cluster.master, app_name="keg-bench-analyze",
                                  conf=CLUSTER_CONF)
            measure("cluster 2x1", spark, 1)
            spark.stop()

    best_duck = duck["2 threads"]
    # Executor cores that match DuckDB on this machine, if the work spreads evenly over
    # cores (as local[1] -> local[2] -> the cluster shows it does, or not).
    cores_to_match = spark_s["local[1]"] / best_duck
    return {
        "events": args.audit_events,
        "bytes": size,
        "seconds": {"duckdb_2_threads": round(duck["2 threads"], 2),
                    "duckdb_1_thread": round(duck["1 threads"], 2),
                    **{f"spark_{k}": round(v, 2) for k, v in spark_s.items()}},
        "ratios": {
            "spark_local2_vs_duckdb": round(spark_s["local[2]"] / best_duck, 2),
            "spark_local1_vs_duckdb_1_thread": round(spark_s["local[1]"] / duck["1 threads"],
                                                     2),
            "spark_local2_vs_local1": round(spark_s["local[1]"] / spark_s["local[2]"], 2),
            **({"spark_cluster_2x1_vs_local1": round(
                spark_s["local[1]"] / spark_s["cluster 2x1"], 2)}
               if "cluster 2x1" in spark_s else {}),
        },
        "crossover_executor_cores": round(cores_to_match, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--audit-events", type=int, default=5_000_000)
    parser.add_argument("--part", choices=("all", "backtest", "analyze"), default="all")
    parser.add_argument("--no-cluster", action="store_true",
                        help="Skip the standalone cluster (two extra JVMs and executors).")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="keg-bench-pipeline-"))
    result: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        if args.part in ("all", "backtest"):
            result["backtest"] = backtest(args, work)
        if args.part in ("all", "analyze"):
            result["analyze"] = analyze(args, work)
        result["load_average_1m"] = os.getloadavg()[0]
        if args.out.exists() and args.part != "all":  # keep the other part's last run
            previous = json.loads(args.out.read_text())
            result = {**previous, **result}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        for part in ("backtest", "analyze"):
            for name, ratio in result.get(part, {}).get("ratios", {}).items():
                print(f"{name}: {ratio}x")
        if "analyze" in result:
            print(f"crossover: Spark's cluster path matches DuckDB on this machine with "
                  f"~{result['analyze']['crossover_executor_cores']} executor cores")
        print(f"written to {args.out}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
