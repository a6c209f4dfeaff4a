"""/v1/rules: read, create, replace and delete single rules (ETags), and /v1/apply
(a rule directory's whole rule set, GitOps)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Response

from control_plane.api.deps import (
    Context,
    RawBody,
    Reader,
    Reason,
    Writer,
    WriterUnlessDryRun,
    change,
    require_host_access,
)
from control_plane.api.problems import Problem, problem_responses
from control_plane.api.rule_input import parse_files, parse_rule, reading
from control_plane.api.schemas import (
    RULE_REF,
    ApplyIn,
    ApplyOut,
    DeleteOut,
    DiffOut,
    RuleEntry,
    RuleList,
    RuleWriteOut,
    VersionOut,
)
from control_plane.store import EVERY_OWNER, OutOfScope, ServedDirectory, StoredRule
from filter_rules.model import RULE_ID_PATTERN

router = APIRouter(tags=["rules"])

RuleId = Annotated[str, Path(pattern=RULE_ID_PATTERN, max_length=128,
                             description="The rule's id.")]
IfMatch = Annotated[str | None, Header(description='The ETag you read ("..."), or *.')]
IfNoneMatch = Annotated[str | None, Header(description="PUT: * to create only; GET: ETags.")]



def _etags(header: str | None) -> list[str] | None:
    """An If-Match list: '"a", "b"' -> [a, b]; '*' -> ['*']. Weak tags never match."""
    if header is None or not header.strip():
        return None
    tags = []
    for part in header.split(","):
        tag = part.strip()
        if tag == "*":
            tags.append("*")
        elif tag.startswith('"') and tag.endswith('"') and len(tag) >= 2:
            tags.append(tag[1:-1])
        elif tag:
            tags.append(tag if tag.startswith("W/") else tag.strip('"'))
    return tags


def _quoted(etag: str) -> str:
    return f'"{etag}"'


@router.get("/v1/rules", response_model=RuleList, responses=problem_responses(401, 403, 503))
def list_rules(ctx: Context, _: Reader) -> RuleList:
    """The latest version's rules, in rule-set order, with their ETags, owners and
    sources; its status, and the version the fleet runs (`live_version`)."""
    number, rules = ctx.store.rules()
    verdict = ctx.store.verdict(number) if number else None
    live = ctx.store.live()
    return RuleList(version=number, status=verdict.status if verdict else "pending",
                    live_version=live.number if live else None,
                    rules=[RuleEntry.of(r) for r in rules])


@router.get("/v1/rules/{rule_id}", response_model=RuleEntry, responses={
    **problem_responses(401, 403, 404, 422, 503),
    304: {"description": "Not modified (If-None-Match)."}})
def get_rule(rule_id: RuleId, ctx: Context, _: Reader, response: Response,
             if_none_match: IfNoneMatch = None) -> Any:
    """One rule; its ETag is in the `ETag` header (send it back in `If-Match`)."""
    stored = ctx.store.rule(rule_id)
    tags = _etags(if_none_match)
    if tags is not None and (stored.etag in tags or "*" in tags):
        return Response(status_code=304, headers={"ETag": _quoted(stored.etag)})
    response.headers["ETag"] = _quoted(stored.etag)
    return RuleEntry.of(stored)


@router.put(
    "/v1/rules/{rule_id}", response_model=RuleWriteOut, status_code=200,
    responses={**problem_responses(400, 401, 403, 409, 412, 413, 422, 428, 503),
               201: {"description": "Created.", "model": RuleWriteOut}},
    openapi_extra={"requestBody": {"required": True,
                                   "content": {"application/json": {"schema": RULE_REF}}}},
)
def put_rule(rule_id: RuleId, body: RawBody, ctx: Context, who: Writer, why: Reason,
             response: Response, if_match: IfMatch = None,
             if_none_match: IfNoneMatch = None) -> RuleWriteOut:
    """Create (If-None-Match: * to refuse replacing) or replace (If-Match: the ETag
    you read) one rule. The body is the rule as JSON; its `id` may be left out."""
    create_only = bool(if_none_match and if_none_match.strip())
    if create_only and if_none_match and if_none_match.strip() != "*":
        raise Problem(400, "Bad request", "PUT supports If-None-Match: * only",
                      kind="bad-precondition")
    rule = parse_rule(body, rule_id)
    require_host_access(who, [rule], "write")
    result = ctx.store.put_rule(rule, change(who, why), if_match=_etags(if_match),
                                if_none_match=create_only, scope=who.scope)
    if result.version is not None:
        ctx.metrics.rule_changes.labels(result.version.operation).inc()
    response.headers["ETag"] = _quoted(result.rule.etag)
    if result.created:
        response.status_code = 201
        response.headers["Location"] = f"/v1/rules/{rule_id}"
    latest = result.version.number if result.version else ctx.store.rules()[0]
    return RuleWriteOut(version=latest, changed=result.version is not None,
                        created=result.created, rule=RuleEntry.of(result.rule),
                        new_version=VersionOut.of(result.version, None) if result.version
                        else None)


@router.delete("/v1/rules/{rule_id}", response_model=DeleteOut,
               responses=problem_responses(401, 403, 404, 409, 412, 422, 428, 503))
def delete_rule(rule_id: RuleId, ctx: Context, who: Writer, why: Reason,
                if_match: IfMatch = None) -> DeleteOut:
    """Delete one rule; If-Match with its ETag (or *) is required."""
    info = ctx.store.delete_rule(rule_id, change(who, why), if_match=_etags(if_match),
                                 scope=who.scope)
    ctx.metrics.rule_changes.labels(info.operation).inc()
    return DeleteOut(version=info.number, new_version=VersionOut.of(info, None))


@router.post("/v1/apply", response_model=ApplyOut, tags=["gitops"],
             responses=problem_responses(400, 401, 403, 409, 413, 422, 503))
def apply(who: WriterUnlessDryRun, body: ApplyIn, ctx: Context, why: Reason,
          dry_run: Annotated[bool, Query(description="Only say what would change "
                                                     "(needs read access only).")] = False,
          ) -> ApplyOut:
    """Make the rules `owner` owns exactly those of `files` (what `keg apply` sends).

    Rules of other owners are refused (409); rules nobody owns are refused unless
    `adopt`. One new version for the whole change, none when nothing changes.
    """
    scope = who.scope if who else EVERY_OWNER
    if not dry_run and not scope.allows(body.owner):  # before reading what it sent
        raise OutOfScope({body.owner}, scope.describe())
    if not dry_run and body.owner == ctx.settings.directory_owner:
        raise ServedDirectory(body.owner)
    with reading(sum(len(text) for text in body.files.values())):
        ruleset = parse_files(body.files)
    if not dry_run:
        # What the change adds or alters: a rule it carries unchanged was written by
        # whoever wrote it before.
        stored = {r.id: r.etag for r in ctx.store.rules()[1]}
        require_host_access(who, [r for r in ruleset.rules
                                  if stored.get(r.id) != StoredRule.of(r).etag], "write")
    result = ctx.store.apply(body.owner, ruleset, change(who, body.reason or why),
                             adopt=body.adopt, dry_run=dry_run,
                             scope=scope)
    if result.version is not None:
        ctx.metrics.rule_changes.labels(result.version.operation).inc()
    verdict = ctx.store.verdict(result.current) if result.current else None
    live = ctx.store.live()
    return ApplyOut(
        owner=body.owner, dry_run=dry_run, version=result.current,
        status=verdict.status if verdict else "pending",
        status_detail=verdict.describe() if verdict else None,
        live_version=live.number if live else None,
        new_version=VersionOut.of(result.version, None) if result.version else None,
        diff=DiffOut.of(result.diff, f"version {result.current - (1 if result.version else 0)}",
                        body.owner),
    )
