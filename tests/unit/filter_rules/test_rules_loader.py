"""The rule loader: every broken file gives one clear error at the right file:line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filter_rules import (
    DEFAULT_RULES_DIR,
    RuleError,
    RuleSet,
    RuleSetInvalid,
    load_rule_data,
    load_rule_dir,
    load_rule_file,
    load_rule_text,
)
from filter_rules import loader as loader_module

FILES = Path(__file__).parent / "rule_files"


def errors_of(path: Path) -> tuple[RuleError, ...]:
    with pytest.raises(RuleSetInvalid) as caught:
        load_rule_file(path)
    return caught.value.errors


def text_errors(text: str | bytes, name: str = "t.yaml") -> tuple[RuleError, ...]:
    with pytest.raises(RuleSetInvalid) as caught:
        load_rule_text(text, name)
    return caught.value.errors


# file, line, column, field path, a fragment of the message
BROKEN = [
    ("bad_yaml.yaml", 7, 11, "",
     "invalid YAML: expected ',' or ']', but got ':' (while parsing a flow sequence at line 6"),
    ("unknown_field.yaml", 7, 7, "rules[0].match.topic",
     "unknown field 'topic'; did you mean 'topics'?"),
    # A field of a record action (only filter_rules.model's fields were offered).
    ("unknown_action_field.yaml", 7, 9, "rules[0].action.mask.methd",
     "unknown field 'methd'; did you mean 'method'?"),
    ("bad_regex.yaml", 7, 32, "rules[0].match.topics.regex[1]",
     r"invalid RE2 pattern '(a)\1': invalid escape sequence: \1"),
    ("wrong_type.yaml", 5, 5, "rules[0].order", "expected an integer, got '10'"),
    ("missing_field.yaml", 7, 5, "rules[1].action", "missing required field 'action'"),
    ("bad_cidr.yaml", 8, 11, "rules[0].match.client_addresses[1]", "invalid CIDR '10.0.0.0/33'"),
    ("unknown_api.yaml", 6, 23, "rules[0].match.apis[1]", "unknown API 'FetchMessages'"),
    ("unknown_error.yaml", 7, 9, "rules[0].action.deny.error",
     "unknown Kafka error 'TOPIC_AUTHORISATION_FAILED'; "
     "did you mean 'TOPIC_AUTHORIZATION_FAILED'?"),
    ("two_actions.yaml", 3, 5, "rules[0].action",
     "an action has exactly one kind, not 2 (observe, deny)"),
    ("unknown_action.yaml", 3, 5, "rules[0].action", "unknown action 'tokenize'; expected one of"),
    ("duplicate_key.yaml", 4, 5, "rules[0].mode", "duplicate key 'mode'"),
    ("not_a_mapping.yaml", 1, 1, "", "a rule file holds a mapping (apiVersion, kind, rules)"),
    ("bad_listener.yaml", 4, 19, "rules[0].match.listeners[0]", "invalid listener '127.0.0.1'"),
    ("bad_rule_id.yaml", 2, 5, "rules[0].id", "got 'Payments_Writers'"),
    ("bad_versions.yaml", 5, 7, "rules[0].match.versions", "min 12 is greater than max 4"),
    ("empty_string_match.yaml", 4, 7, "rules[0].match.topics",
     "give at least one of exact, prefix, regex"),
    ("unsafe_tag.yaml", 2, 9, "rules[0].id", "could not determine a constructor for the tag"),
    ("bad_version_field.yaml", 1, 1, "apiVersion", "Input should be 'keg/v1', got 'keg/v2'"),
    ("yaml_boolean.yaml", 4, 24, "rules[0].match.topics.exact[0]",
     "expected a string, got false (a boolean; quote it to make it a string)"),
]


@pytest.mark.parametrize(("name", "line", "column", "field_path", "fragment"), BROKEN,
                         ids=[case[0] for case in BROKEN])
def test_each_broken_file_gives_one_clear_error(
    name: str, line: int, column: int, field_path: str, fragment: str
) -> None:
    path = FILES / name
    (error,) = errors_of(path)
    assert (error.file, error.line, error.column, error.field_path) == (
        str(path), line, column, field_path
    )
    assert fragment in error.message
    prefix = f"{path}:{line}:{column}: " + (f"{field_path}: " if field_path else "")
    assert str(error) == prefix + error.message
    assert "\n" not in str(error)


def test_error_format_matches_the_documented_example() -> None:
    text = "rules:\n  - id: r\n    match:\n      topics:\n        regex: ['(a)\\1']\n" \
           "    action: {observe: {}}\n"
    with pytest.raises(RuleSetInvalid) as caught:
        load_rule_text(text, "filter_rules/rules/payments.yaml")
    assert str(caught.value) == (
        "filter_rules/rules/payments.yaml:5:17: rules[0].match.topics.regex[0]: "
        "invalid RE2 pattern '(a)\\1': invalid escape sequence: \\1"
    )


def test_duplicate_ids_across_files_name_both_locations() -> None:
    directory = FILES / "duplicate_ids"
    with pytest.raises(RuleSetInvalid) as caught:
        load_rule_dir(directory)
    (error,) = caught.value.errors
    assert error.file == str(directory / "b.yaml")
    assert (error.line, error.column, error.field_path) == (5, 5, "rules[1].id")
    assert error.message == (
        f"duplicate rule id 'same-id' (first defined at {directory / 'a.yaml'}:2:5)"
    )


def test_duplicate_ids_in_one_file() -> None:
    text = "- id: a\n  action: {observe: {}}\n- id: a\n  action: {deny: {}}\n"
    (error,) = text_errors(text)
    assert (error.line, error.field_path) == (3, "rules[1].id")
    assert "first defined at t.yaml:1:3" in error.message


def test_every_error_of_every_file_is_reported_in_file_order(tmp_path: Path) -> None:
    shutil.copy(FILES / "bad_regex.yaml", tmp_path / "a.yaml")
    shutil.copy(FILES / "bad_cidr.yaml", tmp_path / "b.yaml")
    (tmp_path / "c.yaml").write_text(
        "rules:\n  - id: x\n    mode: loud\n    order: high\n    action: {observe: {}}\n"
    )
    with pytest.raises(RuleSetInvalid) as caught:
        load_rule_dir(tmp_path)
    errors = caught.value.errors
    assert [Path(e.file).name for e in errors] == ["a.yaml", "b.yaml", "c.yaml", "c.yaml"]
    assert [e.field_path for e in errors[2:]] == ["rules[0].order", "rules[0].mode"]
    assert str(caught.value).count("\n") == 3


def test_missing_directory_and_a_file_given_as_directory(tmp_path: Path) -> None:
    with pytest.raises(RuleSetInvalid) as caught:
        load_rule_dir(tmp_path / "nowhere")
    assert str(caught.value) == f"{tmp_path / 'nowhere'}: rule directory does not exist"
    file = tmp_path / "rules.yaml"
    file.write_text("rules: []\n")
    with pytest.raises(RuleSetInvalid, match="not a directory"):
        load_rule_dir(file)
    with pytest.raises(RuleSetInvalid, match="cannot read"):
        load_rule_file(tmp_path / "absent.yaml")


def test_a_directory_named_like_a_rule_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "odd.yaml").mkdir()
    with pytest.raises(RuleSetInvalid, match=r"odd\.yaml: cannot read"):
        load_rule_dir(tmp_path)


def test_directory_reads_yaml_and_yml_in_name_order_and_skips_the_rest(tmp_path: Path) -> None:
    rule = "- id: {id}\n  action: {{observe: {{}}}}\n"
    (tmp_path / "b.yml").write_text(rule.format(id="from-b"))
    (tmp_path / "a.yaml").write_text(rule.format(id="from-a"))
    (tmp_path / ".hidden.yaml").write_text("not: [valid")
    (tmp_path / "notes.txt").write_text("not: [valid")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.yaml").write_text("not: [valid")
    ruleset = load_rule_dir(tmp_path)
    assert [r.id for r in ruleset.rules] == ["from-a", "from-b"]
    assert str(ruleset.sources["from-b"]) == f"{tmp_path / 'b.yml'}:1:3"


def test_empty_directory_and_empty_files_hold_no_rules(tmp_path: Path) -> None:
    assert load_rule_dir(tmp_path).rules == []
    for text in ["", "\n\n", "# only a comment\n", "---\n", "---\n...\n", "~\n"]:
        assert load_rule_text(text).rules == []
    assert load_rule_file(FILES / "empty.yaml").rules == []


def test_list_and_multi_document_files() -> None:
    assert [r.id for r in load_rule_file(FILES / "list_form.yaml").rules] == [
        "list-one", "list-two",
    ]
    ruleset = load_rule_file(FILES / "multi_document.yaml")
    assert [r.id for r in ruleset.rules] == ["doc-one", "doc-two"]
    assert ruleset.sources["doc-two"].line == 8


def test_errors_in_a_list_file_point_into_the_list() -> None:
    (error,) = text_errors("- id: ok\n  action: {observe: {}}\n- id: bad\n  action: {ban: {}}\n")
    assert (error.line, error.column, error.field_path) == (4, 3, "rules[1].action")


def test_non_utf8_bytes_are_located(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"rules:\n  - id: caf\xe9\n    action: {observe: {}}\n")
    (error,) = errors_of(path)
    assert (error.line, error.column) == (2, 12)
    assert error.message == "not valid UTF-8: byte 0xe9 at offset 18"


def test_byte_order_marks_are_honoured() -> None:
    text = "rules:\n  - id: bom\n    action: {observe: {}}\n"
    assert load_rule_text(b"\xef\xbb\xbf" + text.encode()).rules[0].id == "bom"
    assert load_rule_text(text.encode("utf-16")).rules[0].id == "bom"
    (error,) = text_errors(b"\xff\xfe\x00")
    assert "not valid UTF-16" in error.message


def test_control_characters_are_a_yaml_error() -> None:
    (error,) = text_errors("rules:\n  - id: a\x07b\n")
    assert error.message.startswith("invalid YAML")


def test_null_where_a_mapping_or_list_belongs() -> None:
    (error,) = text_errors("rules:\n  - id: x\n    action:\n      observe:\n")
    assert (error.line, error.field_path) == (4, "rules[0].action.observe")
    assert error.message == "expected a mapping, got null (write {} for an empty one)"
    (error,) = text_errors("apiVersion: keg/v1\nrules:\n")
    assert (error.line, error.message) == (2, "expected a list, got null (write [])")


def test_anchors_and_merge_keys_work() -> None:
    text = """
