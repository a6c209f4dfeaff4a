"""encrypt / decrypt: AES-256-GCM over whole values or over JSON/Avro fields.

Whole value: `KEG1` + nonce (12 bytes) + ciphertext||tag (16 bytes).
Field: the field's JSON text encrypted, written as the string
`keg:v1:<base64url(nonce + ciphertext||tag)>`; decryption gives the JSON value back
with its type. Both set the header `keg.key-id` to the key's id; decryption picks its
key by that header.

Keys are static (`key`: 32 bytes from an environment variable or a file) or, with
`kms`, data keys a KMS generates and wraps (envelope encryption, interceptors/kms.py):
the wrapped data key travels in the header `keg.dek`, `keg.key-id` names it, and
decryption unwraps it through the KMS (cached: never a KMS call per record).

Nonces are random (96 bits, the GCM standard size), so encrypting the same record
twice gives different bytes: encryption is the one built-in that is not byte-for-byte
deterministic. The associated data is a fixed label per form (whole value, field), so
a field's ciphertext cannot pass as a whole value or the reverse. The topic is *not*
authenticated: ciphertexts survive copies to other topics, mirroring and virtual topic
renames; use a key per topic where moving ciphertexts between topics must fail.

Decryption leaves a record unchanged when it has no key id header, names a key the
rule does not hold, or is not in the format above. A ciphertext that fails its
authentication tag (tampered, or a key with a reused id) is left as it is and logged
once per rule, without key material; `failures` counts them.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
from collections.abc import Mapping
from typing import Any, Final

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from filter_rules.record_actions import (
    HEADER_DATA_KEY,
    HEADER_ENCRYPTION_KEY_ID,
    DecryptSpec,
    EncryptSpec,
)
from interceptors.avro import AvroCodec
from interceptors.builtin._values import (
    ValueCodec,
    compile_paths,
    dump_json,
    read_aes_key,
    unreadable_value,
    value_codec,
)
from interceptors.contract import BuildContext, InterceptedRecord, InterceptorConfigError
from interceptors.jsonpath import FieldPath
from interceptors.kms import DataKeys, KmsClient, WrappedKey, kms_client

log = logging.getLogger(__name__)

VALUE_MAGIC: Final = b"KEG1"
FIELD_PREFIX: Final = "keg:v1:"
NONCE_BYTES: Final = 12
TAG_BYTES: Final = 16
_VALUE_AAD: Final = b"keg:value"
_FIELD_AAD: Final = b"keg:field"
_MIN_VALUE_BYTES: Final = len(VALUE_MAGIC) + NONCE_BYTES + TAG_BYTES


class EncryptInterceptor:
    __slots__ = ("_aead", "codec", "data_keys", "format", "key_id", "paths", "unreadable")

    def __init__(self, spec: EncryptSpec, ctx: BuildContext) -> None:
        self.unreadable = spec.unreadable
        self.format = spec.format
        self._aead: AESGCM | None = None
        self.data_keys: DataKeys | None = None
        if spec.kms is not None:
            self.key_id = ""
            self.data_keys = DataKeys(kms_client(spec.kms, ctx), spec.kms)
        else:
            assert spec.key is not None
            self.key_id = spec.key.id
            self._aead = AESGCM(read_aes_key(spec.key.secret, ctx, spec.key.id))
        self.paths = compile_paths(spec.fields) if spec.fields is not None else None
        self.codec: ValueCodec | None = None
        if self.paths is not None:
            self.codec = value_codec(spec.format, spec.avro_schema, ctx)
            _check_avro_strings(self.codec, self.paths, "encrypt")

    def configure(self, config: Mapping[str, Any]) -> None:
        """Built when the rule set is compiled; nothing to configure."""

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord | None:
        value = record.value
        if value is None:
            return record
        if self.data_keys is not None:  # raises ServiceUnavailable when it has no key
            aead, wrapped, key_id = self.data_keys.for_topic(record.topic)
        else:
            assert self._aead is not None
            aead, wrapped, key_id = self._aead, None, self.key_id
        if self.paths is None:
            nonce = os.urandom(NONCE_BYTES)
            record.value = VALUE_MAGIC + nonce + aead.encrypt(nonce, value, _VALUE_AAD)
        elif not self._encrypt_fields(record, value, aead):
            return record
        record.headers = _with_key_id(record.headers, key_id, wrapped)
        return record

    def _encrypt_fields(self, record: InterceptedRecord, value: bytes, aead: AESGCM) -> bool:
        assert self.codec is not None and self.paths is not None
        try:
            doc = self.codec.decode(value)
            return self._seal_fields(record, value, doc, aead)
        except (ValueError, RecursionError) as err:
            unreadable_value(record, self.unreadable, self.format, err)  # raises unless pass
            return False

    def _seal_fields(self, record: InterceptedRecord, value: bytes, doc: Any,
                     aead: AESGCM) -> bool:
        assert self.codec is not None and self.paths is not None
        changed = False
        for path in self.paths:
            for container, key in path.locations(doc):
                plain = container[key]
                if plain is None:
                    continue
                nonce = os.urandom(NONCE_BYTES)
                sealed = nonce + aead.encrypt(nonce, dump_json(plain), _FIELD_AAD)
                container[key] = FIELD_PREFIX + base64.urlsafe_b64encode(sealed).decode()
                changed = True
        if changed:
            record.value = self.codec.encode(doc, value)
        return changed


class DecryptInterceptor:
    __slots__ = ("_fail_open", "_keys", "_kms", "_warned", "codec", "failures", "paths")

    def __init__(self, spec: DecryptSpec, ctx: BuildContext) -> None:
        self._keys: dict[str, AESGCM] = {}
        for key in spec.keys or ():
            if key.id in self._keys:
                raise InterceptorConfigError(f"decrypt lists key id {key.id} twice")
            self._keys[key.id] = AESGCM(read_aes_key(key.secret, ctx, key.id))
        self._kms: KmsClient | None = None
        self._fail_open = False
        if spec.kms is not None:
            self._kms = kms_client(spec.kms, ctx)
            self._fail_open = spec.kms.on_unavailable == "pass"
        self.paths = compile_paths(spec.fields) if spec.fields is not None else None
        self.codec: ValueCodec | None = None
        if self.paths is not None:
            self.codec = value_codec(spec.format, spec.avro_schema, ctx)
            _check_avro_strings(self.codec, self.paths, "decrypt")
        self.failures = 0
        self._warned = False

    def configure(self, config: Mapping[str, Any]) -> None:
        """Built when the rule set is compiled; nothing to configure."""

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord | None:
        value = record.value
        if value is None:
            return record
        aead = self._key_of(record)
        if aead is None:
            return record
        if self.paths is None:
            self._decrypt_value(record, value, aead)
        else:
            self._decrypt_fields(record, value, aead)
        return record

    def _key_of(self, record: InterceptedRecord) -> AESGCM | None:
        """The record's key: its wrapped data key unwrapped by the KMS (raises
        ServiceUnavailable when the KMS does not answer), or the static key its key id
        names; None when this rule holds neither."""
        if self._kms is not None:
            header = record.header(HEADER_DATA_KEY)
            if header is not None:
                wrapped = WrappedKey.decode(header)
                if wrapped is None or wrapped.provider != self._kms.backend.provider:
                    return None
                aead = self._kms.unwrap(wrapped, self._fail_open)
                if aead is None:  # the KMS refuses it: as a failed authentication
                    self._failed(record)
                return aead
        key_id = record.header(HEADER_ENCRYPTION_KEY_ID)
        if key_id is None:
            return None
        return self._keys.get(key_id.decode("utf-8", "replace"))

    def _decrypt_value(self, record: InterceptedRecord, value: bytes, aead: AESGCM) -> None:
        if len(value) < _MIN_VALUE_BYTES or not value.startswith(VALUE_MAGIC):
            return
        nonce = value[len(VALUE_MAGIC) : len(VALUE_MAGIC) + NONCE_BYTES]
        try:
            plain = aead.decrypt(nonce, value[len(VALUE_MAGIC) + NONCE_BYTES :], _VALUE_AAD)
        except InvalidTag:
            self._failed(record)
            return
        record.value = plain
        record.headers = [h for h in record.headers
                          if h[0] != HEADER_ENCRYPTION_KEY_ID and h[0] != HEADER_DATA_KEY]

    def _decrypt_fields(self, record: InterceptedRecord, value: bytes, aead: AESGCM) -> None:
        assert self.codec is not None and self.paths is not None
        try:
            doc = self.codec.decode(value)
        except ValueError:
            return
        changed = False
        for path in self.paths:
            for container, key in path.locations(doc):
                sealed = container[key]
                if not isinstance(sealed, str) or not sealed.startswith(FIELD_PREFIX):
                    continue
                plain = self._open_field(sealed, aead)
                if plain is _FAILED:
                    self._failed(record)
                    continue
                container[key] = plain
                changed = True
        if changed:
            record.value = self.codec.encode(doc, value)

    @staticmethod
    def _open_field(sealed: str, aead: AESGCM) -> Any:
        try:
            raw = base64.urlsafe_b64decode(sealed[len(FIELD_PREFIX) :])
            if len(raw) < NONCE_BYTES + TAG_BYTES:
                return _FAILED
            plain = aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _FIELD_AAD)
            return orjson.loads(plain)
        except (InvalidTag, binascii.Error, ValueError):
            return _FAILED

    def _failed(self, record: InterceptedRecord) -> None:
        self.failures += 1
        if not self._warned:
            self._warned = True
            log.warning(
                "decrypt: a ciphertext on topic %s partition %d failed authentication "
                "(tampered, or another key with the same id); left encrypted. "
                "Further failures of this rule are only counted.",
                record.topic,
                record.partition,
            )


_FAILED: Final = object()


def build_encrypt(spec: EncryptSpec, ctx: BuildContext) -> EncryptInterceptor:
    return EncryptInterceptor(spec, ctx)


def build_decrypt(spec: DecryptSpec, ctx: BuildContext) -> DecryptInterceptor:
    return DecryptInterceptor(spec, ctx)


Headers = list[tuple[str, bytes | None]]


def _with_key_id(headers: Headers, key_id: str, wrapped: bytes | None) -> Headers:
    """The headers naming the key (and, KMS mode, carrying the wrapped data key)."""
    kept = [h for h in headers if h[0] != HEADER_ENCRYPTION_KEY_ID and h[0] != HEADER_DATA_KEY]
    kept.append((HEADER_ENCRYPTION_KEY_ID, key_id.encode()))
    if wrapped is not None:
        kept.append((HEADER_DATA_KEY, wrapped))
    return kept


def _check_avro_strings(codec: ValueCodec, paths: list[FieldPath], action: str) -> None:
    if not isinstance(codec, AvroCodec):
        return
    for path in paths:
        types, _holder = codec.types_at(path)
        if "string" not in types:
            raise InterceptorConfigError(
                f"{action} needs {path.text} to be a string in the Avro schema {codec.name} "
                f"(it is {' or '.join(sorted(types))}): ciphertexts are written as strings"
            )
