"""`--fail-on` conditions: when a backtest must fail (so CI blocks a rule change).

    dropped>0.1          more than 10% of the records would be dropped
    rejected>=1          at least one record would be rejected
    differs>5%           more than 5% differ from the live rules' outcome
    pii-mask:modified==0 the rule pii-mask would modify nothing

A metric is a record status (unchanged, modified, dropped, rejected, failed),
`changed` (anything but unchanged) or `differs` (vs the live rules). A number with a
decimal point or a % sign is a fraction of all records; a whole number is a count.
With a `rule:` prefix the metric counts the records that rule's steps had (matched,
modified, dropped, rejected, failed, unchanged; a dry-run rule's would_modified,
would_dropped, would_rejected). A rule the backtest does not evaluate (a request rule,
`pipeline.scope`) cannot be gated on: it would measure 0 whatever it does live.
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pipeline.errors import PipelineError

RECORD_METRICS: Final = ("unchanged", "modified", "dropped", "rejected", "failed", "changed",
                         "differs")
RULE_METRICS: Final = ("matched", "unchanged", "modified", "dropped", "rejected", "failed",
                       "would_modified", "would_dropped", "would_rejected")
_OPS: Final[dict[str, Callable[[float, float], bool]]] = {
    ">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
    ">": operator.gt, "<": operator.lt,
}
_PATTERN: Final = re.compile(
    r"^\s*(?:(?P<rule>[a-z0-9][a-z0-9._-]*):)?(?P<metric>[a-z_]+)\s*"
    r"(?P<op>>=|<=|==|!=|>|<)\s*(?P<number>\d+(?:\.\d*)?|\.\d+)(?P<pct>%)?\s*$")


@dataclass(frozen=True)
class Threshold:
    text: str
    metric: str
    op: str
    value: float
    fraction: bool
    rule: str | None = None

    def measure(self, summary: Mapping[str, Any]) -> float:
        """The metric's value in a backtest summary (a rule that never matched: 0)."""
        total = summary["totals"]["records"]
        if self.rule is None:
            count = float(summary["totals"][self.metric])
        else:
            rule = next((r for r in summary["rules"] if r["rule_id"] == self.rule), None)
            count = 0.0 if rule is None else float(rule[self.metric])
        return count / total if self.fraction and total else count

    def crossed(self, summary: Mapping[str, Any]) -> tuple[bool, float]:
        value = self.measure(summary)
        return _OPS[self.op](value, self.value), value


def parse_threshold(text: str) -> Threshold:
    found = _PATTERN.match(text)
    if not found:
        raise PipelineError(
            f"invalid --fail-on '{text}' (expected [rule:]metric OP number, e.g. "
            "'dropped>0.1', 'rejected>=1', 'differs>5%')")
    metric, rule = found["metric"], found["rule"]
    allowed = RULE_METRICS if rule else RECORD_METRICS
    if metric not in allowed:
        raise PipelineError(f"invalid --fail-on '{text}': unknown metric '{metric}' "
                            f"(one of {', '.join(allowed)})")
    number = float(found["number"])
    pct = found["pct"] is not None
    fraction = pct or "." in found["number"]
    value = number / 100 if pct else number
    if fraction and not 0 <= value <= 1:
        raise PipelineError(f"invalid --fail-on '{text}': a fraction is between 0 and 1")
    return Threshold(text.strip(), metric, found["op"], value, fraction, rule)


def check_rule_ids(thresholds: list[Threshold], rule_ids: Collection[str],
                   unevaluated: Mapping[str, str] | None = None) -> None:
    """PipelineError for a threshold naming a rule the candidate set does not have, or
    one the backtest does not evaluate (`unevaluated`: rule id -> kind): it would
    measure 0 for ever, so a gate with a typo in it (or on a deny) passed every change."""
    for threshold in thresholds:
        if threshold.rule is not None and threshold.rule in (unevaluated or {}):
            kind = (unevaluated or {})[threshold.rule]
            raise PipelineError(
                f"invalid --fail-on '{threshold.text}': rule '{threshold.rule}' is a {kind} "
                "rule, which a backtest does not evaluate (it runs record rules only): it "
                "would measure 0 whatever the rule does live")
        if threshold.rule is None or threshold.rule in rule_ids:
            continue
        close = difflib.get_close_matches(threshold.rule, list(rule_ids), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise PipelineError(f"invalid --fail-on '{threshold.text}': the rules have no rule "
                            f"'{threshold.rule}'{hint}")


def check(thresholds: list[Threshold], summary: Mapping[str, Any]) -> list[str]:
    """One line per crossed threshold (empty: the backtest passes)."""
    crossed = []
    for threshold in thresholds:
        hit, value = threshold.crossed(summary)
        if hit:
            shown = f"{value:.2%}" if threshold.fraction else f"{value:.0f}"
            crossed.append(f"{threshold.text}: measured {shown}")
    return crossed


__all__ = ["RECORD_METRICS", "RULE_METRICS", "Threshold", "check", "check_rule_ids",
           "parse_threshold"]
