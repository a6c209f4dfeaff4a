"""/v1/decisions (rule decisions scraped from real ext_proc /metrics endpoints) and
/v1/audit (the audit log's tail), and the console's static pages being served."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from control_plane.api import ApiSettings, Observability, create_app
from control_plane.store import RuleStore
from ext_proc.metrics import Metrics
from kafka_wire import ApiKey
from tests.unit.control_plane.conftest import ADMIN, TOKENS, store

__all__ = ["store"]


@pytest.fixture
def metrics() -> Iterator[tuple[Metrics, int]]:
    """A real ext_proc Metrics registry served over HTTP, with decisions in it."""
    m = Metrics()
    m.decision("no-pii", "deny", "enforce", "denied", 3, api_key=ApiKey.PRODUCE, error_code=29)
    m.decision("no-pii", "deny", "enforce", "denied", 1, api_key=ApiKey.FETCH, error_code=29)
    m.decision("mask-card", "mask", "enforce", "modified", 5)
    m.decision("try-freeze", "deny", "dry-run", "would-deny", 2)
    port = m.start_http_server(0, "0.0.0.0")
    yield m, port
    m.stop_http_server()


def client_for(store: RuleStore, observability: Observability) -> TestClient:
    return TestClient(create_app(store, ApiSettings(tokens=TOKENS), observability=observability))


def test_decisions_are_summed_per_rule_over_every_instance(
        store: RuleStore, metrics: tuple[Metrics, int], monkeypatch: pytest.MonkeyPatch) -> None:
    _, port = metrics
    real = socket.getaddrinfo

    def two_pods(host: str, *args: Any, **kwargs: Any) -> Any:
        """A headless Service's name: two pod addresses (both this loopback server)."""
        if host == "ext-proc.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                    for a in ("127.0.0.1", "127.0.0.2")]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", two_pods)
    client = client_for(store, Observability(metrics_urls=(
        f"http://ext-proc.test:{port}/metrics", "http://127.0.0.1:9/metrics")))
    assert client.get("/v1/decisions").status_code == 401
    body = client.get("/v1/decisions", headers=ADMIN).json()
    assert [(t["url"], t["ok"]) for t in body["targets"]] == [
        (f"http://127.0.0.1:{port}/metrics", True), (f"http://127.0.0.2:{port}/metrics", True),
        ("http://127.0.0.1:9/metrics", False)]
    rules = {(r["rule"], r["mode"]): r for r in body["rules"]}
    # Both pods answered: each count twice; both APIs of no-pii in one row.
    assert rules[("no-pii", "enforce")]["outcomes"] == {"denied": 8}
    assert rules[("mask-card", "enforce")] == {"rule": "mask-card", "action": "mask",
                                               "mode": "enforce", "outcomes": {"modified": 10},
                                               "total": 10}
    assert rules[("try-freeze", "dry-run")]["outcomes"] == {"would-deny": 4}


def test_the_audit_tail_is_the_newest_complete_lines(store: RuleStore, tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    events = [{"rule_id": f"r{i}", "topic": "orders", "padding": "x" * 500} for i in range(300)]
    log.write_text("".join(json.dumps(e) + "\n" for e in events) + '{"rule_id": "being-wr')
    client = client_for(store, Observability(audit_logs=(log,)))
    body = client.get("/v1/audit?limit=3", headers=ADMIN).json()
    assert [e["rule_id"] for e in body["events"]] == ["r299", "r298", "r297"]
    assert body["source"] == str(log)
    every = client.get("/v1/audit?limit=1000", headers=ADMIN).json()["events"]
    assert len(every) == 300 and every[-1]["rule_id"] == "r0"
    assert client.get("/v1/audit?limit=1001", headers=ADMIN).status_code == 422
    log.unlink()
    assert client.get("/v1/audit", headers=ADMIN).json()["events"] == []


def test_the_audit_tail_merges_every_workers_file_by_time(store: RuleStore,
                                                          tmp_path: Path) -> None:
    """Each ext_proc worker writes its own file: the tail is all of them, newest first."""
    first, second = tmp_path / "audit.jsonl", tmp_path / "audit-1.jsonl"
    first.write_text("".join(json.dumps({"rule_id": f"a{i}", "ts": f"2026-11-25T10:00:0{i}.000Z"})
                             + "\n" for i in (0, 2, 4)))
    second.write_text("".join(json.dumps({"rule_id": f"b{i}", "ts": f"2026-11-25T10:00:0{i}.000Z"})
                              + "\n" for i in (1, 3)))
    client = client_for(store, Observability(audit_logs=(first, second)))
    body = client.get("/v1/audit?limit=4", headers=ADMIN).json()
    assert [e["rule_id"] for e in body["events"]] == ["a4", "b3", "a2", "b1"]
    assert body["source"] == f"{first}, {second}"
    second.unlink()  # a worker that has audited nothing yet
    assert [e["rule_id"] for e in client.get("/v1/audit", headers=ADMIN).json()["events"]] == [
        "a4", "a2", "a0"]


def test_without_an_audit_log_the_tail_says_what_it_would_need(store: RuleStore) -> None:
    response = client_for(store, Observability()).get("/v1/audit", headers=ADMIN)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
    assert "shared audit sink" in response.json()["detail"]


def test_the_console_is_served_from_the_package(store: RuleStore) -> None:
    client = client_for(store, Observability())
    assert client.get("/console", follow_redirects=False).headers["location"] == "/console/"
    page = client.get("/console/")
    assert page.status_code == 200 and 'src="console.js"' in page.text
    for asset in ("console.js", "console.css"):
        response = client.get(f"/console/{asset}")
        assert response.status_code == 200 and "http://" not in response.text
        assert "https://" not in response.text  # nothing from another host
    assert not any(p.startswith("/console") for p in client.get("/openapi.json").json()["paths"])
