"""Fixtures shared by the API tests (no tests here): an app on a fresh SQLite store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from control_plane.api import ApiSettings, Tokens, create_app, ruleset_validator
from control_plane.store import RuleStore, open_store

ADMIN_TOKEN = "admin-token-0123456789"
CI_TOKEN = "ci-token-abcdefghijklmnop"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CI = {"Authorization": f"Bearer {CI_TOKEN}"}
TOKENS = Tokens.of([("admin", ADMIN_TOKEN), ("ci", CI_TOKEN)])

FLEET = [{"node": "envoy-1", "kind": "envoy", "rules_version": None, "last_ack": "v3",
          "last_nack": None, "last_seen": "2026-01-01T00:00:00Z"}]


def rule_json(rule_id: str, **extra: Any) -> str:
    return json.dumps({"id": rule_id, "action": {"observe": {}}, **extra})


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RuleStore]:
    store = open_store(None, tmp_path, validator=ruleset_validator(build_record_rules=True))
    yield store
    store.close()


def make_client(store: RuleStore, **settings: Any) -> TestClient:
    app = create_app(store, ApiSettings(tokens=TOKENS, **settings), fleet_status=lambda: FLEET)
    return TestClient(app)


@pytest.fixture
def client(store: RuleStore) -> TestClient:
    return make_client(store)


@pytest.fixture
def public_client(store: RuleStore) -> TestClient:
    return make_client(store, public_reads=True)
