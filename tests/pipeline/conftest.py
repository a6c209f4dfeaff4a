"""The pipeline tests' SparkSession (one per test session, local[2]) and sample data."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from filter_rules import CompiledRuleSet, load_rule_dir
from interceptors.capture import CaptureWriter, to_row
from interceptors.contract import BuildContext, InterceptedRecord
from interceptors.engine import RecordEngine, RecordOutcome
from pipeline.evaluate import outcome_digest, record_bytes

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CANDIDATE_RULES = """\
apiVersion: keg/v1
kind: RuleSet
rules:
  - id: mask-email
    match: {topics: {exact: [orders]}}
    action:
      mask: {fields: ["$.customer.email"]}
  - id: drop-test-keys
    order: 5
    match: {topics: {prefix: [ord]}}
    action:
      drop: {when: {key: {prefix: [test-]}}}
  - id: require-id
    match: {topics: {exact: [events]}}
    action:
      validate: {json_schema: {type: object, required: [id]}, allow_null: true}
  - id: tag-bob
    match: {principals: {exact: ["User:bob"]}}
    action:
      headers: {set: {x-reviewed: "yes"}}
  - id: would-drop-tombstones
    mode: dry-run
    match: {topics: {exact: [orders]}}
    action:
      drop: {when: {tombstone: true}}
  - id: capture-events
    match: {topics: {exact: [events]}}
    action:
      capture: {path: /nonexistent/never-written}
  - id: consume-side
    match: {topics: {exact: [orders]}, direction: response}
    action:
      headers: {remove: [secret-ish]}
"""

LIVE_RULES = """\
apiVersion: keg/v1
kind: RuleSet
rules:
  - id: drop-test-keys
    match: {topics: {prefix: [ord]}}
    action:
      drop: {when: {key: {prefix: [test-]}}}
"""


def sample_records(n: int = 240) -> list[InterceptedRecord]:
    """Varied records: two topics, JSON with and without the masked field, invalid
    events, tombstones, null keys, headers, two principals, both directions."""
    records = []
    for i in range(n):
        topic = "orders" if i % 2 else "events"
        doc: dict[str, object] = {"id": i, "customer": {"name": f"n{i}"}}
        if i % 3 == 0:
            doc["customer"] = {"name": f"n{i}", "email": f"user{i}@example.com"}
        if i % 7 == 0:
            doc.pop("id")
        value: bytes | None = json.dumps(doc).encode()
        if i % 17 == 0:
            value = None
        elif i % 29 == 0:
            value = b"not json {"
        key = None if i % 13 == 0 else (b"test-%d" if i % 11 == 0 else b"k-%d") % i
        headers: list[tuple[str, bytes | None]] = [("trace", b"%d" % i)]
        if i % 5 == 0:
            headers.append(("secret-ish", None))
        if i % 19 == 0:  # (the pandas route could not read a capture with some of these)
            headers = []
        records.append(InterceptedRecord(
            topic, i % 3, key, value, headers, 1_700_000_000_000 + i * 1000, i,
            "User:bob" if i % 4 == 0 else "User:alice",
            "consume" if i % 9 == 0 else "produce"))
    return records


def write_capture(directory: Path, records: list[InterceptedRecord]) -> Path:
    writer = CaptureWriter(directory)
    writer.write([to_row(r, include_value=True, now_ms=1_800_000_000_000) for r in records])
    writer.close()
    return directory


def rule_dir(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "rules.yaml").write_text(text)
    return directory


def live_inputs(base: Path, count: int) -> tuple[Path, Path]:
    """Under `base`: a capture of `count` sample records, and a rule directory of
    LIVE_RULES."""
    return (write_capture(base / "capture", sample_records(count)),
            rule_dir(base / "rules", LIVE_RULES))


def plain_outcomes(records: list[InterceptedRecord], rules: Path
                   ) -> dict[tuple[Any, ...], RecordOutcome]:
    """The backtests' reference: RecordEngine.evaluate in a loop, the engine as the
    gateway builds it."""
    engine = RecordEngine(CompiledRuleSet(load_rule_dir(rules)), BuildContext())
    try:
        return {(r.topic, r.partition, r.offset): engine.evaluate(r, measure=True)
                for r in records}
    finally:
        engine.close()


def expected_row(outcome: RecordOutcome) -> dict[str, Any]:
    kept = outcome.status in ("unchanged", "modified")
    return {
        "status": outcome.status,
        "reason": outcome.reason,
        "bytes_after": record_bytes(outcome.record) if kept else 0,
        "digest": outcome_digest(outcome) if outcome.status == "modified" else None,
        "steps": [(s.rule_id, s.kind, s.effect, s.reason, s.dry_run) for s in outcome.steps],
    }


def actual_row(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    return {
        "status": row[f"{prefix}status"],
        "reason": row[f"{prefix}reason"],
        "bytes_after": row[f"{prefix}bytes_after"],
        "digest": row[f"{prefix}digest"],
        "steps": [(s["rule_id"], s["kind"], s["effect"], s["reason"], s["dry_run"])
                  for s in row[f"{prefix}steps"]],
    }


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from pipeline.spark import build_session

    session = build_session("local[2]", app_name="keg-tests", shuffle_partitions=2,
                            driver_memory="1g")
    yield session
    session.stop()
