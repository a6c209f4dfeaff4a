"""Rule changes under load: REST rule changes while records flow through the gateway.

    python -m benchmarks.rule_churn [--records 200000] [--changes 100]
                                    [--data-path native|ext-proc] [--no-save]

The goal: 100 rule changes while 200,000 records flow, 0 connections closed, each
change enforced within 1 s of the control plane accepting it.

`keg up`'s arrangement on the embedded broker: the rule directory (a `mask` rule on the
flow's topics, so the flow's every Produce is handed to the Python service and its
records changed while rule sets are swapped under it), the rule store and its REST API.

- *The flow*: one idempotent librdkafka producer (acks=all) sends 1 KiB JSON orders to
  a fresh topic until `--records` are acknowledged and the last change is enforced.
- *The changes*: one rule, `churn-probe`, on a second topic, is written through the API
  `--changes` times (created, then replaced, with its ETag): a Produce deny, then an
  observe, alternately. A change is *accepted* when the API answers 200/201.
- *Enforcement*: a probe sends one Produce after another to the probe topic, on one
  bare Kafka connection (a client would answer from its own cache of the topic's
  state); a change is enforced when a probe's answer shows it (TOPIC_AUTHORIZATION_FAILED
  after a deny, stored after an observe). What is timed is from the API's answer to
  that probe's answer: an upper bound.
- *Connections closed*: the probe's connection must stay open (a close ends the run),
  the flow's is librdkafka's own count (`disconnects` of every broker handle in its
  statistics); the flow's records are counted in the topic afterwards (the high
  watermark against what was acknowledged: nothing lost, nothing twice).

Prints the enforcement times (p50, p99, max, how many within 1 s) and appends one JSON
line to benchmarks/results/rule_churn.jsonl (rule_churn.md: the latest run of each
data path).
`churn` is what the integration suite runs too, on a smaller scale, asserting all but
the times.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import socket
import statistics
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.gateway_vs_direct import RESULTS_DIR, create_topics, git_commit, machine_info
from benchmarks.record_rules import order_value
from benchmarks.wire import produce_answer
from kafka_wire.records import BatchHeader, Record, encode_batch

log = logging.getLogger("benchmarks.rule_churn")

GOAL_S = 1.0  # each change enforced within this long after the API accepted it
FLOW_PREFIX = "churn.flow."
PROBE_RULE = "churn-probe"
DENIED = 29  # TOPIC_AUTHORIZATION_FAILED
# The rule directory: the flow's records are masked (a record rule on every Produce).
FLOW_RULES = f"""\
rules:
  - id: churn-flow-mask
    match: {{apis: [Produce], topics: {{prefix: [{FLOW_PREFIX}]}}}}
    action: {{mask: {{fields: [$.card.number]}}}}
"""


@dataclass
class ChurnResult:
    """What one run saw. `enforced_s[i]`: change i's acceptance to the probe showing it
    (None: not within the timeout)."""

    changes: int
    enforced_s: list[float | None] = field(default_factory=list)
    flow_acknowledged: int = 0
    flow_errors: list[str] = field(default_factory=list)
    flow_stored: int = 0  # the flow topic's high watermark afterwards
    records_during_changes: int = 0  # acknowledged between the first and the last change
    disconnects: int = 0  # librdkafka's count over the flow producer's broker handles
    seconds: float = 0.0

    @property
    def unenforced(self) -> list[int]:
        return [i for i, s in enumerate(self.enforced_s) if s is None]

    def summary(self) -> dict[str, Any]:
        times = sorted(s for s in self.enforced_s if s is not None)
        quantile = (lambda q: round(times[min(len(times) - 1, int(q * len(times)))], 4)) \
            if times else (lambda q: None)
        return {"changes": self.changes, "enforced": len(times),
                "within_goal": sum(1 for s in times if s <= GOAL_S),
                "p50_s": round(statistics.median(times), 4) if times else None,
                "p99_s": quantile(0.99), "max_s": round(times[-1], 4) if times else None,
                "flow_acknowledged": self.flow_acknowledged,
                "flow_stored": self.flow_stored, "flow_errors": len(self.flow_errors),
                "records_during_changes": self.records_during_changes,
                "disconnects": self.disconnects, "seconds": round(self.seconds, 1)}


class _Stats:
    """The latest librdkafka statistics of one client: its disconnect count."""

    def __init__(self) -> None:
        self.latest: dict[str, Any] = {}

    def update(self, text: str) -> None:
        self.latest = json.loads(text)

    @property
    def disconnects(self) -> int:
        return sum(int(b.get("disconnects", 0)) for b in self.latest.get("brokers", {}).values())


def _producer(bootstrap: str, stats: _Stats, **config: Any) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "acks": "all",
                     "statistics.interval.ms": 200, "stats_cb": stats.update, **config})


class _Flow:
    """The flow producer on its own thread: sends until told to stop and `records` are
    acknowledged (or one failed); counts what was acknowledged and what failed."""

    def __init__(self, bootstrap: str, topic: str, records: int) -> None:
        self.topic, self.records = topic, records
        self.stats = _Stats()
        self.producer = _producer(bootstrap, self.stats, **{
            "enable.idempotence": True, "linger.ms": 5, "batch.size": 256 * 1024,
            "queue.buffering.max.messages": 10_000})  # what is sent is soon acknowledged
        self.acknowledged = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="churn-flow", daemon=True)
        self.values = [order_value(i) for i in range(1000)]

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.acknowledged += 1
        else:
            self.errors.append(err.name())

    def _run(self) -> None:
        sent = 0
        while self.acknowledged < self.records or not self.stop.is_set():
            if self.errors:
                break
            try:
                self.producer.produce(self.topic, self.values[sent % len(self.values)],
                                      on_delivery=self._delivered)
                sent += 1
            except BufferError:
                self.producer.poll(0.01)
            self.producer.poll(0)
        self.producer.flush(120)
        self.producer.poll(0.5)  # one more statistics report, after the last answer

    def __enter__(self) -> _Flow:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(180)


class _Probe:
    """One Produce at a time to the probe topic, on one bare connection, so each answer
    is the gateway's, not a client's cached view of the topic."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        host, _, port = bootstrap.split(",")[0].rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=15)
        self.topic, self.correlation = topic, 0
        self.batch = encode_batch(BatchHeader(base_timestamp=int(time.time() * 1000)),
                                  [Record(0, 0, None, b"probe", [])])

    def send(self) -> int:
        """The partition's error code (0: stored). ConnectionError: the gateway closed
        the connection."""
        self.correlation += 1
        code, _message = produce_answer(self.sock, self.correlation, self.topic, self.batch,
                                        "keg-churn-probe")
        return code

    def close(self) -> None:
        self.sock.close()


