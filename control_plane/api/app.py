"""`create_app`: the control plane's REST API, assembled (routers, errors, metrics)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from prometheus_client import CollectorRegistry

from control_plane.api import (
    routes_check,
    routes_impact,
    routes_observe,
    routes_ops,
    routes_rules,
    routes_versions,
)
from control_plane.api.body_guard import BodyGuard
from control_plane.api.console_pages import install_console
from control_plane.api.deps import ApiContext, FleetStatus, caller_first
from control_plane.api.docs_pages import install_docs
from control_plane.api.metrics import ApiMetrics
from control_plane.api.problems import PROBLEM_SCHEMA, install_handlers
from control_plane.api.routes_observe import Observability
from control_plane.api.settings import ApiSettings
from control_plane.store import RuleStore
from filter_rules.schema import rule_file_schema

log = logging.getLogger(__name__)

API_VERSION = "1"
DESCRIPTION = """\
Rules for keg, the Kafka Envoy Gateway: read and change them (ETags), validate them,
dry-run them against sample requests and records, browse their versions, roll back,
and see the fleet. Writes need `Authorization: Bearer <token>`; every error is
`application/problem+json`. See docs/control-plane-api.md."""


def create_app(store: RuleStore, settings: ApiSettings | None = None,
               fleet_status: FleetStatus | None = None,
               observability: Observability | None = None) -> FastAPI:
    """The API over `store`. `fleet_status()` lists the fleet's nodes as JSON-able
    dicts (the xDS side provides it); without it /v1/fleet says it is unavailable.
    `observability` says where /v1/decisions and /v1/audit read what the data path did."""
    settings = settings or ApiSettings()
    registry = settings.registry if settings.registry is not None else CollectorRegistry()
    metrics = ApiMetrics(registry)
    app = FastAPI(title=settings.title, version=API_VERSION, description=DESCRIPTION,
                  docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.keg = ApiContext(store=store, settings=settings, metrics=metrics,
                               fleet_status=fleet_status)
    app.state.keg_observability = observability or Observability()
    routers = [m.router for m in (routes_rules, routes_versions, routes_check, routes_impact,
                                  routes_ops, routes_observe)]
    for router in routers:
        app.include_router(router)
    app.state.api_routes = [route for router in routers for route in router.routes]
    install_handlers(app, caller_first=_caller_first)
    install_docs(app)  # Swagger UI and ReDoc from bundled assets, no CDN
    install_console(app)
    # Bodies read and bounded before any route; the metrics middleware, added next,
    # wraps it (its 413s and 422s are counted).
    app.add_middleware(BodyGuard, limit=settings.max_body_bytes)
    app.middleware("http")(metrics.middleware)

    metrics.watch_live(store.live)
    if not settings.tokens:
        log.warning("no API tokens configured (--api-tokens or KEG_API_TOKENS): "
                    "every write will be refused")
    app.openapi = _openapi_with_rule_schemas(app)  # type: ignore[method-assign]
    return app


def _openapi_with_rule_schemas(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """FastAPI's document plus the rule language's JSON Schema as components (`Rule`,
    `RuleFileDocument` and what they refer to)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version,
                             description=app.description, routes=app.routes)
        rules = json.loads(json.dumps(rule_file_schema()).replace("#/$defs/",
                                                                  "#/components/schemas/"))
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, definition in rules["$defs"].items():
            if components.setdefault(name, definition) != definition:
                raise RuntimeError(f"OpenAPI component {name} is defined twice")
        components["Problem"] = PROBLEM_SCHEMA
        components["RuleFileDocument"] = {
            "anyOf": rules["anyOf"],
            "description": "One rule-file document: {apiVersion, kind, rules}, a list of "
                           "rules, or null.",
        }
        app.openapi_schema = schema
        return schema

    return openapi


def _caller_first(request: Request) -> None:
    """Raises the 401/403 problem of the route `request` reached, if its caller may not
    use it (FastAPI reads a JSON body before it runs any dependency)."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is not None:
        caller_first(request, (d.call for d in dependant.dependencies if d.call is not None))
