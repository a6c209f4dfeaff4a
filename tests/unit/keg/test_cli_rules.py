"""`keg diff` and `keg apply [--watch]` against a live control-plane API (uvicorn on a
free loopback port, SQLite store): the commands go over real HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from control_plane.api import ApiSettings, Tokens, create_app, ruleset_validator
from control_plane.fleet import ENVOY, EXT_PROC, Fleet, NodeInfo, NodeStatus
from control_plane.snapshot import RULES
from control_plane.store import RuleStore, open_store
from filter_rules import DEFAULT_RULES_DIR
from keg.cli import app
from keg.cli_rules import Rollout
from tests.unit.control_plane.conftest import serving

TOKEN = "gitops-token-0123456789"
runner = CliRunner()


@dataclass
class LiveApi:
    url: str
    store: RuleStore
    fleet: Fleet  # what /v1/fleet reports (the xDS side is not running here)


@pytest.fixture
def live_api(tmp_path: Path) -> Iterator[LiveApi]:
    store = open_store(None, tmp_path / "cp", validator=ruleset_validator())
    fleet = Fleet()
    with serving(create_app(store, ApiSettings(tokens=Tokens.of([("ci", TOKEN)])),
                             fleet.status)) as url:
        yield LiveApi(url, store, fleet)
    store.close()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(f"# the CI's token\n{TOKEN}\n")
    return path


def rules_dir(tmp_path: Path, **files: str) -> Path:
    directory = tmp_path / "rules"
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / f"{name}.yaml").write_text(text)
    return directory


ONE = "rules:\n  - id: a\n    action: {observe: {}}\n"
TWO = ONE + "  - id: b\n    match: {apis: [Produce]}\n    action: {deny: {}}\n"


def test_apply_then_diff_round_trip(live_api: LiveApi, token_file: Path, tmp_path: Path) -> None:
    directory = rules_dir(tmp_path, team=ONE)
    common = ["--api", live_api.url, "--token-file", str(token_file)]
    before = runner.invoke(app, ["diff", str(directory), *common, "--exit-code"])
    assert before.exit_code == 3, before.output
    assert "+ a" in before.output

    applied = runner.invoke(app, ["apply", str(directory), *common, "--reason", "commit abc"])
    assert applied.exit_code == 0, applied.output
    assert "version 1" in applied.output
    number, ruleset = live_api.store.current()
    assert number == 1 and [r.id for r in ruleset.rules] == ["a"]
    stored = live_api.store.rule("a")
    assert stored.owner == "dir:rules"
    assert stored.source == {"file": str(directory / "team.yaml"), "line": 2, "column": 5}
    assert live_api.store.versions()[0].reason == "commit abc"
    assert live_api.store.versions()[0].author == "ci"

    same = runner.invoke(app, ["diff", str(directory), *common, "--exit-code"])
    assert same.exit_code == 0 and "no differences" in same.output
    again = runner.invoke(app, ["apply", str(directory), *common])
    assert again.exit_code == 0 and "nothing to change" in again.output

    (directory / "team.yaml").write_text(TWO.replace("id: a\n    action: {observe: {}}",
                                                     "id: a\n    order: 5\n    action: "
                                                     "{observe: {}}"))
    changed = runner.invoke(app, ["diff", str(directory), *common])
    assert changed.exit_code == 0
    assert "+ b" in changed.output and "~ a" in changed.output
    assert "+    order: 5" in changed.output.replace("+  order", "+    order")
    assert runner.invoke(app, ["apply", str(directory), *common]).exit_code == 0
    assert live_api.store.current()[0] == 2


def test_apply_exit_codes(live_api: LiveApi, token_file: Path, tmp_path: Path) -> None:
    directory = rules_dir(tmp_path, team=ONE)
    invalid = rules_dir(tmp_path / "x", bad="rules:\n  - id: a\n    action: {nope: {}}\n")
    ok = ["--api", live_api.url, "--token-file", str(token_file)]

    result = runner.invoke(app, ["apply", str(invalid), *ok])
    assert result.exit_code == 1 and f"{invalid / 'bad.yaml'}:3:" in result.output

    result = runner.invoke(app, ["apply", str(directory), "--api", live_api.url],
                           env={"KEG_API_TOKEN": ""})
    assert result.exit_code == 4 and "401" in result.output
    bad_token = tmp_path / "bad-token"
    bad_token.write_text("not-the-token-at-all\n")
    result = runner.invoke(app, ["apply", str(directory), "--api", live_api.url,
                                 "--token-file", str(bad_token)])
    assert result.exit_code == 4 and "403" in result.output
    assert "not-the-token-at-all" not in result.output

    result = runner.invoke(app, ["apply", str(directory), "--api", "http://127.0.0.1:9", *ok[2:]])
    assert result.exit_code == 5 and "cannot reach" in result.output

    assert runner.invoke(app, ["apply", str(directory), *ok, "--owner", "dir:team-a"]
                         ).exit_code == 0
    conflict = runner.invoke(app, ["apply", str(directory), *ok, "--owner", "dir:team-b"])
    assert conflict.exit_code == 4 and "not owned by dir:team-b" in conflict.output
    assert "409" in conflict.output

    result = runner.invoke(app, ["apply", str(tmp_path / "missing"), *ok])
    assert result.exit_code == 1 and "does not exist" in result.output  # as keg validate
    assert runner.invoke(app, ["apply", str(directory)]).exit_code == 2  # no --api


def test_versions_lists_the_history_and_rollback_restores_a_version(
        live_api: LiveApi, token_file: Path, tmp_path: Path) -> None:
    common = ["--api", live_api.url, "--token-file", str(token_file)]
    directory = rules_dir(tmp_path, team=ONE)
    assert runner.invoke(app, ["apply", str(directory), *common, "--reason", "first"]
                         ).exit_code == 0
    (directory / "team.yaml").write_text(TWO)
    assert runner.invoke(app, ["apply", str(directory), *common, "--reason", "deny b"]
                         ).exit_code == 0

    listed = runner.invoke(app, ["versions", *common], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    rows = [line.split() for line in listed.output.splitlines()[1:] if line.strip()]
    # version, date, time, author, operation, rules, status, reason
    assert [(r[0], *r[3:7], " ".join(r[7:])) for r in rows] == [
        ("2", "ci", "apply", "2", "pending", "deny b"),
        ("1", "ci", "apply", "1", "pending", "first")]

    rolled = runner.invoke(app, ["rollback", "1", *common, "--reason", "incident 42"])
    assert rolled.exit_code == 0, rolled.output
    assert "rolled back to version 1: version 3 (1 rules)" in rolled.output
    number, ruleset = live_api.store.current()
    assert number == 3 and [r.id for r in ruleset.rules] == ["a"]
    newest = json.loads(runner.invoke(app, ["versions", *common, "--json", "--limit", "1"]
                                      ).output)
    assert newest["next_before"] == 3
    [info] = newest["versions"]
    assert (info["number"], info["operation"], info["parent"], info["reason"]) == (
        3, "rollback", 1, "incident 42")
    assert "rollback to 1" in runner.invoke(app, ["versions", *common]).output


def test_rollback_refusals_exit_4_and_change_nothing(
        live_api: LiveApi, token_file: Path, tmp_path: Path) -> None:
    common = ["--api", live_api.url, "--token-file", str(token_file)]
    assert runner.invoke(app, ["apply", str(rules_dir(tmp_path, team=ONE)), *common]
                         ).exit_code == 0
    missing = runner.invoke(app, ["rollback", "7", *common])
    assert missing.exit_code == 4 and "404" in missing.output
    anonymous = runner.invoke(app, ["rollback", "1", "--api", live_api.url],
                              env={"KEG_API_TOKEN": ""})
    assert anonymous.exit_code == 4 and "401" in anonymous.output
    assert runner.invoke(app, ["rollback", "0", *common]).exit_code == 2  # not a version
    assert live_api.store.current()[0] == 1
    unreachable = runner.invoke(app, ["versions", "--api", "http://127.0.0.1:9"])
    assert unreachable.exit_code == 5 and "cannot reach" in unreachable.output


def test_rollback_wait_returns_once_the_fleet_runs_the_new_version(
        live_api: LiveApi, token_file: Path, tmp_path: Path) -> None:
    common = ["--api", live_api.url, "--token-file", str(token_file)]
    assert runner.invoke(app, ["apply", str(rules_dir(tmp_path, team=ONE)), *common]
                         ).exit_code == 0
    instance = _instance(live_api.fleet, "xp-1")
    acked = threading.Event()

    def ack_later() -> None:  # as the instance does once the control plane pushed it
        _wait_for(lambda: live_api.store.current()[0] == 2, "the rollback")
        time.sleep(0.5)
        live_api.fleet.ack(instance, RULES, "2", None)
        acked.set()

    acker = threading.Thread(target=ack_later, daemon=True)
    acker.start()
    result = runner.invoke(app, ["rollback", "1", *common, "--wait", "--wait-timeout", "20"])
    acker.join(10)
    assert result.exit_code == 0, result.output
    assert acked.is_set()  # it did not return before the instance had applied
    assert "version 2 applied by all 1 connected ext_proc instance(s)" in result.output


def test_shipped_rules_diff_cleanly(live_api: LiveApi, token_file: Path) -> None:
    result = runner.invoke(app, ["apply", str(DEFAULT_RULES_DIR), "--api", live_api.url,
                                 "--token-file", str(token_file)])
    assert result.exit_code == 0, result.output
    assert live_api.store.current()[1].version == _shipped_version()


def _shipped_version() -> str:
    from filter_rules import load_rule_dir

    return load_rule_dir(DEFAULT_RULES_DIR).version


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_watch_applies_valid_changes_and_skips_invalid_ones(
    live_api: LiveApi, token_file: Path, tmp_path: Path,
) -> None:
    directory = rules_dir(tmp_path, team=ONE)
    log = (tmp_path / "watch.log").open("w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "keg", "apply", str(directory), "--api", live_api.url,
         "--token-file", str(token_file), "--watch"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "200"})
    try:
        _wait_for(lambda: live_api.store.current()[0] == 1, "the first apply")
        _wait_for(lambda: "watching" in (tmp_path / "watch.log").read_text(), "the watcher")
        (directory / "team.yaml").write_text(TWO)
        _wait_for(lambda: live_api.store.current()[0] == 2, "the change to be applied")
        assert [r.id for r in live_api.store.current()[1].rules] == ["a", "b"]

        (directory / "broken.yaml").write_text("rules:\n  - id: c\n    action: {nope: {}}\n")
        _wait_for(lambda: "nothing applied" in (tmp_path / "watch.log").read_text(),
                  "the invalid file to be reported")
        assert live_api.store.current()[0] == 2

        (directory / "broken.yaml").unlink()
        (directory / "more.yaml").write_text("rules:\n  - id: c\n    action: {observe: {}}\n")
        _wait_for(lambda: live_api.store.current()[0] == 3, "the fixed set to be applied")
        # Stored is not yet answered: Ctrl-C before the reply interrupts the request.
        _wait_for(lambda: "version 3" in (tmp_path / "watch.log").read_text(),
                  "the watcher to report the apply")
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(20)
        log.close()
    output = (tmp_path / "watch.log").read_text()
    assert code == 0, output
    assert f"{directory / 'broken.yaml'}:3:" in output
    assert TOKEN not in output


# --- apply --wait: the fleet as the control plane's Fleet reports it -------------------


def _instance(fleet: Fleet, node_id: str, role: str = EXT_PROC) -> NodeStatus:
    return fleet.connected(NodeInfo(node_id, role=role))


def test_rollout_sorts_connected_ext_proc_instances_by_version() -> None:
    fleet = Fleet()
    on_it, later, behind, refused = (_instance(fleet, n) for n in ("on", "later", "behind", "nack"))
    gone = _instance(fleet, "gone")
    _instance(fleet, "envoy-1", role=ENVOY)  # Envoys take no rule sets
    fleet.ack(on_it, RULES, "7", None)
    fleet.ack(later, RULES, "8", None)
    fleet.ack(behind, RULES, "6", None)
    fleet.ack(refused, RULES, "6", None)
    fleet.nack(refused, RULES, "7", "plugin acme:Redact: No module named 'acme'")
    fleet.disconnected(gone.node_id)

    state = Rollout.of(fleet.status(), 7)
    assert sorted(state.applied) == ["later", "on"]
    assert state.pending == ("behind",)
    assert state.nacked == (("nack", "plugin acme:Redact: No module named 'acme'"),)
    # An older NACK does not count against a newer version.
    assert Rollout.of(fleet.status(), 8).nacked == ()


def test_apply_wait_returns_once_every_instance_applied(
        live_api: LiveApi, token_file: Path, tmp_path: Path) -> None:
    directory = rules_dir(tmp_path, team=ONE)
    instances = [_instance(live_api.fleet, n) for n in ("xp-1", "xp-2")]
    acked = threading.Event()

    def ack_later() -> None:  # as instances do once the control plane pushed version 1
        _wait_for(lambda: live_api.store.current()[0] == 1, "the apply")
        time.sleep(0.5)
        for status in instances:
            live_api.fleet.ack(status, RULES, "1", None)
        acked.set()

    acker = threading.Thread(target=ack_later, daemon=True)
    acker.start()
    result = runner.invoke(app, ["apply", str(directory), "--api", live_api.url,
                                 "--token-file", str(token_file), "--wait"])
    acker.join(10)
    assert result.exit_code == 0, result.output
    assert acked.is_set()  # it did not return before the instances had applied
    assert "version 1 applied by all 2 connected ext_proc instance(s)" in result.output

    again = runner.invoke(app, ["apply", str(directory), "--api", live_api.url,
                                "--token-file", str(token_file), "--wait"])
    assert again.exit_code == 0 and "nothing to change" in again.output
    assert "version 1 applied by all 2" in again.output


def test_apply_wait_fails_on_a_nack_or_at_the_timeout(
        live_api: LiveApi, token_file: Path, tmp_path: Path) -> None:
    directory = rules_dir(tmp_path, team=ONE)
    common = ["--api", live_api.url, "--token-file", str(token_file), "--wait"]
    slow = _instance(live_api.fleet, "xp-slow")
    result = runner.invoke(app, ["apply", str(directory), *common, "--wait-timeout", "0.5"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 6, result.output
    assert "not applied within 0.5 s" in result.output and "xp-slow" in result.output
    assert live_api.store.current()[0] == 1  # applied all the same: the fleet lags

    live_api.fleet.ack(slow, RULES, "1", None)
    picky = _instance(live_api.fleet, "xp-picky")
    live_api.fleet.nack(picky, RULES, "2", "rule r: key KEG_KEY is not set")
    (directory / "team.yaml").write_text(TWO)
    result = runner.invoke(app, ["apply", str(directory), *common], env={"COLUMNS": "200"})
    assert result.exit_code == 6, result.output
    assert "NACK xp-picky refused version 2: rule r: key KEG_KEY is not set" in result.output


def test_apply_wait_needs_a_fleet_view_and_no_watch(
        tmp_path: Path, token_file: Path) -> None:
    store = open_store(None, tmp_path / "cp", validator=ruleset_validator())
    directory = rules_dir(tmp_path, team=ONE)
    try:
        with serving(create_app(store, ApiSettings(tokens=Tokens.of([("ci", TOKEN)])))) as url:
            common = ["--api", url, "--token-file", str(token_file), "--wait"]
            result = runner.invoke(app, ["apply", str(directory), *common],
                                   env={"COLUMNS": "200"})
            assert result.exit_code == 6 and "has no fleet view" in result.output
            result = runner.invoke(app, ["apply", str(directory), *common, "--watch"])
            assert result.exit_code == 2 and "do not go together" in result.output
    finally:
        store.close()


# --- what the fleet made of a version, as the commands say it ----------------------------


def test_a_version_the_fleet_rejected_is_never_called_live(
        live_api: LiveApi, token_file: Path, tmp_path: Path) -> None:
    directory = rules_dir(tmp_path, team=ONE)
    common = ["--api", live_api.url, "--token-file", str(token_file)]
    assert runner.invoke(app, ["apply", str(directory), *common]).exit_code == 0
    pending = runner.invoke(app, ["diff", str(directory), *common])
    assert pending.exit_code == 0
    assert "version 1 is not applied by the fleet yet" in pending.output
    live_api.store.record_verdict(1, "xp-1")
    live = runner.invoke(app, ["diff", str(directory), *common])
    assert live.exit_code == 0 and "version 1 is live" in live.output

    (directory / "team.yaml").write_text(TWO)
    assert runner.invoke(app, ["apply", str(directory), *common]).exit_code == 0
    live_api.store.record_verdict(2, "xp-1", "rule b: key k: environment variable K is not set")
    for command in ("diff", "apply"):
        result = runner.invoke(app, [command, str(directory), *common])
        assert result.exit_code == 6, (command, result.output)
        assert ("version 2 was REJECTED by the fleet (xp-1: rule b: key k: environment "
                "variable K is not set); it is not served, the fleet runs version 1"
                in result.output), result.output
        assert "is live" not in result.output


def test_output_off_a_terminal_is_whole_and_as_written(
        live_api: LiveApi, token_file: Path, tmp_path: Path) -> None:
    """Piped output (CI logs): no line cut at 80 columns, no rich markup or emoji codes
    taken from rule ids, owners, paths or rule text."""
    directory = rules_dir(tmp_path / "x", team=ONE).rename(tmp_path / "watch")
    common = ["--api", live_api.url, "--token-file", str(token_file)]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}

    def keg(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "keg", *args, *common], env=env,
                              capture_output=True, text=True, timeout=60)
        return done.stdout + done.stderr

    applied = keg("apply", str(directory))
    assert f"applied {directory} as dir:watch: version 1" in applied, applied
    description = "[red]not-markup[/red]:watch:" + "x" * 150  # one word: YAML keeps it whole
    (directory / "team.yaml").write_text(ONE.replace(
        "action:", f"description: '{description}'\n    action:"))
    diff = keg("diff", str(directory))
    assert f"+  description: '{description}'\n" in diff, diff
    assert "\u231a" not in applied + diff  # rich's :watch: emoji


def test_watch_applies_again_while_the_control_plane_cannot_be_reached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save while the control plane was down was applied only at the next file change:
    the live rules stayed behind the directory."""
    import keg.cli_rules as cli_rules

    attempts: list[str] = []

    class Down:
        api = "http://127.0.0.1:1"

        def apply(self, owner: str, *_: object, **__: object) -> dict[str, object]:
            attempts.append(owner)
            raise cli_rules.ApiFailure(cli_rules.Exit.UNREACHABLE, "cannot reach it")

    monkeypatch.setattr(cli_rules, "WATCH_RETRY_S", 0.0)
    monkeypatch.setattr(cli_rules, "_changes", lambda *_: iter([True, False, False, False]))
    directory = rules_dir(tmp_path, team=ONE)
    code = cli_rules._watch(Down(), directory, "dir:team", "test", adopt=False)  # type: ignore[arg-type]
    assert code == cli_rules.Exit.OK
    assert attempts == ["dir:team"] * 4  # the first, then once per quiet tick
