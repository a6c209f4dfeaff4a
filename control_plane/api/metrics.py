"""Prometheus metrics of the API and of the rule store's live version.

Every label taken from a request is bounded, so that nobody (the metrics and most
errors need no token) can add series at will: the method is one of `METHODS` or
"other", the route is the matched route's template or "unmatched", the status is
the one the API answered.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.requests import Request
from starlette.responses import Response

from control_plane.store import StoreError, VersionInfo

#: The methods counted by name; any other is counted as "other".
METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class ApiMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "keg_api_requests", "Control-plane API requests by route and status.",
            ["method", "route", "status"], registry=registry)
        self.latency = Histogram(
            "keg_api_request_duration_seconds", "Control-plane API request time by route.",
            ["method", "route"], registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
        self.auth_failures = Counter(
            "keg_api_auth_failures", "Refused API tokens: missing, scheme, invalid.",
            ["reason"], registry=registry)
        self.rule_changes = Counter(
            "keg_rule_changes", "New rule-set versions written, by operation.",
            ["operation"], registry=registry)
        self.live_version = Gauge(
            "keg_rules_live_version", "The rule-set version the fleet runs: the newest it "
            "applied and nobody rejected (0: none yet).", registry=registry)
        self.live_rules = Gauge(
            "keg_rules_live_count", "Rules in the live rule-set version.", registry=registry)

    def watch_live(self, live: Callable[[], VersionInfo | None]) -> None:
        """Read the live version from `live()` at every scrape (the fleet's answers come
        in on the xDS side, any time); NaN while the store cannot be read."""

        def read(attribute: str) -> float:
            try:
                info = live()
            except StoreError:
                return math.nan
            return 0.0 if info is None else float(getattr(info, attribute))

        self.live_version.set_function(lambda: read("number"))
        self.live_rules.set_function(lambda: read("rule_count"))

    async def middleware(self, request: Request,
                         call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        start = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            method, route = _method_of(request), _route_of(request)
            self.latency.labels(method, route).observe(time.perf_counter() - start)
            self.requests.labels(method, route, str(status)).inc()


def _method_of(request: Request) -> str:
    """The request's method if it is a standard one, else "other": a client could
    otherwise make a series of every made-up method (FOO1, FOO2, ...)."""
    method = request.method
    return method if method in METHODS else "other"


def _route_of(request: Request) -> str:
    """The matched route's template (/v1/rules/{rule_id}), never the raw path: labels
    stay bounded whatever clients send."""
    route = request.scope.get("route")
    return str(getattr(route, "path", None) or "unmatched")
