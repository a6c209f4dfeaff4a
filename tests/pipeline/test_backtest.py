"""keg backtest on a local SparkSession equals a plain-Python run of the same engine."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from keg.cli import app
from pipeline.backtest import RulesInvalid, load_rules, run_backtest
from pipeline.errors import PipelineError
from pipeline.evaluate import differs, record_bytes
from pipeline.inputs import KafkaInput, check_capture_files, parse_input, read_records
from tests.pipeline.conftest import (
    CANDIDATE_RULES,
    LIVE_RULES,
    actual_row,
    expected_row,
    live_inputs,
    plain_outcomes,
    rule_dir,
    sample_records,
    write_capture,
)


@pytest.mark.parametrize("method", ["direct", "arrow", "pandas"])
def test_backtest_equals_plain_python_record_for_record(spark: Any, tmp_path: Path,
                                                         method: str) -> None:
    records = sample_records()
    capture = write_capture(tmp_path / "capture", sample_records())
    never = tmp_path / "never-written"
    candidate_dir = rule_dir(tmp_path / "candidate",
                             CANDIDATE_RULES.replace("/nonexistent/never-written", str(never)))
    live_dir = rule_dir(tmp_path / "live", LIVE_RULES)

    # The direct route reads the capture files itself; the others get a DataFrame.
    source = capture if method == "direct" else read_records(spark, parse_input(str(capture)))
    result = run_backtest(spark, source, load_rules(candidate_dir), load_rules(live_dir),
                          tmp_path / "out", method)  # type: ignore[arg-type]
    assert not never.exists(), "a backtest must not write captures"

    rows = pq.read_table(tmp_path / "out" / "records").to_pylist()
    assert len(rows) == len(records)
    by_id = {(r["topic"], r["partition"], r["offset"]): r for r in rows}
    candidate = plain_outcomes(sample_records(), candidate_dir)
    live = plain_outcomes(sample_records(), live_dir)
    for record in records:
        rid = (record.topic, record.partition, record.offset)
        row = by_id[rid]
        assert actual_row(row) == expected_row(candidate[rid]), rid
        assert actual_row(row, "live_") == expected_row(live[rid]), rid
        assert row["bytes_before"] == record_bytes(record)
        assert row["differs"] == differs(candidate[rid], live[rid])

    # The summary counts what the reference says.
    statuses = Counter(o.status for o in candidate.values())
    totals = result.summary["totals"]
    assert totals["records"] == len(records)
    for status in ("unchanged", "modified", "dropped", "rejected", "failed"):
        assert totals[status] == statuses[status], status
    steps = Counter((s.rule_id, s.effect, s.dry_run) for o in candidate.values() for s in o.steps)
    per_rule = {r["rule_id"]: r for r in result.summary["rules"]}
    expected: Counter[tuple[str, str]] = Counter()
    for (rule_id, effect, dry_run), count in steps.items():
        column = f"would_{effect}" if dry_run and effect != "unchanged" else effect
        expected[rule_id, column] += count
    for (rule_id, column), count in expected.items():
        assert per_rule[rule_id][column] == count, (rule_id, column)
    matched = Counter(s.rule_id for o in candidate.values() for s in o.steps)
    assert {r: v["matched"] for r, v in per_rule.items()} == dict(matched)
    # Each rule's bytes are what it got and passed on: every rule that matched the same
    # records showed the same bytes, the records' final ones (regression).
    got_bytes: Counter[str] = Counter()
    passed_bytes: Counter[str] = Counter()
    for outcome in candidate.values():
        for step in outcome.steps:
            got_bytes[step.rule_id] += step.bytes_in or 0
            passed_bytes[step.rule_id] += step.bytes_out or 0
    assert {r: (v["bytes_before"], v["bytes_after"]) for r, v in per_rule.items()} == {
        r: (got_bytes[r], passed_bytes[r]) for r in matched}
    dropping = per_rule["drop-test-keys"]
    assert dropping["dropped"] > 0 and dropping["bytes_after"] < dropping["bytes_before"]
    dry = per_rule["would-drop-tombstones"]
    assert dry["bytes_after"] == dry["bytes_before"]  # a dry run passes records on as is
    assert per_rule["tag-bob"]["bytes_after"] > per_rule["tag-bob"]["bytes_before"]
    # Sample reasons come from the records the rule rejected.
    assert per_rule["require-id"]["rejected"] > 0
    assert per_rule["require-id"]["sample_reasons"]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["totals"] == totals


def test_backtest_without_live_rules_counts_changes_as_differences(spark: Any,
                                                                   tmp_path: Path) -> None:
    capture, rules = live_inputs(tmp_path, 60)
    result = run_backtest(spark, read_records(spark, parse_input(str(capture))),
                          load_rules(rules), None, tmp_path / "out")
    reference = plain_outcomes(sample_records(60), rules)
    dropped = sum(o.status == "dropped" for o in reference.values())
    assert dropped > 0
    assert result.summary["totals"]["dropped"] == dropped
    assert result.summary["totals"]["differs"] == dropped


def test_invalid_rules_report_file_and_line(tmp_path: Path) -> None:
    rules = rule_dir(tmp_path / "bad", "apiVersion: keg/v1\nkind: RuleSet\nrules:\n"
                     "  - id: x\n    action:\n      mask: {fields: [\"email\"]}\n")
    with pytest.raises(RulesInvalid) as err:
        load_rules(rules)
    assert any(str(rules / "rules.yaml") + ":6:" in line for line in err.value.lines)


def test_rules_that_cannot_be_built_are_invalid(tmp_path: Path) -> None:
    rules = rule_dir(tmp_path / "bad", "apiVersion: keg/v1\nkind: RuleSet\nrules:\n"
                     "  - id: h\n    action:\n      mask: {fields: [$.a], method: hash, "
                     "hash_key: {env: KEG_TEST_NO_SUCH_KEY}}\n")
    with pytest.raises(RulesInvalid) as err:
        load_rules(rules)
    assert err.value.lines[0].startswith(f"{rules / 'rules.yaml'}:4:")
    assert "KEG_TEST_NO_SUCH_KEY" in err.value.lines[0]


def test_missing_rule_directory(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="does not exist"):
        load_rules(tmp_path / "nope")


@pytest.mark.parametrize(("value", "message"), [
    ("/definitely/not/here", "does not exist"),
    ("kafka://localhost/topic", "expected kafka://host:port/topic"),
    ("kafka://localhost:9092/", "expected kafka://host:port/topic"),
    ("s3://bucket/x", "unsupported input"),
])
def test_bad_inputs(value: str, message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        parse_input(value)


def test_input_directory_without_parquet(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(PipelineError, match="holds no Parquet files"):
        parse_input(str(tmp_path))


def test_kafka_input_parses() -> None:
    assert parse_input("kafka://127.0.0.1:9092/orders.v1") == KafkaInput("127.0.0.1:9092",
                                                                          "orders.v1")


def test_unreadable_parquet_is_one_clear_error(spark: Any, tmp_path: Path) -> None:
    capture = tmp_path / "capture"
    capture.mkdir()
    (capture / "part-0.parquet").write_bytes(b"this is not parquet")
    rules = load_rules(rule_dir(tmp_path / "rules", LIVE_RULES))
    with pytest.raises(PipelineError, match="is not a readable Parquet file") as early:
        check_capture_files(capture)  # `keg backtest --input`, before Spark starts
    assert "\n" not in str(early.value)
    for source in (read_records(spark, parse_input(str(capture))), capture):
        with pytest.raises(PipelineError) as err:
            run_backtest(spark, source, rules, None, tmp_path / "out")
        message = str(err.value)
        assert message.startswith("the backtest failed:")
        assert "\n" not in message and "\tat " not in message


def test_parquet_without_the_capture_columns_is_refused_by_name(tmp_path: Path) -> None:
    """A Parquet file that is not a capture was read as rows of nulls and the backtest
    died with a Spark stack trace and `IndexError: index out of bounds` (regression)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    capture = tmp_path / "capture"
    (capture / "date=2026-01-01").mkdir(parents=True)
    pq.write_table(pa.table({"foo": [1, 2]}), capture / "date=2026-01-01" / "x.parquet")
    rules = rule_dir(tmp_path / "rules", LIVE_RULES)
    result = runner.invoke(app, ["backtest", "--rules", str(rules), "--input", str(capture)])
    assert result.exit_code == 2, result.output
    assert "is not a capture file: it lacks the column(s) topic, partition, direction, " \
        "captured_at" in " ".join(result.output.split())
    assert "Traceback" not in result.output and "\tat " not in result.output


