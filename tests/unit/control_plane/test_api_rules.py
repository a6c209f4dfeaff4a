"""/v1/rules and /v1/apply: CRUD with ETags, auth, invalid rules, directory ownership."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from control_plane.api import ApiSettings, Tokens, create_app
from control_plane.store import RuleStore
from keg.cli import app
from tests.unit.control_plane.conftest import ADMIN, CI, client, public_client, rule_json, store

__all__ = ["client", "public_client", "store"]

PROBLEM = "application/problem+json"


def create(client: TestClient, rule_id: str, **extra: object) -> str:
    response = client.put(f"/v1/rules/{rule_id}", content=rule_json(rule_id, **extra),
                          headers={**ADMIN, "If-None-Match": "*"})
    assert response.status_code == 201, response.text
    return response.headers["ETag"]


def test_create_read_update_delete_with_etags(client: TestClient) -> None:
    etag = create(client, "audit-all", description="everything")
    got = client.get("/v1/rules/audit-all", headers=ADMIN)
    assert got.status_code == 200 and got.headers["ETag"] == etag
    assert got.json()["rule"]["description"] == "everything"
    assert got.json()["owner"] is None
    assert client.get("/v1/rules/audit-all", headers={**ADMIN, "If-None-Match": etag}
                      ).status_code == 304

    updated = client.put("/v1/rules/audit-all", content=rule_json("audit-all", order=2),
                         headers={**ADMIN, "If-Match": etag, "X-Keg-Reason": "run it first"})
    assert updated.status_code == 200 and updated.json()["changed"]
    assert updated.json()["new_version"]["reason"] == "run it first"
    assert updated.json()["new_version"]["author"] == "admin"
    new_etag = updated.headers["ETag"]
    assert new_etag != etag

    same = client.put("/v1/rules/audit-all", content=rule_json("audit-all", order=2),
                      headers={**ADMIN, "If-Match": new_etag})
    assert same.status_code == 200 and not same.json()["changed"] and same.json()["version"] == 2

    listed = client.get("/v1/rules", headers=ADMIN).json()
    assert listed["version"] == 2 and [r["id"] for r in listed["rules"]] == ["audit-all"]

    deleted = client.delete("/v1/rules/audit-all?reason=not%20needed",
                            headers={**ADMIN, "If-Match": new_etag})
    assert deleted.status_code == 200
    assert deleted.json()["new_version"]["operation"] == "delete"
    assert deleted.json()["new_version"]["reason"] == "not needed"
    assert client.get("/v1/rules/audit-all", headers=ADMIN).status_code == 404


def test_the_id_may_come_from_the_url_but_must_agree(client: TestClient) -> None:
    body = json.dumps({"action": {"observe": {}}})
    assert client.put("/v1/rules/from-url", content=body, headers=ADMIN).status_code == 201
    wrong = client.put("/v1/rules/other", content=rule_json("not-other"), headers=ADMIN)
    assert wrong.status_code == 422
    assert wrong.json()["errors"][0]["field"] == "id"


def test_etag_conflicts_are_412_and_missing_etags_428(client: TestClient) -> None:
    etag = create(client, "r1")
    stale = client.put("/v1/rules/r1", content=rule_json("r1", order=1),
                       headers={**ADMIN, "If-Match": '"0000"'})
    assert stale.status_code == 412
    assert stale.headers["content-type"] == PROBLEM
    assert stale.headers["ETag"] == etag  # the current one, to re-read
    assert stale.json()["type"] == "urn:keg:problem:etag-mismatch"
    assert client.put("/v1/rules/r1", content=rule_json("r1"),
                      headers={**ADMIN, "If-None-Match": "*"}).status_code == 412
    missing = client.put("/v1/rules/r1", content=rule_json("r1", order=1), headers=ADMIN)
    assert missing.status_code == 428 and "If-Match" in missing.json()["detail"]
    assert client.delete("/v1/rules/r1", headers=ADMIN).status_code == 428
    assert client.delete("/v1/rules/r1", headers={**ADMIN, "If-Match": '"x"'}).status_code == 412
    assert client.put("/v1/rules/r1", content=rule_json("r1", order=1),
                      headers={**ADMIN, "If-Match": f'"nope", {etag}'}).status_code == 200
    assert client.put("/v1/rules/r1", content=rule_json("r1"),
                      headers={**ADMIN, "If-None-Match": '"abc"'}).status_code == 400


def test_writes_need_a_valid_bearer_token(client: TestClient) -> None:
    body = rule_json("r1")
    none = client.put("/v1/rules/r1", content=body)
    assert none.status_code == 401 and none.headers["content-type"] == PROBLEM
    assert none.headers["WWW-Authenticate"].startswith("Bearer")
    basic = client.put("/v1/rules/r1", content=body, headers={"Authorization": "Basic YTpi"})
    assert basic.status_code == 401
    wrong = client.put("/v1/rules/r1", content=body,
                       headers={"Authorization": "Bearer not-a-token-of-ours"})
    assert wrong.status_code == 403 and wrong.json()["type"] == "urn:keg:problem:forbidden"
    assert "not-a-token-of-ours" not in wrong.text
    assert client.delete("/v1/rules/r1", headers={"If-Match": "*"}).status_code == 401
    assert client.post("/v1/versions/1/rollback").status_code == 401
    assert client.post("/v1/apply", json={"owner": "dir:x", "files": {}}).status_code == 401
    # Reads need a token too unless reads are public.
    assert client.get("/v1/rules").status_code == 401
    assert client.get("/v1/rules", headers=CI).status_code == 200


@pytest.mark.parametrize("body", [b"{}", b"{not json", b"[1]", b'{"owner": 5}'])
@pytest.mark.parametrize("public_reads", [False, True])
def test_a_caller_without_a_token_is_told_401_whatever_body_it_sends(
        store: RuleStore, body: bytes, public_reads: bool) -> None:
    """/v1/apply validated its body before it asked for a token, and an unreadable JSON
    body was a 422 on every route (FastAPI reads it before any dependency): an anonymous
    caller learned about a route it may not use before it was told to authenticate
    (regression). Every route that needs a token now answers 401 first."""
    anonymous = TestClient(create_app(store, ApiSettings(tokens=Tokens.of([("admin", "a" * 24)]),
                                                         public_reads=public_reads)))
    paths = anonymous.get("/openapi.json", headers={"Authorization": f"Bearer {'a' * 24}"}
                          ).json()["paths"]
    writes = [(method.upper(), re.sub(r"\{[^}]+\}", "1", path))
              for path, operations in paths.items() for method in operations
              if method not in ("get", "head")]
    # Reads (dry runs, validation) are anyone's when reads are public.
    public = {"/v1/validate", "/v1/dry-run"} if public_reads else set()
    assert len(writes) >= 6
    for method, path in writes:
        answer = anonymous.request(method, path, content=body,
                                   headers={"content-type": "application/json"})
        want = 401 if path not in public else 200 if body == b"{}" else 422
        assert answer.status_code == want, (method, path, answer.text)


def test_a_rule_body_without_its_id_keeps_the_location_of_its_errors(client: TestClient) -> None:
    """The URL gives the id; the errors still say where in the body they are."""
    response = client.put("/v1/rules/r1", content='{"match": {"topic": "a"},\n "action": {}}',
                          headers=ADMIN)
    assert response.status_code == 422
    errors = {e["field"]: (e["line"], e["column"]) for e in response.json()["errors"]}
    assert errors["match.topic"] == (1, 12)


@pytest.mark.parametrize("content_type", ["application/json", "text/plain"])
def test_a_json_body_that_repeats_a_key_is_refused(client: TestClient, content_type: str) -> None:
    """Decoders keep the last copy of a repeated key without a word: an `action` written
    twice became the second one. Every JSON body of the API is refused instead."""
    response = client.put("/v1/rules/r1", headers={**ADMIN, "Content-Type": content_type},
                          content='{"action": {"observe": {}}, "action": {"deny": {}}}')
    assert response.status_code == 422 and response.headers["content-type"] == PROBLEM
    (error,) = response.json()["errors"]
    assert (error["field"], error["message"]) == ("action", "duplicate key 'action'")
    plan = '{"owner": "dir:rules", "owner": "dir:other", "files": {}}'
    refused = client.post("/v1/apply", content=plan,
                          headers={**ADMIN, "Content-Type": "application/json"})
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "owner"
    assert client.get("/v1/rules", headers=ADMIN).json()["rules"] == []


def test_reads_can_be_public_writes_never(public_client: TestClient) -> None:
    assert public_client.get("/v1/rules").status_code == 200
    assert public_client.get("/v1/versions").status_code == 200
    assert public_client.get("/v1/fleet").status_code == 200
    assert public_client.put("/v1/rules/r1", content=rule_json("r1")).status_code == 401
    plan = {"owner": "dir:rules", "files": {"a.yaml": "rules: []\n"}}
    assert public_client.post("/v1/apply?dry_run=true", json=plan).status_code == 200  # keg diff
    assert public_client.post("/v1/apply", json=plan).status_code == 401
    assert public_client.post("/v1/apply?dry_run=false", json=plan).status_code == 401


@pytest.mark.parametrize("flag", ["True", "1", "yes", "on", "t", "y"])
def test_every_spelling_of_a_dry_run_the_route_reads_is_a_read(
        public_client: TestClient, flag: str) -> None:
    """The caller is decided by the same reading of `dry_run` as the route's own: a
    spelling only the route took as true asked a reader for a writer's token (401)."""
    plan = {"owner": "dir:rules", "files": {"a.yaml": "rules: []\n"}}
    response = public_client.post(f"/v1/apply?dry_run={flag}", json=plan)
    assert response.status_code == 200 and response.json()["dry_run"] is True
    assert public_client.get("/v1/rules").json()["rules"] == []


