"""RecordEngine: plans, stages, outcomes, budgets; batches in and out (no network)."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from filter_rules import CompiledRuleSet, MatchContext, RuleSetInvalid, load_rule_text
from interceptors import BuildContext, InterceptedRecord, NoSideEffects, RecordRejected
from interceptors.engine import RecordEngine
from kafka_wire import ApiKey
from kafka_wire.records import BatchHeader, BatchView, Record, decode_records, encode_batch

EXAMPLES = Path(__file__).resolve().parents[3] / "filter_rules" / "examples"


class Upper:
    def configure(self, config: Mapping[str, Any]) -> None:
        self.suffix = str(config.get("suffix", "")).encode()

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord | None:
        if record.value == b"drop":
            return None
        if record.value == b"bad":
            raise RecordRejected("bad value")
        if record.value == b"boom":
            raise RuntimeError("exploded")
        if record.value is not None and record.value.islower():
            record.value = record.value.upper() + self.suffix
        return record


class Sleepy:
    calls = 0

    def configure(self, config: Mapping[str, Any]) -> None:
        self.seconds = float(config["seconds"])

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord | None:
        type(self).calls += 1
        time.sleep(self.seconds)
        return record


def engine(rules: str, tmp_path: Path | None = None) -> RecordEngine:
    ruleset = load_rule_text(textwrap.dedent(rules), str((tmp_path or Path.cwd()) / "r.yaml"))
    return RecordEngine(CompiledRuleSet(ruleset), BuildContext())


CUSTOM = """
rules:
  - id: upper
    match: {topics: {prefix: [t.]}}
    action:
      interceptor: {class: "tests.unit.interceptors.test_record_engine:Upper",
                    config: {suffix: "!"}}
