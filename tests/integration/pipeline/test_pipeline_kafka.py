"""The data pipeline against the real broker and the real gateway.

* `keg capture` snapshots a topic range straight from Kafka (exact records, offsets).
* `keg backtest --input kafka://...` reads the topic with Spark's Kafka source
  (spark-sql-kafka from Maven Central), in a subprocess as a user would run it.
* End to end: records produced through the gateway with a capture rule are
  backtested against a new masking rule; the report counts exactly the records that
  contain the field.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from typer.testing import CliRunner

from interceptors.capture import read_capture
from keg.cli import app
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, gateway_settings, rule_dir

pytestmark = pytest.mark.integration

MASK_EMAIL = """\
apiVersion: keg/v1
kind: RuleSet
rules:
  - id: mask-email
    match: {topics: {prefix: [pipeline-]}}
    action:
      mask: {fields: ["$.customer.email"]}
"""


def _documents(n: int) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """(key, value, headers); every third value has the field the rule masks."""
    out = []
    for i in range(n):
        customer: dict[str, Any] = {"name": f"c{i}"}
        if i % 3 == 0:
            customer["email"] = f"c{i}@example.com"
        out.append((b"k%d" % i, json.dumps({"id": i, "customer": customer}).encode(),
                    [("trace", b"%d" % i)]))
    return out


def _produce(bootstrap: str, topic: str, docs: list[tuple[bytes, bytes, list[tuple[str, bytes]]]]
             ) -> None:
    errors: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for key, value, headers in docs:
        producer.produce(topic, value, key, headers=list[tuple[str, str | bytes | None]](headers),
                         on_delivery=delivered)
    assert producer.flush(60) == 0
    assert errors == []


def _with_email(docs: list[tuple[bytes, bytes, list[tuple[str, bytes]]]]) -> int:
    return sum(b'"email"' in value for _, value, _ in docs)


@pytest.fixture
def masking_rules(tmp_path: Path) -> Path:
    rules = tmp_path / "candidate"
    rules.mkdir()
    (rules / "mask.yaml").write_text(MASK_EMAIL)
    return rules


def test_keg_capture_snapshots_a_topic_range(kafka: EmbeddedKafka, tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, partitions=2, name="pipeline-snap-" + os.urandom(3).hex())
    docs = _documents(50)
    _produce(kafka.bootstrap, topic, docs)
    out = tmp_path / "capture"
    result = CliRunner().invoke(app, ["capture", "--topic", topic, "--bootstrap-servers",
                                      kafka.bootstrap, "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    rows = read_capture(out).to_pylist()
    assert sorted((r["key"], r["value"]) for r in rows) == sorted((k, v) for k, v, _ in docs)
    assert all(r["headers"] == [{"key": "trace", "value": r["key"][1:]}] for r in rows)
    for partition in (0, 1):
        offsets = sorted(r["offset"] for r in rows if r["partition"] == partition)
        assert offsets == list(range(len(offsets)))
    # Again into the same directory: refused, as a backtest would count every record twice.
    again = CliRunner().invoke(app, ["capture", "--topic", topic, "--bootstrap-servers",
                                     kafka.bootstrap, "--out", str(out), "-q"])
    assert again.exit_code == 2 and "already holds a capture of" in again.output, again.output
    assert read_capture(out).num_rows == len(docs)

    # A range: offsets 2..4 of partition 0 only.
    ranged = tmp_path / "ranged"
    result = CliRunner().invoke(app, ["capture", "--topic", topic, "--bootstrap-servers",
                                      kafka.bootstrap, "--out", str(ranged), "--partition", "0",
                                      "--from-offset", "2", "--to-offset", "5", "-q"])
    assert result.exit_code == 0, result.output
    assert sorted(read_capture(ranged).column("offset").to_pylist()) == [2, 3, 4]


def test_a_capture_of_a_quiet_range_backtests_as_no_records(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """`keg capture` of a range without records said "0 records (0 file(s))" and exit 0,
    and `keg backtest` then refused the directory ("holds no Parquet files"): a
    capture-then-backtest job failed whenever its topic had been quiet. A quiet range is
    captured as a file of no rows."""
    topic = create_topic(kafka.bootstrap, name="pipeline-quiet-" + os.urandom(3).hex())
    _produce(kafka.bootstrap, topic, _documents(3))
    out = tmp_path / "capture"
    result = CliRunner().invoke(app, ["capture", "--topic", topic, "--bootstrap-servers",
                                      kafka.bootstrap, "--out", str(out),
                                      "--from-offset", "100", "-q"])
    assert result.exit_code == 0, result.output
    assert read_capture(out).num_rows == 0
    rules = rule_dir(tmp_path / "rules", {"rules.yaml": MASK_EMAIL})
    backtest = CliRunner().invoke(app, ["backtest", "--rules", str(rules), "--input", str(out),
                                        "--out", str(tmp_path / "bt"), "-q"])
    assert backtest.exit_code == 0, backtest.output
    assert "backtest: 0 records" in backtest.output


def test_a_capture_cut_short_leaves_nothing_and_can_be_run_again(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """Ctrl-C during `keg capture` left the files it had completed (and its open one):
    a backtest read them as the whole capture, and capturing again into that --out was
    refused, as if it held a capture (regression). A capture cut short keeps nothing."""
    from pipeline.snapshot import snapshot

    topic = create_topic(kafka.bootstrap, name="pipeline-cut-" + os.urandom(3).hex())
    docs = _documents(12_000)
    _produce(kafka.bootstrap, topic, docs)
    out = tmp_path / "capture"
    calls = []

    def interrupt(done: int, _total: int) -> None:
        calls.append(done)
        if done >= 8_192:  # two row groups written, one file rotated
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        snapshot(kafka.bootstrap, topic, out, rotate_bytes=1, on_progress=interrupt)
    assert max(calls) >= 8_192
    assert [p for p in out.rglob("*") if p.is_file() and p.name != ".lock"] == []
    result = snapshot(kafka.bootstrap, topic, out)
    assert result.records == len(docs) and read_capture(out).num_rows == len(docs)


def test_capture_of_a_missing_topic_is_a_clear_error(kafka: EmbeddedKafka,
                                                     tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["capture", "--topic", "no-such-topic-here",
                                      "--bootstrap-servers", kafka.bootstrap,
                                      "--out", str(tmp_path), "-q"])
    assert result.exit_code == 2
    assert "topic 'no-such-topic-here' does not exist" in result.output


def test_spark_jobs_on_a_missing_topic_are_a_clear_error(
        kafka: EmbeddedKafka, tmp_path: Path, masking_rules: Path) -> None:
    """A backtest of kafka://.../no-such-topic said only "An error occurred while calling
    o125.parquet" (an unreachable broker hung for minutes), and `analyze --follow` of a
    missing audit topic printed a 150-line JVM trace and exited 1: one line now, exit 2,
    before Spark starts."""
    missing = f"kafka://{kafka.bootstrap}/no-such-topic-here"
    runs = {
        "backtest": ["backtest", "--rules", str(masking_rules), "--input", missing,
                     "--out", str(tmp_path / "bt"), "-q"],
        "analyze --follow": ["analyze", "--follow", "--audit", missing,
                             "--out", str(tmp_path / "an"), "-q"],
    }
    for what, args in runs.items():
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, (what, result.output)
        assert "topic 'no-such-topic-here' does not exist" in result.output, (what, result.output)
        assert "Traceback" not in result.output, (what, result.output)


def test_backtest_reads_the_topic_with_sparks_kafka_source(
        kafka: EmbeddedKafka, tmp_path: Path, masking_rules: Path) -> None:
    topic = create_topic(kafka.bootstrap, partitions=2, name="pipeline-src-" + os.urandom(3).hex())
    docs = _documents(90)
    _produce(kafka.bootstrap, topic, docs)
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "keg", "backtest", "--rules", str(masking_rules),
         "--input", f"kafka://{kafka.bootstrap}/{topic}", "--master", "local[1]",
         "--out", str(out), "-q"],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    totals = json.loads((out / "summary.json").read_text())["totals"]
    assert totals["records"] == 90
    assert totals["modified"] == _with_email(docs) == 30
    offsets = {(r["partition"], r["offset"]) for r in pq.read_table(out / "records").to_pylist()}
    assert len(offsets) == 90


def _captured(root: Path) -> int:
    return read_capture(root).num_rows if any(root.rglob("*.parquet")) else 0


@pytest.fixture
def capturing_gateway(kafka: EmbeddedKafka, tmp_path: Path) -> Iterator[tuple[Gateway, Path]]:
    capture = tmp_path / "captured"
    rules = rule_dir(tmp_path / "live", {"capture.yaml": (
        "apiVersion: keg/v1\nkind: RuleSet\nrules:\n  - id: capture-pipeline\n"
        "    match: {topics: {prefix: [pipeline-]}}\n"
        f"    action: {{capture: {{path: {capture}}}}}\n")})
    with Gateway(gateway_settings(kafka, tmp_path / "envoy", rules_dir=rules)) as gateway:
        yield gateway, capture


def test_records_captured_by_the_gateway_backtest_against_a_masking_rule(
        kafka: EmbeddedKafka, capturing_gateway: tuple[Gateway, Path], tmp_path: Path,
        masking_rules: Path) -> None:
    gateway, capture = capturing_gateway
    topic = create_topic(kafka.bootstrap, name="pipeline-e2e-" + os.urandom(3).hex())
    docs = _documents(120)
    _produce(gateway.bootstrap, topic, docs)
    # The capture closes its files once records stop coming (flush_seconds).
    deadline = time.monotonic() + 60
    while _captured(capture) < len(docs):
        assert time.monotonic() < deadline, f"{_captured(capture)} records captured"
        time.sleep(0.5)
    captured = read_capture(capture).to_pylist()
    assert sorted((r["key"], r["value"]) for r in captured) == sorted((k, v) for k, v, _ in docs)
    assert {r["direction"] for r in captured} == {"produce"}

    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["backtest", "--rules", str(masking_rules), "--input",
                                      str(capture), "--live-rules", str(capture.parent / "live"),
                                      "--out", str(out), "--master", "local[2]", "-q",
                                      "--fail-on", "mask-email:modified>40"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    expected = _with_email(docs)
    assert summary["totals"]["modified"] == summary["totals"]["differs"] == expected == 40
    (rule,) = summary["rules"]
    assert (rule["rule_id"], rule["matched"], rule["modified"]) == ("mask-email", 120, expected)
    assert "mask-email" in (out / "report.html").read_text()
