"""/metrics cannot be grown by clients: every label taken from a request is bounded
(the method to the standard ones or "other", the route to a template or "unmatched"),
over real HTTP to the real uvicorn server, without a token."""

from __future__ import annotations

import http.client
import random
import string
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from control_plane.api import ApiSettings, Tokens, create_app, ruleset_validator
from control_plane.api.metrics import METHODS
from control_plane.store import open_store
from tests.unit.control_plane.conftest import serving


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    store = open_store(None, tmp_path / "cp", validator=ruleset_validator())
    app = create_app(store, ApiSettings(tokens=Tokens.of([("admin", "admin-token-0123456789")])))
    with serving(app) as served:
        yield served
    store.close()


def send(url: str, method: str, path: str) -> int:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port,
                                            timeout=30)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def series(url: str, name: str) -> list[dict[str, str]]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port,
                                            timeout=30)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    return [sample.labels for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and sample.labels["route"] != "/metrics"]  # the scrapes


def made_up(rng: random.Random, length: int) -> str:
    return "".join(rng.choices(string.ascii_uppercase + string.digits, k=length))


def test_random_methods_and_paths_do_not_add_series(url: str) -> None:
    rng = random.Random(20240611)
    requests = [(f"FOO{i}{made_up(rng, 6)}", f"/{made_up(rng, 10).lower()}/{i}")
                for i in range(20)]
    # Made-up methods on routes that exist too (405), and standard ones on unknown paths.
    requests += [(f"BAR{i}{made_up(rng, 6)}", "/v1/rules") for i in range(5)]
    requests += [("GET", f"/v1/{made_up(rng, 12).lower()}") for _ in range(5)]
    for method, path in requests:
        assert send(url, method, path) in (400, 404, 405, 501), (method, path)

    counted = series(url, "keg_api_requests_total")
    timed = series(url, "keg_api_request_duration_seconds_count")
    routes = {labels["route"] for labels in counted}
    assert {labels["method"] for labels in counted + timed} <= METHODS | {"other"}
    assert routes <= {"unmatched", "/v1/rules"}, routes
    # 30 requests with 26 methods and 25 paths: three series (other and GET on
    # unmatched paths, other on /v1/rules), not one each.
    assert len(counted) <= 3, counted
    assert len(timed) <= 3, timed

    for method, path in requests:  # the same again, and new ones: not one series more
        send(url, method, path)
        send(url, f"X{made_up(rng, 8)}", f"/{made_up(rng, 8).lower()}")
    assert len(series(url, "keg_api_requests_total")) == len(counted)
