"""Compiling a large rule set and looking up a frame's candidate rules.

    python -m benchmarks.rule_lookup [--rules 1000] [--lookups 40000]

Prints the compile time and the mean time of one `candidates()` lookup for the
generated rule set `thousand_rules` (also what tests/unit/filter_rules/test_rules_compiled.py checks
for behaviour: lookups are precomputed, identical tuples). Numbers depend on the
machine; nothing is asserted here.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from filter_rules import CompiledRuleSet, load_rule_data
from kafka_wire import ApiKey

APIS = ("Produce", "Fetch", "Metadata", "CreateTopics")


def thousand_rules(count: int = 1000) -> list[dict[str, Any]]:
    """`count` observe rules: topic prefixes and regexes, one in five for every API,
    every tenth with a version floor, every third for one principal."""
    rules = []
    for n in range(count):
        match: dict[str, Any] = {"topics": {"prefix": [f"tenant-{n}."], "regex": [f"t{n}-.*"]}}
        if n % 5:  # one in five rules applies to every API
            match["apis"] = [APIS[n % 4]]
        if n % 10 == 0:
            match["versions"] = {"min": n % 11}
        if n % 3 == 0:
            match["principals"] = {"exact": [f"user-{n}"]}
        rules.append({"id": f"r{n:04d}", "match": match, "action": {"observe": {}},
                      "order": n % 13})
    return rules


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", type=int, default=1000)
    parser.add_argument("--lookups", type=int, default=40_000)
    args = parser.parse_args(argv)
    data = {"rules": thousand_rules(args.rules)}
    started = time.perf_counter()
    compiled = CompiledRuleSet(load_rule_data(data))
    compile_s = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(args.lookups // 2):
        compiled.candidates(ApiKey.PRODUCE, 9, "request")
        compiled.candidates(ApiKey.FETCH, 12, "request")
    per_lookup = (time.perf_counter() - started) / args.lookups
    print(f"{args.rules} rules: compiled in {compile_s:.2f} s; "
          f"candidates() {per_lookup * 1e9:.0f} ns per lookup ({args.lookups} lookups)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
