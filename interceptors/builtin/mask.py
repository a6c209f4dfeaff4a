"""mask: redact, hash, truncate, null or remove fields of JSON or Avro values.

A record is returned untouched (the same key/value objects, never re-serialized) when
its value is null, `when` does not match, no path names a field in it, or every named
field is null or already holds the masked value. A value that is not JSON (or not
the schema's Avro), or is nested deeper than a parser follows, fails closed: the
record is refused (`unreadable: refuse`, the default) unless the rule says `pass`, so
a field the rule must hide never goes out in clear.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping
from typing import Any, Final

from filter_rules.record_actions import MaskSpec
from interceptors.avro import AvroCodec
from interceptors.builtin._values import (
    ValueCodec,
    compile_paths,
    field_text,
    read_hash_key,
    unreadable_value,
    value_codec,
)
from interceptors.contract import BuildContext, InterceptedRecord, InterceptorConfigError
from interceptors.jsonpath import FieldPath, delete_locations
from interceptors.predicate import compile_predicate

Masker = Callable[[Any], Any]
_STRING_METHODS: Final = frozenset({"redact", "hash", "truncate"})


class MaskInterceptor:
    __slots__ = ("codec", "format", "mask", "paths", "remove", "unreadable", "when")

    def __init__(self, spec: MaskSpec, ctx: BuildContext) -> None:
        self.paths = compile_paths(spec.fields)
        self.codec: ValueCodec = value_codec(spec.format, spec.avro_schema, ctx)
        if isinstance(self.codec, AvroCodec):
            for path in self.paths:
                _check_avro_field(self.codec, path, spec.method)
        self.remove = spec.method == "remove"
        self.mask: Masker = _masker(spec, ctx)
        self.when = compile_predicate(spec.when)
        self.unreadable = spec.unreadable
        self.format = spec.format

    def configure(self, config: Mapping[str, Any]) -> None:
        """Built when the rule set is compiled; nothing to configure."""

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord | None:
        value = record.value
        if value is None:
            return record
        try:
            doc = self.codec.decode(value)
            if self.when is not None and not self.when(record, doc):
                return record
            return self._mask(record, value, doc)
        except (ValueError, RecursionError) as err:
            return unreadable_value(record, self.unreadable, self.format, err)

    def _mask(self, record: InterceptedRecord, value: bytes, doc: Any) -> InterceptedRecord:
        changed = False
        for path in self.paths:
            locations = path.locations(doc)
            if not locations:
                continue
            if self.remove:
                delete_locations(locations)
                changed = True
                continue
            for container, key in locations:
                old = container[key]
                if old is None:
                    continue  # nothing to hide
                new = self.mask(old)
                if new != old:
                    container[key] = new
                    changed = True
        if changed:
            record.value = self.codec.encode(doc, value)
        return record


def build_mask(spec: MaskSpec, ctx: BuildContext) -> MaskInterceptor:
    return MaskInterceptor(spec, ctx)


def _masker(spec: MaskSpec, ctx: BuildContext) -> Masker:
    method = spec.method
    if method == "redact":
        replacement = spec.replacement
        return lambda _old: replacement
    if method == "truncate":
        keep = spec.keep
        return lambda old: field_text(old)[:keep]
    if method == "hash":
        assert spec.hash_key is not None  # the model insists
        key = read_hash_key(spec.hash_key, ctx)

        def keyed_hash(old: Any) -> str:
            return hmac.new(key, field_text(old).encode(), hashlib.sha256).hexdigest()

        return keyed_hash
    return lambda _old: None  # null (remove deletes instead)


def _check_avro_field(codec: AvroCodec, path: FieldPath, method: str) -> None:
    types, holder = codec.types_at(path)
    if method in _STRING_METHODS and "string" not in types:
        raise InterceptorConfigError(
            f"mask {method} writes a string but {path.text} is "
            f"{' or '.join(sorted(types))} in the Avro schema {codec.name}"
        )
    if method == "null" and "null" not in types:
        raise InterceptorConfigError(
            f"mask null needs {path.text} to allow null in the Avro schema {codec.name}"
        )
    if method == "remove" and holder == "record":
        raise InterceptorConfigError(
            f"mask remove cannot delete {path.text}: the Avro schema {codec.name} requires "
            "the field (use method null on a nullable field)"
        )
