"""headers: remove, rename, then set record headers (in that order).

`remove` deletes every header of a name; `rename` renames every header of a name in
place (Kafka allows duplicate names, so a renamed header may join existing ones);
`set` gives a name exactly one header: at the position of its first occurrence, or
appended when absent. Values are written as UTF-8. Untouched headers keep their order.
A record none of this changes is returned with its headers list untouched; otherwise
it gets a new list (never changed in place, so the engine can compare).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from filter_rules.record_actions import HeadersSpec
from interceptors.contract import BuildContext, InterceptedRecord, InterceptorConfigError

Headers = list[tuple[str, bytes | None]]


class HeadersInterceptor:
    __slots__ = ("remove", "rename", "set")

    def __init__(self, spec: HeadersSpec, ctx: BuildContext) -> None:
        names = [*(spec.remove or ()), *(spec.rename or {}), *(spec.rename or {}).values(),
                 *(spec.set or {})]
        if any(not name for name in names):
            raise InterceptorConfigError("headers: a header name is empty")
        self.remove = frozenset(spec.remove or ())
        self.rename = dict(spec.rename or {})
        self.set = {name: value.encode() for name, value in (spec.set or {}).items()}

    def configure(self, config: Mapping[str, Any]) -> None:
        """Built when the rule set is compiled; nothing to configure."""

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord | None:
        headers = record.headers
        out: Headers = []
        for name, value in headers:
            if name in self.remove:
                continue
            out.append((self.rename.get(name, name), value))
        for name, value in self.set.items():
            out = _set(out, name, value)
        if out != headers:
            record.headers = out
        return record


def build_headers(spec: HeadersSpec, ctx: BuildContext) -> HeadersInterceptor:
    return HeadersInterceptor(spec, ctx)


def _set(headers: Headers, name: str, value: bytes) -> Headers:
    out: Headers = []
    placed = False
    for header in headers:
        if header[0] != name:
            out.append(header)
        elif not placed:
            out.append((name, value))
            placed = True
    if not placed:
        out.append((name, value))
    return out
