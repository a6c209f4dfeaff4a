"""KMS-held keys through the real gateway: envelope encryption with a real KMS server.

local-kms (the AWS KMS API) and keg's keyring file hold the key-encryption keys. Records
produced through the gateway are encrypted with data keys the KMS generated and wrapped
(the wrapped key in the record's `keg.dek` header); consumers reading through the
gateway get them decrypted. Mid-stream the data keys rotate (max_records) and the KEK
changes (the alias moves to a new KMS key; a new keyring version becomes primary): old
and new records still decrypt. A KMS that is down gets the rule's declared policy.
"""

from __future__ import annotations

import base64
import json
import os
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import orjson
import pytest

from filter_rules import load_rule_text
from filter_rules.record_actions import HEADER_DATA_KEY, HEADER_ENCRYPTION_KEY_ID
from interceptors.kms import PROVIDER_AWS, PROVIDER_KEYRING, WrappedKey
from kafka_wire import ErrorCode
from keg.embedded.kafka import EmbeddedKafka, _free_ports
from keg.embedded.local_kms import LocalKms
from keg.gateway import Gateway
from tests.integration.conftest import (
    DATA_PATH,
    create_topic,
    envoy_data_paths,
    gateway_settings,
    rule_dir,
)
from tests.integration.rules.records_io import AuditLog, Headers, consume, produce, values

pytestmark = pytest.mark.integration

KEY_ID_ENV, SECRET_ENV = "KEG_TEST_AWS_ACCESS_KEY_ID", "KEG_TEST_AWS_SECRET_ACCESS_KEY"
Rec = tuple[bytes | None, Headers]


def rules(kms: LocalKms, alias: str, down: str) -> str:
    aws = (f'{{endpoint: "{kms.endpoint}", region: {kms.region}, '
           f"access_key_id: {{env: {KEY_ID_ENV}}}, secret_access_key: {{env: {SECRET_ENV}}}}}")
    aws_down = (f'{{endpoint: "{down}", region: {kms.region}, '
                f"access_key_id: {{env: {KEY_ID_ENV}}}, "
                f"secret_access_key: {{env: {SECRET_ENV}}}}}")
    return textwrap.dedent(f"""
    rules:
      - id: aws-encrypt
        match: {{topics: {{prefix: [aws.]}}}}
        action:
          encrypt:
            kms:
              aws: {{key_id: {alias}, {aws[1:]}
              data_key: {{max_records: 4}}
      - id: aws-decrypt
        match: {{direction: response, topics: {{prefix: [aws.]}}}}
        action: {{decrypt: {{kms: {{aws: {aws}}}}}}}
      - id: aws-fields
        match: {{topics: {{prefix: [fields.]}}}}
        action:
          encrypt:
            fields: [$.card.number]
            kms: {{aws: {{key_id: {alias}, {aws[1:]}}}
      - id: fields-decrypt
        match: {{direction: response, topics: {{prefix: [fields.]}}}}
        action: {{decrypt: {{fields: [$.card.number], kms: {{aws: {aws}}}}}}}
      - id: keyring-encrypt
        match: {{topics: {{prefix: [ring.]}}}}
        action:
          encrypt:
            kms:
              keyring: {{secret: {{file: keyring.json}}, key: orders}}
              data_key: {{max_records: 4}}
      - id: keyring-encrypt-hourly
        match: {{topics: {{prefix: [hourly.]}}}}
        action: {{encrypt: {{kms: {{keyring: {{secret: {{file: keyring.json}}, key: orders}}}}}}}}
      - id: keyring-decrypt
        match: {{direction: response, topics: {{prefix: [ring.]}}}}
        action: {{decrypt: {{kms: {{keyring: {{secret: {{file: keyring.json}}}}}}}}}}
      - id: kms-down-encrypt
        match: {{topics: {{prefix: [down.]}}}}
        action:
          encrypt: {{kms: {{aws: {{key_id: {alias}, {aws_down[1:]}, timeout_ms: 300}}}}
      - id: kms-down-decrypt
        match: {{direction: response, topics: {{prefix: [downfetch.]}}}}
        action: {{decrypt: {{kms: {{aws: {aws_down}, timeout_ms: 300}}}}}}
    """)


def keyring_doc(versions: dict[int, bytes], primary: int) -> str:
    return json.dumps({"keys": {"orders": {
        "primary": primary,
        "versions": {str(v): base64.b64encode(k).decode() for v, k in versions.items()}}}})


