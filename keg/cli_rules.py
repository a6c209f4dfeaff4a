"""GitOps commands against a control plane: `keg diff DIR`, `keg apply DIR [--watch]`,
and the history: `keg versions`, `keg rollback N`.

The directory is the source of truth for the rules it holds: `apply` uploads its
files (the control plane loads them with the same loader as `keg validate`) as the
owner `dir:<name>`, in one new version, and the control plane refuses REST writes to
those rules. Exit codes, for CI:

    0  done (apply: applied or nothing to change; diff: no differences, or any
       differences without --exit-code)
    1  the rule directory is invalid (file:line errors, as `keg validate`)
    2  usage error
    3  diff --exit-code: there are differences
    4  the control plane refused (token, ownership conflict, invalid on its side, no
       such version)
    5  the control plane cannot be reached or failed
    6  the fleet rejected the directory's version (an ext_proc instance NACKed it: it
       is not served, the fleet runs the last good version), or --wait: not every
       connected instance applied it within --wait-timeout

Output never calls a version live unless the fleet applied it: the control plane
answers with the latest version's status (pending, applied, rejected) and the live
version (docs/control-plane-api.md, "Versions and the fleet").

The API token never crosses a network in plain text: with a token, an http:// --api
must be a loopback address (127.0.0.0/8, ::1, localhost); anything else needs
https://, or --insecure-http when something else protects the way there (exit 2
otherwise, before any connection).
"""

from __future__ import annotations

import ipaddress
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Any, Final
from urllib.parse import urlsplit

import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn
from rich.table import Table
from rich.text import Text

from control_plane.fleet import EXT_PROC
from control_plane.snapshot import RULES
from filter_rules import RuleSetInvalid, load_rule_dir
from filter_rules.loader import RULE_FILE_SUFFIXES
from keg.console import error_line, make_console, plain_column, styled

#: This module's commands; keg/cli.py adds them to keg's app.
commands = typer.Typer()

TOKEN_ENV: Final = "KEG_API_TOKEN"
API_ENV: Final = "KEG_API_URL"
console = make_console()
out = make_console(stderr=False)


class Exit(IntEnum):
    OK = 0
    INVALID = 1
    USAGE = 2
    CHANGES = 3
    REFUSED = 4
    UNREACHABLE = 5
    NOT_APPLIED = 6


