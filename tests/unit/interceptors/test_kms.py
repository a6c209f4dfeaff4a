"""Envelope encryption with a keyring KMS: header format, data keys, rotation, failures."""

from __future__ import annotations

import base64
import json
import os
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest

from filter_rules import CompiledRuleSet, load_rule_text
from filter_rules.record_actions import (
    HEADER_DATA_KEY,
    HEADER_ENCRYPTION_KEY_ID,
    DecryptSpec,
    EncryptSpec,
    KmsSpec,
)
from interceptors.builtin.crypto import DecryptInterceptor, EncryptInterceptor
from interceptors.contract import (
    BuildContext,
    InterceptedRecord,
    InterceptorConfigError,
    ServiceUnavailable,
)
from interceptors.kms import (
    KEK_CHECK_S,
    PROVIDER_AWS,
    PROVIDER_KEYRING,
    DataKeys,
    KeyringBackend,
    KeyUnusable,
    KmsClient,
    WrappedKey,
    kms_client,
    parse_keyring,
)
from interceptors.secrets import check_secrets


def key_text() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def write_keyring(path: Path, versions: dict[int, str], primary: int, name: str = "orders"
                  ) -> None:
    doc = {"keys": {name: {"primary": primary,
                           "versions": {str(v): k for v, k in versions.items()}}}}
    path.write_text(json.dumps(doc))


@pytest.fixture
def keyring(tmp_path: Path) -> Path:
    path = tmp_path / "keyring.json"
    write_keyring(path, {1: key_text()}, 1)
    return path


def ctx(tmp_path: Path) -> BuildContext:
    return BuildContext(base_dir=tmp_path)


def kms_spec(**kw: Any) -> KmsSpec:
    return KmsSpec.model_validate({"keyring": {"secret": {"file": "keyring.json"},
                                               "key": "orders"}, **kw})


def record(value: bytes | None, topic: str = "orders") -> InterceptedRecord:
    return InterceptedRecord(topic, 0, b"k", value, [("src", b"t")])


def test_header_format_round_trips_and_refuses_what_it_cannot_read() -> None:
    key = WrappedKey(PROVIDER_AWS, "arn:aws:kms:eu-west-2:1:key/abc", b"\x01\x02blob")
    raw = key.encode()
    assert raw[:4] == bytes([1, PROVIDER_AWS, 0, len(key.kek)])
    assert WrappedKey.decode(raw) == key
    assert key.key_id.startswith("dek-") and len(key.key_id) == 20
    for bad in (b"", b"\x02\x01\x00\x01ab", b"\x01\x01\x00\x09short", b"\x01\x01\x00\x02\xff\xfe!"):
        assert WrappedKey.decode(bad) is None


def test_keyring_errors_name_the_problem_never_a_key() -> None:
    secret = key_text()
    for text, message in [
        ("not json", "not JSON"),
        ('{"keys": {}}', "expected"),
        ('{"keys": {"a": {"primary": 1, "versions": {"1": "short"}}}}', "version 1"),
        (json.dumps({"keys": {"a": {"primary": 2, "versions": {"1": secret}}}}), "primary"),
    ]:
        with pytest.raises(InterceptorConfigError, match=message) as err:
            parse_keyring(text)
        assert secret not in str(err.value)
    assert parse_keyring(json.dumps({"keys": {"a": {"primary": 1, "versions": {"1": secret}}}})
                         )["a"][0] == 1


def test_encrypt_and_decrypt_whole_values_with_a_keyring(tmp_path: Path, keyring: Path) -> None:
    context = ctx(tmp_path)
    enc = EncryptInterceptor(EncryptSpec(kms=kms_spec()), context)
    dec = DecryptInterceptor(DecryptSpec(kms=kms_spec()), context)
    sealed = enc.intercept(record(b"secret value"))
    assert sealed is not None and sealed.value is not None and b"secret" not in sealed.value
    header = sealed.header(HEADER_DATA_KEY)
    assert header is not None
    wrapped = WrappedKey.decode(header)
    assert wrapped is not None and wrapped.provider == PROVIDER_KEYRING
    assert wrapped.kek == "orders:v1"
    assert sealed.header(HEADER_ENCRYPTION_KEY_ID) == wrapped.key_id.encode()
    opened = dec.intercept(sealed)
    assert opened is not None and opened.value == b"secret value"
    assert opened.headers == [("src", b"t")]  # both key headers gone


def test_field_encryption_with_a_kms_key(tmp_path: Path, keyring: Path) -> None:
    context = ctx(tmp_path)
    enc = EncryptInterceptor(EncryptSpec(fields=["$.card"], kms=kms_spec()), context)
    dec = DecryptInterceptor(DecryptSpec(fields=["$.card"], kms=kms_spec()), context)
    doc = {"card": "4111", "name": "x"}
    sealed = enc.intercept(record(orjson.dumps(doc)))
    assert sealed is not None and orjson.loads(sealed.value or b"")["card"].startswith("keg:v1:")
    opened = dec.intercept(sealed)
    assert opened is not None and orjson.loads(opened.value or b"") == doc


