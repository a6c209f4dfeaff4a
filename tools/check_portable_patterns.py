"""Cross-check the topic-pattern subset keg's native module is given (docs/native.md,
topic selectors): random RE2 patterns that `ext_proc.filters.portable_regex` lets
through must compile in the module (Rust's `regex`, ASCII mode) and select exactly the
names RE2 selects.

    python tools/check_portable_patterns.py [seed] [count]

Runs the crate's `probe_patterns` test (cargo) once on all patterns; prints what the
module refused and where the engines disagree (both must be 0).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from ext_proc.filters import portable_regex
from filter_rules.patterns import PatternError, compile_re2

CRATE = Path(__file__).resolve().parent.parent / "envoy" / "kafka_filter"
ATOMS = ["a", "b", "A", "1", ".", "-", "_", "*", "+", "?", "(", ")", "[", "]", "^", "$", "|",
         "{", "}", ",", "2", "\\d", "\\w", "\\D", "\\W", "\\.", "\\-", "(?:", "(?i)", "(?i:",
         "[^", "{2}", "{1,3}", "{0,}", "x", "z", "\\]"]
NAMES = ["", "a", "b", "A", "B", "ab", "aB", "a.b", "a-b", "a_b", "1", "12", "a1", "x", "z",
         "aa", "aaa", "ba", "-", "_", ".", "a.", "xz", "Ab1", "abab", "a1b2", "zz", "b-a",
         "a..b", "AAB"]


def patterns(rng: random.Random, count: int) -> list[str]:
    found: set[str] = set()
    while len(found) < count:
        pattern = "".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 8)))
        try:
            compile_re2(pattern)
        except PatternError:
            continue
        if portable_regex(pattern):
            found.add(pattern)
    return sorted(found)


def main() -> int:
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 6000
    chosen = patterns(random.Random(seed), count)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump([chosen, NAMES], fh)
    try:
        out = subprocess.run(
            ["cargo", "test", "--quiet", "--lib", "probe_patterns", "--", "--ignored",
             "--nocapture"], cwd=CRATE, env={**os.environ, "KEG_PATTERNS": fh.name},
            capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(fh.name)
    line = next(line for line in out.splitlines() if line.startswith("PROBE "))
    refused = differ = 0
    for pattern, selected in zip(chosen, json.loads(line.removeprefix("PROBE ")), strict=True):
        program = compile_re2(pattern)
        expected = sorted(n for n in NAMES if program.fullmatch(n) is not None)
        if selected is None:
            refused += 1
            print("refused by the module:", repr(pattern))
        elif sorted(selected) != expected:
            differ += 1
            print("selects differently:", repr(pattern), expected, selected)
    print(f"{len(chosen)} patterns: {refused} refused, {differ} selecting differently")
    return 1 if refused or differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
