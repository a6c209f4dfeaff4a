"""What the built-in actions share: value codecs, secrets and the text of a field."""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from typing import Any, Final, Protocol

from filter_rules.record_actions import AvroSchemaRef, SecretRef
from interceptors.avro import AvroCodec
from interceptors.contract import (
    BuildContext,
    InterceptedRecord,
    InterceptorConfigError,
    RecordRejected,
)
from interceptors.jsonpath import JSON_CODEC, FieldPath, PathError, dump_json

AES_KEY_BYTES: Final = 32
MIN_HASH_KEY_BYTES: Final = 16


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


# --- secrets -----------------------------------------------------------------------


def read_secret(ref: SecretRef, ctx: BuildContext, what: str) -> str:
    """The secret's text, stripped. Errors name where it was looked for, never its value."""
    if ref.env is not None:
        environ: Mapping[str, str] = ctx.environ if ctx.environ is not None else os.environ
        text = environ.get(ref.env)
        if text is None:
            raise InterceptorConfigError(f"{what}: environment variable {ref.env} is not set")
        source = f"environment variable {ref.env}"
    else:
        assert ref.file is not None
        path = ctx.resolve(ref.file)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InterceptorConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise InterceptorConfigError(f"{what}: {path} is not UTF-8 text") from None
        source = f"file {path}"
    text = text.strip()
    if not text:
        raise InterceptorConfigError(f"{what}: {source} is empty")
    return text


def read_aes_key(ref: SecretRef, ctx: BuildContext, key_id: str) -> bytes:
    """32 bytes given as 64 hex digits or as base64 (standard or URL-safe)."""
    what = f"key {key_id}"
    text = read_secret(ref, ctx, what)
    key = _decode_key(text)
    if key is None or len(key) != AES_KEY_BYTES:
        where = f"environment variable {ref.env}" if ref.env else f"file {ref.file}"
        raise InterceptorConfigError(
            f"{what}: {where} does not hold a 32-byte AES-256 key as 64 hex digits or base64"
        )
    return key


def _decode_key(text: str) -> bytes | None:
    if len(text) == 2 * AES_KEY_BYTES:
        try:
            return bytes.fromhex(text)
        except ValueError:
            pass
    try:
        return base64.b64decode(text.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        return None


def read_hash_key(ref: SecretRef, ctx: BuildContext) -> bytes:
    """An HMAC key: the secret's UTF-8 bytes as written, at least 16 of them."""
    key = read_secret(ref, ctx, "hash_key").encode()
    if len(key) < MIN_HASH_KEY_BYTES:
        raise InterceptorConfigError(
            f"hash_key is shorter than {MIN_HASH_KEY_BYTES} bytes; use a long random secret"
        )
    return key
