"""/v1/versions: the history of the rule set, diffs between versions, rollback."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from control_plane.api.deps import Context, Reader, Reason, Writer, change
from control_plane.api.problems import problem_responses
from control_plane.api.schemas import DiffOut, RuleEntry, VersionDetail, VersionList, VersionOut

router = APIRouter(tags=["versions"])

Number = Annotated[int, Path(ge=1, le=2**62, description="A version number.")]



@router.get("/v1/versions", response_model=VersionList,
            responses=problem_responses(401, 403, 404, 422, 503))
def list_versions(
    ctx: Context, _: Reader,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    before: Annotated[int | None, Query(ge=1, le=2**62,
                                        description="Only versions below this one.")] = None,
) -> VersionList:
    """Versions, newest first: who made each, when, why, what it did, and what the
    fleet made of it (pending, applied, rejected)."""
    infos = ctx.store.versions(limit=limit, before=before)
    more = len(infos) == limit and infos[-1].number > 1
    verdicts = ctx.store.verdicts([i.number for i in infos])
    return VersionList(versions=[VersionOut.of(i, verdicts.get(i.number)) for i in infos],
                       next_before=infos[-1].number if more else None)


@router.get("/v1/versions/{number}", response_model=VersionDetail,
            responses=problem_responses(401, 403, 404, 422, 503))
def get_version(number: Number, ctx: Context, _: Reader) -> VersionDetail:
    """One version: its record and its whole rule set."""
    version = ctx.store.version(number)
    return VersionDetail(info=VersionOut.of(version.info, ctx.store.verdict(number)),
                         rules=[RuleEntry.of(r) for r in version.rules])


@router.get("/v1/versions/{number}/diff", response_model=DiffOut,
            responses=problem_responses(401, 403, 404, 422, 503))
def diff_version(
    number: Number, ctx: Context, _: Reader,
    from_: Annotated[int | None, Query(alias="from", ge=0, le=2**62, description=(
        "The version to compare with (0: the empty rule set); default: the one before."))]
    = None,
) -> DiffOut:
    """What changed between two versions: rule ids added, removed, changed, and a
    unified diff of the rule sets as YAML."""
    base = number - 1 if from_ is None else from_
    ctx.store.version(number)  # 404 before comparing
    return DiffOut.of(ctx.store.diff(base, number), f"version {base}", f"version {number}")


@router.post("/v1/versions/{number}/rollback", response_model=VersionOut, status_code=201,
             responses=problem_responses(401, 403, 404, 422, 503))
def rollback(number: Number, ctx: Context, who: Writer, why: Reason,
             response: Response) -> VersionOut:
    """A new version whose rules (owners and sources too) are those of `number`; the
    rules of the served rule directory, if any (`keg up --rules`), stay as they are: the
    directory, not the history, says what they are."""
    info = ctx.store.rollback(number, change(who, why or f"rollback to version {number}"),
                              scope=who.scope, keep=ctx.settings.directory_owner)
    ctx.metrics.rule_changes.labels(info.operation).inc()
    response.headers["Location"] = f"/v1/versions/{info.number}"
    return VersionOut.of(info, None)
