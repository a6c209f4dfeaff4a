"""`keg capture`'s range, checked before it connects to anything."""

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