def test_an_app_without_tokens_refuses_every_write(store: RuleStore) -> None:
    closed = TestClient(create_app(store, ApiSettings(tokens=Tokens())))
    assert closed.put("/v1/rules/r1", content=rule_json("r1"),
                      headers={"Authorization": "Bearer anything-at-all-123"}).status_code == 403


def test_an_invalid_rule_is_422_with_its_location(client: TestClient) -> None:
    body = '{\n  "id": "bad",\n  "match": {"topics": {"regex": ["(a)\\\\1"]}},\n' \
           '  "action": {"deny": {"error": "NOPE"}}\n}'
    response = client.put("/v1/rules/bad", content=body, headers=ADMIN)
    assert response.status_code == 422 and response.headers["content-type"] == PROBLEM
    problem = response.json()
    assert problem["type"] == "urn:keg:problem:invalid-rules" and problem["status"] == 422
    errors = {e["field"]: e for e in problem["errors"]}
    assert errors["action.deny.error"]["line"] == 4
    assert errors["action.deny.error"]["column"] == 23
    assert "did you mean 'NONE'" in errors["action.deny.error"]["message"]
    assert errors["match.topics.regex[0]"]["line"] == 3
    assert errors["match.topics.regex[0]"]["file"] == "request body"

    for bad, field in [("not json", ""), ("[1]", ""), ('{"id": "bad", "action": {}}', "action")]:
        problem = client.put("/v1/rules/bad", content=bad, headers=ADMIN).json()
        assert problem["status"] == 422 and problem["errors"][0]["field"] == field, problem
    assert client.get("/v1/rules/Not_An_Id", headers=ADMIN).status_code == 422
    assert client.get("/v1/versions", headers=ADMIN).json()["versions"] == []


