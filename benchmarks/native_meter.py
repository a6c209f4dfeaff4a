"""What keg's Kafka filter pays per request for its labelled metrics (docs/metrics.md).

    python -m benchmarks.native_meter [--requests 200000] [--rounds 7]

Runs the crate's `meter_cost` example (envoy/kafka_filter/examples/meter_cost.rs): one
session fed the same stream of librdkafka-like Produce v9 requests (1 or 16 records of
1 KiB each) in 64 KiB reads, side by side in one run: without metrics, with them
(client id, principal and Produce topics read, drained into the exporter after every
read, as the filter does after each Envoy callback), and with them but topics off
(`KEG_METRICS_TOPICS=false`). Nanoseconds per request are medians over the rounds;
results go to benchmarks/results/native_meter.jsonl and native_meter.md.
End to end, through Envoy: `python -m benchmarks.native_path --paths native,native_unmetered`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.gateway_vs_direct import RESULTS_DIR, git_commit
from keg.embedded.native import CRATE_DIR, cargo_binary


def measure(requests: int, rounds: int) -> dict[str, Any]:
    """The example's JSON line."""
    done = subprocess.run(
        [cargo_binary(), "run", "--release", "--quiet", "--manifest-path",
         str(CRATE_DIR / "Cargo.toml"), "--example", "meter_cost", str(requests), str(rounds)],
        capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [f"### Labelled metrics in keg's Kafka filter: {result['requests']:,} Produce v9 "
             f"requests in {result['read_bytes'] // 1024} KiB reads, median of "
             f"{result['rounds']} rounds; ns per request (ratio to no metrics)", "",
             "| records per request | no metrics | metrics | metrics, topics off |",
             "|---|---|---|---|"]
    for case in result["cases"]:
        lines.append(
            f"| {case['records_per_request']} ({case['request_bytes']:,} B) "
            f"| {case['ns_per_request_plain']:.0f} "
            f"| {case['ns_per_request_metered']:.0f} ({case['metered_vs_plain']:.2f}x) "
            f"| {case['ns_per_request_metered_no_topics']:.0f} "
            f"({case['no_topics_vs_plain']:.2f}x) |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.requests, args.rounds)
    text = markdown(result)
    print(text)
    if not args.no_save:
        args.results_dir.mkdir(parents=True, exist_ok=True)
        record = {"benchmark": "native_meter", "commit": git_commit(),
                  "at": datetime.now(UTC).isoformat(timespec="seconds"), **result}
        with (args.results_dir / "native_meter.jsonl").open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        (args.results_dir / "native_meter.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
