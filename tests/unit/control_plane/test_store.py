"""The rule store, the same tests on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from control_plane.store import (
    Change,
    InvalidChange,
    PreconditionFailed,
    PreconditionRequired,
    RuleNotFound,
    RuleOwned,
    RuleStore,
    StoreError,
    StoreUnavailable,
    VersionNotFound,
    describe_url,
    open_store,
)
from filter_rules import CompiledRuleSet, Rule, RuleSet, RuleSetInvalid, RuleSource
from tests.unit.control_plane.test_store_postgres_server import postgres_url

__all__ = ["postgres_url"]  # the session fixture, imported to be found here

ALICE = Change("alice", "first rules")
_schemas = itertools.count()


def rule(rule_id: str, **extra: Any) -> Rule:
    return Rule.model_validate({"id": rule_id, "action": {"observe": {}}, **extra})


def ruleset(*rules: Rule, file: str = "rules/a.yaml") -> RuleSet:
    return RuleSet(rules=list(rules),
                   sources={r.id: RuleSource(file=file, line=i + 2, column=5)
                            for i, r in enumerate(rules)})


def _postgres_schema_url(base: str) -> str:
    """A fresh schema per test: isolated tables without a database per test."""
    import psycopg

    name = f"t{next(_schemas)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        conn.execute(f"CREATE SCHEMA {name}")
    return f"{base}?options=-csearch_path%3D{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'store.sqlite3'}"
    return _postgres_schema_url(request.getfixturevalue("postgres_url"))


@pytest.fixture
def opener(store_url: str) -> Iterator[Callable[..., RuleStore]]:
    opened: list[RuleStore] = []

    def open_(**kwargs: Any) -> RuleStore:
        store = open_store(store_url, **kwargs)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


@pytest.fixture
def store(opener: Callable[..., RuleStore]) -> RuleStore:
    return opener()


def test_an_empty_store_has_version_0_and_no_rules(store: RuleStore) -> None:
    assert store.current() == (0, RuleSet())
    assert store.versions() == []
    with pytest.raises(RuleNotFound):
        store.rule("a")
    with pytest.raises(VersionNotFound):
        store.version(1)


def test_every_write_is_a_version_with_who_and_why(store: RuleStore) -> None:
    created = store.put_rule(rule("a"), ALICE)
    assert created.created and created.version is not None
    assert created.version.number == 1 and created.version.operation == "create"
    updated = store.put_rule(rule("a", description="now documented"), Change("bob", "docs"),
                             if_match=[created.rule.etag])
    assert updated.version is not None and updated.version.number == 2
    assert updated.rule.etag != created.rule.etag
    history = store.versions()
    assert [(v.number, v.author, v.reason, v.operation) for v in history] == [
        (2, "bob", "docs", "update"), (1, "alice", "first rules", "create")]
    assert history[0].created_at.tzinfo is not None
    number, live = store.current()
    assert number == 2 and live.rules[0].description == "now documented"
    assert history[0].ruleset_hash == live.version  # what ext_proc instances report


def test_the_same_rule_again_makes_no_new_version(store: RuleStore) -> None:
    first = store.put_rule(rule("a"), ALICE)
    again = store.put_rule(rule("a"), ALICE, if_match=[first.rule.etag])
    assert again.version is None and not again.created
    assert len(store.versions()) == 1


def test_etags_guard_updates_and_deletes(store: RuleStore) -> None:
    etag = store.put_rule(rule("a"), ALICE).rule.etag
    with pytest.raises(PreconditionRequired, match="If-Match"):
        store.put_rule(rule("a", order=3), ALICE)
    with pytest.raises(PreconditionFailed) as failed:
        store.put_rule(rule("a", order=3), ALICE, if_match=["stale"])
    assert failed.value.current_etag == etag
    with pytest.raises(PreconditionFailed, match="already exists"):
        store.put_rule(rule("a", order=3), ALICE, if_none_match=True)
    with pytest.raises(PreconditionFailed, match="does not exist"):
        store.put_rule(rule("b"), ALICE, if_match=[etag])
    assert store.put_rule(rule("a", order=3), ALICE, if_match=["*"]).version is not None
    with pytest.raises(PreconditionRequired):
        store.delete_rule("a", ALICE)
    with pytest.raises(PreconditionFailed):
        store.delete_rule("a", ALICE, if_match=[etag])  # the etag before the update
    with pytest.raises(RuleNotFound):
        store.delete_rule("nope", ALICE, if_match=["*"])
    deleted = store.delete_rule("a", Change("bob", "gone"), if_match=[store.rule("a").etag])
    assert deleted.operation == "delete" and deleted.rule_count == 0
    assert len(store.versions()) == 3  # the refused writes left no version


def test_a_directory_owns_what_it_applies(store: RuleStore) -> None:
    store.put_rule(rule("rest-made"), ALICE)
    result = store.apply("dir:rules", ruleset(rule("a"), rule("b")), Change("ci", "merge #1"))
    assert result.version is not None and result.version.operation == "apply"
    assert result.diff.added == ("a", "b") and result.diff.removed == ()
    assert store.rule("a").owner == "dir:rules"
    assert store.rule("a").source == {"file": "rules/a.yaml", "line": 2, "column": 5}
    assert store.rule("rest-made").owner is None

    with pytest.raises(RuleOwned, match="keg apply") as owned:
        store.put_rule(rule("a", order=1), ALICE, if_match=["*"])
    assert owned.value.owners == {"a": "dir:rules"}
    with pytest.raises(RuleOwned):
        store.delete_rule("b", ALICE, if_match=["*"])

    again = store.apply("dir:rules", ruleset(rule("a"), rule("b")), Change("ci"))
    assert again.version is None and again.diff.empty and again.current == 2

    changed = store.apply("dir:rules", ruleset(rule("a", order=5), rule("c")), Change("ci"))
    assert changed.diff.changed == ("a",)
    assert changed.diff.added == ("c",) and changed.diff.removed == ("b",)
    assert "+  order: 5" in changed.diff.unified
    assert [r.id for r in store.current()[1].rules] == ["rest-made", "a", "c"]


def test_a_directory_cannot_take_other_owners_rules(store: RuleStore) -> None:
    store.apply("dir:team-a", ruleset(rule("shared")), Change("ci"))
    with pytest.raises(RuleOwned, match="not owned by dir:team-b") as owned:
        store.apply("dir:team-b", ruleset(rule("shared")), Change("ci"))
    # How to write as the owner (`keg diff` of the directory `keg up` serves, say).
    assert "pass --owner dir:team-a" in str(owned.value)
    store.put_rule(rule("loose"), ALICE)
    with pytest.raises(RuleOwned, match="adopt") as unowned:
        store.apply("dir:team-b", ruleset(rule("loose")), Change("ci"))
    assert "--owner" not in str(unowned.value)
    adopted = store.apply("dir:team-b", ruleset(rule("loose")), Change("ci"), adopt=True)
    assert adopted.diff.owners_changed == ("loose",)
    assert store.rule("loose").owner == "dir:team-b"
    with pytest.raises(InvalidChange):
        store.apply(" ", ruleset(), Change("ci"))


def test_a_dry_run_apply_writes_nothing(store: RuleStore) -> None:
    plan = store.apply("dir:rules", ruleset(rule("a")), Change("ci"), dry_run=True)
    assert plan.diff.added == ("a",) and plan.version is None
    assert store.versions() == []


def test_diff_and_rollback(store: RuleStore) -> None:
    store.put_rule(rule("a"), ALICE)
    store.put_rule(rule("b"), ALICE)
    store.delete_rule("a", ALICE, if_match=["*"])
    diff = store.diff(1, 3)
    assert diff.added == ("b",) and diff.removed == ("a",)
    assert diff.unified.startswith("--- version 1\n+++ version 3\n")
    assert store.diff(0, 1).added == ("a",)

    back = store.rollback(1, Change("alice", "undo"))
    assert (back.number, back.operation, back.parent, back.reason) == (4, "rollback", 1, "undo")
    assert store.version(4).rules == store.version(1).rules
    assert store.diff(1, 4).empty
    with pytest.raises(VersionNotFound):
        store.rollback(99, ALICE)


def test_a_rollback_keeps_a_directorys_rule_of_an_id_it_took_over(store: RuleStore) -> None:
    """A rule written through REST, then moved into the served directory (which adopts
    it): a rollback to a version before the move answered 500 (duplicate rule id), and
    nothing was rolled back."""
    store.put_rule(rule("x"), ALICE)
    store.put_rule(rule("y"), ALICE)
    before = max(v.number for v in store.versions())
    store.apply("dir:served", ruleset(rule("x")), Change("keg"), adopt=True)
    store.delete_rule("y", ALICE, if_match=["*"])
    back = store.rollback(before, Change("alice", "undo"), keep="dir:served")
    rules = {r.id: r.owner for r in store.version(back.number).rules}
    assert rules == {"x": "dir:served", "y": None}


def test_a_rollback_keeps_the_versions_order_around_a_directorys_rules(store: RuleStore) -> None:
    """Rules of one `order` run in list order: a rollback with the served directory's
    rules kept put those last, so another deny rule won than in the version rolled back
    to (a new user's POLICY_VIOLATION became TOPIC_AUTHORIZATION_FAILED)."""
    store.apply("dir:served", ruleset(rule("dir-first"), rule("dir-second")), Change("keg"))
    store.put_rule(rule("rest"), ALICE)
    good = max(v.number for v in store.versions())
    order = [r.id for r in store.version(good).rules]
    store.delete_rule("rest", ALICE, if_match=["*"])
    back = store.rollback(good, Change("alice", "undo"), keep="dir:served")
    assert [r.id for r in store.version(back.number).rules] == order
    assert store.diff(good, back.number).empty
    # A directory rule the version did not have comes after its rules.
    store.apply("dir:served", ruleset(rule("dir-first"), rule("dir-second"), rule("dir-new")),
                Change("keg"))
    again = store.rollback(good, Change("alice", "undo"), keep="dir:served")
    assert [r.id for r in store.version(again.number).rules] == [*order, "dir-new"]


def test_a_validator_refuses_sets_the_data_path_could_not_run(
    opener: Callable[..., RuleStore],
) -> None:
    def no_deny(candidate: RuleSet) -> None:
        CompiledRuleSet(candidate)
        if any(r.action.kind == "deny" for r in candidate.rules):
            raise RuleSetInvalid([])

    store = opener(validator=no_deny)
    store.put_rule(rule("a"), ALICE)
    denying = Rule.model_validate({"id": "d", "action": {"deny": {}}})
    with pytest.raises(RuleSetInvalid):
        store.put_rule(denying, ALICE)
    with pytest.raises(RuleSetInvalid):
        store.apply("dir:x", ruleset(denying), ALICE, dry_run=True)
    assert len(store.versions()) == 1


def test_subscribers_hear_every_version_in_order(opener: Callable[..., RuleStore]) -> None:
    store, other = opener(), opener()
    heard: list[tuple[int, list[str]]] = []
    store.subscribe(lambda n, rs: heard.append((n, [r.id for r in rs.rules])))
    def failing(number: int, ruleset: RuleSet) -> None:
        raise RuntimeError("a failing subscriber does not stop the others")

    unsubscribe = store.subscribe(failing)
    store.put_rule(rule("a"), ALICE)
    unsubscribe()
    other.put_rule(rule("b"), ALICE)  # another control-plane instance
    assert heard == [(1, ["a"])]
    assert store.poll() and not store.poll()
    assert heard == [(1, ["a"]), (2, ["a", "b"])]
    assert store.current()[0] == other.current()[0] == 2


def test_a_rejected_version_is_never_served_and_the_last_good_one_is(
        opener: Callable[..., RuleStore]) -> None:
    """The fleet's answers: a NACKed version stays in the history, marked rejected, and
    the store serves the last good version again; live is what the fleet applied."""
    store, other = opener(), opener()
    heard: list[int] = []
    store.subscribe(lambda number, _rules: heard.append(number))
    store.put_rule(rule("a"), ALICE)
    assert store.live() is None and store.verdict(1) is None, "pending until answered"
    assert store.record_verdict(1, "xp-1") and not store.record_verdict(1, "xp-2")
    store.put_rule(rule("b"), ALICE)
    assert store.current()[0] == 2
    live = store.live()
    assert live is not None and live.number == 1, "version 2 is not applied yet"

    assert store.record_verdict(2, "xp-1", "key k1: environment variable K is not set")
    verdict = store.verdict(2)
    assert verdict is not None and verdict.status == "rejected"
    assert verdict.describe() == "xp-1: key k1: environment variable K is not set"
    number, served = store.current()
    assert (number, [r.id for r in served.rules]) == (1, ["a"])
    assert heard == [1, 2, 1], "subscribers (the control plane) serve version 1 again"
    live = store.live()
    assert live is not None and live.number == 1
    assert store.rules()[0] == 2, "the history keeps it: writes build on the latest"
    assert not store.record_verdict(2, "xp-2"), "a late ACK does not undo a rejection"
    assert store.verdicts([1, 2])[2].status == "rejected"
    assert other.poll() and other.current()[0] == 1, "other instances see the rejection"

    fixed = store.put_rule(rule("b", description="fixed"), ALICE,
                           if_match=[store.rule("b").etag])
    assert fixed.version is not None and store.current()[0] == 3
    store.record_verdict(3, "xp-1", "still broken")
    assert store.current()[0] == 1 and heard[-1] == 1


def test_a_version_the_fleet_applied_is_not_taken_back_by_one_instances_refusal(
        store: RuleStore) -> None:
    """A worker restarted after its key file went bad refused the version the fleet ran:
    it was marked rejected, the store fell back to the version before, which the worker
    refused too, and so on until all six were rejected (a new user's report). The first
    answer stands: a version an instance applied stays served."""
    heard: list[int] = []
    store.subscribe(lambda number, _rules: heard.append(number))
    store.put_rule(rule("a"), ALICE)
    store.record_verdict(1, "xp-1")
    store.put_rule(rule("b"), ALICE)
    assert store.record_verdict(2, "xp-1")
    assert not store.record_verdict(2, "xp-1", "key k1: key file k1.key: not a key")
    verdict = store.verdict(2)
    assert verdict is not None and verdict.status == "applied"
    assert store.current()[0] == 2 and heard == [1, 2], "nothing served again"
    live = store.live()
    assert live is not None and live.number == 2


def test_applying_a_rejected_set_again_retries_it_only_when_asked(store: RuleStore) -> None:
    directory = ruleset(rule("a"))
    store.apply("dir:x", directory, ALICE)
    store.record_verdict(1, "xp-1", "module acme missing")
    assert store.apply("dir:x", directory, ALICE).version is None
    retried = store.apply("dir:x", directory, ALICE, retry_rejected=True)
    assert retried.version is not None and retried.current == 2
    assert store.current()[0] == 2 and store.verdict(2) is None
    assert store.apply("dir:x", directory, ALICE, retry_rejected=True).version is None, (
        "a pending version is not retried")


def test_concurrent_writers_with_one_etag_only_one_wins(
    opener: Callable[..., RuleStore],
) -> None:
    etag = opener().put_rule(rule("a"), ALICE).rule.etag
    stores = [opener() for _ in range(2)]  # two instances, four threads each
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def write(index: int) -> None:
        barrier.wait()
        try:
            stores[index % 2].put_rule(rule("a", order=index + 1), Change(f"w{index}"),
                                       if_match=[etag])
            outcomes.append("won")
        except PreconditionFailed:
            outcomes.append("refused")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["refused"] * 7 + ["won"]
    assert [v.number for v in stores[0].versions()] == [2, 1]


def test_versions_survive_a_restart_and_page(opener: Callable[..., RuleStore]) -> None:
    first = opener()
    for index in range(5):
        first.put_rule(rule(f"r{index}"), ALICE)
    first.close()
    reopened = opener()
    assert reopened.current()[0] == 5
    assert [v.number for v in reopened.versions(limit=2)] == [5, 4]
    assert [v.number for v in reopened.versions(limit=2, before=4)] == [3, 2]
    assert [r.id for r in reopened.version(3).rules] == ["r0", "r1", "r2"]


def test_store_urls() -> None:
    with pytest.raises(StoreError, match="unknown store URL"):
        open_store("mysql://x")
    with pytest.raises(StoreError, match="data directory"):
        open_store(None)
    assert describe_url("postgresql://keg:s3cret@db:5432/keg") == "postgresql://keg:***@db:5432/keg"
    assert "s3cret" not in describe_url("postgres://u:s3cret@h/d")


def test_sqlite_by_default_in_the_data_dir(tmp_path: Path) -> None:
    store = open_store(None, tmp_path / "data")
    store.put_rule(rule("a"), ALICE)
    store.close()
    assert (tmp_path / "data" / "control-plane.sqlite3").exists()


def test_an_unreachable_postgres_is_store_unavailable() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StoreUnavailable, match="postgresql"):
        open_store(f"postgresql://keg:pw@127.0.0.1:{port}/keg")