def test_oversized_bodies_are_413(store: RuleStore) -> None:
    from tests.unit.control_plane.conftest import make_client

    small = make_client(store, max_body_bytes=100)
    response = small.put("/v1/rules/r1", content=rule_json("r1", description="x" * 200),
                         headers=ADMIN)
    assert response.status_code == 413 and response.headers["content-type"] == PROBLEM


def files(tmp_path: Path, **contents: str) -> dict[str, str]:
    return {f"rules/{name}.yaml": text for name, text in contents.items()}


A_RULES = "rules:\n  - id: a\n    action: {observe: {}}\n  - id: b\n    action: {deny: {}}\n"


def test_apply_makes_a_directory_own_its_rules(client: TestClient, tmp_path: Path) -> None:
    create(client, "rest-made")
    body = {"owner": "dir:rules", "files": files(tmp_path, a=A_RULES), "reason": "merge #7"}
    plan = client.post("/v1/apply?dry_run=true", json=body, headers=CI)
    assert plan.status_code == 200 and plan.json()["dry_run"]
    assert plan.json()["diff"]["added"] == ["a", "b"] and plan.json()["new_version"] is None

    applied = client.post("/v1/apply", json=body, headers=CI).json()
    assert applied["new_version"]["operation"] == "apply"
    assert applied["new_version"]["author"] == "ci"
    assert applied["new_version"]["reason"] == "merge #7"
    assert applied["version"] == 2
    got = client.get("/v1/rules/a", headers=ADMIN).json()
    assert got["owner"] == "dir:rules"
    assert got["source"] == {"file": "rules/a.yaml", "line": 2, "column": 5}

    refused = client.put("/v1/rules/a", content=rule_json("a", order=3),
                         headers={**ADMIN, "If-Match": "*"})
    assert refused.status_code == 409
    assert "keg apply" in refused.json()["detail"]
    assert refused.json()["owners"] == {"a": "dir:rules"}
    assert client.delete("/v1/rules/b", headers={**ADMIN, "If-Match": "*"}).status_code == 409

    again = client.post("/v1/apply", json=body, headers=CI).json()
    assert again["new_version"] is None and again["version"] == 2

    taken = client.post("/v1/apply", json={"owner": "dir:other", "files": files(
        tmp_path, x="rules:\n  - id: rest-made\n    action: {observe: {}}\n")}, headers=CI)
    assert taken.status_code == 409 and "adopt" in taken.json()["detail"]


