"""/v1/validate, /v1/dry-run and the operational endpoints (fleet, health, metrics, docs)."""

from __future__ import annotations

import base64
from typing import Any

from fastapi.testclient import TestClient

import kafka_wire
from control_plane.store import RuleStore, StoreUnavailable
from filter_rules import DEFAULT_RULES_DIR
from kafka_wire import ApiKey
from keg.cli_rules import Rollout
from tests.unit.control_plane.conftest import ADMIN, client, make_client, public_client, store

__all__ = ["client", "public_client", "store"]

CANDIDATE = """
rules:
  - id: payments-only-alice
    match: {apis: [Produce], topics: {prefix: [payments.]}, not: {principals: {exact: [alice]}}}
    action: {deny: {}}
  - id: watch-metadata
    mode: dry-run
    match: {apis: [Metadata]}
    action: {deny: {}}
  - id: mask-card
    match: {topics: {prefix: [payments.]}}
    action: {mask: {fields: ["$.card"]}}
  - id: copy-payments
    match: {topics: {prefix: [payments.]}}
    action: {copy: {topic: audit.payments}}
"""


def produce(*topics: str) -> dict[str, Any]:
    return {"TopicData": [{"Name": t, "PartitionData": [{"Index": 0}]} for t in topics]}


def test_validate_accepts_a_rule_file_and_locates_every_problem(client: TestClient) -> None:
    text = (DEFAULT_RULES_DIR / "payments.yaml").read_bytes()
    ok = client.post("/v1/validate", content=text, headers={**ADMIN,
                                                            "Content-Type": "application/yaml"})
    assert ok.status_code == 200 and ok.json()["valid"] and ok.json()["rules"] > 0
    as_json = client.post("/v1/validate", json={"rules": [{"id": "x", "action": {"observe": {}}}]},
                          headers=ADMIN)
    assert as_json.status_code == 200 and as_json.json()["rules"] == 1

    broken = "rules:\n  - id: a\n    action: {observe: {}}\n  - id: a\n    action: {nope: {}}\n"
    bad = client.post("/v1/validate?file=rules/x.yaml", content=broken, headers=ADMIN)
    assert bad.status_code == 422 and bad.headers["content-type"] == "application/problem+json"
    errors = bad.json()["errors"]
    # Every problem at once: the bad action, and the duplicate id beside it.
    assert [(e["file"], e["line"], e["field"]) for e in errors] == [
        ("rules/x.yaml", 5, "rules[1].action"), ("rules/x.yaml", 4, "rules[1].id")]
    assert client.post("/v1/validate", content=b"\xff\xfe\xfa", headers=ADMIN).status_code == 422


def test_validate_checks_the_host_as_a_write_would_for_a_token_that_may_use_it(
        client: TestClient, public_client: TestClient) -> None:
    """A rule whose key is a variable this host lacks was said valid, then refused at
    the write (regression). A caller that could not write such a rule (anonymous, or a
    scoped token) is not told what the host has."""
    rule = {"id": "enc", "match": {"topics": {"prefix": ["p."]}}, "action": {"encrypt": {
        "key": {"id": "k1", "secret": {"env": "KEG_TEST_NEVER_SET_VARIABLE"}}}}}
    refused = client.post("/v1/validate", json={"rules": [rule]}, headers=ADMIN)
    assert refused.status_code == 422, refused.json()
    [error] = refused.json()["errors"]
    assert "KEG_TEST_NEVER_SET_VARIABLE" in error["message"]
    assert error["field"].startswith("enc.action.encrypt")
    written = client.put("/v1/rules/enc", json={k: v for k, v in rule.items() if k != "id"},
                         headers=ADMIN)
    assert written.status_code == 422
    assert [(e["field"], e["message"]) for e in written.json()["errors"]] == [
        (error["field"], error["message"])]
    anonymous = public_client.post("/v1/validate", json={"rules": [rule]})
    assert anonymous.status_code == 200 and anonymous.json()["valid"]