"""


def record(value: bytes | None, topic: str = "t.a", **kw: Any) -> InterceptedRecord:
    return InterceptedRecord(topic, 0, b"k", value, [("h", b"1")], 1_700_000_000_000, **kw)


def test_outcomes_per_record() -> None:
    e = engine(CUSTOM)
    assert [(o.status, o.reason) for o in (e.evaluate(record(v)) for v in
            (b"abc", b"ABC", b"drop", b"bad", b"boom", None))] == [
        ("modified", None), ("unchanged", None), ("dropped", None), ("rejected", "bad value"),
        ("failed", "interceptor failed: RuntimeError: exploded"), ("unchanged", None)]
    assert e.evaluate(record(b"abc")).record.value == b"ABC!"  # type: ignore[union-attr]


def test_plan_follows_topic_direction_and_principal() -> None:
    e = engine("""
    rules:
      - id: produce-only
        match: {topics: {exact: [t.a]}}
        action: {interceptor: {class: "tests.unit.interceptors.test_record_engine:Upper"}}
      - id: consume-for-bob
        match: {direction: response, principals: {exact: [bob]}}
        action: {interceptor: {class: "tests.unit.interceptors.test_record_engine:Upper"}}
    """)
    ctx = MatchContext(api_key=ApiKey.PRODUCE, api_version=9, principal="alice")
    assert [s.rule_id for s in e.plan("produce", "t.a", ctx)] == ["produce-only"]
    assert e.plan("produce", "t.b", ctx) == ()
    assert e.plan("consume", "t.a", ctx) == ()
    bob = MatchContext(api_key=ApiKey.FETCH, api_version=12, principal="bob")
    assert [s.rule_id for s in e.plan("consume", "any", bob)] == ["consume-for-bob"]
    assert (
        e.interested(ApiKey.PRODUCE, 9)
        and e.interested(ApiKey.FETCH, 12)
        and not e.interested(ApiKey.METADATA, 12)
    )


def test_dry_run_reports_but_changes_nothing() -> None:
    e = engine(CUSTOM.replace("id: upper", "id: upper\n    mode: dry-run"))
    outcome = e.evaluate(record(b"abc"))
    assert outcome.status == "unchanged" and outcome.record.value == b"abc"  # type: ignore[union-attr]
    assert [(s.rule_id, s.effect, s.dry_run) for s in outcome.steps] == [
        ("upper", "modified", True)]


def test_a_dry_run_copies_nothing_and_captures_nothing(tmp_path: Path) -> None:
    sent = NoSideEffects()
    rules = load_rule_text(textwrap.dedent(f"""
        rules:
          - id: copy-out
            mode: dry-run
            action: {{copy: {{topic: elsewhere}}}}
          - id: capture-all
            mode: dry-run
            action: {{capture: {{path: "{tmp_path / 'capture'}"}}}}
          - id: copy-for-real
            match: {{topics: {{prefix: [real.]}}}}
            action: {{copy: {{topic: audit}}}}
        """), str(tmp_path / "r.yaml"))
    e = RecordEngine(CompiledRuleSet(rules), BuildContext(side_effects=sent))
    try:
        outcome = e.evaluate(record(b"abc"))
        assert [(s.rule_id, s.dry_run) for s in outcome.steps] == [
            ("copy-out", True), ("capture-all", True)]
        e.evaluate(InterceptedRecord("real.t", 0, None, b"x"))
    finally:
        e.close()
    assert [topic for topic, _ in sent.topic_copies] == ["audit"]  # the enforced rule only
    assert not (tmp_path / "capture").exists() or not any((tmp_path / "capture").rglob("*"))


def test_budget_retries_then_times_out() -> None:
    Sleepy.calls = 0
    e = engine("""
    rules:
      - id: sleepy
        action:
          interceptor: {class: "tests.unit.interceptors.test_record_engine:Sleepy",
                        config: {seconds: 0.3}, timeout_ms: 20, retries: 2}
    """)
    assert e.blocking
    outcome = e.evaluate(record(b"x"))
    assert outcome.status == "failed"
    assert outcome.steps[-1].effect == "timeout"
    assert "3 attempts of 20 ms" in (outcome.reason or "")
    time.sleep(0.35 * 3)  # let the abandoned attempts finish
    assert Sleepy.calls == 3


def test_rules_that_cannot_be_built_name_their_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(RuleSetInvalid) as info:
        engine("""
        rules:
          - id: nope
            action: {interceptor: {class: "no_such_module_here:Thing"}}
          - id: nope2
            action: {interceptor: {class: "tests.unit.interceptors.test_record_engine:Missing"}}
        """, tmp_path)
    text = str(info.value)
    assert f"{tmp_path / 'r.yaml'}:3:" in text and "no module 'no_such_module_here'" in text
    assert "has no class 'Missing'" in text


def test_example_plugin_loads_from_the_rule_directory() -> None:
    from filter_rules import load_rule_dir

    ruleset = load_rule_dir(EXAMPLES)
    only = ruleset.model_copy(update={"rules": [ruleset.get("redact-ssn-in-support-tickets")]})
    e = RecordEngine(CompiledRuleSet(only))
    outcome = e.evaluate(record(b"ssn 123-45-6789 here", topic="support.tickets"))
    assert outcome.record is not None and outcome.record.value == b"ssn ***-**-**** here"
    assert outcome.record.headers[-1] == ("keg.redacted", b"1")
    assert e.evaluate(record(b"ssn 123-45-6789", topic="sales")).status == "unchanged"


def batch(values: list[bytes], **header: Any) -> BatchView:
    records = [Record(i, i, b"k", v, []) for i, v in enumerate(values)]
    fields = {"base_offset": 100, "base_timestamp": 1_700_000_000_000, **header}
    return BatchView.from_bytes(encode_batch(BatchHeader(**fields), records))


def test_process_batch_keeps_untouched_batches_as_bytes() -> None:
    e = engine(CUSTOM)
    stages = e.plan("produce", "t.a", MatchContext(api_key=ApiKey.PRODUCE, api_version=9))
    outcome = e.process_batch(batch([b"ABC", b"DEF"]), stages, topic="t.a", partition=0,
                              direction="produce", principal=None)
    assert outcome.records is None and not outcome.refused
    assert outcome.counts == {("upper", "unchanged"): 2}


def test_process_batch_changes_drops_and_refuses() -> None:
    e = engine(CUSTOM)
    stages = e.plan("produce", "t.a", MatchContext(api_key=ApiKey.PRODUCE, api_version=9))
    outcome = e.process_batch(batch([b"abc", b"drop", b"DEF"]), stages, topic="t.a",
                              partition=0, direction="produce", principal=None)
    assert outcome.records is not None
    assert [(r.offset_delta, r.value) for r in outcome.records] == [(0, b"ABC!"), (2, b"DEF")]
    assert (outcome.modified, outcome.dropped) == (1, 1)

    refused = e.process_batch(batch([b"abc", b"bad", b"ok", b"bad"]), stages, topic="t.a",
                              partition=0, direction="produce", principal=None)
    assert refused.refused and refused.records is None
    assert [(r.index, r.reason) for r in refused.rejections] == [(1, "bad value"),
                                                                (3, "bad value")]
    # At consume time an invalid record is withheld, never refused.
    consumed = e.process_batch(batch([b"abc", b"bad"]), stages, topic="t.a", partition=0,
                               direction="consume", principal=None)
    assert not consumed.refused and consumed.dropped == 1
    assert consumed.records is not None and [r.value for r in consumed.records] == [b"ABC!"]


def test_consume_side_sees_offsets() -> None:
    seen: list[int | None] = []

    class Spy:
        def configure(self, config: Mapping[str, Any]) -> None: ...

        def intercept(self, record: InterceptedRecord) -> InterceptedRecord:
            seen.append(record.offset)
            return record

    e = RecordEngine(CompiledRuleSet(load_rule_text(
        "rules: [{id: spy, match: {direction: response}, action: {mask: {fields: [$.a]}}}]",
        "r.yaml")), builders={"mask": lambda spec, ctx: Spy()})
    stages = e.plan("consume", "x", MatchContext(api_key=ApiKey.FETCH, api_version=12))
    e.process_batch(batch([b"1", b"2"]), stages, topic="x", partition=0, direction="consume",
                    principal=None)
    assert seen == [100, 101]
    assert decode_records(batch([b"1"]))[0].value == b"1"


def test_each_effect_weighs_its_records_for_the_audit() -> None:
    # Key, value and header bytes of the records with each effect (the audit's bytes).
    e = engine(CUSTOM)
    stages = e.plan("produce", "t.a", MatchContext(api_key=ApiKey.PRODUCE, api_version=9))
    outcome = e.process_batch(batch([b"abc", b"drop", b"DEF"]), stages, topic="t.a",
                              partition=0, direction="produce", principal=None)
    assert outcome.sizes[("upper", "modified")] == len(b"k") + len(b"abc")
    assert outcome.sizes[("upper", "dropped")] == len(b"k") + len(b"drop")


def test_a_frames_time_budget_ends_before_keg_ups_hand_off_timeout() -> None:
    """At 4 s the module had answered the client REQUEST_TIMED_OUT at its 2 s hand-off
    timeout while the worker went on for 2 s more, holding up every other connection of
    that worker (a new user's heavy batches of 99,000 records)."""
    import inspect

    from interceptors.engine import DEFAULT_LIMITS
    from keg.cli import up

    handoff_timeout_s = inspect.signature(up).parameters["message_timeout"].default
    assert DEFAULT_LIMITS.max_frame_seconds < handoff_timeout_s
