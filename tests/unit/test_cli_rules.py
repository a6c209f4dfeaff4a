"""`keg diff` and `keg apply [--watch]` against a live control-plane API (uvicorn on a
free loopback port, SQLite store): the commands go over real HTTP."""

from __future__ import annotations

import asyncio
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

from control_plane.api import ApiSettings, Tokens, create_app, ruleset_validator, serve_api
from control_plane.store import RuleStore, open_store
from filter_rules import DEFAULT_RULES_DIR
from keg.cli import app

TOKEN = "gitops-token-0123456789"
runner = CliRunner()


@dataclass
class LiveApi:
    url: str
    store: RuleStore


@pytest.fixture
def live_api(tmp_path: Path) -> Iterator[LiveApi]:
    store = open_store(None, tmp_path / "cp", validator=ruleset_validator())
    api = create_app(store, ApiSettings(tokens=Tokens.of([("ci", TOKEN)])))
    started = threading.Event()
    port: list[int] = []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def main() -> None:
        server = await serve_api(api, "127.0.0.1", 0)
        port.append(server.port)
        started.set()
        await stop.wait()
        await server.stop()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(10), "the API server did not start"
    yield LiveApi(f"http://127.0.0.1:{port[0]}", store)
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)
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
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(20)
        log.close()
    output = (tmp_path / "watch.log").read_text()
    assert code == 0, output
    assert f"{directory / 'broken.yaml'}:3:" in output
    assert TOKEN not in output
