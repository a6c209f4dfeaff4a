"""Rules reloaded 50 times while a producer sends 100,000 records through the gateway.

Acceptance: no connection is closed, no record is lost or duplicated.

An idempotent producer (acks=all) writes 100,000 numbered records to a 3-partition
topic through the gateway at a steady pace, while a thread rewrites the rule directory
56 times: 50 valid writes alternating between two rule sets that both act on the
topic's Produce requests without refusing them (an `observe` rule; a dry-run `deny`
plus a `deny` of another prefix), and 6 invalid writes, which must be refused with the
last good set staying in force. Each write is checked in the ext_proc service's
metrics: the reload counter moved by exactly one, the active version is the expected
one, the rule of the set in force is seen deciding on the live connection's Produce
requests and the rule of the set replaced no longer decides. The producer runs at a
pace that spans all the writes (it may run at most two windows ahead of them, and its
last window waits for the last write), so every reload happens mid-stream.

Then: every delivery report succeeded; the broker (read directly, not through the
gateway) holds each of the 100,000 values exactly once; and no connection was closed:
Envoy's listener, tcp_proxy, network ext_proc and upstream cluster connection stats
and the ext_proc service's connection counters did not move, and the producer saw no
disconnect (librdkafka statistics: same broker, UP since before the first write, one
connect, no disconnect; nothing from error_cb; no disconnect in librdkafka's log).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from prometheus_client.parser import text_string_to_metric_families

from control_plane.service import EXT_PROC_PATH, free_port
from filter_rules import load_rule_text
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, gateway_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# Prometheus samples by (name, sorted labels).
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

RECORDS = 100_000
PARTITIONS = 3
VALID_WRITES = 50
POLL_INTERVAL = 0.25  # the watchers' (--rules-poll-interval): they read a directory once it
# held still for a poll, so a write is read up to two polls after it was made
WRITE_SPACING = 0.8  # between two writes
PRODUCE_TAIL = 4.0  # the producer's pace: RECORDS over the writes' time plus this
STEP_TIMEOUT = 15.0  # for one write to show in the metrics

# Rule set A: the test topic's Produce requests are observed.
RULES_A = """\
apiVersion: keg/v1
kind: RuleSet
rules:
  - id: stress-observe
    description: watch the stress topic
    match:
      apis: [Produce]
      topics: {{exact: [{topic}]}}
    action: {{observe: {{audit: false}}}}
"""

# Rule set B: another prefix is refused; the test topic only sees a dry-run deny.
RULES_B = """\
apiVersion: keg/v1
kind: RuleSet
rules:
  - id: stress-deny-other
    description: nobody writes forbidden topics
    match:
      apis: [Produce]
      topics: {{prefix: [forbidden.]}}
    action: {{deny: {{}}}}
  - id: stress-dry-run-deny
    description: would refuse the stress topic, but only reports
    mode: dry-run
    match:
      apis: [Produce]
      topics: {{exact: [{topic}]}}
    action: {{deny: {{error: POLICY_VIOLATION}}}}