def test_apply_reports_every_invalid_file_with_its_location(client: TestClient,
                                                            tmp_path: Path) -> None:
    body = {"owner": "dir:rules", "files": files(
        tmp_path, a=A_RULES, b="rules:\n  - id: a\n    action: {observe: {}}\n",
        c="rules:\n  - id: c\n    action: {bogus: {}}\n")}
    problem = client.post("/v1/apply", json=body, headers=CI).json()
    assert problem["status"] == 422
    located = {(e["file"], e["line"]) for e in problem["errors"]}
    assert located == {("rules/b.yaml", 2), ("rules/c.yaml", 3)}
    bad_owner = client.post("/v1/apply", json={"owner": "has space", "files": {}}, headers=CI)
    assert bad_owner.status_code == 422 and bad_owner.json()["errors"][0]["field"] == "body.owner"


def test_the_no_token_warning_names_flags_that_exist(
        store: RuleStore, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="control_plane.api.app"):
        create_app(store, ApiSettings(tokens=Tokens()))
    warning = next(r.getMessage() for r in caplog.records if "no API tokens" in r.getMessage())
    flags = re.findall(r"--[a-z][a-z-]+", warning)
    assert flags, warning
    runner = CliRunner()
    for command in ("up", "control-plane"):
        result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        for flag in flags:
            assert flag in result.output, f"keg {command} has no {flag}"
