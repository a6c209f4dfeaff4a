"""Gateway vs direct: the same Kafka workloads against the broker and through keg, side by side.

One embedded Kafka broker is started once. Each rule-set scenario (``--scenario``, see
``benchmarks/scenarios.py``: ``plain``, ``rules-1000-nonmatching``, ``observe-all``)
starts a gateway of its own in front of it, and every step (Kafka's
ProducerPerformance, its ConsumerPerformance over the records just written,
librdkafka produce, librdkafka consume) runs first directly against the broker, then
through that gateway, before the next step starts, so machine noise hits both paths
alike. Each round uses fresh topics; ``--repeat`` rounds are summarised by their median.
The summary compares the scenarios by their gateway/direct ratios.

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
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

if TYPE_CHECKING:
    from keg.gateway import Gateway

from benchmarks.scenarios import (
    PLAIN,
    SCENARIOS,
    Scenario,
    ScenarioSetup,
    check_metrics,
    count_audit_events,
    scrape_metrics,
)

log = logging.getLogger("benchmarks")

MIB = 1024 * 1024  # Kafka's perf tools say "MB" and mean MiB; so do we.
DIRECT, GATEWAY = "direct", "gateway"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent

Sample = dict[str, float]  # metric key -> value, for one step on one path


class BenchmarkError(RuntimeError):
    """A benchmark step failed or produced output that could not be understood."""


# --------------------------------------------------------------------------- parameters


def _option(default: Any, option: str, help_text: str) -> Any:
    """A Params field the command line sets: its option and the option's help."""
    return dataclasses.field(default=default, metadata={"option": option, "help": help_text})


@dataclass(frozen=True)
class Params:
    records: int = _option(
        200_000, "--records",
        "records per step and path of the plain scenario (2000 makes a quick smoke run)")
    scenario_records: int = _option(
        100_000, "--scenario-records",
        "records per step and path of the other scenarios (at most --records)")
    record_size: int = _option(1024, "--record-size", "bytes per record value")
    partitions: int = _option(3, "--partitions", "partitions of each fresh topic")
    repeat: int = _option(
        1, "--repeat", "rounds (direct/gateway pairs) per scenario; the tables show medians")
    warmup: int = _option(
        10_000, "--warmup",
        "records of an unrecorded librdkafka warm-up per path and scenario (0: none)")
    linger_ms: int = 5
    step_timeout_s: float = _option(600.0, "--step-timeout", "seconds one step may take")
    data_path: str = _option(
        "ext-proc", "--data-path",
        "the gateway's data path: ext-proc (network ext_proc) or native (keg's module)")


# The Params the command line sets: field -> (option, help).
PARAM_OPTIONS: Final = {f.name: (f.metadata["option"], f.metadata["help"])
                        for f in dataclasses.fields(Params) if "option" in f.metadata}


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
    from keg.embedded.kafka import run_java_tool

    try:
        # An English locale keeps the tools' decimal points parseable.
        done = run_java_tool(name, *args, timeout=timeout,
                             jvm_options=("-Duser.language=en", "-Duser.country=US"))
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


def rdkafka_produce(bootstrap: str, topic: str, params: Params,
                    security: Mapping[str, Any] | None = None) -> Sample:
    """Produce ``records`` values of ``record_size`` bytes with acks=all; time until flushed.
    `security`: librdkafka's security.protocol, ssl.* and sasl.* settings, if any."""
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
            **{"linger.ms": params.linger_ms, "compression.type": "none", **(security or {})},
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


def rdkafka_consume(bootstrap: str, topic: str, params: Params,
                    security: Mapping[str, Any] | None = None) -> Sample:
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
                **(security or {}),
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


@contextlib.contextmanager
def gateway_with_rules(bootstrap: str, work: Path, rule_file: str, rules: str,
                       **settings: Any) -> Iterator[Gateway]:
    """A gateway in front of the broker at `bootstrap` serving one rule file (`rule_file`
    in `work`/rules), its files in `work`/envoy, the ext_proc service's log quiet;
    `settings` are more GatewaySettings."""
    from keg.gateway import Gateway, GatewaySettings

    rules_dir = work / "rules"
    rules_dir.mkdir()
    (rules_dir / rule_file).write_text(rules)
    with Gateway(GatewaySettings(bootstrap_servers=bootstrap, listen_port_base=0,
                                 rules_dir=rules_dir, work_dir=work / "envoy",
                                 ext_proc_log_level="WARNING", **settings)) as gateway:
        yield gateway


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

