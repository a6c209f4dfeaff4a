"""Fixtures shared by the API tests (no tests here): an app on a fresh SQLite store,
in a TestClient or served by uvicorn on a free loopback port."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from control_plane.api import ApiSettings, Tokens, create_app, ruleset_validator, serve_api
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


@contextmanager
def serving(api: FastAPI) -> Iterator[str]:
    """`api` served by the real uvicorn server (ApiServer) on a free loopback port, on
    a loop of its own; yields its base URL."""
    started = threading.Event()
    port: list[int] = []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def main() -> None:
        server = await serve_api(api, "127.0.0.1", 0)
        port.append(server.port)
        started.set()
        await stop.wait()
        await server.stop()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(10), "the API server did not start"
    try:
        yield f"http://127.0.0.1:{port[0]}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
