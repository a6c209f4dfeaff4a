"""Hostile input to the REST API, over real HTTP to the real uvicorn server: bodies
bounded by the bytes read (chunked ones too), deeply nested JSON, and tokens scoped to
the rules of some owners."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from control_plane.api import ApiSettings, TokenError, Tokens, create_app, ruleset_validator
from control_plane.api.rule_input import _LARGE_INPUT, LARGE_INPUT_BYTES
from control_plane.store import RuleStore, open_store
from tests.unit.control_plane.conftest import serving

LIMIT = 64 * 1024
ADMIN_TOKEN = "admin-token-0123456789"
PAYMENTS_TOKEN = "payments-token-0123456789"
OPS_TOKEN = "ops-token-0123456789abc"
TOKEN_FILE = f"""\
# every rule
admin:{ADMIN_TOKEN}
# only the rules of the payments directory
payments-ci:{PAYMENTS_TOKEN} owner=dir:payments
# the payments directory, the team directories and the rules written through REST
ops:{OPS_TOKEN} owner=dir:payments owner=dir:team-* owner=@rest
"""


class Api:
    """Requests over one HTTP/1.1 connection per call, to the served app."""

    def __init__(self, url: str, store: RuleStore) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.store = store

    def call(self, method: str, path: str, body: bytes | Iterator[bytes] | None = None,
             token: str = ADMIN_TOKEN, headers: dict[str, str] | None = None
             ) -> tuple[int, str, Any]:
        """(status, content type, JSON body). A generator body goes chunked, without a
        Content-Length."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            sent = {"Authorization": f"Bearer {token}", **(headers or {})}
            if body is not None and not isinstance(body, bytes):
                sent["Transfer-Encoding"] = "chunked"
            connection.request(method, path, body=body, headers=sent,
                               encode_chunked=body is not None and not isinstance(body, bytes))
            response = connection.getresponse()
            text = response.read()
            return (response.status, response.getheader("content-type", ""),
                    json.loads(text) if text else None)
        finally:
            connection.close()


def served(tmp_path: Path, tokens: str) -> Iterator[Api]:
    store = open_store(None, tmp_path / "cp", validator=ruleset_validator())
    tokens_path = tmp_path / "tokens"
    tokens_path.write_text(tokens)
    app = create_app(store, ApiSettings(tokens=Tokens.load(tokens_path, environ={}),
                                        max_body_bytes=LIMIT))
    with serving(app) as url:
        yield Api(url, store)
    store.close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    yield from served(tmp_path, f"admin:{ADMIN_TOKEN}\n")


@pytest.fixture
def scoped_api(tmp_path: Path) -> Iterator[Api]:
    yield from served(tmp_path, TOKEN_FILE)


def chunks(data: bytes, size: int = 4096) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start:start + size]


def padded_rule_file(rule_id: str, size: int) -> str:
    """A valid rule file of about `size` bytes (the rest is a YAML comment)."""
    text = f"rules:\n  - id: {rule_id}\n    action: {{observe: {{}}}}\n"
    return text + "#" + "x" * max(0, size - len(text)) + "\n"


