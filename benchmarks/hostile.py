"""A healthy producer next to a bomb loop, side by side with the same producer alone.

    python -m benchmarks.hostile [--records 50000] [--repeat 3]

One broker, one gateway with a record rule (mask) on every topic used. Per round:
librdkafka produces `--records` 1 KiB JSON records through the gateway alone, then
again while another connection sends record-count bombs (a 1,000,000-record zstd batch
of a few hundred bytes) in a loop, each answered before the next. The ratio is the
healthy producer's rate under the bombs / its rate alone (the goal: >= 0.8).
Results: benchmarks/results/hostile.json and hostile.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

from benchmarks.gateway_vs_direct import (
    RESULTS_DIR,
    create_topics,
    gateway_with_rules,
    git_commit,
    machine_info,
)
from benchmarks.record_rules import order_value, produce

log = logging.getLogger("benchmarks.hostile")

RULES = """
rules:
  - id: mask-everything
    match: {topics: {prefix: [h.]}}
    action: {mask: {fields: [$.customer.email, $.card.number]}}
"""


def bomb_until(bootstrap: str, topic: str, stop: threading.Event, sent: list[int]) -> None:
    from tests.integration.rules.test_hostile_records import bomb_loop

    while not stop.is_set():
        answers: list[Any] = []
        bomb_loop(bootstrap, topic, 10, answers)
        sent[0] += len(answers)


def run(records: int, repeat: int) -> dict[str, Any]:
    from keg.embedded.kafka import EmbeddedKafka

    values = [order_value(i) for i in range(records)]
    alone: list[float] = []
    bombed: list[float] = []
    bombs: list[int] = []
    with (tempfile.TemporaryDirectory(prefix="keg-hostile-") as tmp, EmbeddedKafka() as kafka,
          gateway_with_rules(kafka.bootstrap, Path(tmp), "rules.yaml", RULES) as gateway):
        for round_ in range(repeat):
            quiet, noisy, target = (f"h.{name}-{uuid.uuid4().hex[:6]}"
                                    for name in ("alone", "bombed", "bombs"))
            create_topics(kafka.bootstrap, [quiet, noisy, target], 1)
            alone.append(produce(gateway.bootstrap, quiet, values, "none"))
            stop, sent = threading.Event(), [0]
            bomber = threading.Thread(target=bomb_until,
                                      args=(gateway.bootstrap, target, stop, sent))
            bomber.start()
            try:
                bombed.append(produce(gateway.bootstrap, noisy, values, "none"))
            finally:
                stop.set()
                bomber.join(120)
            bombs.append(sent[0])
            log.info("round %d: alone %.0f rec/s, under bombs %.0f rec/s (%d bombs)",
                     round_ + 1, alone[-1], bombed[-1], sent[0])
    ratio = statistics.median(b / a for a, b in zip(alone, bombed, strict=True))
    return {"benchmark": "hostile", "commit": git_commit(), "machine": machine_info(),
            "records": records, "repeat": repeat, "alone_rps": alone, "bombed_rps": bombed,
            "bombs_answered": bombs, "healthy_under_bombs_vs_alone": round(ratio, 3)}


def markdown(result: dict[str, Any]) -> str:
    rows = [f"| {i + 1} | {a:,.0f} | {b:,.0f} | {b / a:.2f}x | {n} |" for i, (a, b, n) in
            enumerate(zip(result["alone_rps"], result["bombed_rps"],
                          result["bombs_answered"], strict=True))]
    return "\n".join([
        "# A healthy producer next to a bomb loop (through the gateway, mask on every record)",
        "", "| round | alone rec/s | under bombs rec/s | ratio | bombs answered |",
        "|---:|---:|---:|---:|---:|", *rows, "",
        f"Median ratio: **{result['healthy_under_bombs_vs_alone']:.2f}x** (goal >= 0.80).", ""])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    result = run(args.records, args.repeat)
    text = markdown(result)
    print(text)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "hostile.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.results_dir / "hostile.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
