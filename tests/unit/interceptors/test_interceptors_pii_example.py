"""filter_rules/examples/pii.yaml built with the built-ins, stage by stage (no engine)."""

from __future__ import annotations

import base64
import os

import orjson

from filter_rules import load_rule_file
from filter_rules.record_actions import HEADER_ENCRYPTION_KEY_ID, record_spec
from filter_rules.schema import SCHEMA_PATH
from interceptors import BuildContext, InterceptedRecord, Interceptor
from interceptors.builtin import BUILDERS

EXAMPLE = SCHEMA_PATH.parent / "examples" / "pii.yaml"
# One key for both directions, as the gateway reads it from its environment.
CTX = BuildContext(environ={"KEG_CARD_KEY": base64.b64encode(os.urandom(32)).decode()})
ORDER = {"id": 1, "customer": {"email": "ann@example.com"}, "card": {"number": "4111111111111111"}}


def stages(direction: str, principal: str | None) -> list[Interceptor]:
    """The example's rules for one direction and consumer, in rule order."""
    out = []
    for rule in load_rule_file(EXAMPLE).ordered():
        principals = rule.match.principals
        if rule.direction != direction:
            continue
        if principals is not None and principal not in principals.exact:
            continue
        out.append(BUILDERS[rule.action.kind](record_spec(rule.action), CTX))
    return out


def run(interceptors: list[Interceptor], record: InterceptedRecord) -> InterceptedRecord:
    for interceptor in interceptors:
        result = interceptor.intercept(record)
        assert result is not None
        record = result
    return record


def test_pii_scenario() -> None:
    stored = run(stages("request", None), InterceptedRecord("orders", 0, b"1", orjson.dumps(ORDER)))
    stored_doc = orjson.loads(stored.value or b"")
    assert stored_doc["card"]["number"].startswith("keg:v1:")
    assert stored_doc["customer"] == ORDER["customer"]
    assert stored.headers == [(HEADER_ENCRYPTION_KEY_ID, b"cards-2026")]

    def consumed(principal: str) -> dict[str, object]:
        record = InterceptedRecord(
            "orders",
            0,
            b"1",
            stored.value,
            list(stored.headers),
            principal=principal,
            direction="consume",
        )
        return orjson.loads(run(stages("response", principal), record).value or b"")

    assert consumed("User:analytics") == {"id": 1, "customer": {"email": "***@***"}, "card": {}}
    assert consumed("User:billing") == ORDER
    assert consumed("User:other") == stored_doc
