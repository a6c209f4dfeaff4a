"""The API's documentation pages work offline: Swagger UI (/docs) and ReDoc (/redoc) are
rendered by a real headless Chromium from the assets keg serves itself (this machine
has no internet: a page that needed a CDN would stay empty)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from control_plane.api import create_app, serve_api
from control_plane.api.docs_pages import ASSETS_URL, assets_directory
from control_plane.store import RuleStore
from keg.gateway import BackgroundLoop
from tests.browser import dump_dom, needs_chromium
from tests.unit.control_plane.conftest import client, store

__all__ = ["client", "store"]


def test_pages_name_only_assets_served_here(client: TestClient) -> None:
    for page in ("/docs", "/redoc"):
        html = client.get(page).text
        sources = re.findall(r'(?:src|href)="([^"]+)"', html) + re.findall(
            r"url: '([^']+)'", html)
        assert sources, page
        for source in sources:
            assert source.startswith("/"), f"{page} loads {source} from another host"
        for asset in re.findall(rf"{ASSETS_URL}/[\w.-]+", html):
            assert client.get(asset).status_code == 200, asset
    for name in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js"):
        assert (Path(assets_directory()) / name).stat().st_size > 100_000, name
    # The pages are public and not API operations.
    assert client.get("/docs").status_code == 200
    assert not any(p.startswith(("/docs", "/redoc")) for p in client.get(
        "/openapi.json").json()["paths"])


@pytest.fixture
def served(store: RuleStore) -> Iterator[str]:
    loop = BackgroundLoop()
    server = loop.run(serve_api(create_app(store), "127.0.0.1", 0), timeout=30)
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        loop.run(server.stop(), timeout=30)
        loop.close()


@needs_chromium
def test_swagger_ui_lists_every_operation_in_chromium(served: str, client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    dom = dump_dom(f"{served}/docs")
    shown = set(re.findall(r'data-path="([^"]+)"', dom))
    assert shown == set(spec["paths"]), "Swagger UI lists exactly the API's paths"
    methods = {m.lower() for m in re.findall(r'class="opblock-summary-method">(\w+)<', dom)}
    assert {"get", "put", "post", "delete"} <= methods


@needs_chromium
def test_redoc_lists_every_operation_in_chromium(served: str, client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    dom = dump_dom(f"{served}/redoc")
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            # ReDoc gives each operation an anchor named after its tag and operation id.
            assert f'operation/{operation["operationId"]}' in dom, (path, operation["summary"])
