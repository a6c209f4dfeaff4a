"""Java consumers' fetch sessions on the native path: a consume-time rule on another topic.

    python -m benchmarks.fetch_sessions [--records 100000] [--repeat 3]

Kafka's Java consumer fetches in a KIP-227 session: after its first Fetch every one is
incremental, naming only what changed. Until the module judged such a Fetch by its
answer, any consume-time rule sent every incremental Fetch, whatever its topics, through
the Python service. One broker; per round a fresh topic of 1 KiB records (written
directly), then Kafka's ConsumerPerformance reads it side by side:

- ``direct``: the broker's own listener;
- ``native``: the native gateway without rules;
- ``native_other_consume``: the native gateway with a consume-time mask rule on
  ``other.*`` (not the topic read): its incremental fetches go to the broker at once and
  their answers, naming no ruled topic, go to the consumer as they came.

With ``--baseline-module-dir DIR`` (a directory holding another build of the module,
e.g. of the commit before), ``baseline_other_consume`` runs the same rule on that build,
side by side in the same rounds: new vs old code.

Also reported: how many Fetch requests each gateway handed to the Python service (0 is
the point) and how many incremental ones the module judged by their answers. Ratios are
path / direct (medians over rounds). Results: benchmarks/results/fetch_sessions.json/.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import tempfile
import uuid
from pathlib import Path
from typing import Any

from benchmarks import record_rules
from benchmarks.gateway_vs_direct import (
    RESULTS_DIR,
    Params,
    create_topics,
    gateway_with_rules,
    git_commit,
    java_consume,
    machine_info,
)

log = logging.getLogger("benchmarks.fetch_sessions")

NO_RULES = "rules: []\n"
OTHER_CONSUME_RULES = """
rules:
  - id: mask-other-on-read
    match: {direction: response, topics: {prefix: [other.]}}
    action: {mask: {fields: [$.customer.email]}}
"""
GATEWAYS = {"native": NO_RULES, "native_other_consume": OTHER_CONSUME_RULES}
BASELINE = "baseline_other_consume"


@contextlib.contextmanager
def module_dir_set(directory: Path | None) -> Any:
    """KEG_NATIVE_MODULE_DIR set to `directory` while a gateway starts (its Envoy reads
    it once, at start)."""
    from keg.embedded.native import MODULE_DIR_ENV

    old = os.environ.get(MODULE_DIR_ENV)
    if directory is not None:
        os.environ[MODULE_DIR_ENV] = str(directory)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(MODULE_DIR_ENV, None)
        else:
            os.environ[MODULE_DIR_ENV] = old


def run(records: int, repeat: int, baseline: Path | None = None,
        warmup_rounds: int = 1) -> dict[str, Any]:
    from keg.embedded.kafka import EmbeddedKafka, ensure_kafka

    values = [record_rules.order_value(i) for i in range(records)]
    params = Params(records=records)
    rates: dict[str, list[float]] = {}
    ensure_kafka()
    with contextlib.ExitStack() as stack:
        kafka = stack.enter_context(EmbeddedKafka())
        gateways = {}
        starts: list[tuple[str, str, Path | None]] = [
            (name, rules, None) for name, rules in GATEWAYS.items()]
        if baseline is not None:
            starts.append((BASELINE, OTHER_CONSUME_RULES, baseline))
        for name, rules, module in starts:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            with module_dir_set(module):
                gateways[name] = stack.enter_context(gateway_with_rules(
                    kafka.bootstrap, work, "bench.yaml", rules, data_path="native",
                    metrics_port=0))
        before = {name: (gw.handed_off_requests("Fetch"),
                         gw.module_counter("handoff_by_answer"))
                  for name, gw in gateways.items()}
        for number in range(warmup_rounds + repeat):
            topic = f"bench.{uuid.uuid4().hex[:8]}"
            create_topics(kafka.bootstrap, [topic], 1)
            record_rules.produce(kafka.bootstrap, topic, values, "none")
            paths = {"direct": kafka.bootstrap,
                     **{name: gw.bootstrap for name, gw in gateways.items()}}
            round_rates = {path: java_consume(bootstrap, topic, params)["records_per_s"]
                           for path, bootstrap in paths.items()}
            log.info("round %d%s: %s", number + 1, " (warm-up)" if number < warmup_rounds else "",
                     {p: round(r) for p, r in round_rates.items()})
            if number >= warmup_rounds:  # the first rounds warm JVMs, caches and pools up
                for path, rate in round_rates.items():
                    rates.setdefault(path, []).append(rate)
        handed = {name: {"fetches_handed_off": gw.handed_off_requests("Fetch")
                         - before[name][0],
                         "judged_by_answer": gw.module_counter("handoff_by_answer")
                         - before[name][1]} for name, gw in gateways.items()}
    direct = statistics.median(rates["direct"])
    paths_out = {path: {"records_per_s": round(statistics.median(r)),
                        "rounds": [round(x) for x in r],
                        "ratio": round(statistics.median(r) / direct, 3)}
                 for path, r in rates.items()}
    return {"records": records, "record_bytes": 1024, "repeat": repeat,
            "warmup_rounds": warmup_rounds, "commit": git_commit(),
            "baseline_module": str(baseline) if baseline is not None else None,
            "machine": machine_info(), "paths": paths_out, "hand_offs": handed}


def markdown(result: dict[str, Any]) -> str:
    lines = [f"Java ConsumerPerformance, {result['records']:,} x 1 KiB, one partition, median "
             f"of {result['repeat']} after {result.get('warmup_rounds', 0)} warm-up round(s) "
             f"(commit {result['commit']})", "",
             "| path | records/s | ratio to direct | rounds | Fetches handed to Python | "
             "incremental Fetches judged by answer |",
             "|---|---:|---:|---|---:|---:|"]
    for path, p in result["paths"].items():
        h = result["hand_offs"].get(path, {})
        lines.append(f"| {path} | {p['records_per_s']:,} | {p['ratio']:.2f}x | "
                     f"{', '.join(f'{x:,}' for x in p['rounds'])} | "
                     f"{h.get('fetches_handed_off', '-')} | {h.get('judged_by_answer', '-')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup-rounds", type=int, default=1,
                        help="unrecorded rounds first")
    parser.add_argument("--baseline-module-dir", type=Path, default=None,
                        help="a directory with another build of the module, measured as "
                             f"{BASELINE} in the same rounds")
    parser.add_argument("--output", default="fetch_sessions",
                        help="results file name (benchmarks/results/<output>.json and .md)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    result = run(args.records, args.repeat, args.baseline_module_dir, args.warmup_rounds)
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / f"{args.output}.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (RESULTS_DIR / f"{args.output}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
