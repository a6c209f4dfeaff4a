"""RE2 regular expressions: linear time, no backreferences, no lookaround.

Rule files come from many hands and are matched against every frame, so a pattern
must never be able to take exponential time: keg compiles them with RE2 only.
"""

from __future__ import annotations

from typing import Any, Final

import re2

#: Longest pattern a rule may hold; RE2 also refuses programs over its memory budget.
MAX_PATTERN_LENGTH: Final = 4096


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 would print every rejected pattern to stderr
    return options


_OPTIONS: Final = _options()


class PatternError(ValueError):
    """RE2 refused the pattern."""


def compile_re2(pattern: str) -> Any:
    """The compiled RE2 program of `pattern`; PatternError with RE2's reason if refused."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise PatternError(f"pattern is longer than {MAX_PATTERN_LENGTH} characters")
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "refused"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        if "repetition size" in reason:  # RE2 multiplies nested counts: {100}{100} is 10,000
            reason += " (RE2 allows at most 1,000 repetitions, nested counts multiplied)"
        raise PatternError(str(reason)) from None
    except (TypeError, ValueError, UnicodeError) as exc:  # e.g. lone surrogates
        raise PatternError(str(exc)) from None


def compile_alternatives(patterns: list[str] | tuple[str, ...]) -> Any:
    """One RE2 program matching what any of `patterns` matches (each already valid).

    Returns None when they cannot be joined safely (a `\\Q...` literal would swallow
    the `)|(?:` joining it to the next pattern) or RE2 cannot join them (over its
    memory budget); callers then try the patterns one by one.
    """
    if len(patterns) == 1:
        return compile_re2(patterns[0])
    if any("\\Q" in p for p in patterns):
        return None
    try:
        return re2.compile("|".join(f"(?:{p})" for p in patterns), _OPTIONS)
    except (re2.error, TypeError, ValueError):
        return None
