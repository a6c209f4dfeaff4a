"""Key material in keg's environment stays out of the children that do not need it:
a real broker and a real gateway started with secrets in the
parent's environment; /proc/<pid>/environ of each child is read."""

from __future__ import annotations

import base64
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer

from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import EXT_PROC_COMPONENT, Gateway
from keg.paths import SIDE_EFFECTS_PASSWORD_ENV
from tests.integration.conftest import create_topic, gateway_settings
from tests.integration.runtime.faults import stored_values, wait_serving

pytestmark = pytest.mark.integration

KEY_ENV = "KEG_ENV_TEST_CARD_KEY"
CARD_KEY = base64.b64encode(bytes(range(100, 132))).decode()
# Secrets keg's process holds that no rule names: an API token, a store password, the
# SASL password of copies (the gateway here has no SASL login: nobody needs it).
OTHER_SECRETS = {
    "KEG_API_TOKENS": "ops:env-test-token-0123456789abcdef",
    "KEG_STORE_URL": "postgresql://keg:env-test-store-password@db/keg",
    SIDE_EFFECTS_PASSWORD_ENV: "env-test-copy-password",
}
RULES = f"""\
rules:
  - id: env-encrypt-cards
    match: {{topics: {{prefix: [env.cards.]}}}}
    action:
      encrypt: {{fields: [$.card.number], key: {{id: k-env, secret: {{env: {KEY_ENV}}}}}}}
"""


def environ(pid: int | None) -> dict[str, str]:
    assert pid is not None
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0")
                if "=" in item)


def holds_a_secret(env: dict[str, str]) -> list[str]:
    """Names under which `env` carries the card key or another secret, by value."""
    secrets = {CARD_KEY, *OTHER_SECRETS.values()}
    return sorted(name for name, value in env.items() if any(s in value for s in secrets))


PASSED_ENV = "KEG_ENV_TEST_PLUGIN_SETTING"  # named for the ext_proc service (--ext-proc-env)


@pytest.fixture
def secrets_in_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(PASSED_ENV, "plugin-setting")
    monkeypatch.setenv(KEY_ENV, CARD_KEY)
    for name, value in OTHER_SECRETS.items():
        monkeypatch.setenv(name, value)
    yield


def produce_card(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    errors: list[object] = []
    producer.produce(topic, orjson.dumps({"card": {"number": "4111111111111111"}}),
                     on_delivery=lambda err, _m: errors.append(err))
    producer.flush(30)
    assert errors == [None]


def assert_card_encrypted(kafka: EmbeddedKafka, topic: str, count: int) -> None:
    stored = list(stored_values(kafka.bootstrap, topic).elements())
    assert len(stored) == count
    for value in stored:
        number = orjson.loads(value)["card"]["number"]
        assert number.startswith("keg:v1:") and "4111" not in value, value


def test_children_get_only_the_environment_they_need(
        secrets_in_environment: None, tmp_path: Path) -> None:
    with EmbeddedKafka(data_dir=tmp_path / "kafka") as kafka:
        rules = tmp_path / "rules"
        rules.mkdir()
        (rules / "encrypt.yaml").write_text(RULES)
        settings = gateway_settings(
            kafka, tmp_path / "work", rules_dir=rules, rules_delivery="control-plane",
            ext_proc_env=(PASSED_ENV,))
        with Gateway(settings) as gateway:
            assert gateway.envoy is not None
            broker, envoy, ext_proc = (environ(kafka.pid), environ(gateway.envoy.pid),
                                       environ(gateway.ext_proc_pid))
            # Envoy and the broker: no secret at all, under any name.
            assert holds_a_secret(broker) == [] and holds_a_secret(envoy) == []
            assert "PATH" in broker and "PATH" in envoy
            # The ext_proc service: the key its rule reads, and nothing else secret; what
            # it was named besides.
            assert holds_a_secret(ext_proc) == [KEY_ENV]
            assert ext_proc[PASSED_ENV] == "plugin-setting"
            assert PASSED_ENV not in envoy and PASSED_ENV not in broker
            # ... and the rule using it works.
            topic = create_topic(kafka.bootstrap, name=f"env.cards.{time.monotonic_ns()}")
            produce_card(gateway.bootstrap, topic)
            assert_card_encrypted(kafka, topic, 1)

            # Restarted by the supervisor, the ext_proc service gets the key again.
            pid = gateway.ext_proc_pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            wait_serving(gateway.bootstrap, also=lambda: gateway.ext_proc_pid != pid
                         and gateway.components()[EXT_PROC_COMPONENT] == "up")
            assert holds_a_secret(environ(gateway.ext_proc_pid)) == [KEY_ENV]
            produce_card(gateway.bootstrap, topic)
            assert_card_encrypted(kafka, topic, 2)
