"""What the store holds, as plain immutable values, and the pure functions over them.

A version is the whole rule set at one moment: an ordered tuple of `StoredRule`
(the rule as JSON, where it was written, who owns it, its ETag) plus who made the
change, when and why. Nothing here does I/O: the planner and the diff are shared by
the store, the REST API and `keg diff`.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

import yaml

from filter_rules import Rule, RuleSet, RuleSource

# What the store package exports of these (the rest serves the store itself).
__all__ = [
    "EVERY_OWNER",
    "REST_OWNED",
    "Change",
    "Operation",
    "OwnerScope",
    "RuleDiff",
    "StoredRule",
    "Verdict",
    "Version",
    "VersionInfo",
    "VersionStatus",
    "diff_rules",
    "etag_of",
    "plan_apply",
    "rules_yaml",
    "to_ruleset",
]

Operation = Literal["create", "update", "delete", "apply", "rollback"]


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def etag_of(body: dict[str, Any]) -> str:
    """A rule's ETag: a hash of its JSON (defaults filled in), so equal rules share it."""
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class StoredRule:
    id: str
    body: dict[str, Any]  # Rule.model_dump(mode="json", by_alias=True)
    owner: str | None = None  # "dir:<name>" for rules a rule directory owns
    source: dict[str, Any] | None = None  # RuleSource as JSON: file, line, column
    etag: str = ""

    @classmethod
    def of(cls, rule: Rule, owner: str | None = None,
           source: RuleSource | None = None) -> StoredRule:
        body = rule.model_dump(mode="json", by_alias=True)
        src = source.model_dump(mode="json") if source is not None else None
        return cls(rule.id, body, owner, src, etag_of(body))

    def rule(self) -> Rule:
        return Rule.model_validate(self.body)

    def manifest(self) -> dict[str, Any]:
        """The row a version keeps for this rule (its body is stored once, by ETag)."""
        return {"id": self.id, "etag": self.etag, "owner": self.owner, "source": self.source}


@dataclass(frozen=True, slots=True)
class Change:
    """Who makes a change and why (when is the store's clock)."""

    author: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class VersionInfo:
    number: int
    created_at: datetime
    author: str
    reason: str
    operation: Operation
    ruleset_hash: str  # RuleSet.version of the rules: what ext_proc instances report
    rule_count: int
    parent: int | None = None  # for a rollback: the version it restores


VersionStatus = Literal["pending", "applied", "rejected"]
PENDING: VersionStatus = "pending"
APPLIED: VersionStatus = "applied"
REJECTED: VersionStatus = "rejected"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the fleet answered to a version: `applied` (an ext_proc instance ACKed it)
    or `rejected` (an instance NACKed it: `node` said `detail`). Rejected is final, and
    wins over applied: a rejected version is never served again. A version without a
    verdict is pending."""

    number: int
    status: VersionStatus
    node: str
    detail: str
    at: datetime

    def describe(self) -> str:
        return f"{self.node}: {self.detail}" if self.detail else self.node


@dataclass(frozen=True, slots=True)
class Version:
    info: VersionInfo
    rules: tuple[StoredRule, ...]
    # The rules as models, built once: 100,000 rules take seconds to validate, and the
    # store, the control plane and dry runs all ask for the same version.
    _ruleset: list[RuleSet] = field(default_factory=list, compare=False, repr=False)

    @property
    def number(self) -> int:
        return self.info.number

    def get(self, rule_id: str) -> StoredRule | None:
        return next((r for r in self.rules if r.id == rule_id), None)

    def ruleset(self) -> RuleSet:
        """The rule set (the same object every call: do not change it)."""
        if not self._ruleset:
            self._ruleset.append(to_ruleset(self.rules))
        return self._ruleset[0]


def to_ruleset(rules: Iterable[StoredRule]) -> RuleSet:
    entries = list(rules)
    return RuleSet(
        rules=[entry.rule() for entry in entries],
        sources={e.id: RuleSource.model_validate(e.source) for e in entries if e.source},
    )


def ruleset_hash(rules: Sequence[StoredRule]) -> str:
    """RuleSet.version without building the models (same JSON, same hash), fed a rule
    at a time as RuleSet.version is."""
    digest = hashlib.sha256(b"[")
    for position, rule in enumerate(rules):
        if position:
            digest.update(b",")
        digest.update(json.dumps(rule.body, sort_keys=True, separators=(",", ":")).encode())
    digest.update(b"]")
    return digest.hexdigest()[:16]


def manifest_json(rules: Sequence[StoredRule]) -> str:
    """canonical_json of the rules' manifests, a rule at a time (one call over 100,000
    rules would hold the GIL for a second: the event loop would wait as long)."""
    return "[" + ",".join(canonical_json(rule.manifest()) for rule in rules) + "]"


# --- comparing rule lists ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RuleDiff:
    """What turns `before` into `after`: rule ids added, removed, changed; a YAML diff
    (`unified`, written when first asked for: for 100,000 rules it takes a minute, and
    a rule directory applied at each change never asks)."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    unchanged: int = 0
    reordered: bool = False
    owners_changed: tuple[str, ...] = field(default=())
    # (before, after, from_name, to_name): what `unified` is written from.
    compared: tuple[Sequence[StoredRule], Sequence[StoredRule], str, str] = field(
        default=((), (), "before", "after"), repr=False, compare=False)
    _unified: list[str] = field(default_factory=list, repr=False, compare=False)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed or self.reordered
                    or self.owners_changed)

    @property
    def unified(self) -> str:
        """The unified diff of the two rule lists as YAML."""
        if not self._unified:
            self._unified.append(unified_yaml_diff(*self.compared))
        return self._unified[0]


