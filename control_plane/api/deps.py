"""What route handlers are given: the app's context, the caller, the change's reason.

`Writer` and `Reader` are the caller: its token's name and the owners whose rules it
may change (`Reader` is None for an anonymous read when reads are public). 401: no
`Authorization: Bearer` header; 403: a token that is not one of ours. Tokens are
never logged or echoed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Final

from fastapi import Depends, Header, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import TypeAdapter, ValidationError

from control_plane.api.metrics import ApiMetrics
from control_plane.api.problems import Problem
from control_plane.api.settings import ApiSettings
from control_plane.store import EVERY_OWNER, Change, OwnerScope, RuleStore
from filter_rules import Rule
from filter_rules.host_access import host_resources

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


@dataclass(frozen=True)
class Caller:
    """Who calls: the token's name (what versions record) and its scope."""

    name: str
    scope: OwnerScope = EVERY_OWNER


def authenticate(request: Request, ctx: ApiContext) -> Caller:
    """The caller the token names; raises the 401/403 problem otherwise."""
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
    return Caller(name, ctx.settings.tokens.scope(name))


def writer(request: Request, ctx: Context,
           _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Caller:
    return authenticate(request, ctx)


def reader(request: Request, ctx: Context,
           _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
           ) -> Caller | None:
    if ctx.settings.public_reads:
        return None
    return authenticate(request, ctx)


def writer_unless_dry_run(
        request: Request, ctx: Context,
        _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Caller | None:
    """/v1/apply's caller: a writer, or a reader for `?dry_run=true`. A dependency, so a
    caller without a token is told 401 before anything about the body it sent."""
    if _query_flag(request, "dry_run"):
        return reader(request, ctx, None)
    return writer(request, ctx, None)


_FLAG: Final = TypeAdapter(bool)


def _query_flag(request: Request, name: str) -> bool:
    """A boolean query parameter read as FastAPI reads the route's own (pydantic's lax
    bool: `true`, `1`, `yes`, `on`, `t`, `y`...); one it cannot read is False here, and
    the route answers 422 for it once the caller may know."""
    try:
        return _FLAG.validate_python(request.query_params.get(name, False))
    except ValidationError:
        return False


Writer = Annotated[Caller, Depends(writer)]
Reader = Annotated[Caller | None, Depends(reader)]
WriterUnlessDryRun = Annotated[Caller | None, Depends(writer_unless_dry_run)]
# The dependencies that say who calls (the app runs them before answering a body it
# cannot read, so an anonymous caller learns nothing of a route it may not use).
CALLER_DEPENDENCIES: Final = (writer, reader, writer_unless_dry_run)


def caller_first(request: Request, dependencies: Iterable[Callable[..., Any]]) -> None:
    """Runs the caller dependency among a route's `dependencies` (raising its 401/403
    problem): FastAPI reads a JSON body before any dependency, so an unreadable one was
    answered 422 before the missing token's 401."""
    for call in dependencies:
        if call in CALLER_DEPENDENCIES:
            call(request, context(request), None)


def has_host_access(who: Caller | None) -> bool:
    """Whether `who` may have rules use the gateway host (its files, environment, code):
    a token without an owner scope; an anonymous reader never may."""
    return who is not None and who.scope.patterns is None


def require_host_access(who: Caller | None, rules: Iterable[Rule], doing: str) -> None:
    """403 unless `who` may have the gateway host used for it: only a token without an
    owner scope may `doing` rules that read the host's files or environment, run code,
    or write files (filter_rules.host_access); an anonymous reader never may."""
    if has_host_access(who):
        return
    for rule in rules:
        if uses := host_resources(rule):
            holder = "an anonymous caller" if who is None else \
                f"a token scoped to {who.scope.describe()}"
            raise Problem(
                403, "Forbidden",
                f"rule {rule.id} uses what is on the gateway host ({'; '.join(uses)}): "
                f"{holder} may not {doing} it; only a token that may change every owner's "
                "rules may (or a rule directory)", kind="host-resources")


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


def change(author: Caller | None, why: str) -> Change:
    return Change(author=author.name if author else "anonymous", reason=why)


async def raw_body(request: Request) -> bytes:
    """The request body (app.BodyGuard has read and bounded it already)."""
    return await request.body()


RawBody = Annotated[bytes, Depends(raw_body)]
