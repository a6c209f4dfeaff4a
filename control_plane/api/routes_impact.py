"""/v1/impact: what each rule did, minute by minute (read-only).

The rows are the per-minute aggregates `keg analyze --follow` keeps from the audit
stream (control_plane.impact): decisions, bytes, records, errors and p50/p99 latency
per rule, topic, principal and outcome.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query

from control_plane import impact
from control_plane.api.deps import Context, Reader
from control_plane.api.problems import Problem, problem_responses
from control_plane.api.schemas import ImpactOut, ImpactRow

router = APIRouter(tags=["impact"])
Name = Annotated[str | None, Query(max_length=1000)]


@router.get("/v1/impact", response_model=ImpactOut,
            responses=problem_responses(400, 401, 403, 422))
def get_impact(
    ctx: Context,
    _: Reader,
    since: Annotated[datetime | None, Query(
        description="From this minute on (ISO 8601; UTC unless it says).")] = None,
    until: Annotated[datetime | None, Query(description="Before this minute.")] = None,
    rule_id: Name = None,
    topic: Name = None,
    principal: Name = None,
    outcome: Name = None,
    limit: Annotated[int, Query(ge=1, le=100_000, description="At most this many rows "
                                                               "(the newest).")] = 10_000,
) -> ImpactOut:
    """Per-minute impact of each rule: decisions, bytes, records, errors, p50/p99 latency
    per rule, topic, principal and outcome, oldest first."""
    directory = ctx.settings.impact_dir
    if directory is None:
        return ImpactOut(available=False, truncated=False, rows=[])
    since, until = _utc(since), _utc(until)
    if since is not None and until is not None and until <= since:
        raise Problem(400, "Bad time range", "until must be after since", kind="bad-range")
    rows, truncated = impact.query(directory, impact.ImpactQuery(
        since=since, until=until, rule_id=rule_id, topic=topic, principal=principal,
        outcome=outcome, limit=limit))
    return ImpactOut(available=True, truncated=truncated,
                     rows=[ImpactRow.model_validate(r) for r in rows])


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)