base: &base
  mode: dry-run
  action: {observe: {}}
"""
    # `base` is not a field of a rule file: the merge must be used inside rules.
    (error,) = text_errors(text)
    assert error.message == "unknown field 'base'"
    text = """
rules:
  - &first
    id: first
    mode: dry-run
    action: {observe: {}}
  - <<: *first
    id: second
"""
    ruleset = load_rule_text(text)
    assert [(r.id, r.mode) for r in ruleset.rules] == [("first", "dry-run"), ("second", "dry-run")]
    assert ruleset.sources["second"].line == 8  # the key written there, not the merged one
    (error,) = text_errors(text.replace("    id: second", "    id: second\n    id: third"))
    assert (error.line, error.message) == (9, "duplicate key 'id'")


def test_recursive_aliases_and_alias_bombs_are_refused() -> None:
    (error,) = text_errors("rules: &a\n  - *a\n")
    assert "alias refers to the node that contains it" in error.message
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n"
        for i in range(6)
    )
    (error,) = text_errors(bomb)
    assert "more than 200000 values through aliases (it writes 17;" in error.message
    (error,) = text_errors("rules: " + "[" * 200 + "]" * 200 + "\n")
    assert "nested" in error.message
    errors = text_errors("- &m {<<: *m}\n")  # merges nothing: a rule without fields
    assert [e.message for e in errors] == [
        "missing required field 'id'", "missing required field 'action'",
    ]


def test_a_file_too_big_to_read_says_so_without_blaming_aliases(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain rules in one file, more values than one document may hold (the bound is
    lowered here: 200,000 values are about 25,000 rules). The error used to ask
    "(aliases?)" of a file that has none."""
    from filter_rules import _yaml

    monkeypatch.setattr(_yaml, "MAX_NODES", 1000)
    text = "rules:\n" + "".join(
        f"  - id: r{i}\n    match: {{apis: [Produce], topics: {{prefix: [t{i}.]}}}}\n"
        "    action: {deny: {}}\n" for i in range(200))
    (error,) = text_errors(text)
    assert error.message == ("document holds more than 1000 values (mappings, lists and "
                             "scalars): split its rules into several files")
    assert "alias" not in error.message