runner = CliRunner()


def test_cli_backtest_exit_codes_and_report(spark: Any, tmp_path: Path) -> None:
    capture, rules = live_inputs(tmp_path, 80)
    out = tmp_path / "out"
    ok = runner.invoke(app, ["backtest", "--rules", str(rules), "--input", str(capture),
                             "--out", str(out), "--fail-on", "dropped>0.5", "-q"])
    assert ok.exit_code == 0, ok.output
    assert "drop-test-keys" in ok.output
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," in page and "<script" not in page and "http" not in page

    crossed = runner.invoke(app, ["backtest", "--rules", str(rules), "--input", str(capture),
                                  "--out", str(out), "--fail-on", "dropped>=1", "-q"])
    assert crossed.exit_code == 1, crossed.output
    assert "threshold crossed: dropped>=1" in crossed.output


def test_cli_backtest_invalid_rules_exit_2_without_stack_trace(tmp_path: Path) -> None:
    rules = rule_dir(tmp_path / "bad", "apiVersion: keg/v1\nkind: RuleSet\nrules:\n"
                     "  - id: x\n    order: \"10\"\n    action: {drop: {when: {}}}\n")
    result = runner.invoke(app, ["backtest", "--rules", str(rules), "--input", str(tmp_path)])
    assert result.exit_code == 2
    assert f"{rules / 'rules.yaml'}:5:" in result.output
    assert "Traceback" not in result.output


