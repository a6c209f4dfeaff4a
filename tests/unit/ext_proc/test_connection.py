"""Connection metadata from Envoy's initial_metadata."""

from __future__ import annotations

import pytest

from ext_proc.connection import (
    BROKER_ID,
    BROKER_ROUTES,
    CLIENT_ADDRESS,
    GATEWAY_ADDRESS,
    ConnectionInfo,
    format_routes,
    parse_routes,
    split_host_port,
)


def test_full_metadata() -> None:
    info = ConnectionInfo.from_metadata([
        (CLIENT_ADDRESS, "10.1.2.3:55012"),
        (GATEWAY_ADDRESS, "gw:19093"),
        (BROKER_ID, "2"),
        (BROKER_ROUTES, "1=gw:19092,2=gw:19093"),
        ("user-agent", b"grpc"),
    ])
    assert (info.client_host, info.client_port) == ("10.1.2.3", 55012)
    assert info.broker_id == 2
    assert info.gateway_route == ("gw", 19093)
    assert info.routes[1] == ("gw", 19092)


def test_missing_metadata_is_tolerated() -> None:
    info = ConnectionInfo.from_metadata([])
    assert info.client_host == "unknown" and info.broker_id is None
    assert info.gateway_route is None and dict(info.routes) == {}


@pytest.mark.parametrize(("text", "expected"), [
    ("[::1]:9092", ("::1", 9092)),
    ("host:1", ("host", 1)),
])
def test_split_host_port(text: str, expected: tuple[str, int]) -> None:
    assert split_host_port(text) == expected


@pytest.mark.parametrize("bad", ["nohost", ":9092", "host:port"])
def test_split_host_port_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        split_host_port(bad)


def test_routes_round_trip() -> None:
    routes = {3: ("a", 1), 1: ("b", 2)}
    assert parse_routes(format_routes(routes)) == routes
