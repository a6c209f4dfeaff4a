"""Produce latency at a fixed rate: what each path adds to p50 and p99 over the broker alone.

    python -m benchmarks.latency [--seconds 10] [--repeat 3] [--paths tcp_proxy,native,ext_proc]

The goal: at a light 5,000 records/s and at half the direct throughput, the
gateway adds at most 0.5 ms to p50 and 2 ms to p99 produce latency. Throughput runs
(``benchmarks.gateway_vs_direct``) keep the producer's buffers full, so their latencies
are queueing time; here the producer sends at a set rate below what every path can
carry, so a record's latency is its round trip: produce() to its delivery report.

One broker; the paths of ``benchmarks.native_path`` (direct, Envoy's tcp_proxy alone,
keg's native filter, keg's ext_proc path), no rules. librdkafka (confluent-kafka),
1 KiB records, acks=all, linger.ms=1 (the issue's own measurement), one partition.

1. *Calibration*: librdkafka produces ``--calibration-records`` as fast as it can,
   directly; half of that rate is the "half" rate.
2. Per round, per rate (5,000/s, then half), per path back to back (direct first, so
   machine noise hits every path alike): a fresh topic, ``--warmup-seconds`` at the rate
   (not recorded: connections, metadata, the JIT), then ``--seconds`` at the rate,
   recorded. A path that cannot keep the rate is reported with the rate it reached (its
   latency is then queueing, not a round trip). The topic is deleted after the step.

Tables: per rate and path, p50 / p99 / p99.9 in ms (median over rounds) and what the path
adds to direct's p50 and p99 (median over rounds of the per-round difference: each round
compares paths measured within seconds of each other). Results are appended to
benchmarks/results/latency.jsonl; latency.md holds the latest tables.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import statistics
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.gateway_vs_direct import (
    DIRECT,
    RESULTS_DIR,
    BenchmarkError,
    create_topics,
    git_commit,
    machine_info,
)
from benchmarks.native_path import (
    EXT_PROC,
    GATEWAYS,
    NATIVE,
    TCP_PROXY,
    proxied_kafka,
    tcp_proxy_envoy,
)
from control_plane.service import free_port

log = logging.getLogger("benchmarks.latency")

PATHS = (DIRECT, TCP_PROXY, NATIVE, EXT_PROC)
LIGHT_RATE = 5_000  # records/s
# The goal: what a path may add to direct's latency, in ms.
GOAL_ADDED_MS = {"p50": 0.5, "p99": 2.0}
PERCENTILES = {"p50": 0.50, "p99": 0.99, "p999": 0.999}
# A path "keeps the rate" when it acknowledged at least this share of the records/s asked.
KEPT_SHARE = 0.95


@dataclass(frozen=True)
class Pace:
    """Send `rate` records/s for `seconds`: how many records are due `elapsed` s in."""

    rate: float
    seconds: float

    @property
    def total(self) -> int:
        return max(1, round(self.rate * self.seconds))

    def due(self, elapsed: float) -> int:
        return min(self.total, int(elapsed * self.rate) + 1)

    def at(self, sent: int) -> float:
        """When (seconds after the start) record number `sent` is due."""
        return sent / self.rate


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of sorted values."""
    if not sorted_values:
        raise ValueError("no values")
    # The rank is rounded up; the epsilon keeps 0.99 * 100 at 99, whatever the float error.
    rank = math.ceil(fraction * len(sorted_values) - 1e-9)
    return sorted_values[min(len(sorted_values), max(1, rank)) - 1]


def summary(latencies_s: Sequence[float], elapsed_s: float) -> dict[str, float]:
    """Latency percentiles (ms) and the rate reached (records/s) of one recorded run."""
    ordered = sorted(latencies_s)
    result = {name: 1000 * percentile(ordered, fraction) for name, fraction in PERCENTILES.items()}
    result["records_per_s"] = len(ordered) / elapsed_s if elapsed_s > 0 else 0.0
    return result


def added(rounds: Sequence[Mapping[str, Mapping[str, float]]], path: str, key: str) -> float | None:
    """Median over rounds of `path`'s `key` minus direct's in the same round."""
    diffs = [r[path][key] - r[DIRECT][key] for r in rounds if path in r and DIRECT in r]
    return statistics.median(diffs) if diffs else None


def median_of(
    rounds: Sequence[Mapping[str, Mapping[str, float]]], path: str, key: str
) -> float | None:
    values = [r[path][key] for r in rounds if path in r]
    return statistics.median(values) if values else None


