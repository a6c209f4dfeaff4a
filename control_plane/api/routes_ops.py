"""Operations: fleet status, health, readiness and Prometheus metrics."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from control_plane.api.deps import Context, Reader
from control_plane.api.problems import Problem, problem_responses
from control_plane.api.schemas import FleetOut, HealthOut, NodeOut
from control_plane.store import StoreError

log = logging.getLogger(__name__)
router = APIRouter(tags=["operations"])


@router.get("/v1/fleet", response_model=FleetOut, responses=problem_responses(401, 403))
def fleet(ctx: Context, _: Reader) -> FleetOut:
    """Every Envoy and ext_proc instance the control plane knows: the version it
    applied, its last ACK/NACK (with the error), when it was last seen."""
    if ctx.fleet_status is None:
        return FleetOut(available=False, nodes=[])
    return FleetOut(available=True,
                    nodes=[NodeOut.model_validate(node) for node in ctx.fleet_status()])


@router.get("/healthz", response_model=HealthOut)
def healthz() -> HealthOut:
    """The process answers (liveness)."""
    return HealthOut(status="ok")


@router.get("/readyz", response_model=HealthOut, responses=problem_responses(503))
def readyz(ctx: Context) -> HealthOut:
    """Ready to serve: the rule store answers, the process's own check (if any) passes
    and no part of the gateway is down (under `keg up`: ext_proc, Envoy, the broker)."""
    try:
        number, _ = ctx.store.rules()
    except StoreError as err:
        log.warning("not ready: %s", err)
        raise Problem(503, "Not ready", "the rule store cannot be reached",
                      kind="not-ready", headers={"Retry-After": "5"}) from None
    if ctx.settings.ready is not None and not ctx.settings.ready():
        raise Problem(503, "Not ready", "the control plane is starting", kind="not-ready",
                      headers={"Retry-After": "5"})
    if ctx.settings.problems is not None and (down := ctx.settings.problems()):
        raise Problem(503, "Not ready", "; ".join(down), kind="not-ready",
                      headers={"Retry-After": "5"})
    return HealthOut(status="ok", version=number)


@router.get("/metrics", response_class=Response, responses={
    200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}})
def metrics(ctx: Context) -> Response:
    """Prometheus metrics (text exposition format)."""
    return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)
