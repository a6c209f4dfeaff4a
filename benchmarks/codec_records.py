"""Record batch codec throughput: kafka_wire.records against aiokafka and kafka-python.

    .venv/bin/python -m benchmarks.codec_records            # full run, appends a result line
    .venv/bin/python -m benchmarks.codec_records --quick    # smoke run, nothing saved

For each workload and codec one batch is built, then each library decodes it to
(offset, timestamp, key, value, headers) and builds it again with the same codec, and
keg also decodes only, encodes only, and walks the batch without decoding it (what the
gateway does to a batch no rule touches). MB/s is the *uncompressed* batch size over
the time taken (MB = 10^6 bytes), so codecs compare on the same data; best of
``--rounds`` rounds, the libraries interleaved in every round so machine noise hits
them alike. aiokafka (its Cython codec) and kafka-python use their own compression
levels: both write gzip at level 9, aiokafka lz4 at level 9; keg uses
``kafka_wire.compression.DEFAULT_LEVELS``. Results are appended to
``benchmarks/results/codec.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.gateway_vs_direct import git_commit
from kafka_wire.compression import DEFAULT_LEVELS, Compression
from kafka_wire.records import (
    BatchHeader,
    BatchView,
    Record,
    decode_records,
    encode_batch,
    iter_batches,
    rewrite_records,
)

RESULTS = Path(__file__).resolve().parent / "results" / "codec.jsonl"
CODECS = list(Compression)
Op = Callable[[], object]


@dataclass(frozen=True)
class Workload:
    name: str
    records: list[Record]


def workloads(seed: int = 7) -> list[Workload]:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "order", "user", "paid", "EUR", "shipped"]

    def event(i: int) -> bytes:
        doc = {
            "id": i,
            "user": f"user-{rng.randrange(100_000):06d}",
            "email": f"u{rng.randrange(10**6)}@example.com",
            "status": rng.choice(words),
            "amount": round(rng.random() * 1000, 2),
            "note": " ".join(rng.choice(words) for _ in range(rng.randrange(2, 8))),
        }
        return json.dumps(doc).encode()

    events = [
        Record(i, i * 3, b"user-%06d" % rng.randrange(10**6), event(i),
               [("trace-id", b"%016x" % rng.getrandbits(64))])
        for i in range(500)
    ]
    kib = [
        Record(i, i, None, " ".join(rng.choice(words) for _ in range(150)).encode()[:1024], [])
        for i in range(100)
    ]
    return [Workload("500 x ~150 B JSON", events), Workload("100 x 1 KiB text", kib)]


# --------------------------------------------------------------------------- operations


def keg_ops(data: bytes) -> dict[str, Op]:
    view = BatchView.from_bytes(data)
    records = decode_records(view)
    return {
        "keg decode+encode": lambda: encode_batch(view, decode_records(view)),
        "keg decode": lambda: decode_records(view),
        "keg encode": lambda: encode_batch(view, records),
        "keg pass-through": lambda: (list(iter_batches(data)), rewrite_records(data, _none)),
    }


def _none(batch: BatchView) -> None:
    return None


def library_ops(data: bytes, codec: int) -> dict[str, Op]:
    ops: dict[str, Op] = {}
    try:
        from aiokafka.record.default_records import DefaultRecordBatch as AioBatch
        from aiokafka.record.default_records import DefaultRecordBatchBuilder as AioBuilder
    except ImportError:
        pass
    else:
        ops["aiokafka decode+encode"] = lambda: _round_trip(AioBatch, AioBuilder, data, codec)
    from kafka.record.default_records import DefaultRecordBatch as KpBatch
    from kafka.record.default_records import DefaultRecordBatchBuilder as KpBuilder

    ops["kafka-python decode+encode"] = lambda: _round_trip(KpBatch, KpBuilder, data, codec)
    return ops


def _round_trip(batch_cls: Any, builder_cls: Any, data: bytes, codec: int) -> bytes:
    batch = batch_cls(data)
    decoded = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch]
    builder = builder_cls(
        magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 30,
    )
    for offset, timestamp, key, value, headers in decoded:
        builder.append(offset, timestamp=timestamp, key=key, value=value, headers=headers)
    return bytes(builder.build())


# --------------------------------------------------------------------------- timing


def measure(ops: dict[str, Op], size: int, rounds: int, budget_s: float) -> dict[str, float]:
    """MB/s per op: best of ``rounds``, each op timed for about ``budget_s`` per round."""
    loops = {}
    for name, op in ops.items():  # calibrate (and warm up)
        start = time.perf_counter()
        op()
        elapsed = max(time.perf_counter() - start, 1e-6)
        loops[name] = max(1, int(budget_s / elapsed))
    best: dict[str, float] = dict.fromkeys(ops, float("inf"))
    for _ in range(rounds):
        for name, op in ops.items():
            n = loops[name]
            start = time.perf_counter()
            for _ in range(n):
                op()
            best[name] = min(best[name], (time.perf_counter() - start) / n)
    return {name: size / seconds / 1e6 for name, seconds in best.items()}


def run(rounds: int, budget_s: float) -> list[dict[str, Any]]:
    rows = []
    for workload in workloads():
        plain = encode_batch(BatchHeader(base_timestamp=1_700_000_000_000), workload.records)
        for codec in CODECS:
            data = encode_batch(BatchView.from_bytes(plain), workload.records, compression=codec)
            ops = {**keg_ops(data), **library_ops(data, codec)}
            mbps = measure(ops, len(plain), rounds, budget_s)
            rows.append({
                "workload": workload.name,
                "codec": codec.name.lower(),
                "level": DEFAULT_LEVELS[codec],
                "batch_bytes": len(data),
                "uncompressed_bytes": len(plain),
                "mb_per_s": {name: round(v, 1) for name, v in mbps.items()},
            })
    return rows


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "nproc": str(os.cpu_count())}
    for package in ("cramjam", "google-crc32c", "aiokafka", "kafka-python"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "absent"
    return out


def print_table(rows: list[dict[str, Any]], console: Console) -> None:
    columns = list(rows[0]["mb_per_s"])
    table = Table(title="record batch codecs, MB/s of uncompressed batch (higher is better)")
    table.add_column("workload")
    table.add_column("codec")
    table.add_column("bytes", justify="right")
    for column in columns:
        table.add_column(column.replace(" ", "\n", 1), justify="right")
    for row in rows:
        table.add_row(
            row["workload"], row["codec"], f"{row['batch_bytes']:,}",
            *(f"{row['mb_per_s'].get(c, float('nan')):.1f}" for c in columns),
        )
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.2, help="seconds per op per round")
    parser.add_argument("--quick", action="store_true", help="1 round, short, not saved")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    rounds, budget = (1, 0.02) if args.quick else (args.rounds, args.budget)
    console = Console(width=max(120, Console().width))
    started = time.perf_counter()
    rows = run(rounds, budget)
    print_table(rows, console)
    if not (args.quick or args.no_save):
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        line = {
            "benchmark": "codec_records",
            "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
            "git_commit": git_commit(),
            "machine": versions(),
            "params": {"rounds": rounds, "budget_s": budget},
            "elapsed_s": round(time.perf_counter() - started, 1),
            "results": rows,
        }
        with RESULTS.open("a") as fh:
            fh.write(json.dumps(line) + "\n")
        console.print(f"appended to {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
