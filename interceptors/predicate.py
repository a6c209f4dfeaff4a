"""RecordPredicate compiled: which records a drop, copy or `when` applies to.

Every condition given must hold. The key is matched as UTF-8 text (a null or
undecodable key matches nothing). A header condition sees the header's last value
(Kafka's lastHeader); `null` asks only that the header be present. A field condition
matches when any value the path names has matching text: a string as it is, a number
or boolean as JSON writes it (1.50 is "1.5"); null, objects, arrays and missing fields
match nothing. The value is parsed as JSON at most once per record, and only when a
field condition is reached (cheap conditions are checked first).
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from filter_rules.compiled import StringMatcher
from filter_rules.record_actions import RecordPredicate
from interceptors.contract import InterceptedRecord, InterceptorConfigError
from interceptors.jsonpath import JSON_CODEC, FieldPath, PathError


class _Unparsed:
    __slots__ = ()


UNPARSED: Final = _Unparsed()
_NOT_JSON: Final = object()


class CompiledPredicate:
    """`predicate(record)`; a caller that already decoded the value passes it as `doc`."""

    __slots__ = ("fields", "headers", "key", "tombstone")

    def __init__(self, spec: RecordPredicate) -> None:
        self.tombstone = spec.tombstone
        self.key = StringMatcher(spec.key) if spec.key is not None else None
        self.headers = tuple(
            (name, StringMatcher(m) if m is not None else None)
            for name, m in (spec.headers or {}).items()
        )
        try:
            self.fields = tuple(
                (FieldPath(path), StringMatcher(m)) for path, m in (spec.fields or {}).items()
            )
        except PathError as exc:
            raise InterceptorConfigError(str(exc)) from None

    @property
    def reads_value(self) -> bool:
        """Whether the predicate needs the decoded value."""
        return bool(self.fields)

    def __call__(self, record: InterceptedRecord, doc: Any = UNPARSED) -> bool:
        if self.tombstone is not None and (record.value is None) != self.tombstone:
            return False
        if self.key is not None and not _utf8_matches(self.key, record.key):
            return False
        for name, matcher in self.headers:
            if not _header_matches(record.headers, name, matcher):
                return False
        if not self.fields:
            return True
        if doc is UNPARSED:
            doc = _parse(record.value)
        if doc is _NOT_JSON:
            return False
        return all(
            any(_text_matches(matcher, v) for v in path.values(doc))
            for path, matcher in self.fields
        )


def compile_predicate(spec: RecordPredicate | None) -> CompiledPredicate | None:
    return CompiledPredicate(spec) if spec is not None else None


def _utf8_matches(matcher: StringMatcher, data: bytes | None) -> bool:
    """A key's or header value's bytes against a string matcher: null or bytes that are
    not UTF-8 match nothing."""
    if data is None:
        return False
    try:
        return matcher(data.decode("utf-8"))
    except UnicodeDecodeError:
        return False


def _header_matches(
    headers: list[tuple[str, bytes | None]], name: str, matcher: StringMatcher | None
) -> bool:
    for header, value in reversed(headers):
        if header == name:
            return matcher is None or _utf8_matches(matcher, value)
    return False


def _parse(value: bytes | None) -> Any:
    if value is None:
        return _NOT_JSON
    try:
        return JSON_CODEC.decode(value)
    except ValueError:
        return _NOT_JSON


def _text_matches(matcher: StringMatcher, value: Any) -> bool:
    if isinstance(value, str):
        return matcher(value)
    if isinstance(value, bool):
        return matcher("true" if value else "false")
    if isinstance(value, int):
        return matcher(str(value))  # exact, beyond 64 bits too
    if isinstance(value, float):
        return matcher(orjson.dumps(value).decode())
    return False
