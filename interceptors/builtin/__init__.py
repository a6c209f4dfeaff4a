"""The declarative record actions of rule files, as KIP-905 interceptors.

`BUILDERS[kind](spec, ctx)` builds the interceptor of a rule's action: everything
costly (paths, predicates, schemas, keys) is done then, and a problem raises
InterceptorConfigError (messages never hold a secret). Every built-in is
deterministic per record except encrypt, whose AES-GCM nonces are random.
"""

from __future__ import annotations

from typing import Final

from interceptors.builtin.crypto import (
    DecryptInterceptor,
    EncryptInterceptor,
    build_decrypt,
    build_encrypt,
)
from interceptors.builtin.headers import HeadersInterceptor, build_headers
from interceptors.builtin.mask import MaskInterceptor, build_mask
from interceptors.builtin.routing import CopyInterceptor, DropInterceptor, build_copy, build_drop
from interceptors.builtin.schema import SchemaInterceptor, build_schema
from interceptors.builtin.validate import ValidateInterceptor, build_validate
from interceptors.contract import Builder

BUILDERS: Final[dict[str, Builder]] = {
    "mask": build_mask,
    "encrypt": build_encrypt,
    "decrypt": build_decrypt,
    "validate": build_validate,
    "schema": build_schema,
    "headers": build_headers,
    "drop": build_drop,
    "copy": build_copy,
}

__all__ = [
    "BUILDERS",
    "CopyInterceptor",
    "DecryptInterceptor",
    "DropInterceptor",
    "EncryptInterceptor",
    "HeadersInterceptor",
    "MaskInterceptor",
    "SchemaInterceptor",
    "ValidateInterceptor",
]
