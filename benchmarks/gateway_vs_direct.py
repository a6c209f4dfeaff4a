"""Gateway vs direct: the same Kafka workloads against the broker and through keg, side by side.

One embedded Kafka broker and one gateway in front of it are started once. Every step
(Kafka's ProducerPerformance, its ConsumerPerformance over the records just written,
librdkafka produce, librdkafka consume) runs first directly against the broker, then
through the gateway, before the next step starts, so machine noise hits both paths alike.
Each round uses fresh topics; ``--repeat`` rounds are summarised by their median.

Run it with ``python -m benchmarks`` (``--help`` lists the options).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

log = logging.getLogger("benchmarks")

MIB = 1024 * 1024  # Kafka's perf tools say "MB" and mean MiB; so do we.
DIRECT, GATEWAY = "direct", "gateway"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent

Sample = dict[str, float]  # metric key -> value, for one step on one path


class BenchmarkError(RuntimeError):
    """A benchmark step failed or produced output that could not be understood."""


# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class Params:
    records: int = 200_000
    record_size: int = 1024
    partitions: int = 3
    repeat: int = 1
    warmup: int = 10_000
    linger_ms: int = 5
    step_timeout_s: float = 600.0


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    higher_is_better: bool


def _throughput(prefix: str, what: str, unit: str, key: str) -> Metric:
    return Metric(f"{prefix}.{key}", f"{what} {unit}", unit, higher_is_better=True)


def _latency(prefix: str, what: str, key: str, name: str) -> Metric:
    return Metric(f"{prefix}.{key}", f"{what} {name} latency ms", "ms", higher_is_better=False)


METRICS: tuple[Metric, ...] = (
    _throughput("java_produce", "Java producer", "records/s", "records_per_s"),
    _throughput("java_produce", "Java producer", "MB/s", "mb_per_s"),
    _latency("java_produce", "Java producer", "avg_latency_ms", "avg"),
    _latency("java_produce", "Java producer", "p50_ms", "p50"),
    _latency("java_produce", "Java producer", "p95_ms", "p95"),
    _latency("java_produce", "Java producer", "p99_ms", "p99"),
    _latency("java_produce", "Java producer", "p999_ms", "p99.9"),
    _latency("java_produce", "Java producer", "max_latency_ms", "max"),
    _throughput("java_consume", "Java consumer", "records/s", "records_per_s"),
    _throughput("java_consume", "Java consumer", "MB/s", "mb_per_s"),
    _throughput("java_consume", "Java consumer fetch-only", "records/s", "fetch_records_per_s"),
    _throughput("java_consume", "Java consumer fetch-only", "MB/s", "fetch_mb_per_s"),
    _throughput("rdkafka_produce", "librdkafka producer", "records/s", "records_per_s"),
    _throughput("rdkafka_produce", "librdkafka producer", "MB/s", "mb_per_s"),
    _latency("rdkafka_produce", "librdkafka producer", "avg_latency_ms", "avg"),
    _latency("rdkafka_produce", "librdkafka producer", "p50_ms", "p50"),
    _latency("rdkafka_produce", "librdkafka producer", "p99_ms", "p99"),
    _throughput("rdkafka_consume", "librdkafka consumer", "records/s", "records_per_s"),
    _throughput("rdkafka_consume", "librdkafka consumer", "MB/s", "mb_per_s"),
)


# --------------------------------------------------------------------------- Kafka's perf tools

_PRODUCER_SUMMARY = re.compile(
    r"(?P<sent>\d+) records sent, (?P<records_per_s>[\d.]+) records/sec "
    r"\((?P<mb_per_s>[\d.]+) MB/sec\), (?P<avg_latency_ms>[\d.]+) ms avg latency, "
    r"(?P<max_latency_ms>[\d.]+) ms max latency, (?P<p50_ms>\d+) ms 50th, "
    r"(?P<p95_ms>\d+) ms 95th, (?P<p99_ms>\d+) ms 99th, (?P<p999_ms>\d+) ms 99\.9th"
)

# ConsumerPerformance's CSV columns -> our metric keys.
_CONSUMER_COLUMNS = {
    "MB.sec": "mb_per_s",
    "nMsg.sec": "records_per_s",
    "fetch.MB.sec": "fetch_mb_per_s",
    "fetch.nMsg.sec": "fetch_records_per_s",
    "rebalance.time.ms": "rebalance_ms",
}


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_kafka_tool(name: str, *args: str, timeout: float) -> str:
    """Run one of Kafka's Java tools and return its stdout; raise on failure."""
    from keg.embedded.kafka import java_tool_command

    java, *rest = java_tool_command(name, *args)
    # An English locale keeps the tools' decimal points parseable.
    cmd = [java, "-Duser.language=en", "-Duser.country=US", *rest]
    log.debug("running %s", " ".join(cmd))
    try:
        done = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise BenchmarkError(f"kafka tool {name} did not finish within {timeout:.0f}s") from exc
    if done.returncode != 0:
        raise BenchmarkError(
            f"kafka tool {name} failed (exit {done.returncode}):\n{_tail(done.stderr)}"
        )
    return done.stdout