class RuleApi:
    """Writes of one REST rule, with its ETag."""

    def __init__(self, base_url: str, token: str) -> None:
        self.base_url, self.token = base_url, token
        self.etag: str | None = None

    def put(self, rule_id: str, body: dict[str, Any]) -> None:
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        if self.etag is None:
            headers["If-None-Match"] = "*"
        else:
            headers["If-Match"] = self.etag
        request = urllib.request.Request(f"{self.base_url}/v1/rules/{rule_id}", method="PUT",
                                         data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status not in (200, 201):
                raise RuntimeError(f"PUT {rule_id}: HTTP {response.status}")
            self.etag = response.headers["ETag"]


def probe_rule(topic: str, deny: bool) -> dict[str, Any]:
    """Change i of the run: a Produce deny on the probe topic, or an observe of it."""
    return {"match": {"apis": ["Produce"], "topics": {"exact": [topic]}},
            "action": {"deny": {}} if deny else {"observe": {}}}


def churn(bootstrap: str, api_url: str, token: str, *, records: int, changes: int,
          timeout_s: float = 15.0, admin_bootstrap: str | None = None,
          progress: Callable[[int], None] = lambda _i: None) -> ChurnResult:
    """`changes` writes of the probe rule while a flow of at least `records` runs through
    the gateway at `bootstrap` (its API at `api_url`). Topics are created on
    `admin_bootstrap` (default: through the gateway)."""
    from confluent_kafka import Consumer, TopicPartition

    run = uuid.uuid4().hex[:8]
    flow_topic, probe_topic = f"{FLOW_PREFIX}{run}", f"churn.probe.{run}"
    create_topics(admin_bootstrap or bootstrap, [flow_topic, probe_topic], 1)
    result = ChurnResult(changes=changes)
    api = RuleApi(api_url, token)
    probe = _Probe(bootstrap, probe_topic)
    started = time.monotonic()
    while (code := probe.send()) != 0:  # a new topic's leader may not be known yet
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"the probe topic refuses records before any change: {code}")
        time.sleep(0.1)
    with _Flow(bootstrap, flow_topic, records) as flow:
        while flow.acknowledged == 0 and not flow.errors:  # the flow is under way
            if time.monotonic() - started > timeout_s:
                raise RuntimeError("the flow acknowledged nothing")
            time.sleep(0.05)
        before = flow.acknowledged
        for i in range(changes):
            deny = i % 2 == 0
            api.put(PROBE_RULE, probe_rule(probe_topic, deny))
            accepted = time.monotonic()
            expected = DENIED if deny else 0
            enforced: float | None = None
            while time.monotonic() - accepted < timeout_s:
                if probe.send() == expected:
                    enforced = time.monotonic() - accepted
                    break
            result.enforced_s.append(enforced)
            progress(i)
        result.records_during_changes = flow.acknowledged - before
    probe.close()
    result.seconds = time.monotonic() - started
    result.flow_acknowledged, result.flow_errors = flow.acknowledged, flow.errors
    result.disconnects = flow.stats.disconnects
    consumer = Consumer({"bootstrap.servers": admin_bootstrap or bootstrap,
                         "group.id": f"churn-{run}"})
    try:
        result.flow_stored = consumer.get_watermark_offsets(
            TopicPartition(flow_topic, 0), timeout=30)[1]
    finally:
        consumer.close()
    return result


