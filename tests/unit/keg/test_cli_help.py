"""`--help` of every command, as a pipe or a CI log reads it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

COMMANDS = ["up", "ext-proc", "control-plane", "apply", "diff", "versions", "rollback",
            "validate", "backtest", "analyze", "capture"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_off_a_terminal_cuts_no_option_name(command: str) -> None:
    """Off a terminal rich drew help 80 columns wide and cut long option names
    (`--failure-mode-all…`, `--sasl-password-fi…`): they could not be read without
    COLUMNS=200 (regression)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    result = subprocess.run([sys.executable, "-m", "keg", command, "--help"], env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    cut = [line for line in result.stdout.splitlines() if "…" in line]
    assert cut == [], cut
    assert "Usage: keg" in result.stdout


@pytest.mark.parametrize("command", ["up", "control-plane"])
@pytest.mark.parametrize("interval", ["0", "-1", "0.5"])
def test_a_refresh_interval_below_a_second_is_refused(command: str, interval: str) -> None:
    """--refresh-interval 0 or -1 was taken: keg then asked the brokers for their
    topology without pause (1,000 connections a second to one broker, 57% of a core)."""
    result = subprocess.run([sys.executable, "-m", "keg", command, "--refresh-interval",
                             interval], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--refresh-interval" in result.stderr
