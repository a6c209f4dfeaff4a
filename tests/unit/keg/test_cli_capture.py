"""`keg capture` and `keg analyze` arguments, checked before they connect to anything."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from keg.cli import app


@pytest.mark.parametrize(("bounds", "message"), [
    (["--from-offset", "10", "--to-offset", "2"], "--to-offset 2 is not after --from-offset 10"),
    (["--from-offset", "5", "--to-offset", "5"], "--to-offset 5 is not after --from-offset 5"),
    (["--from-time", "2026-11-02T00:00:00Z", "--to-time", "2026-11-01T00:00:00Z"],
     "is before --from-time"),
])
def test_an_empty_range_is_refused_not_captured_as_nothing(bounds: list[str], message: str
                                                           ) -> None:
    """A range that holds no offset captured 0 records and exited 0 (regression)."""
    result = CliRunner().invoke(app, ["capture", "--topic", "t", "--bootstrap-servers",
                                      "127.0.0.1:1", *bounds])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_an_audit_topic_without_follow_is_named_not_mangled() -> None:
    """`keg analyze --audit kafka://host:port/topic` without --follow said "audit log
    kafka:/127.0.0.1:33000/_keg_audit does not exist" (read as a path)."""
    result = CliRunner().invoke(app, ["analyze", "--audit", "kafka://127.0.0.1:1/_keg_audit"])
    assert result.exit_code == 2, result.output
    output = " ".join(result.output.split())
    assert "kafka://127.0.0.1:1/_keg_audit: the audit topic is read with --follow" in output
