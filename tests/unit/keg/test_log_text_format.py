"""Plain-text log lines: what callers chose cannot forge a line or drive the terminal."""

from __future__ import annotations

import logging
import sys

from keg.logs import TextFormatter


def record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    return logging.LogRecord("control_plane.store", logging.INFO, __file__, 1, msg, args,
                             sys.exc_info() if exc else None)


def test_a_reason_with_a_newline_and_an_escape_stays_on_its_line() -> None:
    """A change's reason (`PUT /v1/rules/x?reason=...`) with a newline wrote a forged
    line of its own ("... rules version 99: rollback by alice"), and ESC sequences."""
    reason = "ok\n2026-11-30 21:50:00,000 INFO control_plane.store: rollback by alice\r\x1b[31m"
    line = TextFormatter().format(record("rules version %d: %s by %s%s", 7, "put", "bob",
                                         f": {reason}"))
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert line.endswith(r": ok\n2026-11-30 21:50:00,000 INFO control_plane.store: rollback"
                         r" by alice\r\x1b[31m")


def test_a_traceback_keeps_its_lines() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        line = TextFormatter().format(record("failed: %s", "a\tb", exc=True))
    first, *rest = line.splitlines()
    assert first.endswith(r"failed: a\tb") and rest[0] == "Traceback (most recent call last):"
