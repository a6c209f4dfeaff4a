"""`keg validate`: exit 0 on the shipped rules, 1 with file:line errors otherwise."""

from __future__ import annotations

from pathlib import Path

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
