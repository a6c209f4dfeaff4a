"""The API token file is re-read when it changes (TokenFile): a token removed from it
is refused without a restart, at most one look at the file a second; a file that
becomes unreadable or invalid keeps the last good tokens, with a warning that never
quotes a token."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from control_plane.api import ApiSettings, TokenError, TokenFile, create_app, ruleset_validator
from control_plane.api.settings import RELOAD_INTERVAL_S
from control_plane.service import ControlPlaneSettings
from control_plane.store import EVERY_OWNER, OwnerScope, open_store
from keg.gateway import ApiOptions, ControlPlaneApp
from keg.security import PlaintextTokens
from tests.unit.control_plane.conftest import rule_json

A_TOKEN = "token-of-a-0123456789"
B_TOKEN = "token-of-b-0123456789"
C_TOKEN = "token-of-c-0123456789"


class Clock:
    """time.monotonic, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float = RELOAD_INTERVAL_S) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


def write(path: Path, text: str) -> None:
    path.write_text(text)
    # Older than the racy window: only a real change of the file makes it re-read.
    old = path.stat().st_mtime - 60
    os.utime(path, (old, old))


def token_file(tmp_path: Path, clock: Clock, text: str = f"a:{A_TOKEN}\nb:{B_TOKEN}\n"
               ) -> tuple[Path, TokenFile]:
    path = tmp_path / "tokens"
    write(path, text)
    return path, TokenFile(path, environ={}, clock=clock)


def test_a_removed_token_is_refused_after_the_next_look(tmp_path: Path, clock: Clock) -> None:
    path, tokens = token_file(tmp_path, clock)
    assert tokens.match(A_TOKEN) == "a" and tokens.match(B_TOKEN) == "b"
    write(path, f"b:{B_TOKEN}\nc:{C_TOKEN}\n")
    clock.advance()
    assert tokens.match(A_TOKEN) is None  # removed: refused
    assert tokens.match(B_TOKEN) == "b"  # kept
    assert tokens.match(C_TOKEN) == "c"  # added: taken
    assert tokens.names == ("b", "c")


