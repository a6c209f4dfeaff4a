"""OAUTHBEARER principals through the gateway, on both data paths: rules judge the
principal the broker acts as.

Kafka reads an OAUTHBEARER principal from the claim its validator names
(`sasl.oauthbearer.sub.claim.name`, or the unsecured validator's
`unsecuredValidatorPrincipalClaimName`), `sub` by default. keg read `sub` whatever the
broker read: against a broker reading `client_id`, a token {"sub": "bob", "client_id":
"alice"} wrote as alice where a rule denies alice (the broker's request log named
User:alice). `--oauth-principal-claim` names the broker's claim to keg.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer

from control_plane.topology import SaslPlain
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, gateway_settings, rule_dir

pytestmark = [pytest.mark.integration, pytest.mark.one_data_path]

USERS = {"keg": "keg-secret"}
CLAIM = "client_id"
LISTENER = "listener.name.sasl_plaintext"
BROKER_CONFIG = {
    "sasl.enabled.mechanisms": "PLAIN,OAUTHBEARER",
    f"{LISTENER}.sasl.enabled.mechanisms": "PLAIN,OAUTHBEARER",
    f"{LISTENER}.oauthbearer.sasl.jaas.config": (
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
        f'unsecuredLoginStringClaim_sub="admin" unsecuredValidatorPrincipalClaimName="{CLAIM}";'),
}
RULES = """\
rules:
  - id: alice-may-not-write-ledgers
    match: {apis: [Produce], topics: {prefix: [ledger.]}, principals: {exact: [alice]}}
    action: {deny: {}}
"""


@pytest.fixture(scope="module")
def oauth_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    """A broker whose OAUTHBEARER principal is the token's client_id claim."""
    with EmbeddedKafka(tmp_path_factory.mktemp("oauth-kafka"), sasl_users=USERS,
                       extra_config=BROKER_CONFIG) as broker:
        yield broker


@pytest.fixture(scope="module", params=["ext-proc", "native"])
def gateway(oauth_kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory,
            request: pytest.FixtureRequest) -> Iterator[Gateway]:
    base = tmp_path_factory.mktemp(f"oauth-{request.param}")
    settings = gateway_settings(oauth_kafka, base / "envoy",
                                bootstrap_servers=oauth_kafka.sasl_bootstrap,
                                sasl=SaslPlain("keg", USERS["keg"]),
                                rules_dir=rule_dir(base / "rules", {"rules.yaml": RULES}),
                                oauth_principal_claim=CLAIM, data_path=request.param)
    with Gateway(settings) as gw:
        yield gw


def unsecured_token(claims: dict[str, Any]) -> str:
    """A JWT with no signature (`alg: none`), as Kafka's unsecured validator takes."""
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    now = int(time.time())
    return f"{part({'alg': 'none'})}.{part({'iat': now, 'exp': now + 3600, **claims})}."


def produce_as(bootstrap: str, claims: dict[str, Any], topic: str) -> int:
    """One record written with an OAUTHBEARER token of `claims`: its error code, or 0."""
    token = unsecured_token(claims)
    codes: list[int] = []
    producer = Producer({
        "bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER", "message.timeout.ms": 30000, "retries": 0,
        "oauth_cb": lambda _config: (token, time.time() + 3600)})
    producer.produce(topic, b"v", on_delivery=lambda err, _m: codes.append(
        0 if err is None else err.code()))
    assert producer.flush(60) == 0
    return codes[0]


def test_the_principal_is_the_claim_the_broker_reads(
        gateway: Gateway, oauth_kafka: EmbeddedKafka) -> None:
    ledger = create_topic(oauth_kafka.bootstrap, name=f"ledger.{uuid.uuid4().hex[:6]}")
    # The broker acts as alice: so do the rules, whatever `sub` says.
    assert produce_as(gateway.bootstrap, {"sub": "bob", CLAIM: "alice"}, ledger) \
        == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # And as bob where the claim says bob, though `sub` says alice.
    assert produce_as(gateway.bootstrap, {"sub": "alice", CLAIM: "bob"}, ledger) == 0

