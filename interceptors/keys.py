"""Secrets and keys a rule names: read from an environment variable or a file.

Rule files never hold secrets. These readers are what building a rule and `keg validate`
(interceptors/secrets.py) use; their errors say where a secret was looked for, never
its value.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from typing import Final

from filter_rules.files import read_regular_file
from filter_rules.record_actions import SecretRef
from interceptors.contract import BuildContext, InterceptorConfigError

AES_KEY_BYTES: Final = 32
MIN_HASH_KEY_BYTES: Final = 16


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
        try:  # a regular file only, bounded: a FIFO or /dev/zero never ends
            text = _newlines(read_regular_file(path).decode("utf-8"))
        except OSError as exc:
            raise InterceptorConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise InterceptorConfigError(f"{what}: {path} is not UTF-8 text") from None
        source = f"file {path}"
    text = text.strip()
    if not text:
        raise InterceptorConfigError(f"{what}: {source} is empty")
    return text


def _newlines(text: str) -> str:
    """As a file read in text mode does: CRLF and CR become LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


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


def decode_aes_key(text: str) -> bytes | None:
    """A 32-byte key written as 64 hex digits or base64; None when it is not one."""
    key = _decode_key(text.strip())
    return key if key is not None and len(key) == AES_KEY_BYTES else None


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
