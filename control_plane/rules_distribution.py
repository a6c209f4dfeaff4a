"""Rule sets as xDS resources for ext_proc instances (keg's own type, one resource).

The wire format (an Any of BytesValue carrying the rule set's JSON) is defined on
the receiving side, `ext_proc.rule_subscription`, and only used here.
"""

from __future__ import annotations

from control_plane.snapshot import RULES, Snapshot
from ext_proc.rule_subscription import RULE_SET_RESOURCE, RULES_TYPE_URL, encode_rule_set
from filter_rules import RuleSet

if RULES != RULES_TYPE_URL:  # the control plane and ext_proc must agree on the type URL
    raise ImportError(f"rule type URLs differ: {RULES} != {RULES_TYPE_URL}")


def rules_snapshot(version: str, ruleset: RuleSet) -> Snapshot:
    """What every ext_proc instance gets: the rule set, versioned by its source."""
    if not version:
        raise ValueError("a distributed rule set needs a version")
    return Snapshot({RULES: {RULE_SET_RESOURCE: encode_rule_set(ruleset)}},
                    fixed_versions={RULES: version})