def test_one_data_key_per_topic_until_rotation(tmp_path: Path, keyring: Path) -> None:
    spec = kms_spec(data_key={"scope": "topic", "rotate_after_s": 60, "max_records": 3})
    now = [0.0]
    client = KmsClient(KeyringBackend(spec.keyring, ctx(tmp_path)), 1.0, 100, 60)  # type: ignore[arg-type]
    keys = DataKeys(client, spec, clock=lambda: now[0])
    ids = [keys.for_topic("a")[2] for _ in range(3)]
    assert len(set(ids)) == 1  # one data key for three records
    assert keys.for_topic("a")[2] != ids[0]  # the fourth: max_records reached, a new key
    assert keys.for_topic("b")[2] != ids[0]  # another topic, its own key
    before = keys.for_topic("b")[2]
    now[0] += 61
    assert keys.for_topic("b")[2] != before  # rotate_after_s
    assert keys.generated == 4
    assert client.caller.calls == 4  # the KMS is asked per data key, never per record

    rule_scope = DataKeys(client, kms_spec(data_key={"scope": "rule"}))
    assert rule_scope.for_topic("a")[2] == rule_scope.for_topic("b")[2]


def test_kek_rotation_old_records_still_decrypt(tmp_path: Path, keyring: Path) -> None:
    context = ctx(tmp_path)
    enc = EncryptInterceptor(EncryptSpec(kms=kms_spec()), context)
    old = enc.intercept(record(b"v1 record"))
    assert old is not None
    ring = json.loads(keyring.read_text())
    first = ring["keys"]["orders"]["versions"]["1"]
    write_keyring(keyring, {1: first, 2: key_text()}, 2)  # a new KEK version, primary
    # A new rule set (new data keys) after the change: wrapped by version 2.
    enc2 = EncryptInterceptor(EncryptSpec(kms=kms_spec()), BuildContext(base_dir=tmp_path))
    new = enc2.intercept(record(b"v2 record"))
    assert new is not None
    assert WrappedKey.decode(new.header(HEADER_DATA_KEY) or b"").kek == "orders:v2"  # type: ignore[union-attr]
    dec = DecryptInterceptor(DecryptSpec(kms=kms_spec()), BuildContext(base_dir=tmp_path))
    assert [dec.intercept(r).value for r in (old, new)] == [b"v1 record", b"v2 record"]  # type: ignore[union-attr]


def test_a_keyring_rotation_retires_the_data_keys_of_the_old_kek_within_a_second(
        tmp_path: Path, keyring: Path) -> None:
    """A new primary version in the keyring: the data keys the old one wrapped served on
    until their rotation time (an hour by default) or a new rule set (regression). Now
    they are retired the next time the KEK is asked for (each KEK_CHECK_S)."""
    spec = kms_spec()
    now = [0.0]
    client = KmsClient(KeyringBackend(spec.keyring, ctx(tmp_path)), 1.0, 100, 60)  # type: ignore[arg-type]
    keys = DataKeys(client, spec, clock=lambda: now[0])

    def kek(topic: str) -> str:
        wrapped = WrappedKey.decode(keys.for_topic(topic)[1])
        assert wrapped is not None
        return wrapped.kek

    assert {kek("a"), kek("b")} == {"orders:v1"}
    first = json.loads(keyring.read_text())["keys"]["orders"]["versions"]["1"]
    write_keyring(keyring, {1: first, 2: key_text()}, 2)
    now[0] += KEK_CHECK_S / 2
    assert kek("a") == "orders:v1"  # not asked yet: never per record
    now[0] += KEK_CHECK_S
    assert {kek("a"), kek("b")} == {"orders:v2"}
    assert keys.generated == 4
    now[0] += KEK_CHECK_S
    assert kek("a") == "orders:v2" and keys.generated == 4  # the KEK did not move again


def test_a_data_key_the_kms_refuses_is_left_encrypted_and_counted(
        tmp_path: Path, keyring: Path) -> None:
    context = ctx(tmp_path)
    sealed = EncryptInterceptor(EncryptSpec(kms=kms_spec()), context).intercept(record(b"v"))
    assert sealed is not None
    other = tmp_path / "other"
    other.mkdir()
    write_keyring(other / "keyring.json", {1: key_text()}, 1)  # same name, another key
    dec = DecryptInterceptor(DecryptSpec(kms=kms_spec()), BuildContext(base_dir=other))
    value = sealed.value
    assert dec.intercept(sealed).value == value  # type: ignore[union-attr]
    assert dec.failures == 1


