"""/v1/versions: history with who/when/why, one version, diffs, rollback."""

from __future__ import annotations

from fastapi.testclient import TestClient

from control_plane.store import RuleStore
from tests.unit.control_plane.conftest import ADMIN, client, rule_json, store

__all__ = ["client", "store"]


def write_history(client: TestClient) -> None:
    """v1: a; v2: a, b; v3: b (a deleted)."""
    for rule_id in ("a", "b"):
        assert client.put(f"/v1/rules/{rule_id}?reason=add%20{rule_id}",
                          content=rule_json(rule_id), headers=ADMIN).status_code == 201
    assert client.delete("/v1/rules/a", headers={**ADMIN, "If-Match": "*",
                                                 "X-Keg-Reason": "drop a"}).status_code == 200


def test_history_lists_who_when_why_newest_first_in_pages(client: TestClient) -> None:
    write_history(client)
    page = client.get("/v1/versions?limit=2", headers=ADMIN).json()
    assert [(v["number"], v["operation"], v["author"], v["reason"]) for v in page["versions"]] == [
        (3, "delete", "admin", "drop a"), (2, "create", "admin", "add b")]
    assert page["next_before"] == 2
    rest = client.get(f"/v1/versions?limit=2&before={page['next_before']}", headers=ADMIN).json()
    assert [v["number"] for v in rest["versions"]] == [1] and rest["next_before"] is None
    assert page["versions"][0]["created_at"].endswith("Z")


def test_one_version_holds_its_whole_rule_set(client: TestClient) -> None:
    write_history(client)
    v2 = client.get("/v1/versions/2", headers=ADMIN).json()
    assert v2["info"]["rule_count"] == 2
    assert [r["id"] for r in v2["rules"]] == ["a", "b"]
    assert client.get("/v1/versions/9", headers=ADMIN).status_code == 404
    assert client.get("/v1/versions/0", headers=ADMIN).status_code == 422


def test_diff_between_versions(client: TestClient) -> None:
    write_history(client)
    diff = client.get("/v1/versions/3/diff", headers=ADMIN).json()
    assert (diff["from"], diff["to"]) == ("version 2", "version 3")
    assert diff["removed"] == ["a"] and diff["added"] == [] and diff["unchanged"] == 1
    assert "-- id: a" in diff["unified"]
    full = client.get("/v1/versions/3/diff?from=0", headers=ADMIN).json()
    assert full["added"] == ["b"]
    assert client.get("/v1/versions/3/diff?from=7", headers=ADMIN).status_code == 404


def test_rollback_makes_a_new_version_equal_to_an_old_one(client: TestClient) -> None:
    write_history(client)
    denied = client.post("/v1/versions/2/rollback")
    assert denied.status_code == 401
    back = client.post("/v1/versions/2/rollback", headers={**ADMIN, "X-Keg-Reason": "oops"})
    assert back.status_code == 201 and back.headers["Location"] == "/v1/versions/4"
    info = back.json()
    assert (info["number"], info["operation"], info["parent"], info["reason"]) == (
        4, "rollback", 2, "oops")
    assert [r["id"] for r in client.get("/v1/rules", headers=ADMIN).json()["rules"]] == ["a", "b"]
    assert client.get("/v1/versions/4/diff?from=2", headers=ADMIN).json()["unified"] == ""
    assert client.post("/v1/versions/99/rollback", headers=ADMIN).status_code == 404
    default_reason = client.post("/v1/versions/1/rollback", headers=ADMIN).json()["reason"]
    assert default_reason == "rollback to version 1"


def test_a_version_the_fleet_rejected_is_never_reported_live(client: TestClient,
                                                               store: RuleStore) -> None:
    write_history(client)  # v1..v3, none answered yet
    listed = client.get("/v1/rules", headers=ADMIN).json()
    assert (listed["version"], listed["status"], listed["live_version"]) == (3, "pending", None)
    store.record_verdict(2, "xp-1")
    store.record_verdict(3, "xp-1", "rule b: key k: environment variable K is not set")

    listed = client.get("/v1/rules", headers=ADMIN).json()
    assert (listed["version"], listed["status"], listed["live_version"]) == (3, "rejected", 2)
    history = {v["number"]: v for v in client.get("/v1/versions", headers=ADMIN).json()[
        "versions"]}
    assert [history[n]["status"] for n in (3, 2, 1)] == ["rejected", "applied", "pending"]
    assert history[3]["status_detail"] == ("xp-1: rule b: key k: environment variable K is "
                                           "not set")
    assert history[3]["status_at"] is not None and history[1]["status_at"] is None
    assert client.get("/v1/versions/3", headers=ADMIN).json()["info"]["status"] == "rejected"
    live = client.post("/v1/dry-run", json={}, headers=ADMIN).json()["ruleset"]
    assert (live["source"], live["version"]) == ("live", 2), "dry runs use the served set"
    metrics = client.get("/metrics").text
    assert "keg_rules_live_version 2.0" in metrics and "keg_rules_live_count 2.0" in metrics
    applied = client.post("/v1/apply?dry_run=true", headers=ADMIN,
                          json={"owner": "dir:x", "files": {}}).json()
    assert (applied["version"], applied["status"], applied["live_version"]) == (
        3, "rejected", 2)
    assert applied["status_detail"].startswith("xp-1: rule b:")