def test_dry_run_of_a_candidate_on_requests_and_records(client: TestClient) -> None:
    frame = kafka_wire.encode_request(kafka_wire.RequestHeader(ApiKey.PRODUCE, 9, 7, "app", {}),
                                      produce("payments.eu"))[4:]
    body = {
        "rules": CANDIDATE,
        "requests": [
            {"api": "Produce", "version": 9, "principal": "bob", "body": produce("payments.eu")},
            {"api": 0, "version": 9, "principal": "User:bob",
             "body": produce("payments.eu", "orders")},
            {"frame_b64": base64.b64encode(frame).decode(), "principal": "alice"},
            {"api": "Metadata", "version": 12},
            {"api": "ApiVersions", "version": 3},
        ],
        "records": [
            {"topic": "payments.eu", "key": "k1", "value": '{"card": "4111", "amount": 5}',
             "headers": [{"name": "trace", "value": "t1"}]},
            {"topic": "orders", "value_b64": base64.b64encode(b"\xff\x01").decode()},
        ],
    }
    response = client.post("/v1/dry-run", json=body, headers=ADMIN)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["ruleset"]["source"] == "candidate"
    denied, partial, alice, metadata, untouched = result["requests"]
    assert denied["verdict"] == "answer"
    assert denied["decisions"][0]["error"] == "TOPIC_AUTHORIZATION_FAILED"
    assert denied["decisions"][0]["principal"] == "User:bob"
    responses = denied["answer"]["Responses"]
    assert responses[0]["PartitionResponses"][0]["ErrorCode"] == 29
    assert partial["verdict"] == "forward-changed"
    assert [t["Name"] for t in partial["forwarded"]["TopicData"]] == ["orders"]
    assert alice["verdict"] == "forward" and alice["decisions"] == []
    assert metadata["verdict"] == "forward"
    assert metadata["decisions"][0]["outcome"] == "would-deny"
    assert untouched == {"index": 4, "api": "ApiVersions", "api_key": 18, "version": 3,
                         "verdict": "forward", "decisions": []}

    masked, binary = result["records"]
    assert masked["status"] == "modified"
    assert '"card":"****"' in masked["record"]["value"].replace(" ", "")
    assert masked["record"]["headers"] == [{"name": "trace", "value": "t1"}]
    assert [s["rule"] for s in masked["steps"]] == ["mask-card", "copy-payments"]
    assert binary["status"] == "unchanged" and binary["record"]["value_b64"] == "/wE="
    assert [(e["kind"], e["target"]) for e in result["side_effects"]] == [
        ("copy-to-topic", "audit.payments")]


def test_dry_run_of_requests_naming_groups_with_the_safeguards_example(
        client: TestClient) -> None:
    """A rule with `topics:` and no `apis:` used to crash on DescribeGroups (its Groups
    are group ids, not topic entries): the dry run answered 500."""
    example = (DEFAULT_RULES_DIR.parent / "examples" / "safeguards.yaml").read_text()
    result = client.post("/v1/dry-run", headers=ADMIN, json={"rules": example, "requests": [
        {"api": "DescribeGroups", "version": 5,
         "body": {"Groups": ["orders-app", "billing"], "IncludeAuthorizedOperations": False}},
        {"api": "DeleteGroups", "version": 2, "body": {"GroupsNames": ["orders-app"]}},
        {"api": "Produce", "version": 9, "body": produce("archive.2024")},
    ]})
    assert result.status_code == 200, result.text
    groups, deleted, archive = result.json()["requests"]
    assert groups["verdict"] == deleted["verdict"] == "forward"
    assert archive["verdict"] == "answer"
    assert archive["decisions"][0]["error"] == "TOPIC_AUTHORIZATION_FAILED"


TENANTS = """
rules:
  - id: tenant-a
    match: {principals: {exact: [alice]}}
    action: {virtual_topics: {prefix: "tenant-a."}}
  - id: freeze-tenant-a-orders
    match: {apis: [Produce], topics: {exact: [tenant-a.orders]}}
    action: {deny: {message: "orders are frozen"}}
  - id: mask-tenant-a-cards
    match: {topics: {prefix: [tenant-a.]}}
    action: {mask: {fields: ["$.card"]}}
"""