class ApiFailure(Exception):
    def __init__(self, code: Exit, message: str, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.errors = errors or []


Directory = Annotated[Path, typer.Argument(help="Rule directory (YAML files).",
                                           file_okay=False)]
ApiUrl = Annotated[str, typer.Option("--api", envvar=API_ENV,
                                     help="Control-plane API, e.g. http://127.0.0.1:8080.")]
TokenFile = Annotated[Path | None, typer.Option(
    "--token-file", help=f"File holding the API token (or set {TOKEN_ENV}).", dir_okay=False)]
Owner = Annotated[str | None, typer.Option(
    help="Owner of the directory's rules (default: dir:<directory name>).")]
InsecureHttp = Annotated[bool, typer.Option(
    "--insecure-http",
    help="Allow sending the API token over plain http:// to a host that is not "
         "loopback (refused by default: use https://; give this only when something "
         "else, such as a VPN or an SSH tunnel, protects the connection).")]
Wait = Annotated[bool, typer.Option(
    help="Then wait until every connected ext_proc instance applied the version "
         "(exit 6 on a NACK or at --wait-timeout).")]
WaitTimeout = Annotated[float, typer.Option(help="Seconds --wait waits for the fleet.",
                                            min=0.1)]


# --- talking to the control plane ----------------------------------------------------


def _token(token_file: Path | None) -> str | None:
    if token_file is not None:
        try:
            lines = token_file.read_text(encoding="utf-8").splitlines()
        except OSError as err:
            raise ApiFailure(Exit.USAGE, f"cannot read token file {token_file}: "
                             f"{err.strerror}") from None
        token = next((t.strip() for t in lines if t.strip() and not t.startswith("#")), "")
        if not token:
            raise ApiFailure(Exit.USAGE, f"token file {token_file} holds no token")
        return token
    return os.environ.get(TOKEN_ENV) or None


def _loopback(host: str) -> bool:
    """Whether `host` names this machine only: localhost, 127.0.0.0/8 or ::1."""
    name = host.lower().rstrip(".")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def refuse_plaintext_token(api: str, token: str | None, insecure_http: bool) -> None:
    """Raises ApiFailure (usage) before any connection when `token` would go in plain
    text (http://) to a host other than loopback and `insecure_http` does not allow it:
    the control plane refuses such tokens too, but by then the token has crossed the
    network."""
    if token is None or insecure_http:
        return
    parts = urlsplit(api.strip())
    if parts.scheme.lower() != "http":
        return
    host = parts.hostname or ""
    if not _loopback(host):
        raise ApiFailure(Exit.USAGE, f"refusing to send the API token in plain text to {api} "
                         f"({host or 'no host'} is not a loopback address): use https://, or "
                         "--insecure-http if something else protects the connection")


@dataclass
class Client:
    api: str
    token: str | None
    insecure_http: bool = False

    def __post_init__(self) -> None:
        refuse_plaintext_token(self.api, self.token, self.insecure_http)

    def apply(self, owner: str, files: dict[str, str], *, dry_run: bool, adopt: bool = False,
              reason: str = "") -> dict[str, Any]:
        body = {"owner": owner, "files": files, "adopt": adopt, "reason": reason}
        return self._call("POST", "/v1/apply", json=body,
                          params={"dry_run": "true"} if dry_run else None)

    def fleet(self) -> dict[str, Any]:
        return self._call("GET", "/v1/fleet")

    def version_info(self, number: int) -> dict[str, Any]:
        info: dict[str, Any] = self._call("GET", f"/v1/versions/{number}")["info"]
        return info

    def versions(self, limit: int) -> dict[str, Any]:
        return self._call("GET", "/v1/versions", params={"limit": limit})

    def rollback(self, number: int, reason: str | None) -> dict[str, Any]:
        return self._call("POST", f"/v1/versions/{number}/rollback",
                          params={"reason": reason} if reason else None)

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        import httpx2

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            response = httpx2.request(method, f"{self.api.rstrip('/')}{path}",
                                      headers=headers, timeout=60.0, **kwargs)
        except httpx2.HTTPError as err:
            raise ApiFailure(Exit.UNREACHABLE, f"cannot reach the control plane at "
                             f"{self.api}: {err}") from None
        if response.status_code >= 400:
            raise _failure(response)
        result: dict[str, Any] = response.json()
        return result


def _failure(response: Any) -> ApiFailure:
    try:
        problem = response.json()
    except ValueError:
        problem = {}
    detail = problem.get("detail") if isinstance(problem, dict) else None
    message = f"control plane answered {response.status_code}: {detail or response.text[:300]}"
    errors = []
    for e in problem.get("errors") or [] if isinstance(problem, dict) else []:
        where = e.get("file") or ""
        if e.get("line") is not None:
            where += f":{e['line']}:{e.get('column') or 1}"
        field = f" {e['field']}:" if e.get("field") else ""
        errors.append(f"{where}:{field} {e.get('message', '')}")
    code = Exit.UNREACHABLE if response.status_code >= 500 else Exit.REFUSED
    return ApiFailure(code, message, errors)


# --- the directory --------------------------------------------------------------------


def _rule_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir()
                  if p.suffix in RULE_FILE_SUFFIXES and not p.name.startswith(".")
                  and p.is_file())


