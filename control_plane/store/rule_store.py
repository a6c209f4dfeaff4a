"""The rule store: every change a new immutable version of the whole rule set.

Writes go through one backend transaction that reads the current version, checks
the caller's preconditions against it (ETags, ownership), validates the resulting
rule set and appends it; so two writers -- threads or control-plane instances on
one PostgreSQL -- can never both win a race on the same rule.

Which version is which (docs/control-plane-api.md, "Versions and the fleet"):
- the latest version (`head()`, `rules()`): the newest one written; writes build on it;
- the served version (`current()`): the newest one no ext_proc instance rejected; the
  control plane distributes it, so a rejected version never reaches the fleet again and
  the fleet goes on with the last good one;
- the live version (`live()`): the newest one the fleet applied (ACKed) and nobody
  rejected. A new version is pending until the fleet answers (`record_verdict`).

Subscribers hear whenever the served version changes -- a new version, or a rejection
that takes the fleet back to an older one: `subscribe(cb)` with `cb(number, ruleset)`,
called on the writer's thread after the commit (hand work over to your own loop from
there). Another instance's writes and verdicts are picked up by `poll()`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from control_plane.store import errors
from control_plane.store.entries import (
    APPLIED,
    EVERY_OWNER,
    REJECTED,
    Change,
    Operation,
    OwnerScope,
    RuleDiff,
    StoredRule,
    Verdict,
    Version,
    VersionInfo,
    diff_rules,
    owners_touched,
    plan_apply,
    to_ruleset,
)
from control_plane.store.sql import Backend, Pending
from ext_proc.heap import building
from filter_rules import Rule, RuleSet, RuleSource

log = logging.getLogger(__name__)

Subscriber = Callable[[int, RuleSet], None]
# Raises filter_rules.RuleSetInvalid for a rule set the data path could not run.
Validator = Callable[[RuleSet], None]
ANY = "*"


@dataclass(frozen=True, slots=True)
class RuleWrite:
    rule: StoredRule
    version: VersionInfo | None  # None: the rule was already so, no new version
    created: bool


@dataclass(frozen=True, slots=True)
class ApplyResult:
    owner: str
    diff: RuleDiff
    version: VersionInfo | None  # the new version; None when nothing changed or dry run
    current: int  # the version live after the call


class RuleStore:
    def __init__(self, backend: Backend, validator: Validator | None = None) -> None:
        self._backend = backend
        self._validator = validator
        self._subscribers: list[Subscriber] = []
        self._publish_lock = threading.RLock()
        self._published = 0

    # --- reads ----------------------------------------------------------------------

    def head(self) -> Version | None:
        return self._backend.head()

    def current(self) -> tuple[int, RuleSet]:
        """The served version -- the newest one no ext_proc instance rejected -- and its
        rule set; (0, empty) when there is none."""
        number = self._backend.served_number()
        version = self._backend.version(number) if number else None
        return (0, RuleSet()) if version is None else (number, version.ruleset())

    def live(self) -> VersionInfo | None:
        """The newest version the fleet applied and nobody rejected; None before any."""
        number = self._backend.live_number()
        version = self._backend.version(number) if number else None
        return None if version is None else version.info

    def verdict(self, number: int) -> Verdict | None:
        """The fleet's answer to a version; None: pending."""
        return self._backend.verdicts([number]).get(number)

    def verdicts(self, numbers: Sequence[int]) -> dict[int, Verdict]:
        return self._backend.verdicts(numbers)

    def rules(self) -> tuple[int, tuple[StoredRule, ...]]:
        """The latest version's number and rules (what writes build on)."""
        head = self._backend.head()
        return (0, ()) if head is None else (head.number, head.rules)

    def rule(self, rule_id: str) -> StoredRule:
        head = self._backend.head()
        found = head.get(rule_id) if head is not None else None
        if found is None:
            raise errors.RuleNotFound(rule_id)
        return found

    def versions(self, limit: int = 50, before: int | None = None) -> list[VersionInfo]:
        return self._backend.versions(limit, before)

    def version(self, number: int) -> Version:
        found = self._backend.version(number) if number > 0 else None
        if found is None:
            raise errors.VersionNotFound(number)
        return found

    def diff(self, from_number: int, to_number: int) -> RuleDiff:
        """What changed from one version to another; version 0 is the empty rule set."""
        before = self.version(from_number).rules if from_number else ()
        after = self.version(to_number).rules if to_number else ()
        return diff_rules(before, after, f"version {from_number}", f"version {to_number}")

    # --- writes ---------------------------------------------------------------------

    def put_rule(self, rule: Rule, change: Change, *, if_match: Collection[str] | None = None,
                 if_none_match: bool = False, source: RuleSource | None = None,
                 scope: OwnerScope = EVERY_OWNER) -> RuleWrite:
        """Create or replace one rule (REST). Replacing needs its current ETag; the
        writer's `scope` must cover rules written through REST."""
        entry = StoredRule.of(rule, owner=None, source=source)
        outcome: list[RuleWrite] = []

        def build(head: Version | None) -> Pending | None:
            _check_scope(scope, {None})
            rules = head.rules if head else ()
            existing = next((r for r in rules if r.id == rule.id), None)
            if existing is not None and existing.owner:
                raise errors.RuleOwned({rule.id: existing.owner}, writer=None)
            _check_preconditions(existing, rule.id, if_match, if_none_match, creating=True)
            if existing is not None and existing.etag == entry.etag:
                outcome.append(RuleWrite(existing, None, created=False))
                return None
            if existing is None:
                new_rules = (*rules, entry)
            else:
                new_rules = tuple(entry if r.id == rule.id else r for r in rules)
            outcome.append(RuleWrite(entry, None, created=existing is None))
            return self._pending(new_rules, change, "create" if existing is None else "update")

        version = self._commit(build)
        result = outcome[-1]  # what the build that was committed found
        return RuleWrite(result.rule, version.info if version else None, result.created)

    def delete_rule(self, rule_id: str, change: Change, *,
                    if_match: Collection[str] | None = None,
                    scope: OwnerScope = EVERY_OWNER) -> VersionInfo:
        def build(head: Version | None) -> Pending:
            _check_scope(scope, {None})
            rules = head.rules if head else ()
            existing = next((r for r in rules if r.id == rule_id), None)
            if existing is None:
                raise errors.RuleNotFound(rule_id)
            if existing.owner:
                raise errors.RuleOwned({rule_id: existing.owner}, writer=None)
            _check_preconditions(existing, rule_id, if_match, False, creating=False)
            return self._pending(tuple(r for r in rules if r.id != rule_id), change, "delete")

        version = self._commit(build)
        assert version is not None
        return version.info

    def apply(self, owner: str, ruleset: RuleSet, change: Change, *, adopt: bool = False,
              dry_run: bool = False, retry_rejected: bool = False,
              scope: OwnerScope = EVERY_OWNER) -> ApplyResult:
        """Make the rules `owner` (a rule directory) owns exactly `ruleset` (GitOps).

        Rules another directory owns are refused; rules nobody owns (written through
        REST) are refused unless `adopt`. Rules the directory no longer has are
        removed. One new version, or none when nothing changes -- unless the latest
        version was rejected and `retry_rejected`: then the same rules become a new
        version, served again (what changed may be the instances' environment).
        The writer's `scope` must cover `owner` (and, to adopt, REST-written rules);
        a dry run changes nothing and needs no scope.
        """
        if not owner.strip():
            raise errors.InvalidChange("an owner is required (e.g. 'dir:rules')", "owner")
        incoming = tuple(
            StoredRule.of(rule, owner=owner, source=ruleset.sources.get(rule.id))
            for rule in ruleset.rules
        )
        outcome: list[ApplyResult] = []

        def build(head: Version | None) -> Pending | None:
            if not dry_run:
                _check_scope(scope, {owner})
            rules = head.rules if head else ()
            current = {r.id: r.owner for r in rules}
            foreign = {i: o for i, o in errors.owners_of([r.id for r in incoming], current).items()
                       if o != owner}
            if foreign:
                raise errors.RuleOwned(foreign, writer=owner)
            unowned = [r.id for r in incoming if r.id in current and current[r.id] is None]
            if unowned and not adopt:
                raise errors.RuleOwned(dict.fromkeys(unowned, errors.NOBODY), writer=owner)
            if unowned and not dry_run:
                _check_scope(scope, {None})  # adopting changes REST-written rules
            new_rules = plan_apply(rules, owner, incoming)
            number = head.number if head else 0
            diff = diff_rules(rules, new_rules, f"version {number}", owner)
            outcome.append(ApplyResult(owner, diff, None, number))
            if dry_run:
                self._validate(new_rules)
                return None
            if new_rules == rules and not (retry_rejected and head is not None
                                           and self._rejected(head.number)):
                return None
            return self._pending(new_rules, change, "apply")

        version = self._commit(build)
        result = outcome[-1]
        if version is None:
            return result
        return ApplyResult(owner, result.diff, version.info, version.number)

    def rollback(self, number: int, change: Change, *,
                 scope: OwnerScope = EVERY_OWNER, keep: str | None = None) -> VersionInfo:
        """A new version whose rules (owners and sources too) are those of `number`,
        but for the rules owner `keep` has now (a rule directory's: the directory, not
        the history, says what they are), which it keeps as they are. The writer's
        `scope` must cover the owners of every rule that changes. A rule of `number`
        whose id the kept rules have now (a rule written through REST, or another
        directory's, since moved into that directory) is the kept one's: two rules of
        one id would be no rule set."""
        target = self.version(number)

        def build(head: Version | None) -> Pending:
            rules = target.rules
            if keep is not None:
                # `number`'s order, the kept rules in the places `number` had kept ids
                # (in their owner's order, which its next apply would restore), the rest
                # of them after: rules of one `order` run in list order, so putting them
                # all last changed which rule won (a rollback that did not give back the
                # version's behaviour).
                kept = [r for r in (head.rules if head else ()) if r.owner == keep]
                kept_ids = {r.id for r in kept}
                queue = iter(kept)
                placed = [next(queue) if r.id in kept_ids else r for r in rules
                          if r.id in kept_ids or r.owner != keep]
                rules = (*placed, *queue)
            _check_scope(scope, owners_touched(head.rules if head else (), rules))
            return self._pending(rules, change, "rollback", parent=number)

        version = self._commit(build)
        assert version is not None
        return version.info

    # --- the fleet's answers -----------------------------------------------------------

    def record_verdict(self, number: int, node: str, error: str | None = None) -> bool:
        """An ext_proc instance (`node`) applied version `number` (`error` None) or
        refused it. The first answer stands: a refusal of a version no instance applied
        yet marks it rejected for good and, when it was the served version, makes
        subscribers hear the one served now; a refusal of a version an instance applied
        is that instance's trouble (logged; the fleet view shows its NACK), and the
        version stays served. Returns whether it changed what is known."""
        status = APPLIED if error is None else REJECTED
        verdict = Verdict(number, status, node, error or "", datetime.now(UTC))
        if number <= 0:
            return False
        if not self._backend.record_verdict(verdict):
            known = self.verdict(number) if status == REJECTED else None
            if known is not None and known.status == APPLIED:
                log.error("%s cannot apply rules version %d, which %s applied: %s; the "
                          "version stays served (what changed on that instance: a key, a "
                          "file, its limits?)", node, number, known.node, error)
            return False
        if status == REJECTED:
            log.error("rules version %d rejected by %s: %s; it will not be served again",
                      number, node, error)
            self.poll()
        return True

    # --- publication ----------------------------------------------------------------

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call `callback(number, ruleset)` whenever the served version changes; returns
        unsubscribe."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    def poll(self) -> bool:
        """Publish the served version if it is not the last one published (another
        control-plane instance wrote a version, or the fleet rejected one). Returns
        whether it published."""
        # Read under the lock: two writers publishing at once cannot publish the older
        # version last.
        with self._publish_lock:
            number = self._backend.served_number()
            version = self._backend.version(number) if number else None
            return version is not None and self._publish(version)

    def close(self) -> None:
        self._backend.close()

    # --- helpers --------------------------------------------------------------------

    def _rejected(self, number: int) -> bool:
        verdict = self.verdict(number)
        return verdict is not None and verdict.status == REJECTED

    def _pending(self, rules: tuple[StoredRule, ...], change: Change, operation: Operation,
                 parent: int | None = None) -> Pending:
        return Pending(rules, change, operation, parent, ruleset=self._validate(rules))

    def check(self, ruleset: RuleSet) -> None:
        """Raises RuleSetInvalid where writing `ruleset` would (the store's validator:
        what this gateway's data path could not build); nothing is written."""
        if self._validator is not None:
            self._validator(ruleset)

    def _validate(self, rules: tuple[StoredRule, ...]) -> RuleSet | None:
        """The rules as a RuleSet, checked by the validator; None without one."""
        if self._validator is None:
            return None
        ruleset = to_ruleset(rules)
        self._validator(ruleset)
        return ruleset

    def _commit(self, build: Callable[[Version | None], Pending | None]) -> Version | None:
        """Build the next version from the latest one and write it, unless another
        writer wrote one in between: then build again on that one.

        The build (preconditions, and validation, which compiles the whole rule set)
        runs with no lock held, so reads go on meanwhile; the write itself only checks
        that the latest version is still the one built on."""
        while True:
            head = self._backend.head()
            with building():  # no garbage collection walking a large rule set meanwhile
                pending = build(head)
                if pending is None:
                    return None
                version = self._backend.commit(head.number if head else 0, pending)
            if version is not None:
                break
            log.info("another writer made a version meanwhile: building on it")
        log.info("rules version %d: %s by %s (%d rules)%s", version.number,
                 version.info.operation, version.info.author, version.info.rule_count,
                 f": {version.info.reason}" if version.info.reason else "")
        self.poll()
        return version

    def _publish(self, version: Version) -> bool:
        """Tell subscribers about `version` unless it is the last one they heard of
        (called under the publish lock)."""
        if version.number == self._published:
            return False
        self._published = version.number
        ruleset = version.ruleset()
        for callback in list(self._subscribers):
            try:
                callback(version.number, ruleset)
            except Exception:  # one subscriber must not stop the others
                log.exception("rule-set subscriber failed on version %d", version.number)
        return True


def _check_scope(scope: OwnerScope, owners: Collection[str | None]) -> None:
    outside = {owner for owner in owners if not scope.allows(owner)}
    if outside:
        raise errors.OutOfScope(outside, scope.describe())


def _check_preconditions(existing: StoredRule | None, rule_id: str,
                         if_match: Collection[str] | None, if_none_match: bool,
                         *, creating: bool) -> None:
    if if_none_match and existing is not None:
        raise errors.PreconditionFailed(
            f"rule '{rule_id}' already exists (If-None-Match: *)", existing.etag)
    if if_match is not None:
        if existing is None:
            raise errors.PreconditionFailed(f"rule '{rule_id}' does not exist (If-Match)")
        if ANY not in if_match and existing.etag not in if_match:
            raise errors.PreconditionFailed(
                f"rule '{rule_id}' changed since you read it: its ETag is now "
                f'"{existing.etag}"; read it again and retry', existing.etag)
        return
    if existing is not None and not if_none_match:
        action = "update" if creating else "delete"
        raise errors.PreconditionRequired(
            f"to {action} rule '{rule_id}' send If-Match with the ETag you read "
            f'(now "{existing.etag}")')