def parse_producer_perf(output: str, expected_records: int) -> Sample:
    """The numbers of ProducerPerformance's final summary line (the one with percentiles)."""
    matches = list(_PRODUCER_SUMMARY.finditer(output))
    if not matches:
        raise BenchmarkError(f"no ProducerPerformance summary line in:\n{_tail(output)}")
    fields = matches[-1].groupdict()
    sent = int(fields.pop("sent"))
    if sent != expected_records:
        raise BenchmarkError(f"ProducerPerformance acknowledged {sent} of {expected_records}")
    return {key: float(value) for key, value in fields.items()}


def parse_consumer_perf(output: str, expected_records: int) -> Sample:
    """The numbers of ConsumerPerformance's CSV report (a header line, then a value line)."""
    lines = [line for line in output.splitlines() if line.strip()]
    for header, values in itertools.pairwise(lines):
        if header.startswith("start.time"):
            row = dict(
                zip(
                    (h.strip() for h in header.split(",")),
                    (v.strip() for v in values.split(",")),
                    strict=True,
                )
            )
            break
    else:
        raise BenchmarkError(f"no ConsumerPerformance report in:\n{_tail(output)}")
    consumed = int(row["data.consumed.in.nMsg"])
    if consumed != expected_records:
        raise BenchmarkError(f"ConsumerPerformance consumed {consumed} of {expected_records}")
    return {ours: float(row[theirs]) for theirs, ours in _CONSUMER_COLUMNS.items()}


def java_produce(bootstrap: str, topic: str, params: Params) -> Sample:
    output = run_kafka_tool(
        "producer-perf",
        "--topic", topic,
        "--num-records", str(params.records),
        "--record-size", str(params.record_size),
        "--throughput", "-1",
        "--producer-props", f"bootstrap.servers={bootstrap}", "acks=all",
        timeout=params.step_timeout_s,
    )  # fmt: skip
    return parse_producer_perf(output, params.records)


def java_consume(bootstrap: str, topic: str, params: Params) -> Sample:
    output = run_kafka_tool(
        "consumer-perf",
        "--bootstrap-server", bootstrap,
        "--topic", topic,
        "--messages", str(params.records),
        "--group", f"bench-{uuid.uuid4().hex[:12]}",
        "--timeout", "30000",
        timeout=params.step_timeout_s,
    )  # fmt: skip
    return parse_consumer_perf(output, params.records)


# --------------------------------------------------------------------------- librdkafka