def test_cli_bad_threshold_exit_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["backtest", "--rules", str(tmp_path), "--input", str(tmp_path),
                                 "--fail-on", "dropped~1"])
    assert result.exit_code == 2
    assert "invalid --fail-on 'dropped~1'" in result.output


def test_cli_bad_spark_conf_exit_2(tmp_path: Path) -> None:
    capture, rules = live_inputs(tmp_path, 5)
    result = runner.invoke(app, ["backtest", "--rules", str(rules), "--input", str(capture),
                                 "--conf", "spark.executor.memory"])
    assert result.exit_code == 2
    assert "--conf 'spark.executor.memory': expected KEY=VALUE" in result.output


SCOPED_RULES = """\
apiVersion: keg/v1
kind: RuleSet
rules:
  - id: deny-events
    match: {topics: {exact: [events]}}
    action: {deny: {}}
  - id: size-guard
    match: {topics: {exact: [orders]}}
    action: {safeguard: {max_record_bytes: 10}}
  - id: mask-for-one-client
    match: {topics: {exact: [orders]}, client_ids: {exact: [masked-client]}}
    action: {mask: {fields: ["$.customer.name"]}}
  - id: seal-names
    match: {topics: {exact: [orders]}}
    action: {encrypt: {fields: ["$.customer.name"], key: {id: k1, secret: {file: k1.key}}}}
  - id: try-dropping-tests
    mode: dry-run
    match: {topics: {exact: [orders]}}
    action: {drop: {when: {key: {prefix: [test-]}}}}
"""


def scoped_rules(directory: Path) -> Path:
    rules = rule_dir(directory, SCOPED_RULES)
    (rules / "k1.key").write_text("11" * 32)
    return rules


def test_cli_backtest_names_the_rules_it_does_not_judge_as_live(spark: Any,
                                                                tmp_path: Path) -> None:
    """A new user's backtest left a deny and a safeguard out without a word (the records
    they refuse live counted as unchanged, a gate `deny-x:matched==0` passed), judged a
    client-id rule as matching no client, and with the same rules on both sides said
    every record an encrypt rule changed differs from live (fresh nonces)."""
    capture = write_capture(tmp_path / "capture", sample_records(80))
    rules = scoped_rules(tmp_path / "rules")
    out = tmp_path / "out"
    result = runner.invoke(app, ["backtest", "--rules", str(rules), "--input", str(capture),
                                 "--live-rules", str(rules), "--out", str(out),
                                 "--fail-on", "differs>0",
                                 "--fail-on", "try-dropping-tests:would_dropped>100", "-q"])
    assert result.exit_code == 0, result.output
    where = f"{rules / 'rules.yaml'}:"
    for rule, kind in (("deny-events", "deny"), ("size-guard", "safeguard")):
        assert f"rule {rule} ({kind}) not evaluated: a backtest runs record rules only" \
            in result.output
    assert "rule mask-for-one-client (mask) judged approximately" in result.output
    assert "client ids (judged as a client without one)" in result.output
    assert where in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert {u["rule_id"]: u["approximate"] for u in summary["unjudged"]} == {
        "deny-events": False, "size-guard": False, "mask-for-one-client": True}
    sealed = next(r for r in summary["rules"] if r["rule_id"] == "seal-names")
    assert sealed["modified"] > 0
    assert summary["totals"]["differs"] == 0  # the same rules: nothing differs
    assert "Rules not judged as live" in (out / "report.html").read_text()

    gated = runner.invoke(app, ["backtest", "--rules", str(rules), "--input", str(capture),
                                "--fail-on", "deny-events:matched==0", "-q"])
    assert gated.exit_code == 2, gated.output
    assert "rule 'deny-events' is a deny rule, which a backtest does not evaluate" \
        in gated.output

    alone = runner.invoke(app, ["backtest", "--rules", str(rules), "--input", str(capture),
                                "--out", str(out), "-q"])
    assert alone.exit_code == 0, alone.output
    assert "differ from the live rules: n/a (no --live-rules)" in alone.output


def test_a_capture_direction_that_is_neither_produce_nor_consume_is_one_clear_error(
        tmp_path: Path) -> None:
    """A capture saying direction=sideways failed every task with a KeyError and Spark's
    stack traces."""
    import pyarrow as pa

    capture = write_capture(tmp_path / "capture", sample_records(4))
    file = next(capture.rglob("*.parquet"))
    table = pq.read_table(file)
    column = table.schema.get_field_index("direction")
    pq.write_table(table.set_column(column, table.schema.field(column),
                                    pa.array(["sideways"] * table.num_rows, pa.string())),
                   file)
    with pytest.raises(PipelineError, match="column direction holds 'sideways'; a capture's "
                                            "direction is produce or consume"):
        check_capture_files(capture)
    result = runner.invoke(app, ["backtest", "--rules", str(live_inputs(tmp_path, 1)[1]),
                                 "--input", str(capture), "-q"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