def test_kms_unavailable_fails_closed_or_keeps_the_current_key(tmp_path: Path,
                                                              keyring: Path) -> None:
    spec = kms_spec(data_key={"rotate_after_s": 1})
    backend = KeyringBackend(spec.keyring, ctx(tmp_path))  # type: ignore[arg-type]
    now = [0.0]
    client = KmsClient(backend, 1.0, 100, 60)
    keys = DataKeys(client, spec, clock=lambda: now[0])
    current = keys.for_topic("a")[2]
    keyring.unlink()  # the KMS can no longer give keys
    backend._stamp = None
    now[0] += 2
    assert keys.for_topic("a")[2] == current  # past rotation: the current key is kept
    with pytest.raises(ServiceUnavailable, match="keyring"):
        keys.for_topic("never-seen")  # no key at all: fail (closed by default)


def test_keyring_refuses_unknown_keys(tmp_path: Path, keyring: Path) -> None:
    backend = KeyringBackend(kms_spec().keyring, ctx(tmp_path))  # type: ignore[arg-type]
    _data_key, wrapped = backend.generate("orders")
    with pytest.raises(KeyUnusable, match="no key orders:v7"):
        backend.unwrap(WrappedKey(PROVIDER_KEYRING, "orders:v7", wrapped.wrapped))
    with pytest.raises(KeyUnusable, match="no key nope"):
        backend.generate("nope")


def test_rules_load_and_keg_validate_checks_the_keyring(tmp_path: Path, keyring: Path) -> None:
    rules = textwrap.dedent("""
    rules:
      - id: enc
        match: {topics: {exact: [orders]}}
        action: {encrypt: {kms: {keyring: {secret: {file: keyring.json}, key: orders}}}}
      - id: enc-missing-key
        match: {topics: {exact: [other]}}
        action: {encrypt: {kms: {keyring: {secret: {file: keyring.json}, key: nope}}}}
      - id: dec
        match: {topics: {exact: [orders]}, direction: response}
        action: {decrypt: {kms: {keyring: {secret: {file: keyring.json}}}}}
    """)
    ruleset = load_rule_text(rules, str(tmp_path / "r.yaml"))
    checked, errors = check_secrets(ruleset)
    assert checked == 3
    assert [e.field_path for e in errors] == [
        "enc-missing-key.action.encrypt.kms.keyring.secret.file"]
    assert "no key nope" in errors[0].message
    CompiledRuleSet(ruleset)


@pytest.mark.parametrize("action, message", [
    ({"encrypt": {"kms": {"keyring": {"secret": {"env": "X"}}}}}, "key-encryption key"),
    ({"encrypt": {"key": {"id": "a", "secret": {"env": "X"}},
                  "kms": {"keyring": {"secret": {"env": "X"}, "key": "k"}}}}, "exactly one of key"),
    ({"decrypt": {}}, "give keys, kms or both"),
    ({"encrypt": {"kms": {"aws": {"key_id": "k", "access_key_id": {"env": "A"}}}}},
     "both access_key_id"),
])
def test_rule_model_errors(action: dict[str, Any], message: str) -> None:
    from filter_rules import RuleSetInvalid, load_rule_data

    with pytest.raises(RuleSetInvalid, match=message):
        load_rule_data({"rules": [{"id": "r", "match": {"topics": {"exact": ["t"]}},
                                   "action": action}]}, "r.yaml")


def test_decryption_asks_the_kms_once_per_data_key(tmp_path: Path, keyring: Path) -> None:
    spec = kms_spec(data_key={"max_records": 5})
    enc = EncryptInterceptor(EncryptSpec(kms=spec), ctx(tmp_path))
    sealed = [enc.intercept(record(f"v{i}".encode())) for i in range(20)]
    consumer_side = ctx(tmp_path)  # another process: its own KMS client and cache
    dec = DecryptInterceptor(DecryptSpec(kms=spec), consumer_side)
    assert [dec.intercept(r).value for r in sealed] == [  # type: ignore[union-attr, arg-type]
        f"v{i}".encode() for i in range(20)]
    client = kms_client(spec, consumer_side)
    assert client.caller.calls == 4  # 20 records, 4 data keys: one unwrap each


def test_secrets_of_one_kind_are_checked_alone(tmp_path: Path) -> None:
    """`kinds`: the gateway checks key files where its workers read them; variables have
    a check of their own (what the workers were given)."""
    rules = textwrap.dedent("""\
    rules:
      - id: by-file
        action: {encrypt: {fields: [$.a], key: {id: k, secret: {file: absent.key}}}}
      - id: by-env
        action: {encrypt: {fields: [$.a], key: {id: k, secret: {env: KEG_TEST_NOT_SET}}}}
    """)
    ruleset = load_rule_text(rules, str(tmp_path / "r.yaml"))
    checked, errors = check_secrets(ruleset, environ={}, kinds=("file",))
    assert checked == 1
    assert [e.field_path for e in errors] == ["by-file.action.encrypt.key.secret.file"]
    assert check_secrets(ruleset, environ={}, kinds=("env",))[0] == 1
    assert check_secrets(ruleset, environ={})[0] == 2
