"""What route handlers are given: the app's context, the caller, the change's reason.

`Writer` and `Reader` are the caller's token name (`Reader` is None for an anonymous
read when reads are public). 401: no `Authorization: Bearer` header; 403: a token
that is not one of ours. Tokens are never logged or echoed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Final

from fastapi import Depends, Header, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from control_plane.api.metrics import ApiMetrics
from control_plane.api.problems import Problem
from control_plane.api.settings import ApiSettings
from control_plane.store import Change, RuleStore

log = logging.getLogger(__name__)

FleetStatus = Callable[[], list[dict[str, Any]]]
MAX_REASON: Final = 1000
_bearer = HTTPBearer(auto_error=False, description="A named API token: `name:token` entries "
                     "of the token file or KEG_API_TOKENS; send the token part.")


@dataclass
class ApiContext:
    store: RuleStore
    settings: ApiSettings
    metrics: ApiMetrics
    fleet_status: FleetStatus | None = None


def context(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.keg
    return ctx


Context = Annotated[ApiContext, Depends(context)]


def authenticate(request: Request, ctx: ApiContext) -> str:
    """The token's name; raises the 401/403 problem otherwise."""
    challenge = {"WWW-Authenticate": 'Bearer realm="keg"'}
    header = request.headers.get("authorization")
    if header is None:
        ctx.metrics.auth_failures.labels("missing").inc()
        raise Problem(401, "Unauthorized", "this request needs an API token: "
                      "Authorization: Bearer <token>", kind="unauthorized", headers=challenge)
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        ctx.metrics.auth_failures.labels("scheme").inc()
        raise Problem(401, "Unauthorized", "use the Bearer scheme: Authorization: Bearer <token>",
                      kind="unauthorized", headers=challenge)
    name = ctx.settings.tokens.match(token)
    if name is None:
        ctx.metrics.auth_failures.labels("invalid").inc()
        log.warning("refused a request with an unknown API token from %s",
                    request.client.host if request.client else "?")
        raise Problem(403, "Forbidden", "the API token is not valid", kind="forbidden")
    return name


def writer(request: Request, ctx: Context,
           _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> str:
    return authenticate(request, ctx)


def reader(request: Request, ctx: Context,
           _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> str | None:
    if ctx.settings.public_reads:
        return None
    return authenticate(request, ctx)


Writer = Annotated[str, Depends(writer)]
Reader = Annotated[str | None, Depends(reader)]


def reason(
    reason: Annotated[str | None, Query(max_length=MAX_REASON,
                                        description="Why: recorded with the version.")] = None,
    x_keg_reason: Annotated[str | None, Header(description="Why (if no `reason` query).")] = None,
) -> str:
    text = reason if reason is not None else (x_keg_reason or "")
    if len(text) > MAX_REASON:
        raise Problem(422, "Invalid request", f"reason is longer than {MAX_REASON} characters",
                      kind="invalid-request")
    return text.strip()


Reason = Annotated[str, Depends(reason)]


def change(author: str, why: str) -> Change:
    return Change(author=author, reason=why)


async def raw_body(request: Request, ctx: Context) -> bytes:
    """The request body, bounded by `max_body_bytes` (413 past it)."""
    limit = ctx.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Problem(413, "Request too large", f"the body is larger than {limit} bytes",
                      kind="too-large")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Problem(413, "Request too large", f"the body is larger than {limit} bytes",
                          kind="too-large")
        chunks.append(chunk)
    return b"".join(chunks)


RawBody = Annotated[bytes, Depends(raw_body)]
