"""Fixtures shared by the API tests (no tests here): an app on a fresh SQLite store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from control_plane.api import ApiSettings, Tokens, create_app, ruleset_validator
from control_plane.fleet import EXT_PROC, Fleet, NodeInfo
from control_plane.snapshot import LISTENER, RULES
from control_plane.store import RuleStore, open_store

ADMIN_TOKEN = "admin-token-0123456789"
CI_TOKEN = "ci-token-abcdefghijklmnop"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CI = {"Authorization": f"Bearer {CI_TOKEN}"}
TOKENS = Tokens.of([("admin", ADMIN_TOKEN), ("ci", CI_TOKEN)])



def sample_fleet() -> Fleet:
    """A real fleet view: an Envoy in sync, an ext_proc instance on version 2 that
    NACKed version 3, one still waiting for version 3, one gone."""
    fleet = Fleet()
    envoy = fleet.connected(NodeInfo("envoy-1", cluster="keg"))
    fleet.sent(envoy, LISTENER, "l-1")
    fleet.ack(envoy, LISTENER, "l-1", None)
    refusing, waiting, gone = (fleet.connected(NodeInfo(name, role=EXT_PROC))
                               for name in ("xp-refusing", "xp-waiting", "xp-gone"))
    for node in (refusing, waiting, gone):
        fleet.sent(node, RULES, "2")
        fleet.ack(node, RULES, "2", None)
        fleet.sent(node, RULES, "3")
    fleet.nack(refusing, RULES, "3", "rule r: key k1: environment variable K is not set")
    fleet.disconnected(gone.node_id)
    return fleet


FLEET = sample_fleet()


def rule_json(rule_id: str, **extra: Any) -> str:
    return json.dumps({"id": rule_id, "action": {"observe": {}}, **extra})


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RuleStore]:
    store = open_store(None, tmp_path, validator=ruleset_validator(build_record_rules=True))
    yield store
    store.close()


def make_client(store: RuleStore, **settings: Any) -> TestClient:
    app = create_app(store, ApiSettings(tokens=TOKENS, **settings), fleet_status=FLEET.status)
    return TestClient(app)


@pytest.fixture
def client(store: RuleStore) -> TestClient:
    return make_client(store)


@pytest.fixture
def public_client(store: RuleStore) -> TestClient:
    return make_client(store, public_reads=True)