def _read(directory: Path, progress: Progress | None = None) -> dict[str, str]:
    """The directory's files (path -> text), after checking them as `keg validate` does.

    Raises RuleSetInvalid: nothing invalid is ever uploaded.
    """
    load_rule_dir(directory)
    files = _rule_files(directory)
    task = progress.add_task("reading rule files", total=len(files)) if progress else None
    contents = {}
    for path in files:
        contents[str(path)] = path.read_text(encoding="utf-8-sig")
        if progress is not None and task is not None:
            progress.advance(task)
    return contents


def _owner(directory: Path, owner: str | None) -> str:
    return owner or f"dir:{directory.resolve().name}"


def _print_invalid(directory: Path, err: RuleSetInvalid) -> None:
    for error in err.errors:
        typer.echo(str(error), err=True)
    typer.echo(f"{directory}: {len(err.errors)} problem(s); nothing applied", err=True)


def _print_failure(failure: ApiFailure) -> None:
    console.print(error_line(str(failure)))
    for line in failure.errors:
        typer.echo(line, err=True)


def _summary(diff: dict[str, Any]) -> Text:
    parts: list[str | tuple[str, str]] = [
        (f"+{len(diff['added'])} added", "green"), ", ",
        (f"~{len(diff['changed'])} changed", "yellow"), ", ",
        (f"-{len(diff['removed'])} removed", "red")]
    if diff.get("owners_changed"):
        parts.append(f", {len(diff['owners_changed'])} adopted")
    return styled(*parts)


def _standing(result: dict[str, Any]) -> str:
    """What the fleet made of the latest version an apply or diff answer names."""
    version, live = result["version"], result.get("live_version")
    runs = f"the fleet runs version {live}" if live else "the fleet runs no version yet"
    status = result.get("status")
    if status == "rejected":
        return (f"version {version} was REJECTED by the fleet ({result.get('status_detail')}); "
                f"it is not served, {runs}")
    if status == "applied" and live == version:
        return f"version {version} is live"
    if status == "applied":
        return f"version {version} was applied; {runs}"
    return f"version {version} is not applied by the fleet yet; {runs}"


def _rejected(result: dict[str, Any]) -> bool:
    return result.get("status") == "rejected"


def _print_diff(unified: str) -> None:
    """A unified diff on stdout: coloured on a terminal, always every line whole."""
    styles = {"+": "green", "-": "red", "@": "cyan"}
    for line in unified.splitlines():
        style = "bold" if line.startswith(("+++", "---")) else styles.get(line[:1], "")
        out.print(line, style=style)


def _differs(diff: dict[str, Any]) -> bool:
    return bool(diff["added"] or diff["changed"] or diff["removed"] or diff["reordered"]
                or diff["owners_changed"])


def _progress() -> Progress:
    return Progress(SpinnerColumn(), plain_column(), BarColumn(),
                    TaskProgressColumn(), console=console, transient=True)


# --- commands -------------------------------------------------------------------------


@commands.command()
def diff(
    directory: Directory, api: ApiUrl, token_file: TokenFile = None, owner: Owner = None,
    exit_code: Annotated[bool, typer.Option(
        "--exit-code", help="Exit 3 when the directory differs from what is live.")] = False,
    insecure_http: InsecureHttp = False,
) -> None:
    """Show what `keg apply DIR` would change against the live rules.

    Lists the rules added, changed and removed, then a unified diff of the rule set
    as YAML. Needs a token only if the control plane protects reads.
    """
    try:
        files = _read(directory)
        client = Client(api, _token(token_file), insecure_http)
        result = client.apply(_owner(directory, owner), files, dry_run=True)
    except RuleSetInvalid as err:
        _print_invalid(directory, err)
        raise typer.Exit(int(Exit.INVALID)) from None
    except ApiFailure as failure:
        _print_failure(failure)
        raise typer.Exit(int(failure.code)) from None
    changes = result["diff"]
    if not _differs(changes):
        typer.echo(f"no differences: {directory} is version {result['version']}; "
                   f"{_standing(result)}")
        raise typer.Exit(int(Exit.NOT_APPLIED if _rejected(result) else Exit.OK))
    for kind, sign in (("added", "+"), ("changed", "~"), ("removed", "-")):
        for rule_id in changes[kind]:
            typer.echo(f"{sign} {rule_id}")
    for rule_id in changes["owners_changed"]:
        typer.echo(f"@ {rule_id} (taken over by {result['owner']})")
    if changes["unified"]:
        _print_diff(changes["unified"])
    console.print(styled(f"{directory} vs version {result['version']}: ",
                         _summary(changes), f" ({_standing(result)})"))
    raise typer.Exit(int(Exit.CHANGES if exit_code else Exit.OK))