def diff_rules(before: Sequence[StoredRule], after: Sequence[StoredRule],
               from_name: str = "before", to_name: str = "after") -> RuleDiff:
    old = {r.id: r for r in before}
    new = {r.id: r for r in after}
    common = [rule_id for rule_id in new if rule_id in old]
    changed = tuple(i for i in common if old[i].etag != new[i].etag)
    kept_order = [i for i in old if i in new]
    return RuleDiff(
        added=tuple(i for i in new if i not in old),
        removed=tuple(i for i in old if i not in new),
        changed=changed,
        unchanged=len(common) - len(changed),
        reordered=kept_order != common,
        owners_changed=tuple(i for i in common if old[i].owner != new[i].owner),
        compared=(tuple(before), tuple(after), from_name, to_name),
    )


def rules_yaml(rules: Sequence[StoredRule]) -> str:
    """The rules as one rule file would hold them, defaults left out: the form a
    person wrote, so diffs show what they changed."""
    document = {"apiVersion": "keg/v1", "kind": "RuleSet",
                "rules": [_as_written(r.body) for r in rules]}
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)


def _as_written(body: dict[str, Any]) -> dict[str, Any]:
    try:
        return Rule.model_validate(body).model_dump(mode="json", by_alias=True,
                                                    exclude_defaults=True)
    except ValueError:  # a body this version of the model no longer reads: show it all
        return body


def unified_yaml_diff(before: Sequence[StoredRule], after: Sequence[StoredRule],
                      from_name: str, to_name: str) -> str:
    lines = difflib.unified_diff(
        rules_yaml(before).splitlines(keepends=True),
        rules_yaml(after).splitlines(keepends=True),
        fromfile=from_name, tofile=to_name,
    )
    return "".join(lines)


# --- who may change which rules ------------------------------------------------------------

#: In an OwnerScope, the rules written through REST (they have no owner). No owner can
#: be named so: owners start with a letter or digit.
REST_OWNED: Final = "@rest"


@dataclass(frozen=True, slots=True)
class OwnerScope:
    """Whose rules a writer (an API token) may change: every owner's (`patterns` None),
    or those of the owners matching one of `patterns` (names, or globs such as
    `dir:team-*`; `REST_OWNED` for the rules written through REST)."""

    patterns: tuple[str, ...] | None = None

    def allows(self, owner: str | None) -> bool:
        if self.patterns is None:
            return True
        name = REST_OWNED if owner is None else owner
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.patterns)

    def describe(self) -> str:
        return "every owner" if self.patterns is None else ", ".join(self.patterns)


EVERY_OWNER: Final = OwnerScope()


def owners_touched(before: Sequence[StoredRule], after: Sequence[StoredRule]) -> set[str | None]:
    """The owners (None: REST-written) of every rule that `after` adds, removes or
    changes (content or owner) relative to `before`, on either side."""
    old = {r.id: r for r in before}
    new = {r.id: r for r in after}
    touched: set[str | None] = set()
    for rule_id in old.keys() | new.keys():
        was, now = old.get(rule_id), new.get(rule_id)
        if was is not None and now is not None and (was.etag, was.owner) == (now.etag, now.owner):
            continue
        touched.update(r.owner for r in (was, now) if r is not None)
    return touched


# --- GitOps: a directory's rules replacing the ones it owns -------------------------------


def plan_apply(current: Sequence[StoredRule], owner: str,
               incoming: Sequence[StoredRule]) -> tuple[StoredRule, ...]:
    """The rule list after a directory (`owner`) applies `incoming`.

    Rules of other owners keep their place; the directory's rules, in its order,
    take the place of the first rule it owned before (or go to the end), so file
    order -- which breaks ties of `order` -- is the directory's own.
    """
    owned = [r for r in incoming if r.owner == owner]
    assert len(owned) == len(incoming), "incoming rules must carry the owner"
    ids = {r.id for r in incoming}
    result: list[StoredRule] = []
    inserted = False
    for rule in current:
        if rule.owner == owner or rule.id in ids:
            if not inserted:
                result.extend(incoming)
                inserted = True
            continue
        result.append(rule)
    if not inserted:
        result.extend(incoming)
    return tuple(result)
