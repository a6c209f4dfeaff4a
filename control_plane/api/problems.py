"""Every error the API answers is RFC 7807 problem+json: type, title, status, detail.

Invalid rules add `errors`: one entry per problem with `file`, `line`, `column`,
`field` and `message` (line and column count from 1; null when the input has no
lines, e.g. a field of a JSON request). The store's and the loader's exceptions are
translated here, once, so route handlers just raise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from control_plane.store import (
    InvalidChange,
    OutOfScope,
    PreconditionFailed,
    PreconditionRequired,
    RuleNotFound,
    RuleOwned,
    ServedDirectory,
    StoreError,
    StoreUnavailable,
    VersionNotFound,
)
from filter_rules import RuleError, RuleSetInvalid

log = logging.getLogger(__name__)

PROBLEM_JSON: Final = "application/problem+json"
_TYPE_PREFIX: Final = "urn:keg:problem:"


class Problem(Exception):
    """Raise to answer with a problem document."""

    def __init__(self, status: int, title: str, detail: str = "", *, kind: str | None = None,
                 errors: Sequence[Mapping[str, Any]] | None = None,
                 headers: Mapping[str, str] | None = None,
                 extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(detail or title)
        self.status = status
        self.title = title
        self.detail = detail
        self.kind = kind
        self.errors = list(errors) if errors is not None else None
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def document(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": f"{_TYPE_PREFIX}{self.kind}" if self.kind else "about:blank",
            "title": self.title,
            "status": self.status,
            "detail": self.detail or self.title,
        }
        if self.errors is not None:
            body["errors"] = self.errors
        body.update(self.extra)
        return body

    def response(self) -> JSONResponse:
        return JSONResponse(self.document(), status_code=self.status,
                            headers=self.headers, media_type=PROBLEM_JSON)


PROBLEM_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "RFC 7807 problem details.",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "errors": {"type": "array", "items": {
            "type": "object",
            "required": ["file", "line", "column", "field", "message"],
            "properties": {
                "file": {"type": "string"},
                "line": {"type": ["integer", "null"]},
                "column": {"type": ["integer", "null"]},
                "field": {"type": "string"},
                "message": {"type": "string"},
            },
        }},
        "owners": {"type": "object", "additionalProperties": {"type": "string"},
                   "description": "409: the owned rules and their owners."},
    },
}
_DESCRIPTIONS: Final = {
    400: "Bad request.", 401: "No bearer token (or not the Bearer scheme).",
    403: "Not a valid token, or a change outside the token's owner scope.",
    404: "Not found.", 409: "Owned by a rule directory.",
    412: "ETag mismatch (If-Match / If-None-Match).", 413: "Body too large.",
    422: "Invalid input: `errors` gives each problem's file, line, column and field.",
    428: "If-Match is required.", 503: "The rule store cannot be reached.",
}


def problem_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for these statuses, as problem+json."""
    content = {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    return {code: {"description": _DESCRIPTIONS.get(code, "Error."), "content": content}
            for code in codes}


def rule_errors(errors: Sequence[RuleError]) -> list[dict[str, Any]]:
    return [{"file": e.file, "line": e.line, "column": e.column, "field": e.field_path,
             "message": e.message} for e in errors]


def invalid_rules(err: RuleSetInvalid) -> Problem:
    count = len(err.errors)
    first = f": {err.errors[0]}" if err.errors else ""
    return Problem(422, "Invalid rules", f"{count} problem(s) in the rules{first}",
                   kind="invalid-rules", errors=rule_errors(err.errors))


def from_store_error(err: StoreError) -> Problem:
    if isinstance(err, RuleNotFound | VersionNotFound):
        return Problem(404, "Not found", str(err), kind="not-found")
    if isinstance(err, PreconditionFailed):
        headers = {"ETag": f'"{err.current_etag}"'} if err.current_etag else {}
        return Problem(412, "Precondition failed", str(err), kind="etag-mismatch",
                       headers=headers)
    if isinstance(err, PreconditionRequired):
        return Problem(428, "Precondition required", str(err), kind="etag-required")
    if isinstance(err, OutOfScope):
        return Problem(403, "Out of the token's scope", str(err), kind="out-of-scope",
                       extra={"out_of_scope": err.owners})
    if isinstance(err, ServedDirectory):
        return Problem(409, "Rules of the served rule directory", str(err),
                       kind="served-directory", extra={"owner": err.owner})
    if isinstance(err, RuleOwned):
        return Problem(409, "Rule owned by a rule directory", str(err), kind="rule-owned",
                       extra={"owners": err.owners})
    if isinstance(err, InvalidChange):
        errors = [{"file": "request", "line": None, "column": None, "field": err.field,
                   "message": str(err)}]
        return Problem(422, "Invalid change", str(err), kind="invalid-change", errors=errors)
    if isinstance(err, StoreUnavailable):
        log.error("rule store unavailable: %s", err)
        return Problem(503, "Store unavailable", "the rule store cannot be reached; retry later",
                       kind="store-unavailable", headers={"Retry-After": "5"})
    log.error("rule store error: %s", err)
    return Problem(500, "Store error", str(err), kind="store-error")


def install_handlers(app: FastAPI,
                     caller_first: Callable[[Request], None] | None = None) -> None:
    """The problem documents of every error; `caller_first(request)` raises the route's
    401/403 problem, if any, before a body FastAPI could not read is answered."""

    async def problem(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Problem)
        return exc.response()

    async def store_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StoreError)
        return from_store_error(exc).response()

    async def rules_invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RuleSetInvalid)
        return invalid_rules(exc).response()

    async def request_invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        if caller_first is not None and any(e.get("type") == "json_invalid"
                                            for e in exc.errors()):
            try:
                caller_first(request)
            except Problem as refused:
                return refused.response()
        errors = [{"file": "request", "line": None, "column": None,
                   "field": ".".join(str(p) for p in e.get("loc", ())),
                   "message": str(e.get("msg", ""))} for e in exc.errors()]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
        return Problem(422, "Invalid request", detail, kind="invalid-request",
                       errors=errors).response()

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        title = _TITLES.get(exc.status_code, "Error")
        detail = exc.detail if isinstance(exc.detail, str) else title
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Each method of a path is its own route: Starlette's Allow names one.
            headers["Allow"] = ", ".join(_allowed(request))
        return Problem(exc.status_code, title, detail, headers=headers).response()

    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error in the control-plane API", exc_info=exc)
        return Problem(500, "Internal error", "an unexpected error occurred; see the "
                       "control plane's log", kind="internal").response()

    app.add_exception_handler(Problem, problem)
    app.add_exception_handler(StoreError, store_error)
    app.add_exception_handler(RuleSetInvalid, rules_invalid)
    app.add_exception_handler(RequestValidationError, request_invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)


def _allowed(request: Request) -> list[str]:
    methods: set[str] = set()
    for route in getattr(request.app.state, "api_routes", ()):
        if route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods or set()
    return sorted(methods)


_TITLES: Final = {
    400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found",
    405: "Method not allowed", 406: "Not acceptable", 409: "Conflict",
    413: "Request too large", 415: "Unsupported media type", 422: "Unprocessable content",
}
