"""The control plane's REST API (FastAPI): rules, versions, dry runs, fleet, health.

    store = open_store(None, data_dir, validator=ruleset_validator())
    app = create_app(store, ApiSettings(tokens=TokenFile(token_file)), fleet_status)
    server = await serve_api(app, "0.0.0.0", 8080)   # inside the process's loop
    ...
    await server.stop()

Endpoints, authentication and examples: docs/control-plane-api.md.
"""

from __future__ import annotations

from control_plane.api.app import create_app
from control_plane.api.deps import FleetStatus
from control_plane.api.dry_run import dry_run
from control_plane.api.problems import PROBLEM_JSON, Problem
from control_plane.api.routes_observe import Observability
from control_plane.api.server import ApiServer, serve_api
from control_plane.api.settings import (
    TOKENS_ENV,
    ApiSettings,
    TokenError,
    TokenFile,
    Tokens,
)
from control_plane.store import Validator
from filter_rules import CompiledRuleSet, RuleSet

__all__ = [
    "PROBLEM_JSON",
    "TOKENS_ENV",
    "ApiServer",
    "ApiSettings",
    "FleetStatus",
    "Observability",
    "Problem",
    "TokenError",
    "TokenFile",
    "Tokens",
    "create_app",
    "dry_run",
    "ruleset_validator",
    "serve_api",
]


def ruleset_validator(build_record_rules: bool = False) -> Validator:
    """What the store checks before it writes a version: the rule set compiles and,
    with `build_record_rules`, its record rules build (keys, schemas, custom
    interceptor imports) -- only where this host has what ext_proc hosts have."""

    def validate(ruleset: RuleSet) -> None:
        compiled = CompiledRuleSet(ruleset)
        if build_record_rules:
            from control_plane.api.dry_run import record_engine

            record_engine(compiled).close()

    return validate