def _percentile(sorted_values: Sequence[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


def _rates(records: int, nbytes: int, elapsed_s: float) -> Sample:
    return {"records_per_s": records / elapsed_s, "mb_per_s": nbytes / MIB / elapsed_s}


def _client_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    """librdkafka settings shared by every client; its logs go to Python logging."""
    return {"bootstrap.servers": bootstrap, "logger": logging.getLogger("librdkafka"), **extra}


def rdkafka_produce(bootstrap: str, topic: str, params: Params) -> Sample:
    """Produce ``records`` values of ``record_size`` bytes with acks=all; time until flushed."""
    from confluent_kafka import KafkaError, Message, Producer

    latencies: list[float] = []
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            latencies.append(msg.latency() or 0.0)

    producer = Producer(
        _client_config(
            bootstrap,
            acks="all",
            **{"linger.ms": params.linger_ms, "compression.type": "none"},
            on_delivery=on_delivery,
        )
    )
    payload = os.urandom(params.record_size)
    started = time.perf_counter()
    for i in range(params.records):
        while True:
            try:
                producer.produce(topic, payload)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    unsent = producer.flush(params.step_timeout_s)
    elapsed = time.perf_counter() - started
    if unsent or errors:
        first = errors[0] if errors else "flush timed out"
        raise BenchmarkError(f"librdkafka: {unsent} unsent, {len(errors)} failed ({first})")
    latencies.sort()
    return {
        **_rates(params.records, params.records * params.record_size, elapsed),
        "avg_latency_ms": 1000 * statistics.fmean(latencies),
        "p50_ms": 1000 * _percentile(latencies, 0.50),
        "p99_ms": 1000 * _percentile(latencies, 0.99),
    }


def rdkafka_consume(bootstrap: str, topic: str, params: Params) -> Sample:
    """Read ``records`` records from the beginning of every partition (assign, no group
    rebalance); time from assign to the last record."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        _client_config(
            bootstrap,
            **{
                "group.id": f"bench-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            },
        )
    )
    count = nbytes = 0
    try:
        started = last_progress = time.perf_counter()
        consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(params.partitions)]
        )
        while count < params.records:
            for msg in consumer.consume(num_messages=10_000, timeout=1.0):
                if (err := msg.error()) is not None:
                    raise BenchmarkError(f"librdkafka consume error: {err}")
                count += 1
                nbytes += len(msg.value() or b"")
                last_progress = time.perf_counter()
            if time.perf_counter() - last_progress > 30:
                raise BenchmarkError(f"librdkafka consumer stalled at {count}/{params.records}")
        elapsed = last_progress - started
    finally:
        consumer.close()
    return _rates(count, nbytes, elapsed)


def create_topics(bootstrap: str, names: Sequence[str], partitions: int) -> None:
    """Create fresh topics directly on the broker (set-up, not measured)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(_client_config(bootstrap))
    futures = admin.create_topics(
        [NewTopic(name, partitions, 1) for name in names], operation_timeout=30
    )
    for future in futures.values():
        future.result(30)


# --------------------------------------------------------------------------- the run


StepFn = Callable[[str, str, Params], Sample]


@dataclass(frozen=True)
class Step:
    name: str
    prefix: str  # metric key prefix
    topic_kind: str  # steps sharing a kind read what the previous one wrote
    run: StepFn
    warms_up: bool  # part of the (cheap, in-process) warm-up


STEPS: tuple[Step, ...] = (
    Step("Java ProducerPerformance", "java_produce", "java", java_produce, False),
    Step("Java ConsumerPerformance", "java_consume", "java", java_consume, False),
    Step("librdkafka produce", "rdkafka_produce", "rdkafka", rdkafka_produce, True),
    Step("librdkafka consume", "rdkafka_consume", "rdkafka", rdkafka_consume, True),
)

Status = Callable[[str], contextlib.AbstractContextManager[Any]]


def fresh_topics(
    broker: str, prefix: str, paths: Sequence[str], steps: Sequence[Step], partitions: int
) -> dict[tuple[str, str], str]:
    """Create the topics ``steps`` use on every path; (path, topic kind) -> topic name."""
    kinds = sorted({step.topic_kind for step in steps})
    topics = {(path, kind): f"{prefix}-{path}-{kind}" for path in paths for kind in kinds}
    create_topics(broker, list(topics.values()), partitions)
    return topics


def run_round(
    number: int,
    paths: Mapping[str, str],
    broker: str,
    params: Params,
    status: Status,
    run_id: str,
) -> dict[str, Sample]:
    """Every step on every path (path-alternating per step) on fresh topics."""
    label = f"round {number}/{params.repeat}"
    topics = fresh_topics(
        broker, f"bench-{run_id}-r{number}", list(paths), STEPS, params.partitions
    )
    results: dict[str, Sample] = {path: {} for path in paths}
    for step in STEPS:
        for path, bootstrap in paths.items():
            with status(f"[{label}] {step.name} via {path} ({params.records:,} records)"):
                sample = step.run(bootstrap, topics[path, step.topic_kind], params)
            log.info("[%s] %s via %s: %s", label, step.name, path, _brief(sample))
            results[path].update({f"{step.prefix}.{k}": v for k, v in sample.items()})
    return results


def _brief(sample: Sample) -> str:
    return ", ".join(f"{key}={value:,.1f}" for key, value in sample.items())


def warm_up(
    paths: Mapping[str, str], broker: str, params: Params, status: Status, run_id: str
) -> None:
    """A short librdkafka produce+consume on every path (JIT, page cache, connections)."""
    if params.warmup <= 0:
        return
    small = dataclasses.replace(params, records=params.warmup)
    steps = [step for step in STEPS if step.warms_up]
    topics = fresh_topics(broker, f"bench-{run_id}-warmup", list(paths), steps, params.partitions)
    for path, bootstrap in paths.items():
        with status(f"warming up via {path} ({params.warmup:,} records)"):
            for step in steps:
                step.run(bootstrap, topics[path, step.topic_kind], small)


# --------------------------------------------------------------------------- summary


@dataclass(frozen=True)
class Row:
    metric: Metric
    direct: float | None
    gateway: float | None

    @property
    def ratio(self) -> float | None:
        if self.direct is None or self.gateway is None or self.direct == 0:
            return None
        return self.gateway / self.direct


def summarise(rounds: Sequence[Mapping[str, Sample]]) -> list[Row]:
    """Median of every metric over the rounds, per path."""

    def median(path: str, key: str) -> float | None:
        values = [r[path][key] for r in rounds if path in r and key in r[path]]
        return statistics.median(values) if values else None

    return [Row(m, median(DIRECT, m.key), median(GATEWAY, m.key)) for m in METRICS]


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "records/s":
        return f"{value:,.0f}"
    return f"{value:,.1f}"


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table_cells(rows: Sequence[Row]) -> list[list[str]]:
    return [
        [
            row.metric.label,
            "higher" if row.metric.higher_is_better else "lower",
            _fmt(row.direct, row.metric.unit),
            _fmt(row.gateway, row.metric.unit),
            _fmt_ratio(row.ratio),
        ]
        for row in rows
    ]


TABLE_HEADER = ("metric", "better", "direct", "gateway", "gateway/direct")


def rich_table(rows: Sequence[Row], title: str) -> Table:
    table = Table(title=title, caption="ratio = gateway / direct, for every row")
    for i, name in enumerate(TABLE_HEADER):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    for cells in table_cells(rows):
        table.add_row(*cells)
    return table


def markdown_table(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|---|---|---:|---:|---:|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_cells(rows)]
    return "\n".join(lines)


# --------------------------------------------------------------------------- records


def git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def machine_info() -> dict[str, Any]:
    import confluent_kafka

    from keg.embedded.kafka import kafka_version

    return {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "kafka": kafka_version(),
        "confluent_kafka": getattr(confluent_kafka, "__version__", "unknown"),
        "librdkafka": confluent_kafka.libversion()[0],
    }


def build_record(
    params: Params,
    paths: Sequence[str],
    rounds: Sequence[Mapping[str, Sample]],
    rows: Sequence[Row],
    elapsed_s: float,
) -> dict[str, Any]:
    return {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "machine": machine_info(),
        "params": {
            **asdict(params),
            "paths": list(paths),
            "order": "direct then gateway, per step",
        },
        "elapsed_s": round(elapsed_s, 1),
        "rounds": rounds,
        "summary": {
            row.metric.key: {
                "direct": row.direct,
                "gateway": row.gateway,
                "ratio": row.ratio,
                "higher_is_better": row.metric.higher_is_better,
            }
            for row in rows
        },
    }


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def save(record: Mapping[str, Any], rows: Sequence[Row], results_dir: Path) -> None:
    results_dir.mkdir(parents=True, exist_ok=True)
    with (results_dir / "results.jsonl").open("a") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
    params = record["params"]
    machine = record["machine"]
    text = (
        "# keg benchmark: gateway vs direct\n\n"
        f"- when: {record['timestamp']}, commit: {record['git_commit'] or 'unknown'}\n"
        f"- machine: {machine['nproc']} cores, Python {machine['python']}, "
        f"Kafka {machine['kafka']}, librdkafka {machine['librdkafka']}\n"
        f"- {params['records']:,} records of {params['record_size']} B, acks=all, "
        f"{params['partitions']} partitions, {params['repeat']} round(s) (median), "
        f"fresh topics per round; MB = MiB\n"
        f"- ratio = gateway / direct for every row: below 1 is slower for throughput "
        f"(higher is better), above 1 is slower for latency (lower is better)\n\n"
        f"{markdown_table(rows)}\n"
    )
    _write_atomically(results_dir / "latest.md", text)
    log.info("results: %s, %s", results_dir / "results.jsonl", results_dir / "latest.md")


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    defaults = Params()
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Kafka produce/consume throughput and latency, direct to an embedded broker "
        "and through the keg gateway in front of it, side by side.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--records",
        type=int,
        default=defaults.records,
        help="records per step and path (2000 makes a quick smoke run)",
    )
    parser.add_argument(
        "--record-size", type=int, default=defaults.record_size, help="bytes per record value"
    )
    parser.add_argument(
        "--partitions", type=int, default=defaults.partitions, help="partitions of each fresh topic"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=defaults.repeat,
        help="rounds (direct/gateway pairs); the table shows medians",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=defaults.warmup,
        help="records of an unrecorded librdkafka warm-up per path (0: none)",
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=defaults.step_timeout_s,
        help="seconds one step may take",
    )
    parser.add_argument(
        "--direct-only", action="store_true", help="skip the gateway (e.g. while it is being built)"
    )
    parser.add_argument(
        "--results-dir", type=Path, default=RESULTS_DIR, help="where results.jsonl and latest.md go"
    )
    parser.add_argument(
        "--no-save", action="store_true", help="print the table only; write no results"
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    args = parser.parse_args(argv)
    for name in ("records", "record_size", "partitions", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def _setup_logging(level: str, console: Console) -> None:
    handler = RichHandler(
        console=console, show_path=False, log_time_format="%H:%M:%S", rich_tracebacks=True
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


@contextlib.contextmanager
def _services(direct_only: bool, status: Status) -> Iterator[dict[str, str]]:
    """The broker (and the gateway in front of it); yields path name -> bootstrap."""
    from keg.embedded.kafka import EmbeddedKafka, ensure_kafka
    from keg.gateway import Gateway, GatewaySettings

    with contextlib.ExitStack() as stack:
        with status("fetching Kafka jars (first run only)"):
            ensure_kafka()
        with status("starting the embedded Kafka broker"):
            kafka = stack.enter_context(EmbeddedKafka())
        paths = {DIRECT: kafka.bootstrap}
        if not direct_only:
            settings = GatewaySettings(
                bootstrap_servers=kafka.bootstrap, listen_port_base=0, ext_proc_log_level="WARNING"
            )
            with status("starting the gateway (ext_proc, control plane, Envoy)"):
                try:
                    gateway = stack.enter_context(Gateway(settings))
                except Exception as exc:
                    raise BenchmarkError(
                        f"the gateway did not start ({type(exc).__name__}: {exc}); "
                        "--direct-only measures the broker alone"
                    ) from exc
            paths[GATEWAY] = gateway.bootstrap
        log.info("paths: %s", ", ".join(f"{name} {addr}" for name, addr in paths.items()))
        yield paths


def run(params: Params, direct_only: bool, status: Status) -> tuple[list[str], list[Row], Any]:
    started = time.monotonic()
    run_id = uuid.uuid4().hex[:6]
    with _services(direct_only, status) as paths:
        broker = paths[DIRECT]
        warm_up(paths, broker, params, status, run_id)
        rounds = [
            run_round(n, paths, broker, params, status, run_id) for n in range(1, params.repeat + 1)
        ]
    rows = summarise(rounds)
    record = build_record(params, list(paths), rounds, rows, time.monotonic() - started)
    return list(paths), rows, record


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    err_console = Console(stderr=True)
    _setup_logging(args.log_level, err_console)
    params = Params(
        records=args.records,
        record_size=args.record_size,
        partitions=args.partitions,
        repeat=args.repeat,
        warmup=args.warmup,
        step_timeout_s=args.step_timeout,
    )

    # A status spinner stays up only while the step runs; its log line stays after it.
    def status(text: str) -> contextlib.AbstractContextManager[Any]:
        return err_console.status(text)

    try:
        paths, rows, record = run(params, args.direct_only, status)
    except BenchmarkError as exc:  # expected failures: the message says it all
        log.error("benchmark failed: %s", exc, exc_info=log.isEnabledFor(logging.DEBUG))
        return 1
    except Exception:
        log.exception("benchmark failed")
        return 1
    title = f"keg: {' vs '.join(paths)} ({params.records:,} x {params.record_size} B, acks=all)"
    out = Console()
    if not out.is_terminal:  # a pipe or file: wide enough for the table, not 80 columns
        out = Console(width=110)
    out.print(rich_table(rows, title))
    if not args.no_save:
        save(record, rows, args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