def test_reads_and_other_writes_go_on_while_a_large_write_validates(
        opener: Callable[..., RuleStore]) -> None:
    """Validation compiles the whole rule set (seconds for 100,000 rules). It ran inside
    the write transaction, under the lock every read takes: the REST API stalled for
    as long. Now it runs with no lock held; a write committed meanwhile is built upon."""
    entered, release = threading.Event(), threading.Event()

    def validator(candidate: RuleSet) -> None:
        if any(r.id == "slow" for r in candidate.rules) and not release.is_set():
            entered.set()
            assert release.wait(30)

    store = opener(validator=validator)
    store.put_rule(rule("a"), ALICE)
    errors: list[BaseException] = []

    def slow_write() -> None:
        try:
            store.put_rule(rule("slow"), Change("bob"))
        except BaseException as err:  # reported below
            errors.append(err)

    writer = threading.Thread(target=slow_write)
    writer.start()
    assert entered.wait(30)
    seen: list[Any] = []
    reader = threading.Thread(target=lambda: seen.append(
        (store.rules()[0], store.current()[0], [v.number for v in store.versions()],
         store.put_rule(rule("quick"), Change("carol")).version)))
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "reads waited for the write's validation"
    ((latest, served, numbers, quick),) = seen
    assert (latest, served, numbers) == (1, 1, [1])
    assert quick is not None and quick.number == 2
    release.set()
    writer.join(30)
    assert not errors
    number, rules = store.rules()
    assert number == 3 and [r.id for r in rules] == ["a", "quick", "slow"]