@commands.command()
def apply(
    directory: Directory, api: ApiUrl, token_file: TokenFile = None, owner: Owner = None,
    reason: Annotated[str | None, typer.Option(
        help="Why (recorded with the version), e.g. the commit.")] = None,
    adopt: Annotated[bool, typer.Option(
        help="Take over rules with the same ids that nobody owns (written through REST).")]
        = False,
    watch: Annotated[bool, typer.Option(
        help="Keep running: apply again whenever the files change (valid sets only).")]
        = False,
    wait: Wait = False,
    wait_timeout: WaitTimeout = 60.0,
    insecure_http: InsecureHttp = False,
) -> None:
    """Make the live rules match a rule directory (GitOps), with a progress bar.

    Uploads the directory's rule set as the owner of its rules: one new version with
    what was added, changed and removed (none when it is already live). With --wait,
    returns once every ext_proc instance connected to the control plane runs that
    version. With --watch, applies again whenever the files change; invalid files are
    reported and skipped.
    """
    if wait and watch:
        console.print(error_line("--wait and --watch do not go together"))
        raise typer.Exit(int(Exit.USAGE))
    try:
        client = Client(api, _token(token_file), insecure_http)
    except ApiFailure as failure:
        _print_failure(failure)
        raise typer.Exit(int(failure.code)) from None
    who = _owner(directory, owner)
    why = reason or f"keg apply {directory}"
    if watch:
        raise typer.Exit(int(_watch(client, directory, who, why, adopt)))
    code, live = _apply_once(client, directory, who, why, adopt)
    if wait and live is not None:
        code = _wait_for_fleet(client, live, wait_timeout)
    raise typer.Exit(int(code))


def _apply_once(client: Client, directory: Path, owner: str, reason: str,
                adopt: bool) -> tuple[Exit, int | None]:
    """One apply: its exit code, and the version now live (None when it failed)."""
    try:
        with _progress() as progress:
            files = _read(directory, progress)
            step = progress.add_task(f"applying to {client.api}", total=1)
            result = client.apply(owner, files, dry_run=False, adopt=adopt, reason=reason)
            progress.advance(step)
    except RuleSetInvalid as err:
        _print_invalid(directory, err)
        return Exit.INVALID, None
    except ApiFailure as failure:
        _print_failure(failure)
        return failure.code, None
    version = result["new_version"]
    if version is None:
        console.print(f"nothing to change: {directory} is version {result['version']}; "
                      f"{_standing(result)}")
        if _rejected(result):
            return Exit.NOT_APPLIED, None
    else:
        console.print(styled(("applied", "bold green"), f" {directory} as {owner}: version "
                             f"{version['number']} (", _summary(result["diff"]), ")"))
    return Exit.OK, int(result["version"] if version is None else version["number"])


RULE_SET_TYPE: Final = RULES.rsplit("/", 1)[-1]  # how /v1/fleet names the type