@contextlib.contextmanager
def gateway_with_api(bootstrap: str, work: Path, token: str,
                     data_path: str) -> Iterator[tuple[str, str]]:
    """`keg up`'s control plane (store, REST API, rule directory) in front of
    `bootstrap`: (gateway bootstrap, API URL)."""
    import os

    from keg.gateway import ApiOptions, Gateway, GatewaySettings

    rules_dir = work / "rules"
    rules_dir.mkdir()
    (rules_dir / "flow.yaml").write_text(FLOW_RULES)
    (work / "tokens").write_text(f"bench:{token}\n")
    settings = GatewaySettings(
        bootstrap_servers=bootstrap, listen_port_base=0, work_dir=work / "work",
        ext_proc_log_level="WARNING", data_path=data_path, rules_dir=rules_dir,
        envoy_concurrency=os.cpu_count() or 1, ext_proc_workers=os.cpu_count() or 1,
        api=ApiOptions(data_dir=work / "store", port=0, tokens_file=work / "tokens"))
    with Gateway(settings) as gateway:
        assert gateway.app is not None and gateway.app.api_server is not None
        yield gateway.bootstrap, f"http://127.0.0.1:{gateway.app.api_server.port}"


def markdown(records: Sequence[dict[str, Any]]) -> str:
    """One row per run: REST changes while librdkafka (idempotent, acks=all) produces
    1 KiB JSON records, every one masked."""
    lines = [
        "Rule changes under load: REST changes of one rule while librdkafka (idempotent, "
        "acks=all) produces 1 KiB JSON records through a mask rule; enforced = the API's "
        "answer to the first probe Produce that shows the change (goal: within 1 s)",
        "",
        "| data path | commit | changes | enforced | within 1 s | p50 s | p99 s | max s | "
        "records during the changes | acknowledged | in the topic | errors | "
        "connections closed |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for record in records:
        s = record["summary"]
        lines.append(
            f"| {record['data_path']} | {record['commit']} | {s['changes']} | "
            f"{s['enforced']} | {s['within_goal']} | {s['p50_s']} | {s['p99_s']} | "
            f"{s['max_s']} | {s['records_during_changes']:,} | {s['flow_acknowledged']:,} | "
            f"{s['flow_stored']:,} | {s['flow_errors']} | {s['disconnects']} |")
    return "\n".join(lines) + "\n"


def latest_per_data_path(jsonl: Path) -> list[dict[str, Any]]:
    """The last run of each data path in the results file."""
    latest: dict[str, dict[str, Any]] = {}
    for line in jsonl.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            latest[record["data_path"]] = record
    return list(latest.values())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rule_churn",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--data-path", default="native", choices=("native", "ext-proc"))
    parser.add_argument("--no-save", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from rich.progress import Progress

    from keg.embedded.kafka import EmbeddedKafka, ensure_kafka

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    ensure_kafka()
    token = uuid.uuid4().hex
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="keg-churn-")))
        kafka = stack.enter_context(EmbeddedKafka())
        bootstrap, api_url = stack.enter_context(
            gateway_with_api(kafka.bootstrap, work, token, args.data_path))
        with Progress() as bar:
            task = bar.add_task("rule changes", total=args.changes)
            result = churn(bootstrap, api_url, token, records=args.records,
                           changes=args.changes, admin_bootstrap=kafka.bootstrap,
                           progress=lambda _i: bar.advance(task))
    record = {"benchmark": "rule_churn", "at": datetime.now(UTC).isoformat(timespec="seconds"),
              "commit": git_commit(), "data_path": args.data_path,
              "params": {"records": args.records, "changes": args.changes},
              "machine": machine_info(), "summary": result.summary(),
              "enforced_s": [None if s is None else round(s, 4) for s in result.enforced_s],
              "flow_errors": sorted(set(result.flow_errors))}
    print(markdown([record]))
    if not args.no_save:
        jsonl = RESULTS_DIR / "rule_churn.jsonl"
        with jsonl.open("a") as out:
            out.write(json.dumps(record) + "\n")
        (RESULTS_DIR / "rule_churn.md").write_text(markdown(latest_per_data_path(jsonl)))
    ok = (not result.unenforced and not result.flow_errors and result.disconnects == 0
          and result.flow_stored == result.flow_acknowledged)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