# --------------------------------------------------------------------------- the producer


def _producer(bootstrap: str, on_delivery: Any = None) -> Any:
    from confluent_kafka import Producer

    config = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 1,
        "compression.type": "none",
        "logger": logging.getLogger("librdkafka"),
    }
    return Producer(config if on_delivery is None else {**config, "on_delivery": on_delivery})


def paced_produce(
    bootstrap: str, topic: str, pace: Pace, warmup: Pace, record_size: int
) -> dict[str, float]:
    """Produce at `warmup`'s rate for its time (not recorded), then at `pace`'s; the
    recorded records' delivery latencies and the rate they were acknowledged at."""
    import os

    from confluent_kafka import KafkaError, Message

    recording = False
    latencies: list[float] = []
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(str(err))
        elif recording:  # the warm-up was flushed before recording began
            latencies.append(msg.latency() or 0.0)

    producer = _producer(bootstrap, on_delivery)
    payload = os.urandom(record_size)
    _send_at(producer, topic, payload, warmup)
    producer.flush(30)
    recording = True
    started = time.perf_counter()
    _send_at(producer, topic, payload, pace)
    unsent = producer.flush(60)
    elapsed = time.perf_counter() - started
    if unsent or errors:
        first = errors[0] if errors else "flush timed out"
        raise BenchmarkError(f"librdkafka: {unsent} unsent, {len(errors)} failed ({first})")
    if len(latencies) != pace.total:
        raise BenchmarkError(f"{len(latencies)} delivery reports of {pace.total} records")
    return summary(latencies, elapsed)


def _send_at(producer: Any, topic: str, payload: bytes, pace: Pace) -> None:
    """Send pace.total records, each no earlier than it is due (a burst of the records
    due since the last wake-up, then sleep until the next is due)."""
    started = time.perf_counter()
    sent = 0
    while sent < pace.total:
        due = pace.due(time.perf_counter() - started)
        while sent < due:
            try:
                producer.produce(topic, payload)
                sent += 1
            except BufferError:  # the path cannot keep up: let deliveries drain the queue
                producer.poll(0.001)
        producer.poll(0)
        wait = started + pace.at(sent) - time.perf_counter()
        if wait > 0:
            time.sleep(wait)


def full_rate(bootstrap: str, topic: str, records: int, record_size: int) -> float:
    """Records/s of producing `records` as fast as librdkafka can (same settings)."""
    import os

    producer = _producer(bootstrap)
    payload = os.urandom(record_size)
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, payload)
                break
            except BufferError:
                producer.poll(0.001)
        if i % 1000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise BenchmarkError("calibration: flush timed out")
    return records / (time.perf_counter() - started)


def _delete_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the futures are done
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        future.result(30)


# --------------------------------------------------------------------------- tables


