"""The built-in record actions, built from rule specs as the engine builds them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import logging
from pathlib import Path
from typing import Any

import fastavro
import orjson
import pytest

from filter_rules.record_actions import (
    HEADER_ENCRYPTION_KEY_ID,
    RECORD_KINDS,
    CopySpec,
    DecryptSpec,
    DropSpec,
    EncryptSpec,
    HeadersSpec,
    MaskSpec,
    ValidateSpec,
)
from interceptors import (
    BuildContext,
    InterceptedRecord,
    Interceptor,
    InterceptorConfigError,
    NoSideEffects,
    RecordRejected,
)
from interceptors.builtin import BUILDERS

KEY_A = bytes(range(32))
KEY_B = bytes(range(1, 33))
HASH_KEY = "a-long-enough-hash-secret"
ENV = {
    "KEY_A": base64.b64encode(KEY_A).decode(),
    "KEY_B": KEY_B.hex(),
    "HASH": HASH_KEY,
    "SHORT": "short",
    "BAD_KEY": base64.b64encode(b"sixteen byte key").decode(),
}
ORDER_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "email", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {
            "name": "card",
            "type": {
                "type": "record",
                "name": "Card",
                "fields": [{"name": "number", "type": "string"}],
            },
        },
        {"name": "backup", "type": ["null", "Card"], "default": None},
        {"name": "tags", "type": {"type": "map", "values": "string"}},
        {"name": "items", "type": {"type": "array", "items": "string"}},
    ],
}
ORDER = {
    "id": 7,
    "email": "ann@example.com",
    "note": None,
    "card": {"number": "4111111111111111"},
    "backup": {"number": "5500000000000004"},
    "tags": {"a": "1", "b": "2"},
    "items": ["x", "y"],
}


@pytest.fixture
def ctx(tmp_path: Path) -> BuildContext:
    return BuildContext(side_effects=NoSideEffects(), base_dir=tmp_path, environ=ENV)


def build(kind: str, spec: dict[str, Any], ctx: BuildContext) -> Interceptor:
    model: type[Any] = {
        "mask": MaskSpec,
        "encrypt": EncryptSpec,
        "decrypt": DecryptSpec,
        "validate": ValidateSpec,
        "headers": HeadersSpec,
        "drop": DropSpec,
        "copy": CopySpec,
    }[kind]
    return BUILDERS[kind](model.model_validate(spec), ctx)


def rec(
    value: Any, key: bytes | None = b"k", headers: list[Any] | None = None
) -> InterceptedRecord:
    raw = value if value is None or isinstance(value, bytes) else orjson.dumps(value)
    return InterceptedRecord("orders", 0, key, raw, list(headers or []), timestamp=1000)


def run(interceptor: Interceptor, record: InterceptedRecord) -> InterceptedRecord:
    out = interceptor.intercept(record)
    assert out is not None
    return out


def avro(doc: dict[str, Any], prefix: bytes = b"") -> bytes:
    out = io.BytesIO()
    out.write(prefix)
    fastavro.schemaless_writer(out, fastavro.parse_schema(ORDER_SCHEMA), doc)
    return out.getvalue()


def unavro(data: bytes, prefix: int = 0) -> Any:
    return fastavro.schemaless_reader(
        io.BytesIO(data[prefix:]), fastavro.parse_schema(ORDER_SCHEMA), None
    )


def test_builders_cover_the_declarative_record_actions() -> None:
    assert set(BUILDERS) == RECORD_KINDS - {"interceptor", "capture"}


def test_configure_is_a_no_op(ctx: BuildContext) -> None:
    interceptor = build("drop", {"when": {"tombstone": True}}, ctx)
    interceptor.configure({"ignored": 1})
    assert isinstance(interceptor, Interceptor)


# --- mask: JSON --------------------------------------------------------------------


def test_mask_redact(ctx: BuildContext) -> None:
    m = build("mask", {"fields": ["$.customer.email", "$.items[*].sku"], "replacement": "X"}, ctx)
    out = run(m, rec({"customer": {"email": "a@b", "n": 1}, "items": [{"sku": 1}, {"sku": "s"}]}))
    assert orjson.loads(out.value or b"") == {
        "customer": {"email": "X", "n": 1},
        "items": [{"sku": "X"}, {"sku": "X"}],
    }


def test_mask_hash_is_keyed_hmac_sha256(ctx: BuildContext) -> None:
    m = build(
        "mask", {"fields": ["$.e", "$.n"], "method": "hash", "hash_key": {"env": "HASH"}}, ctx
    )
    out = orjson.loads(run(m, rec({"e": "a@b", "n": 42})).value or b"")
    expect = hmac.new(HASH_KEY.encode(), b"a@b", hashlib.sha256).hexdigest()
    assert out == {"e": expect, "n": hmac.new(HASH_KEY.encode(), b"42", hashlib.sha256).hexdigest()}
    again = orjson.loads(run(m, rec({"e": "a@b", "n": 42})).value or b"")
    assert again == out  # deterministic per record


def test_mask_hash_key_from_file(ctx: BuildContext, tmp_path: Path) -> None:
    (tmp_path / "hash.key").write_text(HASH_KEY + "\n")
    m = build("mask", {"fields": ["$.e"], "method": "hash", "hash_key": {"file": "hash.key"}}, ctx)
    out = orjson.loads(run(m, rec({"e": "x"})).value or b"")
    assert out["e"] == hmac.new(HASH_KEY.encode(), b"x", hashlib.sha256).hexdigest()


def test_mask_truncate_strings_and_other_values(ctx: BuildContext) -> None:
    m = build(
        "mask", {"fields": ["$.s", "$.n", "$.o", "$.short"], "method": "truncate", "keep": 3}, ctx
    )
    out = orjson.loads(
        run(m, rec({"s": "abcdef", "n": 123456, "o": {"a": 1}, "short": "ab"})).value or b""
    )
    assert out == {"s": "abc", "n": "123", "o": '{"a', "short": "ab"}


def test_mask_null_and_remove(ctx: BuildContext) -> None:
    nulled = run(build("mask", {"fields": ["$.a"], "method": "null"}, ctx), rec({"a": "x", "b": 1}))
    assert orjson.loads(nulled.value or b"") == {"a": None, "b": 1}
    removed = run(
        build("mask", {"fields": ["$.a", "$.l[0]"], "method": "remove"}, ctx),
        rec({"a": "x", "b": 1, "l": [1, 2]}),
    )
    assert orjson.loads(removed.value or b"") == {"b": 1, "l": [2]}


@pytest.mark.parametrize(
    "value",
    [
        {"other": 1},  # the field is missing
        {"a": None},  # nothing to hide
        {"a": "****"},  # already masked
        None,  # tombstone
    ],
)
def test_mask_leaves_the_record_untouched(ctx: BuildContext, value: Any) -> None:
    m = build("mask", {"fields": ["$.a"]}, ctx)
    record = rec(value, headers=[("h", b"1")])
    before = (record.key, record.value, record.headers)
    out = run(m, record)
    assert out is record
    assert (out.key, out.value, out.headers) == before
    assert out.value is before[1] and out.headers is before[2]


DEEP = 1100  # past orjson's 1024 levels


@pytest.mark.parametrize("value", [
    b"not json",
    b"\xff\xfe",
    b'{"card": "4111"' + b',"x":' + b"[" * DEEP + b"]" * DEEP + b"}",  # orjson's limit
    # a long number takes the stdlib's recursive parser: RecursionError, not ValueError
    b'{"card": "4111", "n": 12345678901234567890123,' + b'"x":' + b"[" * DEEP
    + b"]" * DEEP + b"}",
], ids=["not json", "not utf-8", "deep", "deep with a long number"])
@pytest.mark.parametrize("action", ["mask", "encrypt"])
def test_a_value_a_rule_must_change_but_cannot_read_fails_closed(
        ctx: BuildContext, value: bytes, action: str) -> None:
    spec: dict[str, Any] = {"fields": ["$.card"]}
    if action == "encrypt":
        spec["key"] = key("a", "KEY_A")
    with pytest.raises(RecordRejected, match="not readable json"):
        run(build(action, spec, ctx), rec(value))
    record = rec(value)
    assert run(build(action, {**spec, "unreadable": "pass"}, ctx), record).value is value


def test_mask_remove_of_a_missing_field_is_untouched(ctx: BuildContext) -> None:
    record = rec({"b": 1})
    value = record.value
    assert run(build("mask", {"fields": ["$.a"], "method": "remove"}, ctx), record).value is value


def test_mask_with_big_integers_still_masks(ctx: BuildContext) -> None:
    raw = b'{"id": 123456789012345678901234567890, "email": "a@b"}'
    out = run(build("mask", {"fields": ["$.email"]}, ctx), rec(raw))
    assert out.value == b'{"id":123456789012345678901234567890,"email":"****"}'


def test_mask_when(ctx: BuildContext) -> None:
    m = build(
        "mask", {"fields": ["$.e"], "when": {"fields": {"$.country": {"exact": ["FR"]}}}}, ctx
    )
    assert orjson.loads(run(m, rec({"e": "x", "country": "FR"})).value or b"")["e"] == "****"
    record = rec({"e": "x", "country": "DE"})
    value = record.value
    assert run(m, record).value is value


def test_mask_applies_paths_in_order(ctx: BuildContext) -> None:
    m = build("mask", {"fields": ["$.a", "$.a.b"], "method": "null"}, ctx)
    assert orjson.loads(run(m, rec({"a": {"b": 1}})).value or b"") == {"a": None}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"fields": ["$.e"], "method": "hash", "hash_key": {"env": "NOPE"}},
            "hash_key: environment variable NOPE is not set",
        ),
        (
            {"fields": ["$.e"], "method": "hash", "hash_key": {"env": "SHORT"}},
            "hash_key is shorter than 16 bytes",
        ),
        (
            {"fields": ["$.e"], "method": "hash", "hash_key": {"file": "missing.key"}},
            "hash_key: cannot read .*missing.key",
        ),
    ],
)
def test_mask_config_errors(ctx: BuildContext, spec: dict[str, Any], message: str) -> None:
    with pytest.raises(InterceptorConfigError, match=message) as caught:
        build("mask", spec, ctx)
    assert "short" not in str(caught.value).replace("shorter", "")  # never the secret


# --- mask: Avro --------------------------------------------------------------------


def avro_mask(ctx: BuildContext, framing: str = "none", **spec: Any) -> Interceptor:
    return build(
        "mask",
        {"format": "avro", "avro_schema": {"schema": ORDER_SCHEMA, "framing": framing}, **spec},
        ctx,
    )


def test_mask_avro_plain(ctx: BuildContext) -> None:
    m = avro_mask(
        ctx, fields=["$.email", "$.card.number", "$.backup.number", "$.tags[*]", "$.items[1]"]
    )
    out = unavro(run(m, rec(avro(ORDER))).value or b"")
    assert out == {
        **ORDER,
        "email": "****",
        "card": {"number": "****"},
        "backup": {"number": "****"},
        "tags": {"a": "****", "b": "****"},
        "items": ["x", "****"],
    }


def test_mask_avro_confluent_framing_keeps_the_prefix(ctx: BuildContext) -> None:
    prefix = b"\x00\x00\x00\x01\x2a"
    m = avro_mask(ctx, "confluent", fields=["$.card.number"], method="truncate", keep=4)
    out = run(m, rec(avro(ORDER, prefix))).value or b""
    assert out[:5] == prefix
    assert unavro(out, 5)["card"] == {"number": "4111"}


def test_mask_avro_null_remove_and_hash(ctx: BuildContext, tmp_path: Path) -> None:
    nulled = unavro(
        run(avro_mask(ctx, fields=["$.backup"], method="null"), rec(avro(ORDER))).value or b""
    )
    assert nulled["backup"] is None
    removed = unavro(
        run(avro_mask(ctx, fields=["$.tags.a"], method="remove"), rec(avro(ORDER))).value or b""
    )
    assert removed["tags"] == {"b": "2"}
    hashed = run(
        avro_mask(ctx, fields=["$.email"], method="hash", hash_key={"env": "HASH"}),
        rec(avro(ORDER)),
    )
    assert (
        unavro(hashed.value or b"")["email"]
        == hmac.new(HASH_KEY.encode(), b"ann@example.com", hashlib.sha256).hexdigest()
    )


def test_mask_avro_schema_from_file(ctx: BuildContext, tmp_path: Path) -> None:
    (tmp_path / "order.avsc").write_bytes(orjson.dumps(ORDER_SCHEMA))
    m = build(
        "mask",
        {"fields": ["$.email"], "format": "avro", "avro_schema": {"file": "order.avsc"}},
        ctx,
    )
    assert unavro(run(m, rec(avro(ORDER))).value or b"")["email"] == "****"


def test_mask_avro_leaves_unchanged_values(ctx: BuildContext) -> None:
    value = avro({**ORDER, "note": None, "email": "****"})
    assert run(avro_mask(ctx, fields=["$.email", "$.note"]), rec(value)).value is value


@pytest.mark.parametrize("value", [avro(ORDER) + b"\x00", avro(ORDER)[:-3], b""])
def test_mask_avro_refuses_values_that_are_not_the_schemas(ctx: BuildContext,
                                                           value: bytes) -> None:
    with pytest.raises(RecordRejected, match="not readable avro"):
        run(avro_mask(ctx, fields=["$.email", "$.note"]), rec(value))


def test_mask_avro_confluent_needs_the_magic_byte(ctx: BuildContext) -> None:
    value = b"\x01\x00\x00\x00\x01" + avro(ORDER)
    with pytest.raises(RecordRejected, match="not readable avro"):
        run(avro_mask(ctx, "confluent", fields=["$.email"]), rec(value))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"fields": ["$.nope"]},
            r"field path \$.nope does not exist in the Avro schema shop.Order",
        ),
        ({"fields": ["$.card.nope"]}, r"\$.card.nope does not exist"),
        ({"fields": ["$.id"]}, r"mask redact writes a string but \$.id is long"),
        ({"fields": ["$.email"], "method": "null"}, r"mask null needs \$.email to allow null"),
        ({"fields": ["$.email"], "method": "remove"}, "requires the field"),
        ({"fields": ["$.items.x"]}, "does not exist"),
    ],
)
def test_mask_avro_paths_are_checked_against_the_schema(
    ctx: BuildContext, spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(InterceptorConfigError, match=message):
        avro_mask(ctx, **spec)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (
            {"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]},
            "invalid Avro schema",
        ),
        ("{not json", "inline Avro schema is not JSON"),
    ],
)
def test_mask_avro_bad_schemas(ctx: BuildContext, schema: Any, message: str) -> None:
    with pytest.raises(InterceptorConfigError, match=message):
        build("mask", {"fields": ["$.a"], "format": "avro", "avro_schema": {"schema": schema}}, ctx)


def test_mask_avro_schema_file_errors(ctx: BuildContext, tmp_path: Path) -> None:
    with pytest.raises(InterceptorConfigError, match="cannot read Avro schema"):
        build(
            "mask", {"fields": ["$.a"], "format": "avro", "avro_schema": {"file": "none.avsc"}}, ctx
        )
    (tmp_path / "bad.avsc").write_text("{")
    with pytest.raises(InterceptorConfigError, match=r"bad\.avsc is not JSON"):
        build(
            "mask", {"fields": ["$.a"], "format": "avro", "avro_schema": {"file": "bad.avsc"}}, ctx
        )


# --- encrypt / decrypt -------------------------------------------------------------


def key(key_id: str, env: str) -> dict[str, Any]:
    return {"id": key_id, "secret": {"env": env}}


def test_whole_value_round_trip(ctx: BuildContext) -> None:
    enc = build("encrypt", {"key": key("a", "KEY_A")}, ctx)
    dec = build("decrypt", {"keys": [key("b", "KEY_B"), key("a", "KEY_A")]}, ctx)
    record = rec(b"secret payload", headers=[("x", b"1"), (HEADER_ENCRYPTION_KEY_ID, b"old")])
    sealed = run(enc, record)
    assert sealed.value is not None and sealed.value.startswith(b"KEG1")
    assert len(sealed.value) == 4 + 12 + len(b"secret payload") + 16
    assert b"secret" not in sealed.value
    assert sealed.headers == [("x", b"1"), (HEADER_ENCRYPTION_KEY_ID, b"a")]
    opened = run(dec, sealed)
    assert opened.value == b"secret payload"
    assert opened.headers == [("x", b"1")]


def test_encryption_uses_fresh_nonces(ctx: BuildContext) -> None:
    enc = build("encrypt", {"key": key("a", "KEY_A")}, ctx)
    assert run(enc, rec(b"same")).value != run(enc, rec(b"same")).value


def test_field_round_trip_keeps_json_types(ctx: BuildContext) -> None:
    fields = ["$.card.number", "$.n", "$.o", "$.l[*]", "$.missing"]
    enc = build("encrypt", {"fields": fields, "key": key("a", "KEY_A")}, ctx)
    dec = build("decrypt", {"fields": fields, "keys": [key("a", "KEY_A")]}, ctx)
    doc = {"card": {"number": "4111"}, "n": 12.5, "o": {"x": [1]}, "l": [True, None], "keep": "k"}
    sealed = run(enc, rec(doc))
    sealed_doc = orjson.loads(sealed.value or b"")
    for value in (
        sealed_doc["card"]["number"],
        sealed_doc["n"],
        sealed_doc["o"],
        sealed_doc["l"][0],
    ):
        assert isinstance(value, str) and value.startswith("keg:v1:")
    assert sealed_doc["l"][1] is None and sealed_doc["keep"] == "k"
    assert sealed.header(HEADER_ENCRYPTION_KEY_ID) == b"a"
    opened = run(dec, sealed)
    assert orjson.loads(opened.value or b"") == doc
    assert opened.header(HEADER_ENCRYPTION_KEY_ID) == b"a"  # fields: the header stays


def test_field_encrypt_of_nothing_leaves_the_record(ctx: BuildContext) -> None:
    enc = build("encrypt", {"fields": ["$.card.number"], "key": key("a", "KEY_A")}, ctx)
    for value in ({"other": 1}, None):
        record = rec(value)
        before, headers = record.value, record.headers
        out = run(enc, record)
        assert out.value is before and out.headers is headers


def test_decrypt_with_another_key_or_no_header_is_untouched(ctx: BuildContext) -> None:
    sealed = run(build("encrypt", {"key": key("a", "KEY_A")}, ctx), rec(b"v"))
    other = build("decrypt", {"keys": [key("b", "KEY_B")]}, ctx)
    value, headers = sealed.value, sealed.headers
    assert run(other, sealed).value is value and sealed.headers is headers
    bare = rec(b"KEG1" + bytes(40))
    assert run(build("decrypt", {"keys": [key("a", "KEY_A")]}, ctx), bare).value == b"KEG1" + bytes(
        40
    )


def test_decrypt_of_a_plain_value_is_untouched(ctx: BuildContext) -> None:
    dec = build("decrypt", {"keys": [key("a", "KEY_A")]}, ctx)
    record = rec(b"plain", headers=[(HEADER_ENCRYPTION_KEY_ID, b"a")])
    assert run(dec, record).value == b"plain"
    assert record.headers == [(HEADER_ENCRYPTION_KEY_ID, b"a")]


def test_wrong_key_under_the_same_id_fails_authentication(
    ctx: BuildContext, caplog: pytest.LogCaptureFixture
) -> None:
    sealed = run(build("encrypt", {"key": key("a", "KEY_A")}, ctx), rec(b"v"))
    wrong = build("decrypt", {"keys": [key("a", "KEY_B")]}, ctx)
    with caplog.at_level(logging.WARNING, logger="interceptors.builtin.crypto"):
        value = sealed.value
        assert run(wrong, sealed).value is value
        run(wrong, sealed)
    assert wrong.failures == 2  # type: ignore[attr-defined]
    assert len(caplog.records) == 1  # logged once
    assert ENV["KEY_A"] not in caplog.text and ENV["KEY_B"] not in caplog.text


def test_tampered_field_is_left_encrypted(ctx: BuildContext) -> None:
    enc = build("encrypt", {"fields": ["$.a", "$.b"], "key": key("a", "KEY_A")}, ctx)
    dec = build("decrypt", {"fields": ["$.a", "$.b"], "keys": [key("a", "KEY_A")]}, ctx)
    sealed = run(enc, rec({"a": "x", "b": "y"}))
    doc = orjson.loads(sealed.value or b"")
    raw = bytearray(base64.urlsafe_b64decode(doc["a"][7:]))
    raw[-1] ^= 1
    doc["a"] = "keg:v1:" + base64.urlsafe_b64encode(bytes(raw)).decode()
    sealed.value = orjson.dumps(doc)
    out = orjson.loads(run(dec, sealed).value or b"")
    assert out == {"a": doc["a"], "b": "y"}
    assert dec.failures == 1  # type: ignore[attr-defined]


def test_tampered_whole_value_is_left_encrypted(ctx: BuildContext) -> None:
    sealed = run(build("encrypt", {"key": key("a", "KEY_A")}, ctx), rec(b"value"))
    assert sealed.value is not None
    sealed.value = sealed.value[:-1] + bytes([sealed.value[-1] ^ 1])
    tampered = sealed.value
    out = run(build("decrypt", {"keys": [key("a", "KEY_A")]}, ctx), sealed)
    assert out.value is tampered and out.header(HEADER_ENCRYPTION_KEY_ID) == b"a"


def test_keys_from_files_hex_and_base64(ctx: BuildContext, tmp_path: Path) -> None:
    (tmp_path / "a.key").write_text(KEY_A.hex() + "\n")
    (tmp_path / "a.b64").write_text(base64.urlsafe_b64encode(KEY_A).decode())
    enc = build("encrypt", {"key": {"id": "a", "secret": {"file": "a.key"}}}, ctx)
    dec = build(
        "decrypt", {"keys": [{"id": "a", "secret": {"file": str(tmp_path / "a.b64")}}]}, ctx
    )
    assert run(dec, run(enc, rec(b"v"))).value == b"v"


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        (
            {"env": "BAD_KEY"},
            "key k: environment variable BAD_KEY does not hold a 32-byte AES-256 key",
        ),
        ({"env": "HASH"}, "does not hold a 32-byte"),
        ({"env": "UNSET"}, "key k: environment variable UNSET is not set"),
        ({"file": "nope.key"}, "key k: cannot read"),
    ],
)
def test_bad_keys(ctx: BuildContext, secret: dict[str, str], message: str) -> None:
    with pytest.raises(InterceptorConfigError, match=message) as caught:
        build("encrypt", {"key": {"id": "k", "secret": secret}}, ctx)
    assert ENV["BAD_KEY"] not in str(caught.value) and HASH_KEY not in str(caught.value)


def test_empty_key_file_and_duplicate_ids(ctx: BuildContext, tmp_path: Path) -> None:
    (tmp_path / "empty.key").write_text("\n")
    with pytest.raises(InterceptorConfigError, match="is empty"):
        build("encrypt", {"key": {"id": "k", "secret": {"file": "empty.key"}}}, ctx)
    with pytest.raises(InterceptorConfigError, match="lists key id a twice"):
        build("decrypt", {"keys": [key("a", "KEY_A"), key("a", "KEY_B")]}, ctx)


def test_avro_field_encryption_round_trip_with_confluent_framing(ctx: BuildContext) -> None:
    schema = {"schema": ORDER_SCHEMA, "framing": "confluent"}
    enc = build(
        "encrypt",
        {
            "fields": ["$.card.number", "$.note"],
            "key": key("a", "KEY_A"),
            "format": "avro",
            "avro_schema": schema,
        },
        ctx,
    )
    dec = build(
        "decrypt",
        {
            "fields": ["$.card.number", "$.note"],
            "keys": [key("a", "KEY_A")],
            "format": "avro",
            "avro_schema": schema,
        },
        ctx,
    )
    prefix = b"\x00\x00\x00\x00\x09"
    order = {**ORDER, "note": "call me"}
    sealed = run(enc, rec(avro(order, prefix)))
    assert sealed.value is not None and sealed.value[:5] == prefix
    stored = unavro(sealed.value, 5)
    assert stored["card"]["number"].startswith("keg:v1:") and stored["note"].startswith("keg:v1:")
    assert unavro(run(dec, sealed).value or b"", 5) == order


def test_avro_field_encryption_needs_string_fields(ctx: BuildContext) -> None:
    with pytest.raises(InterceptorConfigError, match=r"encrypt needs \$.id to be a string"):
        build(
            "encrypt",
            {
                "fields": ["$.id"],
                "key": key("a", "KEY_A"),
                "format": "avro",
                "avro_schema": {"schema": ORDER_SCHEMA},
            },
            ctx,
        )


# --- validate ----------------------------------------------------------------------

ORDER_JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "amount": {"type": "number", "minimum": 0},
        "lines": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["amount"],
}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"amount": -3}, "$.amount: -3 is less than the minimum of 0"),
        ({}, "$: 'amount' is a required property"),
        ({"amount": 1, "lines": ["a", 2]}, "$.lines[1]: 2 is not of type 'string'"),
        (b"{oops", "not valid JSON: "),
        (None, "value is null"),
    ],
)
def test_validate_json_schema_rejects(ctx: BuildContext, value: Any, reason: str) -> None:
    v = build("validate", {"json_schema": ORDER_JSON_SCHEMA}, ctx)
    with pytest.raises(RecordRejected) as caught:
        v.intercept(rec(value))
    assert caught.value.reason.startswith(reason)


def test_validate_passes_valid_records_untouched(ctx: BuildContext) -> None:
    v = build("validate", {"json_schema": ORDER_JSON_SCHEMA}, ctx)
    record = rec({"amount": 0, "lines": ["a"]})
    value = record.value
    assert v.intercept(record) is record and record.value is value


def test_validate_reasons_are_short(ctx: BuildContext) -> None:
    v = build("validate", {"json_schema": {"type": "string"}}, ctx)
    with pytest.raises(RecordRejected) as caught:
        v.intercept(rec({"x": "y" * 1000}))
    assert len(caught.value.reason) <= 200 and caught.value.reason.endswith("...")


def test_validate_key_from_file_and_allow_null(ctx: BuildContext, tmp_path: Path) -> None:
    (tmp_path / "key.json").write_text('{"type": "string", "pattern": "^k-"}')
    v = build(
        "validate", {"json_schema_file": "key.json", "target": "key", "allow_null": True}, ctx
    )
    v.intercept(rec(b"anything", key=b'"k-1"'))
    v.intercept(rec(b"anything", key=None))
    with pytest.raises(RecordRejected, match="does not match"):
        v.intercept(rec(b"x", key=b'"x"'))


def test_validate_honours_the_schema_draft(ctx: BuildContext) -> None:
    # Draft 4's exclusiveMinimum is a boolean; 2020-12 would refuse that schema.
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "minimum": 0,
        "exclusiveMinimum": True,
    }
    v = build("validate", {"json_schema": schema}, ctx)
    with pytest.raises(RecordRejected, match="less than or equal to the minimum"):
        v.intercept(rec(0))


def test_validate_config_errors(ctx: BuildContext) -> None:
    with pytest.raises(InterceptorConfigError, match="cannot read JSON Schema"):
        build("validate", {"json_schema_file": "none.json"}, ctx)


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "objekt"}, r"invalid JSON Schema at \$.type"),
    ({"$ref": "#"}, r"the schema's \$refs recurse without reading the document"),
])
def test_an_inline_schema_that_cannot_be_used_is_refused_with_the_rule(
        schema: dict[str, Any], message: str) -> None:
    """Where the rule is read (keg validate, the API: file:line), not first when the
    gateway builds it."""
    with pytest.raises(ValueError, match=message):
        ValidateSpec.model_validate({"json_schema": schema})


def test_validate_schema_file_not_json(ctx: BuildContext, tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text("nope")
    with pytest.raises(InterceptorConfigError, match=r"s\.json is not JSON"):
        build("validate", {"json_schema_file": "s.json"}, ctx)
    (tmp_path / "l.json").write_text("[1]")
    with pytest.raises(InterceptorConfigError, match="is an object"):
        build("validate", {"json_schema_file": "l.json"}, ctx)


@pytest.mark.parametrize("framing", ["none", "confluent"])
def test_validate_avro(ctx: BuildContext, framing: str) -> None:
    prefix = b"\x00\x00\x00\x00\x01" if framing == "confluent" else b""
    v = build("validate", {"avro_schema": {"schema": ORDER_SCHEMA, "framing": framing}}, ctx)
    good = avro(ORDER, prefix)
    v.intercept(rec(good))
    with pytest.raises(RecordRejected, match=r"not valid Avro for shop\.Order: 2 trailing bytes"):
        v.intercept(rec(good + b"\x00\x00"))
    with pytest.raises(RecordRejected, match=r"not valid Avro for shop\.Order: "):
        v.intercept(rec(good[:-4]))


def test_validate_avro_confluent_framing_is_checked(ctx: BuildContext) -> None:
    v = build("validate", {"avro_schema": {"schema": ORDER_SCHEMA, "framing": "confluent"}}, ctx)
    with pytest.raises(RecordRejected, match="not in Confluent wire format"):
        v.intercept(rec(avro(ORDER)))


def test_validate_avro_primitive_schema(ctx: BuildContext) -> None:
    v = build("validate", {"avro_schema": {"schema": "long"}, "target": "key"}, ctx)
    v.intercept(rec(b"", key=b"\x02"))
    with pytest.raises(RecordRejected):
        v.intercept(rec(b"", key=b"\x02\x02"))


# --- headers -----------------------------------------------------------------------


def test_headers_remove_rename_set(ctx: BuildContext) -> None:
    h = build(
        "headers",
        {"remove": ["drop"], "rename": {"old": "new"}, "set": {"env": "prod", "new": "über"}},
        ctx,
    )
    record = rec(
        b"v",
        headers=[
            ("a", b"1"),
            ("env", b"dev"),
            ("drop", b"x"),
            ("old", b"o"),
            ("env", b"test"),
            ("z", None),
        ],
    )
    out = run(h, record)
    assert out.headers == [("a", b"1"), ("env", b"prod"), ("new", "über".encode()), ("z", None)]


def test_headers_set_appends_when_absent(ctx: BuildContext) -> None:
    out = run(build("headers", {"set": {"x": "1"}}, ctx), rec(b"v", headers=[("a", b"")]))
    assert out.headers == [("a", b""), ("x", b"1")]


def test_headers_unchanged_keeps_the_list(ctx: BuildContext) -> None:
    h = build("headers", {"remove": ["absent"], "set": {"a": "1"}}, ctx)
    record = rec(b"v", headers=[("a", b"1")])
    headers = record.headers
    assert run(h, record).headers is headers


def test_headers_never_change_the_list_in_place(ctx: BuildContext) -> None:
    record = rec(b"v", headers=[("a", b"1")])
    original = record.headers
    run(build("headers", {"remove": ["a"]}, ctx), record)
    assert original == [("a", b"1")] and record.headers == []


def test_headers_empty_name_is_refused(ctx: BuildContext) -> None:
    with pytest.raises(InterceptorConfigError, match="header name is empty"):
        build("headers", {"rename": {"a": ""}}, ctx)


# --- drop and copy -----------------------------------------------------------------


def test_drop(ctx: BuildContext) -> None:
    d = build("drop", {"when": {"headers": {"test": None}}}, ctx)
    assert d.intercept(rec(b"v", headers=[("test", b"")])) is None
    record = rec(b"v")
    assert d.intercept(record) is record


def test_copy_to_topic_and_http(ctx: BuildContext) -> None:
    effects = ctx.side_effects
    assert isinstance(effects, NoSideEffects)
    to_topic = build("copy", {"topic": "audit", "when": {"key": {"exact": ["k"]}}}, ctx)
    to_http = build("copy", {"http": "http://sink/records"}, ctx)
    record = rec(b"v", headers=[("h", b"1")])
    assert to_topic.intercept(record) is record
    assert to_http.intercept(record) is record
    assert to_topic.intercept(rec(b"v", key=b"other")) is not None
    assert [t for t, _ in effects.topic_copies] == ["audit"]
    assert [u for u, _ in effects.http_posts] == ["http://sink/records"]
    copy = effects.topic_copies[0][1]
    assert copy is not record and copy == record
    record.headers.append(("later", b""))  # a later stage's change is not in the copy
    assert copy.headers == [("h", b"1")]


def test_mask_avro_when_sees_the_avro_record_and_removes_array_items(ctx: BuildContext) -> None:
    m = avro_mask(
        ctx, fields=["$.items[0]"], method="remove", when={"fields": {"$.id": {"exact": ["7"]}}}
    )
    assert unavro(run(m, rec(avro(ORDER))).value or b"")["items"] == ["y"]
    other = rec(avro({**ORDER, "id": 8}))
    value = other.value
    assert run(m, other).value is value


def test_the_documented_decryption_opens_keg_ciphertext_without_keg(ctx: BuildContext) -> None:
    """docs/interceptors.md tells a consumer that reads the topic without keg how to
    decrypt; a user following the layout alone, without the labels, opened nothing."""
    text = (Path(__file__).parents[3] / "docs" / "interceptors.md").read_text()
    snippet = text.split("# decrypt-without-keg\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(snippet, "docs/interceptors.md", "exec"), namespace)
    sealed = run(build("encrypt", {"key": key("a", "KEY_A")}, ctx), rec(b"secret payload"))
    assert namespace["open_value"](KEY_A, sealed.value) == b"secret payload"
    fields = build("encrypt", {"fields": ["$.card", "$.n"], "key": key("a", "KEY_A")}, ctx)
    doc = orjson.loads(run(fields, rec({"card": {"number": "4111"}, "n": 7})).value or b"")
    assert orjson.loads(namespace["open_field"](KEY_A, doc["card"])) == {"number": "4111"}
    assert orjson.loads(namespace["open_field"](KEY_A, doc["n"])) == 7