# Besides the metrics, every step records these per path (raw numbers, not summarised):
WALL_S = "wall_s"  # the step's wall time, tool start-up included
AUDIT_EVENTS = "audit_events"  # audit log lines the step added (gateway, with an audit log)
# CPU seconds the path's own processes (Envoy, keg's ext_proc workers) used in the step, and
# the same per GB (10^9 bytes of record values) the step moved: paths given a CPU clock.
CPU_S, CPU_S_PER_GB = "cpu_s", "cpu_s_per_gb"

Status = Callable[[str], contextlib.AbstractContextManager[Any]]
Counter = Callable[[], int]
CpuClock = Callable[[], float]  # CPU seconds some processes used so far


def process_cpu_seconds(pids: Iterable[int | None]) -> float:
    """User + system CPU seconds the processes `pids` used so far (Linux /proc); a
    process that is gone counts nothing."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        if pid is None:
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces) start at field 3, state:
        # utime and stime are fields 14 and 15.
        fields = stat.rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / ticks


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
    topic_prefix: str,
    label: str = "",
    audit_events: Counter | None = None,
    cpu_clocks: Mapping[str, CpuClock] | None = None,
) -> dict[str, Sample]:
    """Every step on every path (path-alternating per step) on fresh topics; a path with
    a clock in `cpu_clocks` also records the CPU its processes used (CPU_S, CPU_S_PER_GB)."""
    label = f"{label}round {number}/{params.repeat}"
    topics = fresh_topics(
        broker, f"{topic_prefix}-r{number}", list(paths), STEPS, params.partitions
    )
    results: dict[str, Sample] = {path: {} for path in paths}
    for step in STEPS:
        for path, bootstrap in paths.items():
            counter = audit_events if path == GATEWAY else None
            before = counter() if counter is not None else 0
            clock = (cpu_clocks or {}).get(path)
            cpu_before = clock() if clock is not None else 0.0
            with status(f"[{label}] {step.name} via {path} ({params.records:,} records)"):
                started = time.perf_counter()
                sample = step.run(bootstrap, topics[path, step.topic_kind], params)
                sample[WALL_S] = time.perf_counter() - started
            if counter is not None:
                sample[AUDIT_EVENTS] = counter() - before
            if clock is not None:
                sample[CPU_S] = clock() - cpu_before
                sample[CPU_S_PER_GB] = sample[CPU_S] / (params.records * params.record_size / 1e9)
            log.info("[%s] %s via %s: %s", label, step.name, path, _brief(sample))
            results[path].update({f"{step.prefix}.{k}": v for k, v in sample.items()})
    return results


def _brief(sample: Sample) -> str:
    return ", ".join(f"{key}={value:,.1f}" for key, value in sample.items())


def warm_up(
    paths: Mapping[str, str], broker: str, params: Params, status: Status, topic_prefix: str
) -> None:
    """A short librdkafka produce+consume on every path (JIT, page cache, connections)."""
    if params.warmup <= 0:
        return
    small = dataclasses.replace(params, records=params.warmup)
    steps = [step for step in STEPS if step.warms_up]
    topics = fresh_topics(broker, f"{topic_prefix}-warmup", list(paths), steps, params.partitions)
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


# The metrics the scenario comparison shows (every metric is in the per-scenario tables).
SUMMARY_KEYS: tuple[str, ...] = (
    "rdkafka_produce.records_per_s",
    "rdkafka_produce.p99_ms",
    "rdkafka_consume.records_per_s",
    "java_produce.records_per_s",
    "java_produce.p99_ms",
    "java_consume.mb_per_s",
)
_METRIC_BY_KEY = {m.key: m for m in METRICS}


@dataclass
class ScenarioResult:
    scenario: Scenario
    params: Params
    setup: ScenarioSetup = dataclasses.field(default_factory=ScenarioSetup)
    rounds: list[dict[str, Sample]] = dataclasses.field(default_factory=list)
    gateway_start_s: float | None = None
    gateway_metrics: dict[str, Any] | None = None
    audit_lines: int | None = None  # the whole audit log, warm-up included
    elapsed_s: float = 0.0
    error: str | None = None

    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def rows(self) -> list[Row]:
        return summarise(self.rounds)

    def ratio(self, key: str) -> float | None:
        return next((row.ratio for row in self.rows if row.metric.key == key), None)

    def audit(self) -> dict[str, Any] | None:
        """Audit events written during the measured gateway steps, and their rate over
        those steps' wall time (tool start-up included, so a lower bound)."""
        if self.setup.audit_log is None or not self.rounds:
            return None
        events = seconds = 0.0
        per_step: dict[str, dict[str, float]] = {}
        for rnd in self.rounds:
            sample = rnd.get(GATEWAY, {})
            for step in STEPS:
                n = sample.get(f"{step.prefix}.{AUDIT_EVENTS}")
                wall = sample.get(f"{step.prefix}.{WALL_S}")
                if n is None or wall is None:
                    continue
                events += n
                seconds += wall
                acc = per_step.setdefault(step.prefix, {"events": 0.0, "wall_s": 0.0})
                acc["events"] += n
                acc["wall_s"] += wall
        return {
            "events": int(events),
            "events_per_s": events / seconds if seconds else None,
            "wall_s": seconds,
            "per_step": {
                prefix: {**acc, "events_per_s": acc["events"] / acc["wall_s"]}
                for prefix, acc in per_step.items()
                if acc["wall_s"]
            },
            "lines_in_file": self.audit_lines,
        }

    def decisions(self) -> int | None:
        metrics = self.gateway_metrics
        if not metrics or "decisions" not in metrics:
            return None
        return sum(metrics["decisions"].values())


