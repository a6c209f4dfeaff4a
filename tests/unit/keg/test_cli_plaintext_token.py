"""`keg diff` and `keg apply` never send the API token in plain text (http://) to an
address that is not loopback, unless --insecure-http says so: they exit 2 with a
clear error before any connection."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from control_plane.api import ApiSettings, Tokens, create_app, ruleset_validator
from control_plane.store import RuleStore, open_store
from keg import cli_rules
from keg.cli import app
from keg.cli_rules import ApiFailure, Exit, refuse_plaintext_token
from tests.unit.control_plane.conftest import serving

TOKEN = "plaintext-token-0123456789"
# TEST-NET-1 (RFC 5737): nothing answers there; a connection attempt would hang.
UNROUTABLE = "http://192.0.2.2:39998"
RULES = "rules:\n  - id: a\n    action: {observe: {}}\n"
runner = CliRunner()


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "team.yaml").write_text(RULES)
    return rules


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\n")
    return path


class Refused:
    """What the fake control plane answers: 403, so that every command stops at once
    (--watch too) when a request does go out."""

    status_code = 403
    text = "forbidden"

    def json(self) -> dict[str, Any]:
        return {"detail": "this test's fake control plane refuses everything"}


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, str]]]:
    """The requests the CLI makes (URL, headers), none of them sent."""
    import httpx2

    calls: list[tuple[str, dict[str, str]]] = []

    def request(method: str, url: str, *, headers: dict[str, str], **_: Any) -> Refused:
        calls.append((url, headers))
        return Refused()

    monkeypatch.setattr(httpx2, "request", request)
    return calls


@pytest.mark.parametrize("command", [["diff"], ["apply"], ["apply", "--wait"],
                                     ["apply", "--watch"]])
def test_a_token_to_a_network_address_over_http_is_refused_before_connecting(
        command: list[str], directory: Path, token_file: Path,
        sent: list[tuple[str, dict[str, str]]]) -> None:
    result = runner.invoke(app, [command[0], str(directory), *command[1:], "--api", UNROUTABLE,
                                 "--token-file", str(token_file)])
    assert result.exit_code == int(Exit.USAGE), result.output
    assert "refusing to send the API token in plain text" in result.output
    assert "--insecure-http" in result.output
    assert TOKEN not in result.output
    assert sent == []  # nothing went out


def test_the_token_from_the_environment_is_refused_too(
        directory: Path, sent: list[tuple[str, dict[str, str]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cli_rules.TOKEN_ENV, TOKEN)
    result = runner.invoke(app, ["apply", str(directory), "--api", "http://keg.example:8080"])
    assert result.exit_code == int(Exit.USAGE), result.output
    assert "keg.example is not a loopback address" in result.output
    assert sent == []


def test_the_cli_exits_at_once_in_a_process_of_its_own(directory: Path, token_file: Path) -> None:
    for command in ("diff", "apply"):
        done = subprocess.run(
            [sys.executable, "-m", "keg", command, str(directory), "--api", UNROUTABLE,
             "--token-file", str(token_file)], capture_output=True, text=True, timeout=30)
        assert done.returncode == int(Exit.USAGE), done.stdout + done.stderr
        assert "refusing to send the API token in plain text to http://192.0.2.2:39998" \
            in done.stderr


def test_insecure_http_sends_it_anyway(directory: Path, token_file: Path,
                                       sent: list[tuple[str, dict[str, str]]]) -> None:
    result = runner.invoke(app, ["apply", str(directory), "--api", UNROUTABLE,
                                 "--token-file", str(token_file), "--insecure-http"])
    assert result.exit_code == int(Exit.REFUSED), result.output  # sent: the fake refused it
    assert sent == [(f"{UNROUTABLE}/v1/apply", {"Authorization": f"Bearer {TOKEN}"})]
    assert "--insecure-http" in runner.invoke(app, ["diff", "--help"]).output


@pytest.mark.parametrize(("api", "token", "insecure", "refused"), [
    ("http://127.0.0.1:8080", TOKEN, False, False),
    ("http://127.10.0.3:8080", TOKEN, False, False),  # 127.0.0.0/8
    ("http://[::1]:8080", TOKEN, False, False),
    ("http://localhost:8080", TOKEN, False, False),
    ("HTTP://LOCALHOST:8080/", TOKEN, False, False),
    ("https://cp.example:8443", TOKEN, False, False),  # TLS: fine anywhere
    ("http://cp.example:8080", None, False, False),  # no token to leak
    ("http://cp.example:8080", TOKEN, True, False),  # said so
    ("http://cp.example:8080", TOKEN, False, True),
    ("http://10.0.0.5:8080", TOKEN, False, True),
    ("http://0.0.0.0:8080", TOKEN, False, True),
    ("http://[2001:db8::1]:8080", TOKEN, False, True),
    ("http://127.0.0.1.example:8080", TOKEN, False, True),  # a name, not 127.0.0.1
    ("http://localhost.example:8080", TOKEN, False, True),
])
def test_what_counts_as_loopback(api: str, token: str | None, insecure: bool,
                                 refused: bool) -> None:
    if refused:
        with pytest.raises(ApiFailure, match="refusing to send the API token") as caught:
            refuse_plaintext_token(api, token, insecure)
        assert caught.value.code == Exit.USAGE
    else:
        refuse_plaintext_token(api, token, insecure)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RuleStore]:
    store = open_store(None, tmp_path / "cp", validator=ruleset_validator())
    yield store
    store.close()


def test_a_loopback_api_still_gets_the_token(directory: Path, token_file: Path,
                                             store: RuleStore) -> None:
    """The real API on 127.0.0.1, reached as 127.0.0.1 and as localhost."""
    with serving(create_app(store, ApiSettings(tokens=Tokens.of([("ci", TOKEN)])))) as url:
        port = url.rsplit(":", 1)[1]
        for api in (url, f"http://localhost:{port}"):
            result = runner.invoke(app, ["diff", str(directory), "--api", api,
                                         "--token-file", str(token_file)])
            assert result.exit_code == 0, result.output
        result = runner.invoke(app, ["apply", str(directory), "--api", url,
                                     "--token-file", str(token_file)])
        assert result.exit_code == 0, result.output
    assert store.current()[0] == 1
    assert store.version(1).info.author == "ci"