def test_load_rule_data_validates_parsed_documents() -> None:
    ruleset = load_rule_data({"rules": [{"id": "api", "action": {"observe": {}}}]}, "api")
    assert ruleset.rules[0].id == "api"
    assert load_rule_data([{"id": "l", "action": {"deny": {}}}]).rules[0].id == "l"
    with pytest.raises(RuleSetInvalid) as caught:
        load_rule_data({"rules": [{"id": "x", "action": {"deny": {"error": "XYZZY"}}}]}, "POST")
    (error,) = caught.value.errors
    assert (error.file, error.line) == ("POST", None)
    assert error.field_path == "rules[0].action.deny.error"
    assert str(error) == "POST: rules[0].action.deny.error: unknown Kafka error 'XYZZY'"
    with pytest.raises(RuleSetInvalid):
        load_rule_data("text")


def test_the_default_directory_is_filter_rules_rules() -> None:
    assert Path(loader_module.__file__).parent / "rules" == DEFAULT_RULES_DIR
    ruleset = load_rule_dir()
    assert ruleset.rules, "the shipped default rules must load"
    assert isinstance(ruleset, RuleSet)


def test_oversized_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader_module, "MAX_FILE_BYTES", 10)
    (tmp_path / "big.yaml").write_text("rules: []\n# padding\n")
    with pytest.raises(RuleSetInvalid, match="larger than 10 bytes"):
        load_rule_dir(tmp_path)


