"""Request bodies, bounded before any route reads them (a pure ASGI middleware).

Every route sees its body only after this middleware read it whole: the size limit
counts the bytes actually received, so a chunked body (`Transfer-Encoding: chunked`,
no Content-Length) is cut off at the limit like any other, whichever route it is
for. A declared Content-Length over the limit is refused before anything is read.

JSON bodies are also refused when nested deeper than `MAX_JSON_DEPTH`: Python's JSON
decoder recurses per level, and no request of this API nests that deep (rule files
have the same bound, filter_rules._yaml.MAX_DEPTH); and when an object repeats a key:
Python's decoder, like most, keeps the last copy without a word, so a rule written
`{"action": {"observe": {}}, "action": {"deny": {}}}` became a deny of everything
(rule files refuse a repeated key too, filter_rules._yaml).
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane.api.problems import Problem
from filter_rules._yaml import MAX_DEPTH

MAX_JSON_DEPTH: Final = MAX_DEPTH
_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET: Final = re.compile(rb"[\[\]{}]")
_OPENING: Final = frozenset(b"[{")


class BodyTooLarge(Problem):
    def __init__(self, limit: int) -> None:
        super().__init__(413, "Request too large", f"the body is larger than {limit} bytes",
                         kind="too-large")


class JsonTooDeep(Problem):
    def __init__(self, depth: int) -> None:
        super().__init__(422, "Invalid request", f"the JSON body is nested {depth} levels "
                         f"deep; at most {MAX_JSON_DEPTH} are accepted", kind="invalid-request")


def json_depth(raw: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (0 for a scalar). Brackets
    inside strings do not count; on text that is not JSON the figure is a guess, and
    the decoder will refuse the text anyway."""
    brackets = _BRACKET.findall(_STRING.sub(b"", raw))
    steps = (1 if bracket[0] in _OPENING else -1 for bracket in brackets)
    return max(accumulate(steps, initial=0))


def check_json_depth(raw: bytes) -> None:
    """Raise JsonTooDeep (422) for JSON nested deeper than MAX_JSON_DEPTH."""
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise JsonTooDeep(depth)


class RepeatedJsonKey(Problem):
    def __init__(self, field: str, key: str) -> None:
        super().__init__(422, "Invalid request", f"{field}: the key {key!r} is repeated in "
                         "one object of the JSON body; which copy is meant cannot be told",
                         kind="invalid-request", errors=[{
                             "file": "request body", "line": None, "column": None,
                             "field": field, "message": f"duplicate key {key!r}"}])


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as the decoder read it: every key, repeated ones too."""


def repeated_key(raw: bytes | str) -> tuple[str, str] | None:
    """The first key a JSON object of `raw` repeats: (its field path, `rules[0].action`;
    the key), or None. Text that is not JSON has none: whoever reads it refuses it."""
    try:
        document = json.loads(raw, object_pairs_hook=_Pairs)
    except (ValueError, RecursionError):
        return None
    return _first_repeat(document, "")


def _first_repeat(value: Any, path: str) -> tuple[str, str] | None:
    if isinstance(value, _Pairs):
        seen: set[str] = set()
        for key, item in value:
            field = f"{path}.{key}" if path else key
            if key in seen:
                return field, key
            seen.add(key)
            if (found := _first_repeat(item, field)) is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if (found := _first_repeat(item, f"{path}[{i}]")) is not None:
                return found
    return None


def check_json_keys(raw: bytes) -> None:
    """Raise RepeatedJsonKey (422) for JSON with an object that repeats a key."""
    if (found := repeated_key(raw)) is not None:
        raise RepeatedJsonKey(*found)


def _is_json(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or media.endswith(b"+json")
    return False


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.strip().isdigit() else None
    return None


class BodyGuard:
    """Reads every request body before the app does, bounded to `limit` bytes (413),
    and JSON bodies to MAX_JSON_DEPTH levels and to keys each object has once (422),
    answering problem+json; the app then gets the body as one message."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            declared = _declared_length(scope)
            if declared is not None and declared > self.limit:
                raise BodyTooLarge(self.limit)  # refused before a byte is read
            body = await self._read_all(receive)
            if _is_json(scope):
                check_json_depth(body)
                check_json_keys(body)
        except Problem as problem:
            await problem.response()(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_all(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                raise Problem(400, "Bad request", "the client closed the request")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                raise BodyTooLarge(self.limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body already read, as one message; then whatever `receive` says (a
    disconnect), as Starlette expects after the body."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
