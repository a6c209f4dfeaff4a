"""The filters of a connection, in their one order.

Observers that learn who is on the connection and what the broker says come first
(identity, the broker's versions and addresses, topic ids, group protocols), then the
filters that decide: virtual topics first, so every later filter (and rule) sees the
broker's names, then request rules, then record rules. The data path builds every
connection's chain from `connection_filters`; the REST dry run uses `rule_filters`.
"""

from __future__ import annotations

from ext_proc.filters import Filter
from ext_proc.filters.api_versions import ApiVersionsNarrower
from ext_proc.filters.broker_address import BrokerAddressRewriter
from ext_proc.filters.group_protocol import GroupProtocolObserver
from ext_proc.filters.identity import IdentityObserver
from ext_proc.filters.records import RecordsFilter
from ext_proc.filters.rules import RuleEngine, RulesFilter
from ext_proc.filters.topic_ids import TopicIdLearner
from ext_proc.filters.virtual_topics import VirtualTopicsFilter
from ext_proc.identity import IdentityTracker


def rule_filters(engine: RuleEngine, identity: IdentityTracker) -> list[Filter]:
    """The filters that judge a request by the rules: virtual topics, then rules."""
    return [VirtualTopicsFilter(engine, identity), RulesFilter(engine, identity)]


def connection_filters(engine: RuleEngine, identity: IdentityTracker) -> list[Filter]:
    groups = GroupProtocolObserver()
    return [IdentityObserver(identity), ApiVersionsNarrower(), BrokerAddressRewriter(),
            TopicIdLearner(engine.topic_ids), groups, groups.guard(),
            *rule_filters(engine, identity), RecordsFilter(engine, identity)]