# --- the loader never raises anything but RuleSetInvalid ---------------------------


def _load_or_invalid(data: str | bytes) -> None:
    try:
        result = load_rule_text(data, "fuzz.yaml")
    except RuleSetInvalid as exc:
        assert exc.errors
        for error in exc.errors:
            assert "internal error" not in error.message, error
            assert error.line is None or error.line >= 1
            assert "\n" not in error.field_path
    else:
        assert isinstance(result, RuleSet)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_never_crash_the_loader(data: bytes) -> None:
    _load_or_invalid(data)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_random_text_never_crashes_the_loader(text: str) -> None:
    _load_or_invalid(text)


YAML_ALPHABET = st.sampled_from([
    *"abc:-[]{},'\"&*!<>|#?%@` \n\t\\/.0123456789",
    "rules:", "- id: ", "action:", "observe: {}", "deny:", "match:", "apis: [", "topics:",
    "regex: [", "!!int ", "!!binary ", "!!timestamp ", "!!float ", "<<: *", "&a ", "*a",
    "---\n", "...\n", "  ", "not:", "~", "yes", "0x", "1e9", "2024-01-01",
])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(YAML_ALPHABET, max_size=60).map("".join))
def test_yaml_like_text_never_crashes_the_loader(text: str) -> None:
    _load_or_invalid(text)


