"""Per-frame rule lookup that does not scan: index rules by the names they require.

Most rules of a large set name the topics (or principals) they are about. A rule
whose top-level match requires a topic can only trigger for a frame carrying one of
its exact topics or a topic starting with one of its prefixes, so those rules are
found by dict lookups on the frame's topic (exact, and each distinct prefix length)
and one pass of an RE2 set over all the rules' regexes; likewise for principals.
Rules with neither are always candidates.
`RuleIndex.relevant` returns the candidates in evaluation order; each still runs its
full `matches`, so the index only ever narrows, never decides.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import re2

from filter_rules._base import StringMatch
from filter_rules.context import normalize_principal
from filter_rules.model import Rule


class IndexedRule(Protocol):
    """What the index needs of a rule (`filter_rules.compiled.CompiledRule`): its model,
    for the names its match requires, and its place in evaluation order."""

    @property
    def rule(self) -> Rule: ...

    @property
    def position(self) -> int: ...


RuleT = TypeVar("RuleT", bound=IndexedRule)


class _NameIndex(Generic[RuleT]):
    """exact names, prefixes and regexes -> rules. `hits(name)` costs a dict lookup per
    distinct prefix length and one pass of an RE2 set over all the regexes."""

    def __init__(self) -> None:
        self.exact: dict[str, list[RuleT]] = defaultdict(list)
        self.prefix: dict[str, list[RuleT]] = defaultdict(list)
        self.lengths: list[int] = []
        self._patterns: list[tuple[str, RuleT]] = []
        self._set: Any = None
        self._set_rules: list[RuleT] = []

    def add(self, spec: StringMatch, rule: RuleT, normalize: bool) -> None:
        fix = normalize_principal if normalize else (lambda v: v)
        for value in spec.exact:
            self.exact[fix(value)].append(rule)
        for value in spec.prefix:
            self.prefix[fix(value) if ":" not in value and normalize else value].append(rule)
        self._patterns += [(pattern, rule) for pattern in spec.regex]

    def freeze(self) -> list[RuleT]:
        """Build the lookup structures; return the rules whose regexes RE2 could not
        take into one set (the caller checks those on every frame)."""
        self.lengths = sorted({len(p) for p in self.prefix})
        if not self._patterns:
            return []
        regex_set = re2.Set.FullMatchSet()
        try:
            for pattern, rule in self._patterns:
                regex_set.Add(pattern)
                self._set_rules.append(rule)
            regex_set.Compile()
        except (re2.error, TypeError, ValueError):
            self._set_rules = []
            return list(dict.fromkeys(rule for _, rule in self._patterns))
        self._set = regex_set
        return []

    def hits(self, name: str, out: set[RuleT]) -> None:
        out.update(self.exact.get(name, ()))
        for length in self.lengths:
            if length > len(name):
                break
            found = self.prefix.get(name[:length])
            if found:
                out.update(found)
        if self._set is not None:
            for i in self._set.Match(name) or ():
                out.add(self._set_rules[i])


class RuleIndex(Generic[RuleT]):
    def __init__(self, rules: Sequence[RuleT]) -> None:
        self._rules = tuple(rules)
        self._always: list[RuleT] = []
        self._topics: _NameIndex[RuleT] = _NameIndex()
        self._principals: _NameIndex[RuleT] = _NameIndex()
        for rule in rules:
            match = rule.rule.match
            if match.topics is not None:
                self._topics.add(match.topics, rule, normalize=False)
            elif match.principals is not None:
                self._principals.add(match.principals, rule, normalize=True)
            else:
                self._always.append(rule)
        self._always += self._topics.freeze() + self._principals.freeze()
        self.scans_everything = len(self._always) == len(self._rules)

    def relevant(self, topics: Iterable[str], principal: str | None) -> tuple[RuleT, ...]:
        """The rules that may trigger for a frame with these topics and principal."""
        if self.scans_everything:
            return self._rules
        found: set[RuleT] = set(self._always)
        for topic in topics:
            self._topics.hits(topic, found)
        if principal is not None:
            self._principals.hits(normalize_principal(principal), found)
        if len(found) == len(self._rules):
            return self._rules
        return tuple(sorted(found, key=lambda r: r.position))
