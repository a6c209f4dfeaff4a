"""JSON documents, and field paths over them.

`JSON_CODEC` reads and writes record values as JSON without losing a number.
Field paths (`$.a.b`, `$.items[*].sku`, `$.lines[0].price`, `$['odd key']`) are compiled
once to a fixed walk over decoded values: JSON as the codec gives it, Avro as fastavro
does (records and maps are dicts, arrays are lists).

A path names zero or more *locations*: (container, key-or-index) pairs whose value can
be read, replaced or deleted. A step that does not fit the value under it (a name on a
list, an index past the end) names nothing there: a missing field is not an error.
`[*]` is every element of a list or every member of an object.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Iterator
from typing import Any, Final

import orjson

from filter_rules.record_actions import JSON_PATH_PATTERN

# orjson reads integers beyond 64 bits as floats (precision lost); the stdlib keeps them.
# A run of 19 digits is the cheap sign of such a number (or of a long digit string).
# Found by mapping digits to "0" and the rest to " " (C speed: ~10x faster than a regex).
_DIGIT_MAP: Final = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_DIGIT_RUN: Final = b"0" * 19


class JsonCodec:
    """RFC 8259 JSON: orjson, and the stdlib for values holding very long numbers, so a
    value that is written back keeps every integer exactly. `decode` raises ValueError
    for anything that is not JSON (NaN, Infinity, invalid UTF-8 included)."""

    __slots__ = ()

    def decode(self, data: bytes) -> Any:
        if _LONG_DIGIT_RUN not in bytes(data).translate(_DIGIT_MAP):
            return orjson.loads(data)  # nesting past 1024 levels: JSONDecodeError
        try:
            return json.loads(
                data.decode("utf-8"), parse_constant=_not_json, parse_float=_finite_float
            )
        except RecursionError:  # the stdlib's parser recurses: deep nesting is unreadable
            raise ValueError("JSON nested too deeply to read") from None

    def encode(self, doc: Any, like: bytes = b"") -> bytes:
        return dump_json(doc)


def dump_json(value: Any) -> bytes:
    """Compact JSON: orjson, the stdlib for integers beyond 64 bits; Avro's bytes and
    logical types (decimal) that JSON has no word for as base64 / text."""
    try:
        return orjson.dumps(value, default=_fallback)
    except TypeError:  # integers beyond 64 bits
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_fallback)
        return text.encode()


def _fallback(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    return str(value)


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


JSON_CODEC: Final = JsonCodec()


class _Wildcard:
    __slots__ = ()

    def __repr__(self) -> str:
        return "[*]"


WILDCARD: Final = _Wildcard()
Step = str | int | _Wildcard
Location = tuple[Any, Any]  # (dict, key) or (list, index)

_PATH = re.compile(JSON_PATH_PATTERN)
_STEP = re.compile(r"\.([A-Za-z_$][A-Za-z0-9_$-]*)|\[(\*|\d+|'[^']*')\]")


class PathError(ValueError):
    """A field path outside the supported JSONPath subset."""


class FieldPath:
    """One compiled path: `steps` from the root, and whether any step fans out."""

    __slots__ = ("fans_out", "steps", "text")

    def __init__(self, text: str) -> None:
        if not _PATH.match(text):
            raise PathError(
                f"invalid field path '{text}' (expected $.a.b, $.items[*].sku, "
                "$.lines[0].price or $['odd key'])"
            )
        steps: list[Step] = []
        for name, bracket in _STEP.findall(text[1:]):
            if name:
                steps.append(name)
            elif bracket == "*":
                steps.append(WILDCARD)
            elif bracket.startswith("'"):
                steps.append(bracket[1:-1])
            else:
                steps.append(int(bracket))
        self.text = text
        self.steps: tuple[Step, ...] = tuple(steps)
        self.fans_out = any(s is WILDCARD for s in steps)

    def __repr__(self) -> str:
        return f"FieldPath({self.text!r})"

    def locations(self, doc: Any) -> list[Location]:
        """Where the path's values are in `doc`, in document order."""
        if not self.fans_out:
            # The common case: no wildcard, one walk, no intermediate lists.
            node = doc
            for step in self.steps[:-1]:
                node = _child(node, step)
                if node is _MISSING:
                    return []
            last = self.steps[-1]
            return [(node, last)] if _has(node, last) else []
        parents = [doc]
        for step in self.steps[:-1]:
            parents = _step(parents, step)
            if not parents:
                return []
        return _slots(parents, self.steps[-1])

    def values(self, doc: Any) -> Iterator[Any]:
        """The values the path names in `doc`."""
        for container, key in self.locations(doc):
            yield container[key]


def delete_locations(locations: list[Location]) -> None:
    """Delete every location; list items from the back so indices stay valid."""
    list_items: list[Location] = []
    for container, key in locations:
        if isinstance(container, dict):
            container.pop(key, None)
        else:
            list_items.append((container, key))
    for container, index in sorted(list_items, key=lambda loc: (id(loc[0]), -loc[1])):
        del container[index]


class _Missing:
    __slots__ = ()


_MISSING: Final = _Missing()


def _child(node: Any, step: Step) -> Any:
    if type(step) is str:
        return node.get(step, _MISSING) if isinstance(node, dict) else _MISSING
    if type(step) is int and isinstance(node, list) and step < len(node):
        return node[step]
    return _MISSING


def _has(node: Any, step: Step) -> bool:
    if type(step) is str:
        return isinstance(node, dict) and step in node
    return type(step) is int and isinstance(node, list) and step < len(node)


def _step(parents: list[Any], step: Step) -> list[Any]:
    out: list[Any] = []
    if step is WILDCARD:
        for node in parents:
            if isinstance(node, list):
                out.extend(node)
            elif isinstance(node, dict):
                out.extend(node.values())
    elif type(step) is str:
        for node in parents:
            if isinstance(node, dict):
                child = node.get(step, _MISSING)
                if child is not _MISSING:
                    out.append(child)
    elif isinstance(step, int):
        for node in parents:
            if isinstance(node, list) and step < len(node):
                out.append(node[step])
    return out


def _slots(parents: list[Any], step: Step) -> list[Location]:
    out: list[Location] = []
    if step is WILDCARD:
        for node in parents:
            if isinstance(node, list):
                out.extend((node, i) for i in range(len(node)))
            elif isinstance(node, dict):
                out.extend((node, k) for k in node)
    else:
        out.extend((node, step) for node in parents if _has(node, step))
    return out
