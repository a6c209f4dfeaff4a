"""A healthy producer next to a bomb loop, side by side with the same producer alone.

    python -m benchmarks.hostile [--records 50000] [--repeat 3]

One broker, one gateway as `keg up` runs it (`--data-path`, native by default; one Envoy
worker and one ext_proc worker per core) with a record rule (mask) on the `h.` topics.
Per round, for a healthy topic the rule masks and one no rule names: librdkafka
produces `--records` 1 KiB JSON records through the gateway alone, then again while
another connection sends record-count bombs (a 1,000,000-record zstd batch of a few
hundred bytes, to a masked topic) in a loop, each answered before the next. The ratio
is the healthy producer's rate under the bombs / its rate alone (the goal: >= 0.95).
Results: benchmarks/results/hostile.json and hostile.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import socket
import statistics
import tempfile
import time
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
from benchmarks.wire import produce_answer, record_count_bomb

log = logging.getLogger("benchmarks.hostile")

GOAL = 0.95  # the healthy producer's rate under bombs / its rate alone
# The healthy producer's topics: one a mask rule reads (as the bombs' topic), one no rule names.
HEALTHY = {"masked": "h.", "plain": "x."}
SPAWN = multiprocessing.get_context("spawn")  # the measuring process runs librdkafka threads
RULES = """
rules:
  - id: mask-everything
    match: {topics: {prefix: [h.]}}
    action: {mask: {fields: [$.customer.email, $.card.number]}}
"""


def bomb_loop(bootstrap: str, topic: str, rounds: int, results: list[Any]) -> None:
    """One connection, bombs in a loop, each answered before the next: (error code,
    message) per bomb in `results`."""
    host, port = bootstrap.rsplit(":", 1)
    bomb = record_count_bomb()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        for cid in range(1, rounds + 1):
            results.append(produce_answer(sock, cid, topic, bomb))


def bomb_until(bootstrap: str, topic: str, stop: Any, sent: Any) -> None:
    """Bombs on one connection until `stop` (a multiprocessing Event) is set; `sent` (a
    multiprocessing Value) counts the answers. Runs in a process of its own, so the
    bomber's Python does not share the measuring process's interpreter lock with the
    healthy producer's delivery callbacks."""
    host, port = bootstrap.rsplit(":", 1)
    bomb = record_count_bomb()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        cid = 0
        while not stop.is_set():
            cid += 1
            produce_answer(sock, cid, topic, bomb)
            with sent.get_lock():
                sent.value += 1


def run(records: int, repeat: int, data_path: str = "native") -> dict[str, Any]:
    from keg.embedded.kafka import EmbeddedKafka

    values = [order_value(i) for i in range(records)]
    rates: dict[str, dict[str, list[float]]] = {kind: {"alone": [], "bombed": []}
                                                for kind in HEALTHY}
    bombs: list[int] = []
    cores = os.cpu_count() or 1
    with (tempfile.TemporaryDirectory(prefix="keg-hostile-") as tmp, EmbeddedKafka() as kafka,
          gateway_with_rules(kafka.bootstrap, Path(tmp), "rules.yaml", RULES,
                             data_path=data_path, envoy_concurrency=cores,
                             ext_proc_workers=cores) as gateway):  # as keg up
        for round_ in range(repeat):
            target = f"h.bombs-{uuid.uuid4().hex[:6]}"
            create_topics(kafka.bootstrap, [target], 1)
            sent = SPAWN.Value("i", 0)
            for kind, prefix in HEALTHY.items():
                quiet, noisy = (f"{prefix}{name}-{uuid.uuid4().hex[:6]}"
                                for name in ("alone", "bombed"))
                create_topics(kafka.bootstrap, [quiet, noisy], 1)
                rates[kind]["alone"].append(produce(gateway.bootstrap, quiet, values, "none"))
                stop = SPAWN.Event()
                bomber = SPAWN.Process(target=bomb_until,
                                       args=(gateway.bootstrap, target, stop, sent))
                bomber.start()
                try:
                    while sent.value == 0:  # the bombs are landing
                        time.sleep(0.01)
                    rates[kind]["bombed"].append(
                        produce(gateway.bootstrap, noisy, values, "none"))
                finally:
                    stop.set()
                    bomber.join(120)
                if bomber.exitcode != 0:
                    raise RuntimeError(f"the bomber exited with {bomber.exitcode}")
                log.info("round %d, %s: alone %.0f rec/s, under bombs %.0f rec/s", round_ + 1,
                         kind, rates[kind]["alone"][-1], rates[kind]["bombed"][-1])
            bombs.append(sent.value)
    ratios = {kind: round(statistics.median(
        b / a for a, b in zip(r["alone"], r["bombed"], strict=True)), 3)
        for kind, r in rates.items()}
    return {"benchmark": "hostile", "commit": git_commit(), "machine": machine_info(),
            "data_path": data_path, "records": records, "repeat": repeat, "rates": rates,
            "bombs_answered": bombs, "healthy_under_bombs_vs_alone": ratios}


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for kind, rates in result["rates"].items():
        rows += [f"| {kind} | {i + 1} | {a:,.0f} | {b:,.0f} | {b / a:.2f}x |" for i, (a, b)
                 in enumerate(zip(rates["alone"], rates["bombed"], strict=True))]
    medians = ", ".join(f"{kind} **{ratio:.2f}x**"
                        for kind, ratio in result["healthy_under_bombs_vs_alone"].items())
    return "\n".join([
        f"# A healthy producer next to a bomb loop ({result['data_path']} data path, "
        f"commit {result['commit']})", "",
        f"{result['records']:,} x 1 KiB JSON records per step (librdkafka, acks=all); the "
        "bombs: 1,000,000-record zstd batches on another connection, to a topic a mask rule "
        f"reads, one after another ({sum(result['bombs_answered'])} answered). masked: the "
        "healthy producer's topic is masked too (its Produce requests share the Python "
        "workers with the bombs); plain: no rule names it.", "",
        "| healthy topic | round | alone rec/s | under bombs rec/s | ratio |",
        "|---|---:|---:|---:|---:|", *rows, "",
        f"Median ratio: {medians} (goal >= {GOAL:.2f}x).", ""])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data-path", default="native", choices=("native", "ext-proc"))
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    result = run(args.records, args.repeat, args.data_path)
    text = markdown(result)
    print(text)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "hostile.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.results_dir / "hostile.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