@dataclass(frozen=True)
class Rollout:
    """Where the connected ext_proc instances stand with one rule-set version."""

    applied: tuple[str, ...]
    pending: tuple[str, ...]
    nacked: tuple[tuple[str, str], ...]  # (node id, the instance's error)

    @classmethod
    def of(cls, nodes: list[dict[str, Any]], version: int) -> Rollout:
        applied, pending, nacked = [], [], []
        for node in nodes:
            if node.get("role") != EXT_PROC or not node.get("connected"):
                continue
            state = (node.get("types") or {}).get(RULE_SET_TYPE) or {}
            nack = state.get("last_nack") or {}
            if _number(state.get("applied_version")) >= version:
                applied.append(node["node_id"])  # this version, or a later one
            elif _number(nack.get("version")) == version:
                nacked.append((node["node_id"], str(nack.get("error"))))
            else:
                pending.append(node["node_id"])
        return cls(tuple(applied), tuple(pending), tuple(nacked))


def _with_store_rejection(client: Client, version: int, state: Rollout) -> Rollout:
    """`state`, with the instance that NACKed `version` when the store rejected it. The
    fleet then runs the version before, and the instance's last NACK may be of that one
    (it could take neither): waiting on the fleet alone waited out --wait-timeout."""
    info = client.version_info(version)
    if info.get("status") != "rejected":
        return state
    node, _, error = str(info.get("status_detail") or "").partition(": ")
    return Rollout(state.applied, tuple(p for p in state.pending if p != node),
                   ((node, error),))


def _number(version: object) -> int:
    try:
        return int(str(version))
    except ValueError:
        return -1  # never applied


def _wait_for_fleet(client: Client, version: int, timeout: float, poll_s: float = 0.2) -> Exit:
    deadline = time.monotonic() + timeout
    try:
        with _progress() as progress:
            task = progress.add_task(f"ext_proc instances on version {version}", total=None)
            while True:
                fleet = client.fleet()
                if not fleet.get("available"):
                    console.print(error_line(f"{client.api} has no fleet view (an API "
                                             f"without xDS): cannot wait for the instances"))
                    return Exit.NOT_APPLIED
                state = Rollout.of(fleet["nodes"], version)
                total = len(state.applied) + len(state.pending) + len(state.nacked)
                progress.update(task, total=total, completed=len(state.applied))
                if state.nacked or not state.pending or time.monotonic() > deadline:
                    break
                state = _with_store_rejection(client, version, state)
                if state.nacked:
                    break
                time.sleep(poll_s)
    except ApiFailure as failure:
        _print_failure(failure)
        return failure.code
    for node_id, error in state.nacked:
        console.print(styled(("NACK", "red"), f" {node_id} refused version {version}: "
                             f"{error}"))
    if state.nacked:
        return Exit.NOT_APPLIED
    if state.pending:
        console.print(styled((f"not applied within {timeout:g} s", "red"),
                             f" by {len(state.pending)} instance(s): "
                             f"{', '.join(state.pending)}"))
        return Exit.NOT_APPLIED
    if not state.applied:
        console.print("no ext_proc instance is connected: nothing to wait for")
    else:
        console.print(f"version {version} applied by all {len(state.applied)} connected "
                      f"ext_proc instance(s)")
    return Exit.OK


def _changes(directory: Path, stop: threading.Event) -> Iterator[bool]:
    """True as soon as the watcher is up, then True per batch of file changes
    (debounced), and False on each quiet tick (about 5 a second, for retries). The first
    comes only once changes are being seen, so nothing written before it can be missed."""
    import watchfiles

    def relevant(_: watchfiles.Change, path: str) -> bool:
        name = Path(path).name
        return Path(path).suffix in RULE_FILE_SUFFIXES and not name.startswith(".")

    up = False
    for changes in watchfiles.watch(directory, watch_filter=relevant, stop_event=stop,
                                    debounce=300, recursive=False, raise_interrupt=False,
                                    rust_timeout=200, yield_on_timeout=True):
        yield bool(changes) or not up
        up = True


# How long `keg apply --watch` waits before applying again after the control plane could
# not be reached (it applied again only on the next file change: the live rules stayed
# behind the directory until someone edited a file).
WATCH_RETRY_S: Final = 5.0