"""

# The rule of each set that decides on the test topic, and its outcome label.
MARKER_A = ("stress-observe", "observed")
MARKER_B = ("stress-dry-run-deny", "would-deny")

# Each of these must be refused by the loader (the last good set stays).
INVALID = [
    # an API that does not exist
    "rules:\n  - id: bad-api\n    match: {apis: [NoSuchApi]}\n    action: {deny: {}}\n",
    # broken YAML
    "rules:\n  - id: bad-yaml\n    match: {apis: [Produce\n    action: {observe: {}}\n",
    # an unknown field
    "rules:\n  - id: bad-field\n    match: {topic: {exact: [x]}}\n    action: {observe: {}}\n",
    # the same id twice
    "rules:\n  - id: twice\n    action: {observe: {}}\n  - id: twice\n    action: {observe: {}}\n",
    # a regex RE2 refuses (backreference)
    "rules:\n  - id: bad-regex\n    match: {topics: {regex: ['(a)\\1']}}\n"
    "    action: {observe: {}}\n",
    # an error name Kafka does not have
    "rules:\n  - id: bad-error\n    match: {apis: [Produce]}\n"
    "    action: {deny: {error: NOT_A_KAFKA_ERROR}}\n",
]


# Envoy stats that move when a client connection is opened, closed or reset, its
# ext_proc stream ends, or its upstream connection changes; by stats scope.
CONNECTION_STATS = {
    "listener": ("downstream_cx_total", "downstream_cx_destroy", "downstream_cx_active"),
    "tcp": ("downstream_cx_total", "downstream_cx_drain_close", "downstream_cx_overload_close",
            "idle_timeout", "max_downstream_connection_duration"),
    "network_ext_proc": ("connections_closed", "connections_reset", "streams_started",
                         "streams_closed", "streams_grpc_error", "streams_grpc_close",
                         "stream_open_failures", "message_timeouts", "failure_mode_allowed"),
    "cluster": ("upstream_cx_total", "upstream_cx_destroy", "upstream_cx_active"),
}


@dataclass
class Env:
    kafka: EmbeddedKafka
    gateway: Gateway
    rules: Path
    metrics_port: int
    topic: str

    def rules_text(self, template: str) -> str:
        return template.format(topic=self.topic)

    def write_rules(self, text: str) -> None:
        """Replace rules.yaml atomically, so the watcher never reads half a file."""
        tmp = self.rules / "rules.tmp"  # not *.yaml / *.yml: the watcher ignores it
        tmp.write_text(text)
        os.replace(tmp, self.rules / "rules.yaml")

    def metrics(self) -> Samples:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        samples: Samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return samples

    def envoy_stats(self) -> dict[str, int]:
        """CONNECTION_STATS of every gateway listener (all must exist)."""
        assert self.gateway.envoy is not None and self.gateway.control_plane is not None
        plan = self.gateway.control_plane.plan
        assert plan is not None
        wanted = []
        for route in plan.routes:
            scopes = {
                "listener": f"listener.{self.gateway.settings.listen_host}_{route.listen_port}",
                "tcp": f"tcp.{route.listener_name}",
                "network_ext_proc": f"network_ext_proc.{route.listener_name}",
                "cluster": f"cluster.{route.cluster_name}",
            }
            if self.gateway.settings.data_path != EXT_PROC_PATH:
                del scopes["network_ext_proc"]  # keg's own filter is in its place
            wanted += [f"{scopes[scope]}.{stat}" for scope, stats in CONNECTION_STATS.items()
                       if scope in scopes for stat in stats]
        found = {}
        for line in self.gateway.envoy.admin("/stats").splitlines():
            name, _, value = line.partition(": ")
            if name in wanted:
                found[name] = int(value)
        missing = sorted(set(wanted) - set(found))
        assert not missing, f"Envoy has no stats {missing}"
        return found


def reloads(m: Samples, result: str) -> int:
    return int(m.get(("keg_rule_reloads_total", (("result", result),)), 0))


def active_versions(m: Samples) -> set[str]:
    return {dict(labels)["version"] for (name, labels), value in m.items()
            if name == "keg_rule_set_version_info" and value == 1}


def decisions(m: Samples, rule: str, outcome: str | None = None) -> int:
    total = 0.0
    for (name, labels), value in m.items():
        if name != "keg_decisions_total":
            continue
        d = dict(labels)
        if d["rule"] == rule and (outcome is None or d["outcome"] == outcome):
            total += value
    return int(total)


@pytest.fixture(scope="module")
def env(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("reload-stress")
    rules = base / "rules"
    rules.mkdir()
    topic = f"reload-stress-{uuid.uuid4().hex[:8]}"
    (rules / "rules.yaml").write_text(RULES_A.format(topic=topic))
    metrics_port = free_port()
    settings = gateway_settings(kafka, base / "envoy", rules_dir=rules,
                                metrics_port=metrics_port, rules_poll_interval_s=POLL_INTERVAL)
    with Gateway(settings) as gateway:
        create_topic(kafka.bootstrap, PARTITIONS, name=topic)
        yield Env(kafka, gateway, rules, metrics_port, topic)


class Reloader(threading.Thread):
    """Rewrites the rule directory, checking in the metrics that each write took effect."""

    def __init__(self, env: Env, delivered: list[tuple[int, int]]) -> None:
        super().__init__(name="rules-reloader", daemon=True)
        self.env = env
        self.delivered = delivered  # the producer's successful deliveries, growing
        a, b = env.rules_text(RULES_A), env.rules_text(RULES_B)
        self.versions = {a: load_rule_text(a).version, b: load_rule_text(b).version}
        # 50 valid writes, B first (A is in force at the start), then A, B, ...; an
        # invalid write after every 8th valid one.
        self.plan: list[tuple[str, bool]] = []
        invalid = iter(INVALID)
        for i in range(VALID_WRITES):
            if i > 0 and i % 8 == 0:
                self.plan.append((next(invalid), False))
            self.plan.append((b if i % 2 == 0 else a, True))
        self.done = 0  # writes checked so far (the producer paces itself on this)
        self.error: BaseException | None = None
        self.applied = self.rejected = 0
        self.write_times: list[float] = []
        self.step_seconds: list[float] = []
        # per write, records delivered from the write until its reload was seen, and from
        # then until the rule of the set in force was seen deciding
        self.delivered_around: list[tuple[int, int]] = []

    @property
    def writes(self) -> int:
        return len(self.plan)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as err:  # handed to the main thread
            self.error = err

    def _wait(self, what: str, check: Any) -> Samples:
        deadline = time.monotonic() + STEP_TIMEOUT
        while True:
            m = self.env.metrics()
            if check(m):
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} after {STEP_TIMEOUT}s")
            time.sleep(0.05)

    def _run(self) -> None:
        m = self.env.metrics()
        applied0, rejected0 = reloads(m, "applied"), reloads(m, "rejected")
        active = self.env.rules_text(RULES_A)
        assert active_versions(m) == {self.versions[active]}
        last_write = time.monotonic()  # the first write, too, comes with records flowing
        frozen: tuple[str, str, int] | None = None  # the set not in force: its rule's count
        for n, (text, valid) in enumerate(self.plan, 1):
            time.sleep(max(0.0, last_write + WRITE_SPACING - time.monotonic()))
            if frozen is not None:  # the rule of the set replaced decided nothing since
                rule, outcome, count = frozen
                assert decisions(self.env.metrics(), rule, outcome) == count, (n, rule)
            last_write = time.monotonic()
            delivered_at_write = len(self.delivered)
            self.env.write_rules(text)
            self.write_times.append(last_write)
            if valid:
                self.applied += 1
                expected = self.applied + applied0
                m = self._wait(f"write {n} (valid) was not applied",
                               lambda m, e=expected: reloads(m, "applied") >= e)
                active = text
            else:
                self.rejected += 1
                expected = self.rejected + rejected0
                m = self._wait(f"write {n} (invalid) was not rejected",
                               lambda m, e=expected: reloads(m, "rejected") >= e)
            seen_at = time.monotonic()
            delivered_at_reload = len(self.delivered)
            self.step_seconds.append(seen_at - last_write)
            # exactly this write was counted, nothing twice; the right set is in force
            assert reloads(m, "applied") == applied0 + self.applied, f"write {n}"
            assert reloads(m, "rejected") == rejected0 + self.rejected, f"write {n}"
            assert active_versions(m) == {self.versions[active]}, f"write {n}"
            self.done = n  # lets the producer go on while the rest is checked
            # The rule of the set in force (after an invalid write: still the last good
            # one) decides on the live producer's requests.
            in_b = active == self.env.rules_text(RULES_B)
            rule, outcome = MARKER_B if in_b else MARKER_A
            seen = decisions(m, rule, outcome)
            m = self._wait(f"write {n}: rule {rule} never decided on the live connection",
                           lambda m, r=rule, o=outcome, s=seen: decisions(m, r, o) > s)
            other_rule, other_outcome = MARKER_A if in_b else MARKER_B
            frozen = (other_rule, other_outcome, decisions(m, other_rule, other_outcome))
            self.delivered_around.append((delivered_at_reload - delivered_at_write,
                                          len(self.delivered) - delivered_at_reload))


def broker_stats(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The producer's broker connections (not librdkafka's logical coordinator handles)."""
    return {name: {k: b.get(k) for k in ("nodeid", "source", "state", "stateage", "connects",
                                          "disconnects", "txretries", "req_timeouts", "txerrs")}
            for name, b in stats.get("brokers", {}).items() if b.get("source") != "logical"}


