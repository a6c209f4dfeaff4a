"""``python -m benchmarks.pipeline``: backtest records/s, three ways, in one run.

1. The data path's per-record cost: `RecordEngine.run` over batches of one topic
   (planned once per batch), as the gateway runs Produce batches.
2. A plain-Python loop: `RecordEngine.evaluate` per record over the capture file.
3. `keg backtest` on Spark local[2], both routes (mapInArrow, mapInPandas), after a
   warm-up run so JVM and Python-worker start-up are not counted; the time includes
   reading the Parquet capture and writing the per-record results.

Writes benchmarks/results/pipeline.json and prints the ratios.
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

from filter_rules import CompiledRuleSet, MatchContext, load_rule_dir
from interceptors.capture import CaptureWriter, read_capture, to_row
from interceptors.contract import InterceptedRecord
from kafka_wire import ApiKey
from pipeline.backtest import evaluate_frame, load_rules
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
    rules = load_rules(rules_dir)
    frame = evaluate_frame(read_records(spark, capture), rules, None, method)  # type: ignore[arg-type]
    start = time.perf_counter()
    frame.write.mode("overwrite").parquet(str(out))
    seconds = time.perf_counter() - start
    written = spark.read.parquet(str(out)).count()
    assert written == expected, (written, expected)
    return expected / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="keg-bench-pipeline-"))
    try:
        rules_dir = work / "rules"
        rules_dir.mkdir()
        (rules_dir / "rules.yaml").write_text(RULES)
        records = make_records(args.records)
        write_capture(work / "capture", records)
        write_capture(work / "warmup", records[:20_000])

        data_path = data_path_rate(rules_dir, make_records(args.records))
        print(f"data path (RecordEngine.run, {BATCH}-record batches): {data_path:,.0f} records/s")
        plain = plain_loop_rate(rules_dir, work / "capture")
        print(f"plain Python loop (evaluate per record): {plain:,.0f} records/s")

        spark = build_session(args.master, app_name="keg-bench")
        rates: dict[str, float] = {}
        for method in ("arrow", "pandas"):
            spark_rate(spark, rules_dir, work / "warmup", work / f"w-{method}", method, 20_000)
        for method in ("arrow", "pandas"):
            rates[method] = spark_rate(spark, rules_dir, work / "capture", work / f"o-{method}",
                                       method, args.records)
            print(f"Spark {args.master} {method}: {rates[method]:,.0f} records/s")
        spark.stop()

        best = max(rates, key=lambda m: rates[m])
        result = {
            "records": args.records,
            "master": args.master,
            "cpus": os.cpu_count(),
            "load_average_1m": os.getloadavg()[0],
            "python": platform.python_version(),
            "rules": 4,
            "records_per_s": {"data_path": round(data_path), "plain_loop": round(plain),
                              "spark_mapInArrow": round(rates["arrow"]),
                              "spark_mapInPandas": round(rates["pandas"])},
            "faster_route": "mapInArrow" if best == "arrow" else "mapInPandas",
            "ratios": {
                "spark_best_vs_plain_loop": round(rates[best] / plain, 2),
                "spark_best_vs_data_path": round(rates[best] / data_path, 2),
                "mapInArrow_vs_mapInPandas": round(rates["arrow"] / rates["pandas"], 2),
                "plain_loop_vs_data_path": round(plain / data_path, 2),
            },
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        for name, ratio in result["ratios"].items():
            print(f"{name}: {ratio}x")
        print(f"written to {args.out}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