def _watch(client: Client, directory: Path, owner: str, reason: str, adopt: bool,
           stop: threading.Event | None = None) -> Exit:
    """Apply once the watcher is up, then on every change, and again every WATCH_RETRY_S
    while the control plane cannot be reached, until Ctrl-C."""
    first = True
    retry_at: float | None = None
    for changed in _changes(directory, stop or threading.Event()):
        if not changed and (retry_at is None or time.monotonic() < retry_at):
            continue
        code, _live = _apply_once(client, directory, owner, reason, adopt)
        if first and code in (Exit.REFUSED, Exit.USAGE):
            return code  # a wrong token or a conflict will not fix itself
        if first:
            console.print(f"watching {directory} (Ctrl-C stops)")
            first = False
        retry_at = time.monotonic() + WATCH_RETRY_S if code == Exit.UNREACHABLE else None
        if retry_at is not None:
            console.print(f"trying again in {WATCH_RETRY_S:.0f} s", style="yellow")
        if code == Exit.INVALID:
            console.print("the rules are unchanged until the files are valid", style="yellow")
    console.print("stopped watching")
    return Exit.OK


# --- the history ----------------------------------------------------------------------

STATUS_STYLES: Final = {"applied": "green", "rejected": "red", "pending": "yellow"}


@commands.command()
def versions(
    api: ApiUrl, token_file: TokenFile = None,
    limit: Annotated[int, typer.Option(help="How many versions, newest first.",
                                       min=1, max=1000)] = 20,
    as_json: Annotated[bool, typer.Option(
        "--json", help="The API's answer as JSON (for scripts) instead of a table.")] = False,
    insecure_http: InsecureHttp = False,
) -> None:
    """List the rule set's versions, newest first: when, who, what and why, and what the
    fleet made of each (applied, rejected, pending). `keg rollback N` restores one."""
    try:
        answer = Client(api, _token(token_file), insecure_http).versions(limit)
    except ApiFailure as failure:
        _print_failure(failure)
        raise typer.Exit(int(failure.code)) from None
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    if not answer["versions"]:
        typer.echo("no versions yet: nothing was ever applied or written")
        return
    table = Table("version", "created", "author", "operation", "rules", "status", "reason",
                  box=None, header_style="bold")
    for v in answer["versions"]:
        operation = v["operation"]
        if v.get("parent") is not None:
            operation += f" to {v['parent']}"
        status = Text(v["status"], style=STATUS_STYLES.get(v["status"], ""))
        if v["status"] == "rejected" and v.get("status_detail"):
            status.append(f" ({v['status_detail']})")
        table.add_row(str(v["number"]), str(v["created_at"])[:19].replace("T", " "),
                      Text(v["author"]), operation, str(v["rule_count"]), status,
                      Text(v["reason"]))
    out.print(table)
    if answer.get("next_before"):
        typer.echo(f"older versions: --limit {min(1000, limit * 2)}")


@commands.command()
def rollback(
    number: Annotated[int, typer.Argument(help="The version whose rules to restore.",
                                          min=1)],
    api: ApiUrl, token_file: TokenFile = None,
    reason: Annotated[str | None, typer.Option(
        help="Why (recorded with the new version); default: \"rollback to version N\".")]
        = None,
    wait: Wait = False,
    wait_timeout: WaitTimeout = 60.0,
    insecure_http: InsecureHttp = False,
) -> None:
    """Restore the rules of an earlier version, as a new version (the history keeps
    everything). The served rule directory's rules (`keg up --rules`) stay as the
    directory says. With --wait, returns once every connected ext_proc instance runs it.
    """
    try:
        client = Client(api, _token(token_file), insecure_http)
        info = client.rollback(number, reason)
    except ApiFailure as failure:
        _print_failure(failure)
        raise typer.Exit(int(failure.code)) from None
    console.print(styled(("rolled back", "bold green"), f" to version {number}: version "
                         f"{info['number']} ({info['rule_count']} rules)"))
    if wait:
        raise typer.Exit(int(_wait_for_fleet(client, int(info["number"]), wait_timeout)))