class LibrdkafkaLog(logging.Handler):
    """What librdkafka logs (its `logger` setting), with the time it was served."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[float, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((time.monotonic(), record.levelname, record.getMessage()))


def test_rules_reloaded_50_times_during_100k_records(env: Env) -> None:
    stats_lock = threading.Lock()
    latest_stats: list[dict[str, Any]] = []
    delivered: list[tuple[int, int]] = []  # (partition, offset) per successful record
    failures: list[str] = []
    reloader = Reloader(env, delivered)
    assert sum(valid for _t, valid in reloader.plan) == VALID_WRITES
    assert reloader.writes - VALID_WRITES >= 5

    client_errors: list[tuple[float, str]] = []  # error_cb: e.g. _ALL_BROKERS_DOWN
    client_log = LibrdkafkaLog()
    logger = logging.getLogger(f"rdkafka.{env.topic}")
    logger.addHandler(client_log)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False

    def on_stats(raw: str) -> None:
        with stats_lock:
            latest_stats[:] = [json.loads(raw)]

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failures.append(f"{msg.value()!r}: {err}")
        else:
            delivered.append((msg.partition() or 0, msg.offset() or 0))

    producer = Producer({
        "bootstrap.servers": env.gateway.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "statistics.interval.ms": 500,
        "stats_cb": on_stats,
        "error_cb": lambda err: client_errors.append((time.monotonic(), str(err))),
        "logger": logger,
    })

    def produce(seq: int) -> None:
        while True:
            try:
                producer.produce(env.topic, value=b"%06d" % seq, on_delivery=on_delivery)
                return
            except BufferError:
                producer.poll(0.05)

    def current_stats() -> dict[str, Any]:
        with stats_lock:
            latest_stats.clear()
        deadline = time.monotonic() + 10
        while True:
            producer.poll(0.1)
            with stats_lock:
                if latest_stats:
                    return latest_stats[0]
            assert time.monotonic() < deadline, "no librdkafka statistics"

    # Warm up: the connection is open and the producer has its id before measuring.
    produce(0)
    assert producer.flush(60) == 0 and not failures, failures
    time.sleep(1.5)  # any bootstrap-only connection librdkafka drops is gone by now
    baseline = time.monotonic()
    raw_before = current_stats()
    stats_before = broker_stats(raw_before)
    envoy_before = env.envoy_stats()
    m0 = env.metrics()

    reloader.start()
    # A steady pace that lasts as long as the writes (and a little longer); should the
    # writes be slower, the producer waits for them: it may run at most two windows
    # ahead, and its last window waits for the last write. (One window more than the
    # writes and those two: after each write, even the one before the last, records
    # are left to show the new set deciding.)
    windows = reloader.writes + 3
    started = time.monotonic()
    rate = RECORDS / (reloader.writes * WRITE_SPACING + PRODUCE_TAIL)
    waited_for_reloads = 0.0
    for seq in range(1, RECORDS):
        while True:
            if reloader.error is not None:
                raise reloader.error
            allowed = (RECORDS if reloader.done >= reloader.writes
                       else min((reloader.done + 3) * RECORDS // windows,
                                (windows - 1) * RECORDS // windows))
            due = started + seq / rate
            now = time.monotonic()
            if seq < allowed and now >= due:
                break
            if seq >= allowed:
                t = time.monotonic()
                producer.poll(0.01)
                waited_for_reloads += time.monotonic() - t
            else:
                producer.poll(min(0.01, due - now))
        produce(seq)
        if seq % 200 == 0:
            producer.poll(0)
    last_produce = time.monotonic()
    reloader.join(STEP_TIMEOUT * 3)
    if reloader.error is not None:
        raise reloader.error
    assert not reloader.is_alive()
    remaining = producer.flush(120)
    finished = time.monotonic()
    assert remaining == 0, f"{remaining} records not delivered"

    # The reloads all happened while records were being produced (and the reloader saw
    # the live connection's Produce requests decided by each new set, see Reloader).
    assert len(reloader.write_times) == reloader.writes
    assert started < reloader.write_times[0] and reloader.write_times[-1] < last_produce

    # Every delivery report succeeded, once per record, each at its own offset.
    assert not failures, failures[:10]
    assert len(delivered) == RECORDS
    assert len(set(delivered)) == RECORDS

    # No connection closed: Envoy's view...
    envoy_after = env.envoy_stats()
    assert envoy_after == envoy_before, {
        k: (envoy_before.get(k), envoy_after.get(k)) for k in envoy_before.keys() | envoy_after
        if envoy_before.get(k) != envoy_after.get(k)}
    assert sum(v for k, v in envoy_after.items()
               if k.startswith("listener.") and k.endswith(".downstream_cx_active")) >= 1

    # ... the ext_proc service's ...
    m1 = env.metrics()
    for name in ("keg_connections_total", "keg_connections_active"):
        assert m1[(name, ())] == m0[(name, ())], name
    assert decisions(m1, "stress-deny-other") == 0  # set B never refused anything here
    assert decisions(m1, *MARKER_A) > decisions(m0, *MARKER_A)
    assert decisions(m1, *MARKER_B) > decisions(m0, *MARKER_B)

    # ... and the producer's: every broker connection it had is the one it still has.
    # librdkafka re-bootstraps when all its brokers are down, with new broker handles
    # whose counters start again at 0: so besides the counters, the broker must have
    # been UP (stateage) since the baseline, and nothing reported or logged a disconnect.
    raw_after = current_stats()
    stats_after = broker_stats(raw_after)
    learned = {k: v for k, v in stats_after.items() if v["nodeid"] >= 0}
    assert learned, stats_after
    assert stats_after.keys() == stats_before.keys(), (stats_before, stats_after)
    since_baseline = raw_after["ts"] - raw_before["ts"]  # µs, librdkafka's clock
    for name, after in stats_after.items():
        before = stats_before[name]
        assert after["disconnects"] == before["disconnects"], (name, before, after)
        assert after["connects"] == before["connects"], (name, before, after)
        assert after["state"] == "UP" and after["stateage"] >= since_baseline, (name, after)
    for name, after in learned.items():
        assert after["connects"] == 1 and after["disconnects"] == 0, (name, after)
    assert not [e for t, e in client_errors if t > baseline], client_errors
    disconnects = [m for t, _level, m in client_log.records
                   if t > baseline and ("Disconnected" in m or m.startswith("FAIL"))]
    assert not disconnects, disconnects
    producer.flush(10)

    # The broker, read directly, holds each value exactly once.
    values = read_topic(env.kafka.bootstrap, env.topic)
    counts = Counter(values)
    duplicates = {v: c for v, c in counts.items() if c > 1}
    missing = set(range(RECORDS)) - set(counts)
    assert not duplicates, f"{len(duplicates)} duplicated, e.g. {list(duplicates.items())[:5]}"
    assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:5]}"
    assert len(values) == RECORDS

    r = reloader
    print(
        f"\n{RECORDS} records in {finished - started:.1f}s "
        f"(produce loop {last_produce - started:.1f}s, waited for reloads "
        f"{waited_for_reloads:.1f}s); {r.applied} reloads applied, {r.rejected} rejected, "
        f"writes {r.write_times[0] - started:.1f}s..{r.write_times[-1] - started:.1f}s "
        f"after the start, step {min(r.step_seconds):.2f}..{max(r.step_seconds):.2f}s; "
        f"decisions observe={decisions(m1, *MARKER_A) - decisions(m0, *MARKER_A)} "
        f"dry-run={decisions(m1, *MARKER_B) - decisions(m0, *MARKER_B)}; "
        f"producer brokers {stats_after}; librdkafka log after the baseline "
        f"{[(lvl, msg) for t, lvl, msg in client_log.records if t > baseline]}; "
        f"records delivered between a write and its reload "
        f"{min(b for b, _a in r.delivered_around)}..{max(b for b, _a in r.delivered_around)} "
        f"(median {statistics.median(b for b, _a in r.delivered_around)}), "
        f"then until the new set decided {min(a for _b, a in r.delivered_around)}.."
        f"{max(a for _b, a in r.delivered_around)}; "
        f"envoy {sorted((k, v) for k, v in envoy_after.items())}"
    )


def read_topic(bootstrap: str, topic: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap,
                         "group.id": f"check-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        ends = {}
        for p in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            assert high > low, f"partition {p} is empty"
            ends[p] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        values: list[int] = []
        positions = dict.fromkeys(ends, -1)
        deadline = time.monotonic() + 60
        while any(positions[p] < ends[p] - 1 for p in ends):
            assert time.monotonic() < deadline, f"read only {len(values)} records"
            for msg in consumer.consume(10_000, 1.0):
                assert msg.error() is None, msg.error()
                positions[msg.partition() or 0] = msg.offset() or 0
                values.append(int(msg.value() or b""))
        return values
    finally:
        consumer.close()