def vs_plain(results: Sequence[ScenarioResult], result: ScenarioResult, key: str) -> float | None:
    """The scenario's gateway/direct ratio over plain's in the same run."""
    plain = next((r for r in results if r.name == PLAIN and r.rounds), None)
    if plain is None:
        return None
    ours, base = result.ratio(key), plain.ratio(key)
    if ours is None or base is None or base == 0:
        return None
    return ours / base


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "records/s":
        return f"{value:,.0f}"
    return f"{value:,.1f}"


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _short(records: int) -> str:
    return f"{records // 1000}k" if records >= 1000 and records % 1000 == 0 else f"{records:,}"


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


def comparison_header(results: Sequence[ScenarioResult]) -> list[str]:
    header = ["metric", "better"]
    for r in results:
        header.append(f"{r.name} ({_short(r.params.records)}) g/d")
        if r.name != PLAIN:
            header.append("vs plain")
    return header


def comparison_cells(results: Sequence[ScenarioResult]) -> list[list[str]]:
    """Metric x scenario: gateway/direct, and (but for plain) that ratio over plain's."""
    cells = []
    for key in SUMMARY_KEYS:
        metric = _METRIC_BY_KEY[key]
        row = [metric.label, "higher" if metric.higher_is_better else "lower"]
        for r in results:
            row.append(_fmt_ratio(r.ratio(key)))
            if r.name != PLAIN:
                row.append(_fmt_ratio(vs_plain(results, r, key)))
        cells.append(row)
    return cells


DETAILS_HEADER = (
    "scenario",
    "records",
    "rules",
    "gateway start s",
    "rule decisions",
    "audit events",
    "audit events/s",
    "status",
)


def details_cells(results: Sequence[ScenarioResult]) -> list[list[str]]:
    cells = []
    for r in results:
        audit = r.audit()
        decisions = r.decisions()
        cells.append(
            [
                r.name,
                f"{r.params.records:,}",
                f"{r.setup.rules:,}",
                _fmt(r.gateway_start_s),
                "-" if decisions is None else f"{decisions:,}",
                "-" if audit is None else f"{audit['events']:,}",
                "-" if audit is None else _fmt(audit["events_per_s"], "records/s"),
                "ok" if r.error is None else "FAILED",
            ]
        )
    return cells


def _rich(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], caption: str) -> Table:
    table = Table(title=title, caption=caption)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right")
    for cells in rows:
        table.add_row(*cells)
    return table


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    align = ["---"] + ["---:"] * (len(header) - 1)
    if header and header[1] == "better":
        align[1] = "---"
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def rich_table(rows: Sequence[Row], title: str) -> Table:
    return _rich(title, TABLE_HEADER, table_cells(rows), "ratio = gateway / direct, for every row")


def markdown_table(rows: Sequence[Row]) -> str:
    return _markdown(TABLE_HEADER, table_cells(rows))


COMPARISON_CAPTION = (
    "g/d = gateway / direct of the scenario (below 1 is slower for throughput, above 1 "
    "slower for latency); vs plain = the scenario's g/d over plain's g/d of the same run "
    "(the cost of the rules: below 1 = less throughput, above 1 = more latency than plain)"
)