def test_a_chunked_body_cannot_pass_the_size_limit(api: Api) -> None:
    """Without a Content-Length nothing was counted: a chunked /v1/apply of any size
    was read whole and applied, a chunked /v1/dry-run run. Now every endpoint with a
    body answers 413 past the limit, chunked or not, and nothing is stored."""
    apply = json.dumps({"owner": "dir:big", "files": {
        "big.yaml": padded_rule_file("big", 4 * LIMIT)}}).encode()
    dry_run = json.dumps({"rules": padded_rule_file("big", 4 * LIMIT),
                          "records": [{"topic": "t", "value": "v"}]}).encode()
    rule = json.dumps({"action": {"observe": {}}, "description": "x" * 4 * LIMIT}).encode()
    json_type = {"Content-Type": "application/json"}
    for method, path, body, headers in [
        ("POST", "/v1/apply", apply, json_type),
        ("POST", "/v1/apply", apply, {}),  # no media type: FastAPI reads it all the same
        ("POST", "/v1/dry-run", dry_run, json_type),
        ("PUT", "/v1/rules/big", rule, {"If-None-Match": "*"}),
        ("POST", "/v1/validate", padded_rule_file("big", 4 * LIMIT).encode(), {}),
    ]:
        for sent in (chunks(body), body):  # chunked, and with a Content-Length
            status, media, problem = api.call(method, path, sent, headers=headers)
            assert (status, media) == (413, "application/problem+json"), (method, path, problem)
            assert problem["type"] == "urn:keg:problem:too-large"
    assert api.store.head() is None  # nothing was written

    small = json.dumps({"owner": "dir:small", "files": {
        "small.yaml": padded_rule_file("small", LIMIT // 2)}}).encode()
    status, _, body = api.call("POST", "/v1/apply", chunks(small), headers=json_type)
    assert status == 200 and body["new_version"]["number"] == 1  # under the limit: served


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_deeply_nested_json_is_a_422_problem_not_a_500(api: Api) -> None:
    """Python's JSON decoder recurses per level: a PUT nested 20,000 deep was a
    RecursionError, answered 500. Every JSON body deeper than 64 levels is now a 422
    problem that says so, whatever the endpoint and Content-Type."""
    deep_rule = ('{"action": {"observe": {}}, "match": ' + nested(20_000) + "}").encode()
    cases = [
        ("PUT", "/v1/rules/deep", deep_rule, {"If-None-Match": "*"}),
        ("PUT", "/v1/rules/deep", deep_rule, {"If-None-Match": "*",
                                               "Content-Type": "application/json"}),
        ("POST", "/v1/apply", ('{"owner": "dir:x", "files": ' + nested(5000) + "}").encode(),
         {"Content-Type": "application/json"}),
        ("POST", "/v1/dry-run", ('{"rules": ' + nested(5000) + "}").encode(),
         {"Content-Type": "application/json"}),
    ]
    for method, path, body, headers in cases:
        status, media, problem = api.call(method, path, body, headers=headers)
        assert (status, media) == (422, "application/problem+json"), (path, problem)
        assert "nested" in problem["detail"] and "at most 64" in problem["detail"]
    # Strings are not structure: brackets inside them do not count.
    fine = json.dumps({"action": {"observe": {}}, "description": "[" * 4000}).encode()
    status, _, _ = api.call("PUT", "/v1/rules/brackets", fine,
                            headers={"If-None-Match": "*"})
    assert status == 201


def apply_as(api: Api, owner: str, token: str, *rule_ids: str,
             adopt: bool = False) -> tuple[int, Any]:
    text = "rules: []\n" if not rule_ids else "rules:\n" + "".join(
        f"  - id: {rule_id}\n    action: {{observe: {{}}}}\n" for rule_id in rule_ids)
    body = json.dumps({"owner": owner, "files": {f"{owner}.yaml": text},
                       "adopt": adopt}).encode()
    status, _, answer = api.call("POST", "/v1/apply", body, token=token,
                                 headers={"Content-Type": "application/json"})
    return status, answer


def put_rule(api: Api, rule_id: str, token: str) -> int:
    body = json.dumps({"action": {"observe": {}}}).encode()
    status, _, _ = api.call("PUT", f"/v1/rules/{rule_id}", body, token=token,
                            headers={"If-None-Match": "*"})
    return status


def assert_out_of_scope(status: int, problem: Any, *owners: str) -> None:
    assert status == 403, problem
    assert problem["type"] == "urn:keg:problem:out-of-scope"
    assert problem["out_of_scope"] == sorted(owners)


def test_a_token_scoped_to_an_owner_changes_only_that_owners_rules(scoped_api: Api) -> None:
    """Ownership was no auth boundary: any token could apply as any directory, roll
    back anyone's rules, write REST rules. A token scoped with `owner=` now changes
    only the rules of the owners it names (403 problem+json otherwise); reads and dry
    runs stay open to it, and an unscoped token still changes everything."""
    assert apply_as(scoped_api, "dir:billing", ADMIN_TOKEN, "billing-a")[0] == 200  # version 1
    assert put_rule(scoped_api, "rest-made", ADMIN_TOKEN) == 201  # version 2

    status, answer = apply_as(scoped_api, "dir:payments", PAYMENTS_TOKEN, "pay-a", "pay-b")
    assert status == 200 and answer["new_version"]["author"] == "payments-ci"  # version 3

    # Another directory's rules: neither as that owner, nor by taking them over.
    assert_out_of_scope(*apply_as(scoped_api, "dir:billing", PAYMENTS_TOKEN), "dir:billing")
    status, problem = apply_as(scoped_api, "dir:payments", PAYMENTS_TOKEN, "rest-made", adopt=True)
    assert_out_of_scope(status, problem, "@rest (written through REST)")
    # REST-written rules are outside its scope too.
    assert put_rule(scoped_api, "pay-rest", PAYMENTS_TOKEN) == 403
    status, _, problem = scoped_api.call("DELETE", "/v1/rules/rest-made", token=PAYMENTS_TOKEN,
                                  headers={"If-Match": "*"})
    assert_out_of_scope(status, problem, "@rest (written through REST)")
    # A rollback to version 1 would remove its own rules but also the REST one.
    status, _, problem = scoped_api.call("POST", "/v1/versions/1/rollback", token=PAYMENTS_TOKEN)
    assert_out_of_scope(status, problem, "@rest (written through REST)")
    assert scoped_api.store.rules()[0] == 3  # none of that wrote a version

    # What it may do: dry runs (reads) as any owner, and roll back its own change.
    status, _, plan = scoped_api.call("POST", "/v1/apply?dry_run=true", json.dumps(
        {"owner": "dir:billing", "files": {}}).encode(), token=PAYMENTS_TOKEN,
        headers={"Content-Type": "application/json"})
    assert status == 200 and plan["diff"]["removed"] == ["billing-a"]
    status, _, rolled = scoped_api.call("POST", "/v1/versions/2/rollback", token=PAYMENTS_TOKEN)
    assert status == 201 and rolled["number"] == 4
    assert {r.id for r in scoped_api.store.rules()[1]} == {"billing-a", "rest-made"}

    # Globs and @rest: the ops token takes REST rules over for a team directory.
    status, answer = apply_as(scoped_api, "dir:team-red", OPS_TOKEN, "rest-made", adopt=True)
    assert status == 200 and answer["diff"]["owners_changed"] == ["rest-made"]
    assert put_rule(scoped_api, "ops-rest", OPS_TOKEN) == 201
    assert_out_of_scope(*apply_as(scoped_api, "dir:billing", OPS_TOKEN), "dir:billing")
    # The unscoped token may still do anything.
    status, _, _ = scoped_api.call("POST", "/v1/versions/1/rollback", token=ADMIN_TOKEN)
    assert status == 201


@pytest.mark.parametrize(("entry", "message"), [
    ("ci:token-0123456789abcdef scope=dir:x", "'scope=dir:x' is not owner=<owner>"),
    ("ci:token-0123456789abcdef owner=", "'owner=' is not owner=<owner>"),
    ("ci:token-0123456789abcdef owner=has,comma", "entry 3 is not name:token"),
])
def test_token_scopes_that_cannot_be_read_are_refused(entry: str, message: str) -> None:
    with pytest.raises(TokenError, match=message) as refused:
        Tokens.load(None, environ={"KEG_API_TOKENS": f"admin:{ADMIN_TOKEN},{entry}"})
    assert "0123456789abcdef" not in str(refused.value)  # never the token


KEY = "00" * 32  # an AES-256 key, hex


def host_rules(key_file: Path, module: str) -> dict[str, str]:
    """Rules that reach the gateway host: an encryption with the host's key file, and an
    interceptor class (imported and run)."""
    return {
        "encrypt": ("rules:\n  - id: seal\n    match: {topics: {exact: [cards]}}\n"
                    "    action:\n      encrypt:\n        fields: ['$.card']\n"
                    f"        key: {{id: k1, secret: {{file: {key_file}}}}}\n"),
        "interceptor": ("rules:\n  - id: run-code\n    match: {topics: {exact: [cards]}}\n"
                        f"    action: {{interceptor: {{class: '{module}:Hook'}}}}\n"),
    }


def dry_run(api: Api, token: str, body: dict[str, Any]) -> tuple[int, Any]:
    status, _, answer = api.call("POST", "/v1/dry-run", json.dumps(body).encode(), token=token,
                                 headers={"Content-Type": "application/json"})
    return status, answer


def test_only_an_unscoped_token_runs_rules_that_reach_the_gateway_host(
        scoped_api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dry run was a read: any token (a team's, scoped to its own rules; anyone with
    --public-reads) had the control plane import and run an interceptor class it named,
    and encrypt or decrypt with any key file of the host (an oracle for the host's
    keys); a scoped token could also write such rules. Rules that use the host's files,
    environment or code now run and are written only for a token without an owner
    scope: 403 problem+json for the others, and nothing runs."""
    key_file = tmp_path / "host.key"
    key_file.write_text(KEY)
    ran = tmp_path / "ran"
    module = "keg_host_access_probe"
    (tmp_path / f"{module}.py").write_text(
        f"import pathlib\npathlib.Path({str(ran)!r}).touch()\n"
        "class Hook:\n    def intercept(self, record):\n        return record\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rules = host_rules(key_file, module)
    record = {"topic": "cards", "value": json.dumps({"card": "4111"})}

    for text in rules.values():
        status, problem = dry_run(scoped_api, OPS_TOKEN, {"rules": text, "records": [record]})
        assert status == 403 and problem["type"] == "urn:keg:problem:host-resources", problem
        assert "scoped to" in problem["detail"] and KEY not in json.dumps(problem)
    assert not ran.exists()  # the class was never imported

    # A scoped writer writes no such rule (PUT, /v1/apply); what it may write it still may.
    status, _, problem = scoped_api.call(
        "PUT", "/v1/rules/seal", json.dumps({
            "match": {"topics": {"exact": ["cards"]}},
            "action": {"encrypt": {"fields": ["$.card"],
                                   "key": {"id": "k1", "secret": {"env": "HOME"}}}}}).encode(),
        token=OPS_TOKEN, headers={"If-None-Match": "*"})
    assert status == 403 and "the environment variable HOME" in problem["detail"]
    body = json.dumps({"owner": "dir:payments", "files": {"a.yaml": rules["encrypt"]}}).encode()
    status, _, problem = scoped_api.call("POST", "/v1/apply", body, token=PAYMENTS_TOKEN,
                                         headers={"Content-Type": "application/json"})
    assert status == 403 and f"the file {key_file}" in problem["detail"]
    assert scoped_api.store.rules()[0] == 0
    assert apply_as(scoped_api, "dir:payments", PAYMENTS_TOKEN, "pay-a")[0] == 200

    # The unscoped token may: it writes the encryption; then the team re-applies its
    # directory with that rule unchanged (its own change adds nothing of the host).
    status, _, _ = scoped_api.call("POST", "/v1/apply", body, token=ADMIN_TOKEN,
                                   headers={"Content-Type": "application/json"})
    assert status == 200
    status, _, _ = scoped_api.call("POST", "/v1/apply", body, token=PAYMENTS_TOKEN,
                                   headers={"Content-Type": "application/json"})
    assert status == 200
    # Records through the live set with the host's key: not for a scoped token; its
    # requests (no records) still are.
    status, problem = dry_run(scoped_api, OPS_TOKEN, {"records": [record]})
    assert status == 403 and problem["type"] == "urn:keg:problem:host-resources"
    status, answer = dry_run(scoped_api, OPS_TOKEN,
                             {"requests": [{"api": "Metadata", "version": 12}]})
    assert status == 200, answer
    status, answer = dry_run(scoped_api, ADMIN_TOKEN, {"records": [record]})
    assert status == 200 and answer["records"][0]["status"] == "modified", answer
    status, answer = dry_run(scoped_api, ADMIN_TOKEN, {"rules": rules["interceptor"],
                                                       "records": [record]})
    assert status == 200 and ran.exists()


def test_one_large_rule_input_is_read_at_a_time(tmp_path: Path) -> None:
    """A large rule file costs seconds of CPU under the GIL: four 8 MiB validations at
    once took 200 s each and /healthz answered in 3.7 s. While one large input is being
    read another is answered 429 (Retry-After); small ones are never held."""
    store = open_store(None, tmp_path / "cp", validator=ruleset_validator())
    tokens_path = tmp_path / "tokens"
    tokens_path.write_text(f"admin:{ADMIN_TOKEN}\n")
    app = create_app(store, ApiSettings(tokens=Tokens.load(tokens_path, environ={})))
    large = padded_rule_file("big", LARGE_INPUT_BYTES + 1).encode()
    small = padded_rule_file("small", 1000).encode()
    with serving(app) as url:
        api = Api(url, store)
        assert _LARGE_INPUT.acquire(blocking=False)  # as a large input being read does
        try:
            status, _, problem = api.call("POST", "/v1/validate", large)
            assert status == 429 and problem["type"].endswith(":busy"), problem
            apply = json.dumps({"owner": "dir:big", "files": {"big.yaml": large.decode()}})
            assert api.call("POST", "/v1/apply", apply.encode(),
                            headers={"Content-Type": "application/json"})[0] == 429
            assert api.call("POST", "/v1/validate", small)[0] == 200
        finally:
            _LARGE_INPUT.release()
        assert api.call("POST", "/v1/validate", large)[0] == 200
    store.close()