def test_dry_run_judges_a_tenant_as_the_data_path_does(client: TestClient) -> None:
    """Virtual topics first: rules see the broker's names, answers carry the client's."""
    result = client.post("/v1/dry-run", headers=ADMIN, json={
        "rules": TENANTS,
        "requests": [
            {"api": "Produce", "version": 9, "principal": "alice",
             "body": produce("orders", "payments")},
            {"api": "Produce", "version": 9, "principal": "alice", "body": produce("orders")},
            {"api": "Produce", "version": 9, "principal": "bob", "body": produce("orders")},
        ],
        "records": [
            {"topic": "orders", "value": '{"card": "4111"}', "principal": "alice"},
            {"topic": "orders", "value": '{"card": "4111"}', "principal": "bob"},
        ],
    }).json()
    partial, denied, other_tenant = result["requests"]
    # alice's `orders` is the broker's tenant-a.orders: refused; her `payments` goes on,
    # under the broker's name.
    assert partial["verdict"] == "forward-changed" and partial["response_patched"]
    assert [t["Name"] for t in partial["forwarded"]["TopicData"]] == ["tenant-a.payments"]
    assert [(d["rule"], d["outcome"], d["topic"]) for d in partial["decisions"]] == [
        ("freeze-tenant-a-orders", "denied", "tenant-a.orders")]
    assert denied["verdict"] == "answer"
    (topic,) = denied["answer"]["Responses"]
    assert topic["Name"] == "orders"  # renamed back: the client sees its own name
    assert topic["PartitionResponses"][0]["ErrorCode"] == 29
    assert topic["PartitionResponses"][0]["ErrorMessage"] == \
        "keg rule freeze-tenant-a-orders: orders are frozen"
    assert other_tenant["verdict"] == "forward" and other_tenant["decisions"] == []

    masked, untouched = result["records"]
    assert masked["status"] == "modified" and masked["broker_topic"] == "tenant-a.orders"
    assert masked["record"]["topic"] == "orders"
    assert '"card":"****"' in masked["record"]["value"].replace(" ", "")
    assert untouched["status"] == "unchanged" and untouched["broker_topic"] == "orders"


def test_dry_run_of_the_live_rules(client: TestClient) -> None:
    client.put("/v1/rules/deny-all-produce", headers=ADMIN,
               json={"match": {"apis": ["Produce"]}, "action": {"deny": {}}})
    result = client.post("/v1/dry-run", headers=ADMIN, json={
        "requests": [{"api": "Produce", "version": 9, "body": produce("t")}]}).json()
    assert result["ruleset"] == {"source": "live", "version": 1,
                                 "ruleset_hash": result["ruleset"]["ruleset_hash"]}
    assert result["requests"][0]["verdict"] == "answer"


def test_dry_run_refuses_unreadable_samples_and_rules(client: TestClient) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"requests": [{"api": "Produce"}]}, "requests[0]"),
        ({"requests": [{"api": "NoSuchApi", "version": 1}]}, "requests[0]"),
        ({"requests": [{"frame_b64": "%%%"}]}, "requests[0].frame_b64"),
        ({"requests": [{"frame_b64": base64.b64encode(b"\x00\x00\xff").decode()}]},
         "requests[0]"),
        ({"records": [{"topic": "t", "value": "a", "value_b64": "YQ=="}]}, "records[0].value"),
        ({"rules": "rules:\n  - id: x\n    action: {nope: {}}\n"}, "rules[0].action"),
        ({"requests": [], "surprise": 1}, "body.surprise"),
    ]
    for body, field in cases:
        response = client.post("/v1/dry-run", json=body, headers=ADMIN)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["errors"][0]["field"] == field, response.json()


def test_dry_run_is_bounded(store: RuleStore) -> None:
    small = make_client(store, max_dry_run_items=2)
    body = {"records": [{"topic": "t"}] * 3}
    assert small.post("/v1/dry-run", json=body, headers=ADMIN).status_code == 422