def table(rounds: Sequence[Mapping[str, Mapping[str, float]]], rate: float) -> str:
    paths = [p for p in PATHS if any(p in r for r in rounds)]
    lines = [
        f"### {rate:,.0f} records/s asked (librdkafka, 1 KiB, acks=all, linger.ms=1)",
        "",
        "| path | records/s reached | p50 ms | p99 ms | p99.9 ms | added p50 ms | "
        "added p99 ms | goal (+0.5 / +2 ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for path in paths:
        cells = [path, _num(median_of(rounds, path, "records_per_s"), 0)]
        cells += [_num(median_of(rounds, path, k), 2) for k in PERCENTILES]
        if path == DIRECT:
            cells += ["-", "-", "-"]
        else:
            extra = {k: added(rounds, path, k) for k in GOAL_ADDED_MS}
            cells += [
                _num(extra["p50"], 2, signed=True),
                _num(extra["p99"], 2, signed=True),
                _verdict(rounds, path, rate, extra),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _verdict(
    rounds: Sequence[Mapping[str, Mapping[str, float]]],
    path: str,
    rate: float,
    extra: Mapping[str, float | None],
) -> str:
    reached = median_of(rounds, path, "records_per_s") or 0.0
    if reached < KEPT_SHARE * rate:
        return f"rate not kept ({reached / rate:.2f} of it)"
    met = all(v is not None and v <= GOAL_ADDED_MS[k] for k, v in extra.items())
    return "met" if met else "missed"


def _num(value: float | None, digits: int, *, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+,.{digits}f}" if signed else f"{value:,.{digits}f}"


# --------------------------------------------------------------------------- the run


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="recorded seconds per step")
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        default=2.0,
        help="seconds at the rate before recording, per step",
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds; tables show medians")
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--calibration-records", type=int, default=200_000)
    parser.add_argument(
        "--rates",
        default="light,half",
        help="comma-separated: light (5,000/s), half (of direct), or a number",
    )
    parser.add_argument("--envoy-concurrency", type=int, default=1)
    parser.add_argument(
        "--paths", default=",".join(PATHS[1:]), help="paths besides direct, comma-separated"
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-save", action="store_true")
    return parser.parse_args(argv)


def _rates(spec: str, direct_rate: float) -> list[float]:
    named = {"light": float(LIGHT_RATE), "half": direct_rate / 2}
    return [named[r] if r in named else float(r) for r in spec.split(",") if r]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("librdkafka").setLevel(logging.ERROR)
    from keg.embedded.kafka import ensure_kafka
    from keg.gateway import Gateway, GatewaySettings

    wanted = [p for p in args.paths.split(",") if p]
    ensure_kafka()
    proxied, proxy = free_port(), free_port()
    results: dict[float, list[dict[str, dict[str, float]]]] = {}
    with contextlib.ExitStack() as stack:
        kafka = stack.enter_context(proxied_kafka(proxied, proxy))
        paths = {DIRECT: kafka.bootstrap}
        if TCP_PROXY in wanted:
            paths[TCP_PROXY], _ = stack.enter_context(
                tcp_proxy_envoy(proxy, proxied, args.envoy_concurrency)
            )
        for path in (NATIVE, EXT_PROC):
            if path in wanted:
                data_path, module_metrics = GATEWAYS[path]
                paths[path] = stack.enter_context(
                    Gateway(
                        GatewaySettings(
                            bootstrap_servers=kafka.bootstrap,
                            listen_port_base=0,
                            envoy_concurrency=args.envoy_concurrency,
                            ext_proc_log_level="WARNING",
                            data_path=data_path,
                            module_metrics_port=module_metrics,
                        )
                    )
                ).bootstrap
        prefix = f"latency-{uuid.uuid4().hex[:6]}"
        calibration = f"{prefix}-calibration"
        create_topics(kafka.bootstrap, [calibration], 1)
        direct_rate = full_rate(
            kafka.bootstrap, calibration, args.calibration_records, args.record_size
        )
        _delete_topic(kafka.bootstrap, calibration)
        log.info("direct full rate: %.0f records/s", direct_rate)
        rates = _rates(args.rates, direct_rate)
        for number in range(1, args.repeat + 1):
            for rate in rates:
                round_: dict[str, dict[str, float]] = {}
                for path, bootstrap in paths.items():
                    topic = f"{prefix}-r{number}-{int(rate)}-{path}"
                    create_topics(kafka.bootstrap, [topic], 1)
                    round_[path] = paced_produce(
                        bootstrap,
                        topic,
                        Pace(rate, args.seconds),
                        Pace(rate, args.warmup_seconds),
                        args.record_size,
                    )
                    _delete_topic(kafka.bootstrap, topic)
                    log.info(
                        "round %d, %.0f/s via %s: %s",
                        number,
                        rate,
                        path,
                        ", ".join(f"{k}={v:,.2f}" for k, v in round_[path].items()),
                    )
                results.setdefault(rate, []).append(round_)
    title = (
        f"Produce latency at a fixed rate ({args.repeat} round(s) of {args.seconds:g} s "
        f"per rate and path; direct full rate {direct_rate:,.0f} records/s; Envoy "
        f"concurrency {args.envoy_concurrency}). Medians over rounds; 'added' is the "
        f"median of each round's path minus direct."
    )
    text = title + "\n\n" + "\n".join(table(rounds, rate) for rate, rounds in results.items())
    print(text)
    if not args.no_save:
        at = datetime.now(UTC).isoformat(timespec="seconds")
        record = {
            "benchmark": "latency",
            "at": at,
            "commit": git_commit(),
            "machine": machine_info(),
            "args": {k: str(v) for k, v in vars(args).items()},
            "direct_full_rate": direct_rate,
            "rounds": {str(rate): rounds for rate, rounds in results.items()},
        }
        args.results_dir.mkdir(parents=True, exist_ok=True)
        with (args.results_dir / "latency.jsonl").open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        (args.results_dir / "latency.md").write_text(
            f"# Produce latency at a fixed rate ({at}, commit {record['commit']})\n\n{text}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
