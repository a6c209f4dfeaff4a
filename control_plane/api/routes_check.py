"""/v1/validate and /v1/dry-run: check rules, and see what they would do, without
changing anything."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from control_plane.api.deps import (
    Context,
    RawBody,
    Reader,
    has_host_access,
    require_host_access,
)
from control_plane.api.dry_run import dry_run
from control_plane.api.problems import Problem, problem_responses
from control_plane.api.rule_input import BODY, parse_rule_file, parse_ruleset_value, reading
from control_plane.api.schemas import (
    RULE_FILE_REF,
    DryRunIn,
    DryRunOut,
    DryRunRuleset,
    ValidateOut,
)
from filter_rules import CompiledRuleSet

router = APIRouter(tags=["check"])



@router.post(
    "/v1/validate", response_model=ValidateOut, responses=problem_responses(401, 403, 413, 422),
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/yaml": {"schema": RULE_FILE_REF},
        "application/json": {"schema": RULE_FILE_REF},
    }}},
)
def validate(body: RawBody, ctx: Context, who: Reader,
             file: Annotated[str, Query(max_length=500, description=(
                 "The name errors give the input (e.g. its path)."))] = BODY) -> ValidateOut:
    """Check one rule file (YAML or JSON) as `keg validate` does: 200 when valid, 422
    with every problem's file, line, column and field otherwise. For a token that may
    use the gateway host (no owner scope), also what a write would check there: the key
    files and variables the rules name (said valid, they were refused at the write);
    for other callers, which could not write such rules, the host is not looked at."""
    if not body.strip():
        raise Problem(422, "Invalid request", "send a rule file (YAML or JSON) as the body",
                      kind="invalid-request")
    with reading(len(body)):
        compiled = CompiledRuleSet(parse_rule_file(body, file))
        if has_host_access(who):
            ctx.store.check(compiled.ruleset)
    return ValidateOut(valid=True, rules=len(compiled.ruleset.rules), enabled=len(compiled.rules),
                       ruleset_hash=compiled.version)


@router.post("/v1/dry-run", response_model=DryRunOut,
             responses=problem_responses(400, 401, 403, 413, 422))
async def dry_run_endpoint(body: DryRunIn, ctx: Context, who: Reader) -> DryRunOut:
    """Apply a rule set -- a candidate given here, or the live one -- to sample
    requests and records, with the data path's own engines, and return the decisions
    and the records as they would leave the gateway. Nothing is sent or stored.

    A rule that uses the gateway host (its files, environment variables, code: key
    files, interceptor classes, ...) runs only for a token without an owner scope: 403
    for others, for a candidate that has one, and for records through a live set that
    has one."""
    limit = ctx.settings.max_dry_run_items
    if len(body.requests) + len(body.records) > limit:
        raise Problem(422, "Too many samples", f"at most {limit} requests and records "
                      "together", kind="invalid-request")

    def run() -> DryRunOut:
        if body.rules is None:
            number, ruleset = ctx.store.current()
            source = DryRunRuleset(source="live", version=number, ruleset_hash=ruleset.version)
            # The live set's keys and code were put there by the gateway's operators;
            # records run through them would make the reader an encryption oracle.
            if body.records:
                require_host_access(who, ruleset.rules, "run records through")
        else:
            # (rules given as JSON data, not text, were read with the request)
            with reading(len(body.rules) if isinstance(body.rules, str) else 0):
                ruleset = parse_ruleset_value(body.rules)
            source = DryRunRuleset(source="candidate", version=None,
                                   ruleset_hash=ruleset.version)
            require_host_access(who, ruleset.rules, "dry-run")
        result = dry_run(ruleset, body.requests, body.records)
        return DryRunOut(ruleset=source, requests=result.requests, records=result.records,
                         side_effects=result.side_effects)

    # Building interceptors may read files and a custom one may block: off the loop.
    return await run_in_threadpool(run)