class Env:
    def __init__(self, kafka: EmbeddedKafka, gateway: Gateway, kms: LocalKms, alias: str,
                 keyring: Path, audit: Path) -> None:
        self.kafka, self.gateway, self.kms, self.alias = kafka, gateway, kms, alias
        self.keyring, self.audit = keyring, AuditLog(audit)
        self.client = boto3.client("kms", endpoint_url=kms.endpoint, region_name=kms.region,
                                   aws_access_key_id="test", aws_secret_access_key="test")

    def topic(self, prefix: str) -> str:
        return create_topic(self.kafka.bootstrap, name=f"{prefix}{uuid.uuid4().hex[:8]}")


@pytest.fixture(scope="module")
def env(kafka: EmbeddedKafka, local_kms: LocalKms,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """The suite's data path (DATA_PATH: `make test` runs ext-proc, then native, keg
    up's default, where keg's filter hands the Produce and Fetch frames to the workers)."""
    base = tmp_path_factory.mktemp("kms")
    saved = {name: os.environ.get(name) for name in (KEY_ID_ENV, SECRET_ENV)}
    os.environ[KEY_ID_ENV], os.environ[SECRET_ENV] = "keg-test", "keg-test-secret"
    try:
        client = boto3.client("kms", endpoint_url=local_kms.endpoint,
                              region_name=local_kms.region, aws_access_key_id="t",
                              aws_secret_access_key="t")
        alias = f"alias/keg-{uuid.uuid4().hex[:6]}"
        client.create_alias(AliasName=alias,
                            TargetKeyId=client.create_key()["KeyMetadata"]["KeyId"])
        (down_port,) = _free_ports(1)
        text = rules(local_kms, alias, f"http://127.0.0.1:{down_port}")
        load_rule_text(text, "check.yaml")
        rules_dir = rule_dir(base / "rules", {
            "kms.yaml": text, "keyring.json": keyring_doc({1: os.urandom(32)}, 1)})
        keyring = rules_dir / "keyring.json"
        audit = base / "audit.jsonl"
        settings = gateway_settings(kafka, base / "envoy", rules_dir=rules_dir,
                                    audit_log=audit)
        with Gateway(settings) as gateway:
            assert envoy_data_paths(gateway) == [DATA_PATH]
            yield Env(kafka, gateway, local_kms, alias, keyring, audit)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def data_keys(records: list[Rec]) -> list[WrappedKey]:
    """The wrapped data key of each stored record."""
    out = []
    for _value, headers in records:
        header = dict(headers)[HEADER_DATA_KEY]
        assert header is not None
        wrapped = WrappedKey.decode(header)
        assert wrapped is not None
        assert dict(headers)[HEADER_ENCRYPTION_KEY_ID] == wrapped.key_id.encode()
        out.append(wrapped)
    return out


def secrets(prefix: str, count: int) -> list[bytes | None]:
    return [f"{prefix} secret record {i}".encode() for i in range(count)]


def test_aws_kms_data_keys_rotate_and_the_kek_changes_mid_stream(env: Env) -> None:
    topic = env.topic("aws.")
    first = secrets("first", 6)
    assert produce(env.gateway.bootstrap, topic, first, retries=10) == [None] * 6
    # The KEK changes: the alias moves to a new KMS key. New data keys are wrapped by it.
    new_kek = env.client.create_key()["KeyMetadata"]["Arn"]
    env.client.update_alias(AliasName=env.alias, TargetKeyId=new_kek)
    second = secrets("second", 6)
    assert produce(env.gateway.bootstrap, topic, second, retries=10) == [None] * 6

    stored = consume(env.kafka.bootstrap, topic)  # directly: what the broker holds
    assert len(stored) == 12
    assert not any(b"secret" in (value or b"") for value, _h in stored)
    keys = data_keys(stored)
    assert {k.provider for k in keys} == {PROVIDER_AWS}
    # A data key serves at most max_records (4) records: 12 records, at least 3 keys,
    # each used for several records (the KMS is not asked per record).
    per_key = {k.key_id: sum(1 for x in keys if x.key_id == k.key_id) for k in keys}
    assert len(per_key) >= 3 and max(per_key.values()) <= 4 and min(per_key.values()) >= 1
    assert len(per_key) <= 6
    # The last records' data keys are wrapped by the new KEK, the first ones' by the old.
    assert keys[-1].kek == new_kek and keys[0].kek != new_kek

    # Read through the gateway: every record decrypted, old KEK and new, headers gone.
    read = consume(env.gateway.bootstrap, topic)
    assert values(read) == first + second
    assert all(HEADER_DATA_KEY not in dict(h) and HEADER_ENCRYPTION_KEY_ID not in dict(h)
               for _v, h in read)


def test_aws_kms_field_encryption(env: Env) -> None:
    topic = env.topic("fields.")
    docs = [{"id": i, "card": {"number": f"4111-{i:04d}"}} for i in range(3)]
    assert produce(env.gateway.bootstrap, topic, [orjson.dumps(d) for d in docs],
                   retries=10) == [None] * 3
    stored = consume(env.kafka.bootstrap, topic)
    assert all(orjson.loads(v or b"")["card"]["number"].startswith("keg:v1:")
               for v, _h in stored)
    assert [orjson.loads(v or b"") for v, _h in consume(env.gateway.bootstrap, topic)] == docs


def test_keyring_kek_rotation_keeps_old_records_readable(env: Env) -> None:
    topic = env.topic("ring.")
    first = secrets("first", 5)
    assert produce(env.gateway.bootstrap, topic, first, retries=10) == [None] * 5
    ring = json.loads(env.keyring.read_text())["keys"]["orders"]["versions"]
    old_key = base64.b64decode(ring["1"])
    env.keyring.write_text(keyring_doc({1: old_key, 2: os.urandom(32)}, 2))  # rotate the KEK
    second = secrets("second", 5)
    assert produce(env.gateway.bootstrap, topic, second, retries=10) == [None] * 5
    keys = data_keys(consume(env.kafka.bootstrap, topic))
    assert {k.provider for k in keys} == {PROVIDER_KEYRING}
    assert keys[0].kek == "orders:v1" and keys[-1].kek == "orders:v2"
    assert values(consume(env.gateway.bootstrap, topic)) == first + second


def test_a_keyring_rotation_takes_effect_within_seconds(env: Env) -> None:
    """A new primary KEK version in the keyring (rotating away from a leaked one): new
    records kept data keys wrapped by the old one until their hour was over, or a new
    rule set (regression). Now the data keys of the old KEK are retired within a
    second of the change."""
    topic = env.topic("hourly.")
    assert produce(env.gateway.bootstrap, topic, secrets("before", 3), retries=10) == [None] * 3
    ring = json.loads(env.keyring.read_text())["keys"]["orders"]
    versions = {int(v): base64.b64decode(k) for v, k in ring["versions"].items()}
    old, new = ring["primary"], max(versions) + 1
    env.keyring.write_text(keyring_doc({**versions, new: os.urandom(32)}, new))
    time.sleep(1.5)
    assert produce(env.gateway.bootstrap, topic, secrets("after", 3), retries=10) == [None] * 3
    keks = [k.kek for k in data_keys(consume(env.kafka.bootstrap, topic))]
    assert keks == [f"orders:v{old}"] * 3 + [f"orders:v{new}"] * 3


def test_kms_down_at_produce_is_a_retriable_refusal(env: Env) -> None:
    topic = env.topic("down.")
    assert produce(env.gateway.bootstrap, topic, [b"secret"], retries=0) == [
        "REQUEST_TIMED_OUT"]
    event = env.audit.wait_for(topic, "unavailable")
    assert event["error_code"] == ErrorCode.REQUEST_TIMED_OUT and "AWS KMS" in event["reason"]
    assert consume(env.kafka.bootstrap, topic) == []


def test_kms_down_at_fetch_withholds_the_records(env: Env) -> None:
    source = env.topic("aws.")
    assert produce(env.gateway.bootstrap, source, [b"secret"], retries=10) == [None]
    encrypted = consume(env.kafka.bootstrap, source)
    topic = env.topic("downfetch.")
    produce(env.kafka.bootstrap, topic, values(encrypted),
            headers=[headers for _v, headers in encrypted])
    got, event = env.audit.withheld_at_fetch(env.gateway.bootstrap, topic)
    assert got == []  # withheld, not handed out encrypted
    assert event["api_name"] == "Fetch" and event["error_code"] == ErrorCode.NOT_LEADER_OR_FOLLOWER
