"""`keg validate`: exit 0 on the shipped rules, 1 with file:line errors otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from filter_rules import DEFAULT_RULES_DIR
from keg.cli import app

runner = CliRunner()


def test_shipped_rules_validate() -> None:
    result = runner.invoke(app, ["validate", str(DEFAULT_RULES_DIR)])
    assert result.exit_code == 0, result.output
    assert "rules valid" in result.output


def test_broken_rules_exit_1_with_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "ok.yaml").write_text("rules:\n  - id: fine\n    action: {observe: {}}\n")
    (tmp_path / "bad.yaml").write_text(
        "rules:\n  - id: broken\n    match: {topics: {regex: ['(a)\\1']}}\n"
        "    action: {deny: {}}\n")
    result = runner.invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 1
    assert f"{tmp_path / 'bad.yaml'}:3:" in result.output
    assert "invalid RE2 pattern" in result.output


def test_missing_directory_is_an_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(tmp_path / "nope")])
    assert result.exit_code == 1


def _with_keys(tmp_path: Path) -> Path:
    """Rules naming three secrets: two by environment variable, one by file."""
    (tmp_path / "pii.yaml").write_text(
        "rules:\n"
        "  - id: encrypt-card\n"
        "    match: {topics: {exact: [payments]}}\n"
        "    action:\n"
        "      encrypt:\n"
        "        fields: [$.card]\n"
        "        key: {id: k1, secret: {env: KEG_TEST_CARD_KEY}}\n"
        "  - id: hash-email\n"
        "    match: {topics: {exact: [users]}}\n"
        "    action:\n"
        "      mask:\n"
        "        fields: [$.email]\n"
        "        method: hash\n"
        "        hash_key: {env: KEG_TEST_HASH_KEY}\n"
        "  - id: decrypt-card\n"
        "    match: {topics: {exact: [payments]}, direction: response}\n"
        "    action:\n"
        "      decrypt:\n"
        "        fields: [$.card]\n"
        "        keys:\n"
        "          - {id: k0, secret: {file: keys/k0}}\n"
        "          - {id: k1, secret: {env: KEG_TEST_CARD_KEY}}\n")
    return tmp_path


def test_secrets_the_rules_name_must_exist(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    directory = _with_keys(tmp_path)
    for name in ("KEG_TEST_CARD_KEY", "KEG_TEST_HASH_KEY"):
        monkeypatch.delenv(name, raising=False)
    result = runner.invoke(app, ["validate", str(directory)])
    assert result.exit_code == 1, result.output
    pii = directory / "pii.yaml"
    lines = [line for line in result.output.splitlines() if line.startswith(str(pii))]
    assert lines == [
        f"{pii}:7:32: encrypt-card.action.encrypt.key.secret.env: key k1: environment "
        "variable KEG_TEST_CARD_KEY is not set",
        f"{pii}:14:20: hash-email.action.mask.hash_key.env: hash_key: environment variable "
        "KEG_TEST_HASH_KEY is not set",
        f"{pii}:21:31: decrypt-card.action.decrypt.keys[0].secret.file: key k0: cannot read "
        f"{directory / 'keys' / 'k0'}: No such file or directory",
        f"{pii}:22:31: decrypt-card.action.decrypt.keys[1].secret.env: key k1: environment "
        "variable KEG_TEST_CARD_KEY is not set",
    ], result.output
    assert "4 problem(s)" in result.output

    # Set, but not a key: reported as the ext_proc service would refuse it; no value shown.
    monkeypatch.setenv("KEG_TEST_CARD_KEY", "not-a-key-at-all")
    monkeypatch.setenv("KEG_TEST_HASH_KEY", "a-long-enough-hash-key-for-hmac")
    (directory / "keys").mkdir()
    (directory / "keys" / "k0").write_text("00" * 32)
    result = runner.invoke(app, ["validate", str(directory)])
    assert result.exit_code == 1
    assert "KEG_TEST_CARD_KEY does not hold a 32-byte AES-256 key" in result.output
    assert "not-a-key-at-all" not in result.output

    monkeypatch.setenv("KEG_TEST_CARD_KEY", "11" * 32)
    result = runner.invoke(app, ["validate", str(directory)])
    assert result.exit_code == 0, result.output
    assert "4 secret(s) found" in result.output


def test_no_secrets_validates_the_files_only(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KEG_TEST_CARD_KEY", raising=False)
    result = runner.invoke(app, ["validate", str(_with_keys(tmp_path)), "--no-secrets"])
    assert result.exit_code == 0, result.output
    assert "3 rules valid" in result.output and "secrets not checked" in result.output


def test_a_record_rule_the_service_could_not_build_is_invalid(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`keg validate` said "2 rules valid" of a validate rule whose JSON Schema file is
    not there, which the gateway then refuses (a new user's report); with a missing
    secret too, each problem is reported once, at its line."""
    (tmp_path / "r.yaml").write_text(
        "rules:\n"
        "  - id: enc\n"
        "    action:\n"
        "      encrypt:\n"
        "        key: {id: k, secret: {env: KEG_TEST_UNSET_KEY}}\n"
        "  - id: v\n"
        "    action: {validate: {json_schema_file: nope.json}}\n")
    monkeypatch.delenv("KEG_TEST_UNSET_KEY", raising=False)
    result = runner.invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 1, result.output
    rule_file = str(tmp_path / "r.yaml")
    lines = [line for line in result.output.splitlines() if line.startswith(rule_file)]
    assert len(lines) == 2, result.output
    assert ":5:" in lines[0] and "KEG_TEST_UNSET_KEY is not set" in lines[0]
    assert ":6:" in lines[1] and "cannot read JSON Schema" in lines[1]

    monkeypatch.setenv("KEG_TEST_UNSET_KEY", "11" * 32)
    result = runner.invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "cannot read JSON Schema" in result.output and "1 problem(s)" in result.output


def test_a_directory_without_rules_names_the_files_it_does_not_read(tmp_path: Path) -> None:
    """`keg validate` of the wrong path (rules in subdirectories, or written as JSON)
    said "0 rules valid" and nothing else."""
    (tmp_path / "team-a").mkdir()
    (tmp_path / "team-a" / "deny.yaml").write_text("rules: []\n")
    (tmp_path / "rules.json").write_text("{}\n")
    result = runner.invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "0 rules valid" in result.output
    assert "has no rules; not read as rule files" in result.output
    assert "rules.json" in result.output and "team-a/deny.yaml" in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "warning" not in runner.invoke(app, ["validate", str(empty)]).output