def comparison_title(results: Sequence[ScenarioResult], params: Params) -> str:
    counts = ", ".join(f"{r.name} {r.params.records:,}" for r in results)
    return (
        f"keg: gateway/direct by rule-set scenario, records per step and path: {counts} "
        f"(x {params.record_size} B, acks=all, median of {params.repeat} round(s))"
    )


# --------------------------------------------------------------------------- records


def git_commit() -> str | None:
    return _git("rev-parse", "--short", "HEAD")


def git_dirty() -> bool | None:
    """Whether the working tree differs from the commit (the numbers are then of that)."""
    out = _git("status", "--porcelain", "--untracked-files=no")
    return None if out is None else bool(out)


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args],
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
    return done.stdout.strip()


def machine_info() -> dict[str, Any]:
    import confluent_kafka

    from keg.embedded.kafka import kafka_version

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "kafka": kafka_version(),
        "confluent_kafka": getattr(confluent_kafka, "__version__", "unknown"),
        "librdkafka": confluent_kafka.libversion()[0],
        "loadavg_at_end": None if load is None else [round(x, 2) for x in load],
    }


def scenario_record(r: ScenarioResult, results: Sequence[ScenarioResult]) -> dict[str, Any]:
    return {
        "description": r.scenario.description,
        "records": r.params.records,
        "rules": r.setup.rules,
        "audit_log": r.setup.audit_log is not None,
        "error": r.error,
        "elapsed_s": round(r.elapsed_s, 1),
        "gateway_start_s": r.gateway_start_s,
        "gateway_metrics": r.gateway_metrics,
        "audit": r.audit(),
        "rounds": r.rounds,
        "summary": {
            row.metric.key: {
                "direct": row.direct,
                "gateway": row.gateway,
                "ratio": row.ratio,
                "vs_plain": vs_plain(results, r, row.metric.key),
                "higher_is_better": row.metric.higher_is_better,
            }
            for row in r.rows
        },
    }


def build_record(
    params: Params,
    paths: Sequence[str],
    results: Sequence[ScenarioResult],
    elapsed_s: float,
) -> dict[str, Any]:
    return {
        "format": 2,  # 2: per-scenario results under "scenarios" (1: one top-level summary)
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "machine": machine_info(),
        "params": {
            **asdict(params),
            "paths": list(paths),
            "scenarios": [r.name for r in results],
            "order": "per scenario (own gateway): direct then gateway, per step",
        },
        "elapsed_s": round(elapsed_s, 1),
        "scenarios": {r.name: scenario_record(r, results) for r in results},
    }


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def latest_markdown(record: Mapping[str, Any], results: Sequence[ScenarioResult]) -> str:
    params = record["params"]
    machine = record["machine"]
    dirty = " (with uncommitted changes)" if record.get("git_dirty") else ""
    counts = "; ".join(f"{r.name} {r.params.records:,}" for r in results)
    parts = [
        "# keg benchmark: gateway vs direct, by rule-set scenario\n",
        f"- when: {record['timestamp']}, commit: {record['git_commit'] or 'unknown'}{dirty}, "
        f"whole run {record['elapsed_s']:.0f} s",
        f"- machine: {machine['nproc']} cores, Python {machine['python']}, "
        f"Kafka {machine['kafka']}, librdkafka {machine['librdkafka']}, "
        f"load average at the end {machine.get('loadavg_at_end')}",
        f"- records of {params['record_size']} B, acks=all, {params['partitions']} partitions, "
        f"{params['repeat']} round(s) (median), fresh topics per round and scenario; MB = MiB",
        f"- **records per step and path**: {counts}",
        "- every scenario has a gateway of its own and is measured side by side with direct "
        "(direct then gateway, per step)",
        f"- {COMPARISON_CAPTION}\n",
        "## Scenario comparison\n",
        _markdown(comparison_header(results), comparison_cells(results)) + "\n",
        _markdown(DETAILS_HEADER, details_cells(results)) + "\n",
    ]
    for r in results:
        parts.append("- " + f"`{r.name}`: {r.scenario.description}")
    parts.append(
        "- audit events/s: audit log lines written during the measured gateway steps over "
        "those steps' wall time (tool start-up included)\n"
    )
    for r in results:
        parts.append(f"## {r.name} ({r.params.records:,} records per step and path)\n")
        if r.error:
            parts.append(f"**FAILED**: {r.error}\n")
        if r.rounds:
            parts.append(markdown_table(r.rows) + "\n")
        audit = r.audit()
        if audit and audit["per_step"]:
            steps = {step.prefix: step.name for step in STEPS}
            parts.append(
                "Audit events per gateway step: "
                + ", ".join(
                    f"{steps[prefix]} {acc['events']:,.0f} ({acc['events_per_s']:,.0f}/s)"
                    for prefix, acc in audit["per_step"].items()
                )
                + f"; {audit['lines_in_file']:,} lines in the file (warm-up included)\n"
            )
    return "\n".join(parts)


