"""What the built-in actions share: value codecs, secrets (interceptors/keys.py) and the
text of a field."""

from __future__ import annotations

from typing import Any, Protocol

from filter_rules.record_actions import AvroSchemaRef
from interceptors.avro import AvroCodec
from interceptors.contract import (
    BuildContext,
    InterceptedRecord,
    InterceptorConfigError,
    RecordRejected,
)
from interceptors.jsonpath import JSON_CODEC, FieldPath, PathError, dump_json
from interceptors.keys import read_aes_key, read_hash_key, read_secret

__all__ = ["ValueCodec", "compile_paths", "dump_json", "field_text", "read_aes_key",
           "read_hash_key", "read_secret", "unreadable_value", "value_codec"]


class ValueCodec(Protocol):
    """Decoded documents from record bytes and back. `decode` raises ValueError."""

    def decode(self, data: bytes) -> Any: ...

    def encode(self, doc: Any, like: bytes) -> bytes: ...


def value_codec(fmt: str, schema: AvroSchemaRef | None, ctx: BuildContext) -> ValueCodec:
    if fmt == "avro":
        if schema is None:
            raise InterceptorConfigError("format avro needs avro_schema")
        return AvroCodec(schema, ctx)
    return JSON_CODEC


def unreadable_value(record: InterceptedRecord, policy: str, fmt: str,
                     err: Exception) -> InterceptedRecord:
    """A value a rule must change but cannot read: fail closed (RecordRejected: the
    record is refused at produce, withheld at fetch) unless the rule says `pass`."""
    if policy == "pass":
        return record
    detail = "nested too deeply" if isinstance(err, RecursionError) else str(err)[:200]
    raise RecordRejected(f"the value is not readable {fmt}: {detail}")


def compile_paths(texts: list[str]) -> list[FieldPath]:
    try:
        return [FieldPath(t) for t in texts]
    except PathError as exc:
        raise InterceptorConfigError(str(exc)) from None


def field_text(value: Any) -> str:
    """A field's text: a string as it is, anything else its compact JSON."""
    if isinstance(value, str):
        return value
    return dump_json(value).decode()
