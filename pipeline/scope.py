"""What a backtest can judge of a rule set, and what it cannot.

A capture keeps records, their topic, principal and direction; not the requests they
came in (acks, compression, the API version), nor the connection (client id, client
address, listener, broker). So:

- request rules (deny, safeguard, rate, observe, allow_apis, deny_apis) and virtual
  topics are not evaluated at all: a backtest runs the record engine only. Before,
  they were silently left out, and a `--fail-on 'RULE:matched==0'` on a deny measured
  0 and passed (a new user's GitOps gate let a rule that refused whole topics through);
- record rules whose match reads what a capture lacks are judged on what it has:
  without a client id, client address, listener or broker, and at one API version
  (`interceptors.engine.PLAN_VERSIONS`). Their counts are approximate, and said so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from filter_rules import CompiledRuleSet
from filter_rules.model import Match
from filter_rules.record_actions import RECORD_KINDS
from interceptors.engine import PLAN_VERSIONS
from kafka_wire import ApiKey

# Match fields a capture does not record, and how the backtest judges them.
_UNCAPTURED: Final = {
    "client_ids": "client ids (judged as a client without one)",
    "client_addresses": "client addresses (judged as unknown)",
    "listeners": "listeners (judged as unknown)",
    "brokers": "brokers (judged as unknown)",
    "groups": "groups (judged as none)",
    "versions": (f"API versions (judged at Produce v{PLAN_VERSIONS['produce']} and "
                 f"Fetch v{PLAN_VERSIONS['consume']})"),
}


@dataclass(frozen=True)
class Unjudged:
    """A rule the backtest does not judge (`approximate` False), or judges without
    some of what its match reads (`approximate` True)."""

    rule_id: str
    kind: str
    where: str  # file:line of the rule, or the rule set's name
    reason: str
    approximate: bool

    def line(self) -> str:
        what = "judged approximately" if self.approximate else "not evaluated"
        return f"{self.where}: rule {self.rule_id} ({self.kind}) {what}: {self.reason}"

    def as_dict(self) -> dict[str, object]:
        return {"rule_id": self.rule_id, "kind": self.kind, "where": self.where,
                "reason": self.reason, "approximate": self.approximate}


def uncaptured_fields(match: Match) -> list[str]:
    """The fields of `match` (its `not` included) a capture does not record."""
    fields = [name for name in _UNCAPTURED if getattr(match, name) is not None]
    if match.not_ is not None:
        fields += [f for f in uncaptured_fields(match.not_) if f not in fields]
    return fields


def unjudged(compiled: CompiledRuleSet, name: str = "<rules>") -> list[Unjudged]:
    """Every enabled rule of `compiled` a backtest does not judge as the gateway would."""
    found = []
    for rule in compiled.rules:
        where = str(rule.source) if rule.source else name
        if rule.kind not in RECORD_KINDS:
            found.append(Unjudged(
                rule.id, rule.kind, where,
                "a backtest runs record rules only; this rule judges requests (their "
                "APIs, acks, compression, rates), which a capture does not keep",
                approximate=False))
            continue
        missing = [_UNCAPTURED[f] for f in uncaptured_fields(rule.rule.match)]
        if rule.api_keys is not None and ApiKey.SHARE_FETCH in rule.api_keys \
                and ApiKey.FETCH not in rule.api_keys:
            missing.append("the API (share consumers' records are judged as Fetch answers, "
                           "which this rule does not read)")
        if missing:
            found.append(Unjudged(
                rule.id, rule.kind, where,
                "its match reads what a capture does not record: " + "; ".join(missing),
                approximate=True))
    return found


__all__ = ["Unjudged", "uncaptured_fields", "unjudged"]