def save(record: Mapping[str, Any], results: Sequence[ScenarioResult], results_dir: Path) -> None:
    results_dir.mkdir(parents=True, exist_ok=True)
    with (results_dir / "results.jsonl").open("a") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
    _write_atomically(results_dir / "latest.md", latest_markdown(record, results))
    log.info("results: %s, %s", results_dir / "results.jsonl", results_dir / "latest.md")


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    defaults = Params()
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Kafka produce/consume throughput and latency, direct to an embedded broker "
        "and through the keg gateway in front of it, side by side, for several rule sets.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=list(SCENARIOS),
        dest="scenarios",
        default=argparse.SUPPRESS,
        help="rule-set scenario, repeatable, run in the order given "
        f"(default: all of {', '.join(SCENARIOS)})",
    )
    for name, (option, help_text) in PARAM_OPTIONS.items():
        default = getattr(defaults, name)
        parser.add_argument(option, dest=name, type=type(default), default=default,
                            help=help_text)
    parser.add_argument(
        "--direct-only",
        action="store_true",
        help="skip the gateway (e.g. while it is being built); runs the plain scenario only",
    )
    parser.add_argument(
        "--results-dir", type=Path, default=RESULTS_DIR, help="where results.jsonl and latest.md go"
    )
    parser.add_argument(
        "--no-save", action="store_true", help="print the tables only; write no results"
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    args = parser.parse_args(argv)
    for name in ("records", "scenario_records", "record_size", "partitions", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    args.scenarios = list(dict.fromkeys(getattr(args, "scenarios", None) or SCENARIOS))
    if args.direct_only:
        args.scenarios = [PLAIN]
    return args


def _setup_logging(level: str, console: Console) -> None:
    handler = RichHandler(
        console=console, show_path=False, log_time_format="%H:%M:%S", rich_tracebacks=True
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def scenario_params(params: Params, scenario: Scenario) -> Params:
    if not scenario.extra:
        return params
    return dataclasses.replace(params, records=min(params.records, params.scenario_records))


def run_scenario(
    scenario: Scenario,
    params: Params,
    broker: str,
    direct_only: bool,
    status: Status,
    run_id: str,
) -> ScenarioResult:
    """One scenario: its own gateway (unless direct_only), warm-up, rounds, its counters."""
    from control_plane.service import free_port
    from keg.gateway import Gateway, GatewaySettings

    result = ScenarioResult(scenario, params)
    started = time.monotonic()
    label = f"{scenario.name}: "
    with tempfile.TemporaryDirectory(prefix=f"keg-bench-{scenario.name}-") as tmp:
        setup = result.setup = scenario.prepare(Path(tmp))
        with contextlib.ExitStack() as stack:
            paths = {DIRECT: broker}
            metrics_port: int | None = None
            if not direct_only:
                metrics_port = free_port()
                settings = GatewaySettings(
                    bootstrap_servers=broker,
                    listen_port_base=0,
                    ext_proc_log_level="WARNING",
                    rules_dir=setup.rules_dir,
                    audit_log=setup.audit_log,
                    metrics_port=metrics_port,
                    data_path=params.data_path,
                )
                with status(f"[{scenario.name}] starting the gateway"):
                    t0 = time.perf_counter()
                    try:
                        gateway = stack.enter_context(Gateway(settings))
                    except Exception as exc:
                        raise BenchmarkError(
                            f"the gateway did not start ({type(exc).__name__}: {exc}); "
                            "--direct-only measures the broker alone"
                        ) from exc
                    result.gateway_start_s = time.perf_counter() - t0
                paths[GATEWAY] = gateway.bootstrap
                log.info(
                    "[%s] gateway %s started in %.1f s (%d rules%s)",
                    scenario.name,
                    gateway.bootstrap,
                    result.gateway_start_s,
                    setup.rules,
                    ", audit log" if setup.audit_log else "",
                )
            audit_log = setup.audit_log
            counter: Counter | None = None
            if audit_log is not None and not direct_only:

                def counter() -> int:
                    return count_audit_events(audit_log)

            topic_prefix = f"bench-{run_id}-{scenario.name}"
            warm_up(paths, broker, params, status, topic_prefix)
            try:
                for n in range(1, params.repeat + 1):
                    result.rounds.append(
                        run_round(n, paths, broker, params, status, topic_prefix, label, counter)
                    )
            finally:
                if metrics_port is not None:
                    try:
                        result.gateway_metrics = scrape_metrics(metrics_port)
                    except OSError as exc:
                        log.warning(
                            "[%s] could not read the gateway's metrics: %s", scenario.name, exc
                        )
        # The gateway has stopped: its audit log is closed and complete.
        if audit_log is not None and not direct_only:
            result.audit_lines = count_audit_events(audit_log)
    result.elapsed_s = time.monotonic() - started
    if result.gateway_metrics is not None:
        problems = check_metrics(setup, result.gateway_metrics, result.audit_lines)
        if problems:  # the numbers are kept, but the scenario counts as failed
            result.error = f"scenario {scenario.name} is not what it claims: " + "; ".join(problems)
            log.error("%s", result.error)
    return result


def run(
    params: Params, scenario_names: Sequence[str], direct_only: bool, status: Status
) -> tuple[list[str], list[ScenarioResult], dict[str, Any]]:
    from keg.embedded.kafka import EmbeddedKafka, ensure_kafka

    started = time.monotonic()
    run_id = uuid.uuid4().hex[:6]
    results: list[ScenarioResult] = []
    with status("fetching Kafka jars (first run only)"):
        ensure_kafka()
    with contextlib.ExitStack() as stack:
        with status("starting the embedded Kafka broker"):
            broker = stack.enter_context(EmbeddedKafka()).bootstrap
        log.info("broker %s; scenarios: %s", broker, ", ".join(scenario_names))
        for name in scenario_names:
            scenario = SCENARIOS[name]
            scenario_started = time.monotonic()
            sp = scenario_params(params, scenario)
            try:
                results.append(run_scenario(scenario, sp, broker, direct_only, status, run_id))
            except BenchmarkError as exc:  # the next scenario may still work
                log.error("scenario %s failed: %s", name, exc)
                failed = ScenarioResult(scenario, sp, error=str(exc))
                failed.elapsed_s = time.monotonic() - scenario_started
                results.append(failed)
            log.info("scenario %s took %.0f s", name, time.monotonic() - scenario_started)
    paths = [DIRECT] if direct_only else [DIRECT, GATEWAY]
    record = build_record(params, paths, results, time.monotonic() - started)
    return paths, results, record


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    err_console = Console(stderr=True)
    _setup_logging(args.log_level, err_console)
    params = Params(**{name: getattr(args, name) for name in PARAM_OPTIONS})

    # A status spinner stays up only while the step runs; its log line stays after it.
    def status(text: str) -> contextlib.AbstractContextManager[Any]:
        return err_console.status(text)

    try:
        paths, results, record = run(params, args.scenarios, args.direct_only, status)
    except BenchmarkError as exc:  # expected failures: the message says it all
        log.error("benchmark failed: %s", exc, exc_info=log.isEnabledFor(logging.DEBUG))
        return 1
    except Exception:
        log.exception("benchmark failed")
        return 1
    out = Console()
    if not out.is_terminal:  # a pipe or file: wide enough for the tables, not 80 columns
        out = Console(width=150)
    for r in results:
        if r.rounds:
            title = (
                f"{r.name}: {' vs '.join(paths)} "
                f"({r.params.records:,} x {params.record_size} B, acks=all)"
            )
            out.print(rich_table(r.rows, title))
        if r.error:
            out.print(f"[bold red]{r.name} FAILED[/]: {r.error}")
    if not args.direct_only:
        out.print(
            _rich(
                comparison_title(results, params),
                comparison_header(results),
                comparison_cells(results),
                COMPARISON_CAPTION,
            )
        )
        out.print(
            _rich(
                "scenarios",
                DETAILS_HEADER,
                details_cells(results),
                "audit events/s: audit lines of the measured gateway steps over their wall time",
            )
        )
    if not args.no_save:
        save(record, results, args.results_dir)
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