_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True),
    st.text(max_size=12), st.sampled_from(["Produce", "Fetch", "deny", "observe", "(a)\\1",
                                           "10.0.0.0/8", "::1", "TOPIC_AUTHORIZATION_FAILED"]),
)
_KEYS = st.sampled_from([
    "id", "description", "order", "mode", "match", "action", "audit", "apis", "versions",
    "min", "max", "direction", "topics", "groups", "client_ids", "principals", "exact",
    "prefix", "regex", "client_addresses", "listeners", "brokers", "not", "observe", "deny",
    "safeguard", "allow_apis", "deny_apis", "rate", "error", "message", "per", "compression",
    "require", "forbid", "enabled", "include_payload", "rules", "apiVersion", "kind", "zzz",
])
_VALUES = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_KEYS, children, max_size=5),
    max_leaves=25,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.dictionaries(_KEYS, _VALUES, max_size=4),
    st.lists(st.dictionaries(_KEYS, _VALUES, max_size=6), max_size=3),
    st.fixed_dictionaries({"rules": st.lists(st.dictionaries(_KEYS, _VALUES, max_size=6),
                                             max_size=3)}),
))
def test_rule_shaped_documents_never_crash_the_loader(document: object) -> None:
    _load_or_invalid(yaml.safe_dump(document, allow_unicode=True))
    try:
        load_rule_data(document)
    except RuleSetInvalid as exc:
        assert all("internal error" not in e.message for e in exc.errors)


def test_a_duplicate_id_is_reported_beside_the_other_errors_of_its_file() -> None:
    """A file that did not validate kept its ids out of the duplicate check: the
    duplicate appeared only once the other error was fixed (regression)."""
    text = ("- id: a\n  match: {topics: {regex: ['(a)\\1']}}\n  action: {deny: {}}\n"
            "- id: a\n  action: {observe: {}}\n")
    errors = text_errors(text)
    assert [(e.line, e.field_path) for e in errors] == [
        (2, "rules[0].match.topics.regex[0]"), (4, "rules[1].id")]
    assert "duplicate rule id 'a'" in errors[1].message


@pytest.mark.parametrize("name", ["ANONYMOUS", "User:ANONYMOUS"])
def test_a_principal_matcher_naming_anonymous_is_refused(name: str) -> None:
    """It would match nothing: principal rules match authenticated clients only."""
    (error,) = text_errors(f"- id: a\n  match: {{principals: {{exact: ['{name}']}}}}\n"
                           "  action: {deny: {}}\n")
    assert "User:ANONYMOUS" in error.message and "not: {principals" in error.message


@pytest.mark.parametrize(("selector", "said"), [
    ("prefix: ['']", "matches every topic"), ("exact: ['']", "matches no topic"),
    ("exact: ['café']", "'café' is no Kafka topic name"),
    ("prefix: [' orders.']", "' orders.' is no Kafka topic name"),
    ("exact: ['a\\0b']", "is no Kafka topic name"), (f"exact: [{'t' * 250}]", "at most 249")])
def test_a_topic_name_kafka_cannot_have_is_refused_at_its_line(selector: str, said: str) -> None:
    """It would never match (a typo), or match every topic (an empty prefix): accepted
    before without a word."""
    (error,) = text_errors(f"- id: a\n  match: {{topics: {{{selector}}}}}\n"
                           "  action: {deny: {}}\n")
    assert said in error.message and error.line is not None, error
    load_rule_text("- id: a\n  match: {topics: {exact: [Orders_2024.v1-x], prefix: [a.]}}\n"
                   "  action: {deny: {}}\n", "ok.yaml")


def test_a_byte_rate_on_apis_without_produce_is_refused() -> None:
    """It counted nothing and never throttled a consumer (regression: silently)."""
    (error,) = text_errors("- id: a\n  match: {apis: [Fetch]}\n"
                           "  action: {rate: {bytes_per_second: 2000}}\n")
    assert "bytes_per_second counts the record bytes of Produce requests" in error.message
    load_rule_text("- id: a\n  match: {apis: [Fetch, Produce]}\n"
                   "  action: {rate: {bytes_per_second: 2000}}\n", "t.yaml")


def test_an_over_long_pattern_is_quoted_short_with_its_reason() -> None:
    """A 400,000-character pattern was quoted whole: one log line that long, a REST
    problem twice that, its reason at the very end."""
    pattern = "a|" * 200_000 + "a"
    text = ("rules:\n  - id: huge\n    match: {topics: {regex: ['" + pattern + "']}}\n"
            "    action: {deny: {}}\n")
    with pytest.raises(RuleSetInvalid) as caught:
        load_rule_text(text, "huge.yaml")
    message = str(caught.value)
    assert len(message) < 400, len(message)
    assert f"({len(pattern)} characters): pattern is longer than 4096 characters" in message