def test_fleet_status_comes_from_the_xds_side(client: TestClient, store: RuleStore) -> None:
    """The fleet view as the xDS side reports it, in the documented shape, read back by
    `keg apply --wait` as the fleet stands."""
    answer = client.get("/v1/fleet", headers=ADMIN).json()
    assert answer["available"] is True
    nodes = {n["node_id"]: n for n in answer["nodes"]}
    assert set(nodes) == {"envoy-1", "xp-refusing", "xp-waiting", "xp-gone"}
    refused = nodes["xp-refusing"]["types"]["keg.v1.RuleSet"]
    assert (refused["applied_version"], refused["sent_version"], refused["in_sync"]) == (
        "2", "3", False)
    assert refused["last_nack"]["version"] == "3"
    assert "K is not set" in refused["last_nack"]["error"]
    assert nodes["envoy-1"]["types"]["envoy.config.listener.v3.Listener"]["in_sync"] is True
    assert not nodes["xp-gone"]["connected"]
    rollout = Rollout.of(answer["nodes"], 3)
    assert rollout.pending == ("xp-waiting",) and rollout.applied == ()
    assert rollout.nacked == (("xp-refusing", "rule r: key k1: environment variable K is not set"),)
    # The shape is the API's contract: documented, so clients can rely on it.
    document = client.get("/openapi.json").json()["components"]["schemas"]
    assert document["FleetOut"]["properties"]["nodes"]["items"] == {
        "$ref": "#/components/schemas/NodeOut"}
    assert {"node_id", "role", "connected", "types"} <= set(document["NodeOut"]["required"])
    from control_plane.api import create_app

    alone = TestClient(create_app(store))
    assert alone.get("/v1/fleet").status_code == 401


def test_health_readiness_and_metrics_are_public(client: TestClient, store: RuleStore) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "version": None}
    assert client.get("/readyz").json() == {"status": "ok", "version": 0}
    client.put("/v1/rules/a", headers=ADMIN, json={"action": {"observe": {}}})
    client.put("/v1/rules/b", headers={"Authorization": "Bearer wrong-token-xxxxxxxx"},
               json={"action": {"observe": {}}})
    text = client.get("/metrics").text
    assert "keg_rules_live_version 0.0" in text, "no ext_proc instance applied version 1"
    assert 'keg_rule_changes_total{operation="create"} 1.0' in text
    assert 'keg_api_auth_failures_total{reason="invalid"} 1.0' in text
    assert ('keg_api_requests_total{method="PUT",route="/v1/rules/{rule_id}",status="201"} 1.0'
            in text)
    assert "wrong-token" not in text
    store.record_verdict(1, "xp-1")
    text = client.get("/metrics").text
    assert "keg_rules_live_version 1.0" in text and "keg_rules_live_count 1.0" in text

    not_ready = make_client(store, ready=lambda: False).get("/readyz")
    assert not_ready.status_code == 503 and not_ready.headers["Retry-After"] == "5"
    down = make_client(store, problems=lambda: ["ext_proc restarting"]).get("/readyz")
    assert down.status_code == 503 and down.json()["detail"] == "ext_proc restarting"
    assert make_client(store, problems=list).get("/readyz").status_code == 200


class _DownBackend:
    """A database that cannot be reached."""

    def head(self) -> None:
        raise StoreUnavailable("postgresql: connection refused")

    version = versions = commit = head

    def close(self) -> None:
        pass


def test_an_unreachable_store_is_503_and_not_ready() -> None:
    down = make_client(RuleStore(_DownBackend()))  # type: ignore[arg-type]
    ready = down.get("/readyz")
    assert ready.status_code == 503 and ready.json()["type"] == "urn:keg:problem:not-ready"
    rules = down.get("/v1/rules", headers=ADMIN)
    assert rules.status_code == 503 and rules.headers["Retry-After"] == "5"
    assert "connection refused" not in rules.text  # details go to the log, not to clients


def test_openapi_and_docs_are_served(public_client: TestClient) -> None:
    spec = public_client.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    paths = set(spec["paths"])
    assert {"/v1/rules", "/v1/rules/{rule_id}", "/v1/apply", "/v1/validate", "/v1/dry-run",
            "/v1/versions", "/v1/versions/{number}", "/v1/versions/{number}/diff",
            "/v1/versions/{number}/rollback", "/v1/fleet", "/healthz", "/readyz",
            "/metrics"} <= paths
    schemas = spec["components"]["schemas"]
    assert "Rule" in schemas and "RuleFileDocument" in schemas and "Match" in schemas
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert public_client.get("/docs").status_code == 200
    missing = public_client.get("/no/such/path")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    assert public_client.post("/healthz").status_code == 405