def test_the_file_is_looked_at_at_most_once_an_interval(
        tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    path, tokens = token_file(tmp_path, clock)
    looks: list[Path] = []
    stat = Path.stat

    def counted(self: Path, **kwargs: bool) -> os.stat_result:
        if self == path:
            looks.append(self)
        return stat(self, **kwargs)

    monkeypatch.setattr(Path, "stat", counted)
    write(path, f"b:{B_TOKEN}\n")
    looks.clear()
    for _ in range(100):  # within the interval: no stat, the old tokens
        assert tokens.match(A_TOKEN) == "a"
    assert looks == []
    clock.advance(RELOAD_INTERVAL_S / 2)
    assert tokens.match(A_TOKEN) == "a" and looks == []
    clock.advance(RELOAD_INTERVAL_S / 2)
    assert tokens.match(A_TOKEN) is None
    for _ in range(100):
        tokens.match(B_TOKEN)
    assert len(looks) == 1  # one look for the interval, however many requests


def test_a_replaced_file_is_re_read_even_with_the_same_size_and_mtime(
        tmp_path: Path, clock: Clock) -> None:
    """An atomic replace (a new inode), as editors and Kubernetes secret volumes do,
    with a same-length token and the old file's mtime."""
    path, tokens = token_file(tmp_path, clock, f"a:{A_TOKEN}\n")
    before = path.stat()
    replacement = tmp_path / ".tokens.new"
    replacement.write_text(f"c:{C_TOKEN}\n")
    os.utime(replacement, ns=(before.st_atime_ns, before.st_mtime_ns))
    replacement.replace(path)
    assert path.stat().st_size == before.st_size
    clock.advance()
    assert tokens.match(A_TOKEN) is None and tokens.match(C_TOKEN) == "c"


@pytest.mark.parametrize("breakage", [
    "invalid entry",  # not name:token
    "duplicate",  # a name given twice
    "short token",
    "deleted",
    "a directory",  # unreadable, for root too
])
def test_a_broken_file_keeps_the_last_good_tokens_and_warns_without_tokens(
        tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture, breakage: str) -> None:
    path, tokens = token_file(tmp_path, clock)
    secret = "never-logged-0123456789"
    if breakage == "invalid entry":
        write(path, f"b:{B_TOKEN}\n{secret}\n")
    elif breakage == "duplicate":
        write(path, f"b:{B_TOKEN}\nb:{secret}\n")
    elif breakage == "short token":
        write(path, f"b:{B_TOKEN}\nc:short\n")
    elif breakage == "deleted":
        path.unlink()
    else:
        path.unlink()
        path.mkdir()
    clock.advance()
    with caplog.at_level(logging.WARNING, logger="control_plane.api.settings"):
        assert tokens.match(A_TOKEN) == "a" and tokens.match(B_TOKEN) == "b"
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = record.getMessage()
    assert "keeping the last good tokens" in message and str(path) in message
    for token in (A_TOKEN, B_TOKEN, secret, "short"):
        assert token not in message
    caplog.clear()
    clock.advance()
    with caplog.at_level(logging.WARNING, logger="control_plane.api.settings"):
        assert tokens.match(A_TOKEN) == "a"
    assert not caplog.records  # the same broken file: warned about once

    if path.is_dir():
        path.rmdir()
    write(path, f"b:{B_TOKEN}\n")  # fixed: taken
    clock.advance()
    assert tokens.match(A_TOKEN) is None and tokens.match(B_TOKEN) == "b"


def test_scopes_follow_the_file_and_a_vanished_name_may_change_nothing(
        tmp_path: Path, clock: Clock) -> None:
    path, tokens = token_file(tmp_path, clock, f"a:{A_TOKEN}\nb:{B_TOKEN}\n")
    assert tokens.scope("a") == EVERY_OWNER
    write(path, f"a:{A_TOKEN} owner=dir:payments\n")
    clock.advance()
    assert tokens.match(A_TOKEN) == "a"
    assert tokens.scope("a") == OwnerScope(("dir:payments",))
    # `b` was matched before the file changed: its scope now allows no owner at all,
    # never every owner's rules.
    assert not tokens.scope("b").allows(None) and not tokens.scope("b").allows("dir:x")


def test_the_variable_s_tokens_stay_and_a_bad_file_at_start_stops_the_start(
        tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "tokens"
    write(path, f"a:{A_TOKEN}\n")
    tokens = TokenFile(path, environ={"KEG_API_TOKENS": f"env:{C_TOKEN}"}, clock=clock)
    assert tokens.names == ("a", "env")
    write(path, f"b:{B_TOKEN}\n")
    clock.advance()
    assert tokens.names == ("b", "env") and tokens.match(C_TOKEN) == "env"

    write(path, "not a token entry\n")
    with pytest.raises(TokenError, match="entry 1 is not name:token"):
        TokenFile(path, environ={}, clock=clock)
    with pytest.raises(TokenError, match="cannot read token file"):
        TokenFile(tmp_path / "absent", environ={}, clock=clock)


def test_the_api_refuses_a_token_removed_from_the_file(tmp_path: Path, clock: Clock) -> None:
    """Through the app: a write with A succeeds, A is removed from the file, A gets
    403 once the file was looked at again, B still writes."""
    path, tokens = token_file(tmp_path, clock)
    store = open_store(None, tmp_path / "cp", validator=ruleset_validator())
    try:
        client = TestClient(create_app(store, ApiSettings(tokens=tokens)))

        def put(rule_id: str, token: str) -> int:
            return client.put(f"/v1/rules/{rule_id}", content=rule_json(rule_id),
                              headers={"Authorization": f"Bearer {token}",
                                       "If-None-Match": "*"}).status_code

        assert put("r1", A_TOKEN) == 201
        write(path, f"b:{B_TOKEN}\n")
        clock.advance()
        assert put("r2", A_TOKEN) == 403
        assert put("r3", B_TOKEN) == 201
        assert [r.id for r in store.current()[1].rules] == ["r1", "r3"]
    finally:
        store.close()


def test_an_empty_token_file_counts_for_the_plaintext_check(tmp_path: Path) -> None:
    """Tokens may be added to the file later: an API on a network address in plain
    HTTP refuses to start with a token file, even an empty one."""
    path = tmp_path / "tokens"
    path.write_text("# tokens come later\n")
    not_a_directory = tmp_path / "store"  # past the check, the start fails at once
    not_a_directory.write_text("")
    app = ControlPlaneApp(
        ControlPlaneSettings(bootstrap_servers="127.0.0.1:1", ext_proc_host="127.0.0.1",
                             ext_proc_port=1),
        ApiOptions(data_dir=not_a_directory, host="0.0.0.0", port=0, tokens_file=path))
    with pytest.raises(PlaintextTokens, match="over plaintext HTTP"):
        asyncio.run(app.start())
    asyncio.run(app.stop())
