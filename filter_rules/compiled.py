"""A RuleSet compiled for the data path: per-frame rule lookup is a dict hit.

`CompiledRuleSet` is built once per rule-set version and never changes. It indexes
the enabled rules by (api key, direction) -- and by version for the keys where a rule
restricts versions -- so the engine asks `candidates(api_key, api_version, direction)`
and gets, in evaluation order, exactly the rules whose APIs, versions and direction
fit. It then asks each candidate `matches(ctx, topic, group)`, which checks the rest:
principals, client ids, addresses, listeners, brokers, topics, groups and `not`.

Strings compile to a frozenset (exact), a tuple for `str.startswith` (prefixes) and
one RE2 program of all regexes of the matcher.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Final

import kafka_wire
from filter_rules._base import StringMatch
from filter_rules.apis import resolve_api
from filter_rules.context import FrameDirection, MatchContext, normalize_principal
from filter_rules.index import RuleIndex
from filter_rules.model import (
    REQUEST_KINDS,
    ActionModel,
    AllowApisAction,
    DenyApisAction,
    Match,
    Rule,
    RuleSet,
    RuleSource,
    SafeguardAction,
    SafeguardSpec,
)
from filter_rules.patterns import compile_alternatives, compile_re2
from filter_rules.record_actions import RECORD_KINDS
from kafka_wire import ApiKey
from kafka_wire.entity_names import GROUP, TOPIC, MessageKind, entity_types, names_topic_ids

# Records travel in Produce requests and in the answers to Fetch and ShareFetch (KIP-932
# share groups read with ShareFetch: a consume-time rule on Fetch alone let every share
# consumer read around it).
CONSUME_APIS: Final = frozenset({ApiKey.FETCH, ApiKey.SHARE_FETCH})
RECORD_APIS: Final = frozenset({ApiKey.PRODUCE, *CONSUME_APIS})

# Kinds for which naming Fetch means reading a topic, share groups included: a deny, an
# observe or a record rule of Fetch covers ShareFetch. Safeguards and rates read Fetch's
# own fields.
READING_KINDS: Final = frozenset({"deny", "observe", *RECORD_KINDS})



def _safeguarded(spec: SafeguardSpec) -> frozenset[int]:
    """The APIs a safeguard can act on: Produce (its checks read Produce requests), and
    Fetch when it caps fetch sizes. On any other API it never triggers: leaving it a
    candidate there decoded (on the native path: handed off) every request of every
    API for nothing."""
    if spec.max_fetch_bytes is not None:
        return frozenset({ApiKey.PRODUCE, ApiKey.FETCH})
    return frozenset({ApiKey.PRODUCE})


@functools.cache
def apis_never_naming(entity: str) -> frozenset[int]:
    """The known APIs no version of whose request or response names `entity` (a topic:
    by name or by id), as `kafka_wire.entity_names` reads them. A rule whose top-level
    match names topics (groups) cannot trigger on them: the rules see a frame's topics
    (groups) through the same reader. An Envelope is never one: it carries another
    request (KIP-590). Keys the catalog does not know are never excluded."""
    def names(api_key: int, version: int, kind: MessageKind) -> bool:
        if entity in entity_types(api_key, version, kind):
            return True
        return entity == TOPIC and names_topic_ids(api_key, version, kind)

    never = set()
    for api_key in kafka_wire.known_api_keys():
        low, high = kafka_wire.supported_versions(api_key) or (0, -1)
        if api_key != ApiKey.ENVELOPE and not any(
                names(api_key, v, kind) for v in range(low, high + 1)
                for kind in ("request", "response")):
            never.add(api_key)
    return frozenset(never)


def _named_entity_exclusions(match: Match) -> frozenset[int]:
    """The APIs a rule's top-level topic and group matchers rule out (a `not` does not:
    it matches frames that name none)."""
    excluded: frozenset[int] = frozenset()
    if match.topics is not None:
        excluded |= apis_never_naming(TOPIC)
    if match.groups is not None:
        excluded |= apis_never_naming(GROUP)
    return excluded


def _reading(api_keys: frozenset[int]) -> frozenset[int]:
    """`api_keys` with ShareFetch when they name Fetch."""
    return api_keys | CONSUME_APIS if ApiKey.FETCH in api_keys else api_keys


def _writing(api_keys: frozenset[int]) -> frozenset[int]:
    """`api_keys` with AddPartitionsToTxn when they name Produce: Kafka authorizes a
    transaction's writes there, before any record is sent. A topic refused only at
    Produce, in the middle of a commit, left the producer with batches that already had
    sequence numbers: the next transaction failed too (OUT_OF_ORDER_SEQUENCE_NUMBER)."""
    return api_keys | {ApiKey.ADD_PARTITIONS_TO_TXN} if ApiKey.PRODUCE in api_keys else api_keys


def _named_apis(api_keys: frozenset[int], kind: str) -> frozenset[int]:
    """The APIs a rule's `apis` stand for: Fetch names ShareFetch for the reading kinds,
    Produce names AddPartitionsToTxn for a deny."""
    if kind in READING_KINDS:
        api_keys = _reading(api_keys)
    if kind == "deny":
        api_keys = _writing(api_keys)
    return api_keys


DIRECTIONS: Final[tuple[FrameDirection, FrameDirection]] = ("request", "response")

Check = Callable[[MatchContext, "str | None", "str | None"], bool]


#: Regex and network verdicts are remembered per value (topics, principals, client
#: ids and addresses repeat): at most this many per matcher, then forgotten at once.
MEMO_LIMIT: Final = 4096
_MEMO_MAX_LENGTH: Final = 512  # longer values are matched every time, not remembered


class StringMatcher:
    """A compiled StringMatch: exact set, prefix tuple, one RE2 program (full match).

    RE2 through its Python wrapper costs microseconds per call, so regex verdicts are
    remembered per value (bounded, see MEMO_LIMIT); exact and prefix checks are not.
    """

    __slots__ = ("_memo", "exact", "prefixes", "regex", "regexes")

    def __init__(self, spec: StringMatch, normalize: Callable[[str], str] | None = None) -> None:
        exact: Iterable[str] = spec.exact
        prefixes: Iterable[str] = spec.prefix
        if normalize is not None:
            exact = map(normalize, exact)
            prefixes = map(normalize, prefixes)
        self.exact: frozenset[str] = frozenset(exact)
        self.prefixes: tuple[str, ...] = tuple(dict.fromkeys(prefixes))
        self.regex: Any = None
        self.regexes: tuple[Any, ...] = ()
        if spec.regex:
            self.regex = compile_alternatives(spec.regex)
            if self.regex is None:
                self.regexes = tuple(compile_re2(p) for p in spec.regex)
        self._memo: dict[str, bool] = {}

    def __call__(self, value: str) -> bool:
        if value in self.exact:
            return True
        if self.prefixes and value.startswith(self.prefixes):
            return True
        if self.regex is None and not self.regexes:
            return False
        verdict = self._memo.get(value)
        if verdict is None:
            verdict = self._regex_matches(value)
            if len(value) <= _MEMO_MAX_LENGTH:
                if len(self._memo) >= MEMO_LIMIT:
                    self._memo.clear()
                self._memo[value] = verdict
        return verdict

    def _regex_matches(self, value: str) -> bool:
        # Bytes take the wrapper's fast path (RE2 reads UTF-8 either way).
        data = value.encode("utf-8", "surrogatepass")
        if self.regex is not None:
            return self.regex.fullmatch(data) is not None
        return any(r.fullmatch(data) is not None for r in self.regexes)


class NetworkMatcher:
    """Client addresses in any of a list of networks; verdicts remembered per address."""

    __slots__ = ("_memo", "networks")

    def __init__(self, cidrs: Iterable[str]) -> None:
        self.networks = tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)
        self._memo: dict[ipaddress.IPv4Address | ipaddress.IPv6Address, bool] = {}

    def __call__(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
        if address is None:
            return False
        verdict = self._memo.get(address)
        if verdict is None:
            verdict = any(
                address.version == network.version and address in network
                for network in self.networks
            )
            if len(self._memo) >= MEMO_LIMIT:
                self._memo.clear()
            self._memo[address] = verdict
        return verdict


def principal_pattern(value: str) -> str:
    """A principal matcher's exact name or prefix as it is compared: "alice" ->
    "User:alice" (an empty one stays empty)."""
    return normalize_principal(value) if value else value


class _Predicate:
    """A compiled Match: all checks must pass (a `not` is one negated check)."""

    __slots__ = ("checks", "uses_groups", "uses_topics")

    def __init__(self, match: Match, *, top_level: bool, directions: frozenset[str],
                 kind: str = "") -> None:
        """`kind`: the rule's, for what its `apis` stand for (`_named_apis`)."""
        checks: list[Check] = []
        if match.apis is not None:
            keys = _named_apis(frozenset(resolve_api(ref) for ref in match.apis), kind)
            checks.append(lambda ctx, t, g: ctx.api_key in keys)
        if match.versions is not None:
            low = match.versions.min if match.versions.min is not None else 0
            high = match.versions.max if match.versions.max is not None else 1 << 16
            checks.append(lambda ctx, t, g: low <= ctx.api_version <= high)
        if (top_level or match.direction is not None) and directions != frozenset(DIRECTIONS):
            checks.append(lambda ctx, t, g: ctx.direction in directions)
        if match.brokers is not None:
            brokers = frozenset(match.brokers)
            checks.append(lambda ctx, t, g: ctx.broker_id in brokers)
        if match.listeners is not None:
            listeners = frozenset(match.listeners)
            checks.append(lambda ctx, t, g: ctx.listener in listeners)
        if match.principals is not None:
            principals = StringMatcher(match.principals, principal_pattern)
            checks.append(lambda ctx, t, g: ctx.principal is not None and principals(ctx.principal))
        if match.client_ids is not None:
            client_ids = StringMatcher(match.client_ids)
            checks.append(lambda ctx, t, g: ctx.client_id is not None and client_ids(ctx.client_id))
        if match.client_addresses is not None:
            networks = NetworkMatcher(match.client_addresses)
            checks.append(lambda ctx, t, g: networks(ctx.client_ip))
        self.uses_topics = match.topics is not None
        if match.topics is not None:
            topics = StringMatcher(match.topics)
            checks.append(lambda ctx, t, g: t is not None and topics(t))
        self.uses_groups = match.groups is not None
        if match.groups is not None:
            groups = StringMatcher(match.groups)
            checks.append(lambda ctx, t, g: g is not None and groups(g))
        if match.not_ is not None:
            inner_directions = frozenset(
                DIRECTIONS if match.not_.direction in (None, "both") else (match.not_.direction,)
            )
            inner = _Predicate(match.not_, top_level=False, directions=inner_directions,
                               kind=kind)
            self.uses_topics = self.uses_topics or inner.uses_topics
            self.uses_groups = self.uses_groups or inner.uses_groups
            checks.append(lambda ctx, t, g: not inner(ctx, t, g))
        self.checks: tuple[Check, ...] = tuple(checks)

    def __call__(self, ctx: MatchContext, topic: str | None, group: str | None) -> bool:
        # A plain loop: about twice as fast as all() over a generator, per frame.
        for check in self.checks:  # noqa: SIM110
            if not check(ctx, topic, group):
                return False
        return True


class CompiledRule:
    """One enabled rule, ready to match. `rule` is the model it came from."""

    __slots__ = (
        "_predicate",
        "action",
        "api_keys",
        "directions",
        "dry_run",
        "excluded_api_keys",
        "id",
        "kind",
        "max_version",
        "min_version",
        "order",
        "position",
        "rule",
        "source",
    )

    def __init__(self, rule: Rule, position: int, source: RuleSource | None) -> None:
        self.rule = rule
        self.id = rule.id
        self.order = rule.order
        self.position = position  # index in evaluation order
        self.source = source
        self.dry_run = rule.mode == "dry-run"
        self.action: ActionModel = rule.action
        self.kind: str = rule.action.kind
        direction = rule.direction
        self.directions: frozenset[str] = frozenset(
            DIRECTIONS if direction == "both" else (direction,)
        )
        api_keys = (
            frozenset(resolve_api(ref) for ref in rule.match.apis)
            if rule.match.apis is not None
            else None
        )
        if api_keys is not None:
            api_keys = _named_apis(api_keys, self.kind)
        excluded: frozenset[int] = frozenset()
        action = rule.action
        if isinstance(action, DenyApisAction):  # the rule applies to the listed APIs only
            denied = frozenset(resolve_api(ref) for ref in action.deny_apis)
            api_keys = denied if api_keys is None else api_keys & denied
        elif isinstance(action, AllowApisAction):  # ... to every API but the listed ones
            excluded = frozenset(resolve_api(ref) for ref in action.allow_apis)
        elif self.kind in RECORD_KINDS:  # records travel in Produce requests, Fetch answers
            api_keys = RECORD_APIS if api_keys is None else api_keys & RECORD_APIS
        elif isinstance(action, SafeguardAction):
            guarded = _safeguarded(action.safeguard)
            api_keys = guarded if api_keys is None else api_keys & guarded
        if self.kind in REQUEST_KINDS:
            excluded |= _named_entity_exclusions(rule.match)
        self.api_keys: frozenset[int] | None = api_keys
        self.excluded_api_keys = excluded
        versions = rule.match.versions
        self.min_version: int | None = versions.min if versions is not None else None
        self.max_version: int | None = versions.max if versions is not None else None
        self._predicate = _Predicate(rule.match, top_level=True, directions=self.directions,
                                     kind=self.kind)

    @property
    def uses_topics(self) -> bool:
        """Whether the rule matches on topics (the frame's topics must be read)."""
        return self._predicate.uses_topics

    @property
    def uses_groups(self) -> bool:
        """Whether the rule matches on consumer groups."""
        return self._predicate.uses_groups

    @property
    def audited(self) -> bool:
        return self.rule.audited

    def applies_to(self, api_key: int, api_version: int, direction: str) -> bool:
        """Whether the rule's APIs, versions and direction admit this frame."""
        if direction not in self.directions:
            return False
        if self.api_keys is not None and api_key not in self.api_keys:
            return False
        if api_key in self.excluded_api_keys:
            return False
        return self.admits_version(api_version)

    def admits_version(self, api_version: int) -> bool:
        if self.min_version is not None and api_version < self.min_version:
            return False
        return self.max_version is None or api_version <= self.max_version

    def matches(
        self, ctx: MatchContext, topic: str | None = None, group: str | None = None
    ) -> bool:
        """Whether the rule triggers for this frame, and this topic and group if given.

        A rule that matches on topics (groups) does not match without one; its `not`
        does. For `allow_apis` the rule triggers on APIs outside the list, for
        `deny_apis` on APIs inside it.
        """
        if ctx.api_key in self.excluded_api_keys:
            return False
        if self.kind == "deny_apis" and ctx.api_key not in (self.api_keys or ()):
            return False
        return self._predicate(ctx, topic, group)

    def __repr__(self) -> str:
        return f"CompiledRule(id={self.id!r}, order={self.order}, kind={self.kind!r})"


Entry = tuple[CompiledRule, ...]
# Below this many candidates, checking each rule is cheaper than the index.
_INDEX_FROM = 8


class CompiledRuleSet:
    """The enabled rules of a RuleSet, indexed for per-frame lookup. Immutable."""

    def __init__(self, ruleset: RuleSet, rules: Sequence[CompiledRule] | None = None,
                 version: str | None = None) -> None:
        self.ruleset = ruleset
        self.version: str = version or ruleset.version
        if rules is None:
            enabled = [rule for rule in ruleset.ordered() if rule.mode != "disabled"]
            rules = [CompiledRule(rule, position, ruleset.sources.get(rule.id))
                     for position, rule in enumerate(enabled)]
        self.rules: tuple[CompiledRule, ...] = tuple(rules)
        self._by_id = {rule.id: rule for rule in self.rules}
        self._plain: dict[tuple[int, str], Entry] = {}
        self._by_version: dict[tuple[int, str], dict[int, Entry]] = {}
        self._unfiltered: dict[tuple[int, str], Entry] = {}
        self._fallback: dict[str, Entry] = {}
        self._indexes: dict[tuple[int, int, str], RuleIndex[CompiledRule]] = {}
        # id of an entry of _plain or _by_version (kept as long as this set) -> its index
        self._entry_indexes: dict[int, RuleIndex[CompiledRule]] = {}
        self._build_index()

    def _build_index(self) -> None:
        keys = set(kafka_wire.known_api_keys())
        for rule in self.rules:
            keys |= rule.api_keys or frozenset()
            keys |= rule.excluded_api_keys
        for direction in DIRECTIONS:
            wildcard = tuple(
                r for r in self.rules if direction in r.directions and r.api_keys is None
            )
            # A key no rule names: only wildcard rules apply, and their exclusions
            # name keys in the index, so none of them excludes it.
            self._fallback[direction] = wildcard
            lists: dict[int, list[CompiledRule]] = {key: [] for key in keys}
            for rule in self.rules:
                if direction not in rule.directions:
                    continue
                for key in rule.api_keys if rule.api_keys is not None else keys:
                    if key not in rule.excluded_api_keys:
                        lists[key].append(rule)
            for key, members in lists.items():
                entry = tuple(members)
                slot = (key, direction)
                if not any(r.min_version is not None or r.max_version is not None for r in entry):
                    self._plain[slot] = entry
                    continue
                self._unfiltered[slot] = entry
                self._by_version[slot] = self._versions_of(key, entry)

    @staticmethod
    def _versions_of(key: int, entry: Entry) -> dict[int, Entry]:
        """Per version, the members that admit it, for the versions the key has (other
        versions are filtered at lookup). Equal tuples are shared."""
        supported = kafka_wire.supported_versions(key)
        bounds = [r.max_version for r in entry if r.max_version is not None]
        highest = supported[1] if supported is not None else min(max(bounds, default=0), 255)
        shared: dict[Entry, Entry] = {}
        per_version: dict[int, Entry] = {}
        for version in range(highest + 1):
            members = tuple(r for r in entry if r.admits_version(version))
            per_version[version] = shared.setdefault(members, members)
        return per_version

    def candidates(
        self, api_key: int, api_version: int, direction: str = "request"
    ) -> tuple[CompiledRule, ...]:
        """The rules that may apply to a frame, in evaluation order.

        Their APIs, versions and direction fit; call `matches` on each for the rest.
        """
        slot = (api_key, direction)
        entry = self._plain.get(slot)
        if entry is not None:
            return entry
        per_version = self._by_version.get(slot)
        if per_version is not None:
            hit = per_version.get(api_version)
            if hit is not None:
                return hit
            return tuple(r for r in self._unfiltered[slot] if r.admits_version(api_version))
        wildcard = self._fallback.get(direction, ())
        return tuple(r for r in wildcard if r.admits_version(api_version))

    def relevant(self, api_key: int, api_version: int, direction: str,
                 topics: Sequence[str], principal: str | None) -> tuple[CompiledRule, ...]:
        """`candidates` narrowed by the frame's topics and principal through an index
        (a large rule set costs dict lookups, not a scan); evaluation order kept."""
        rules = self.candidates(api_key, api_version, direction)
        if len(rules) < _INDEX_FROM:
            return rules
        slot = (api_key, api_version, direction)
        index = self._indexes.get(slot)
        if index is None:
            # Versions that share their candidates (every version, for rules without
            # version bounds) share the index built for them.
            index = self._entry_indexes.get(id(rules)) or RuleIndex(rules)
            self._indexes[slot] = index
        return index.relevant(topics, principal)

    def warm(self) -> None:
        """Build now the indexes `relevant` would build on first use: over 100,000 rules
        that takes seconds, which a frame must not wait for (call it where waiting is
        harmless, e.g. in the thread that prepares a new rule set)."""
        entries = [*self._plain.values(), *(e for per_version in self._by_version.values()
                                            for e in per_version.values())]
        for entry in entries:
            if len(entry) >= _INDEX_FROM and id(entry) not in self._entry_indexes:
                self._entry_indexes[id(entry)] = RuleIndex(entry)

    def interested(self, api_key: int, api_version: int, direction: str = "request") -> bool:
        """Whether any rule may apply: if not, the frame can pass without decoding."""
        return bool(self.candidates(api_key, api_version, direction))

    def matching(
        self, ctx: MatchContext, topic: str | None = None, group: str | None = None
    ) -> tuple[CompiledRule, ...]:
        """The rules that trigger for a frame (and topic and group), in evaluation order."""
        return tuple(
            rule
            for rule in self.candidates(ctx.api_key, ctx.api_version, ctx.direction)
            if rule.matches(ctx, topic, group)
        )

    def subset(self, kinds: Collection[str]) -> CompiledRuleSet:
        """The rules of these action kinds only, indexed on their own (same version).

        Each filter of the data path asks its own subset, so a record rule never makes
        the request filter decode a frame, and the other way round.
        """
        return CompiledRuleSet(self.ruleset, [r for r in self.rules if r.kind in kinds],
                               self.version)

    def get(self, rule_id: str) -> CompiledRule | None:
        """An enabled rule by id."""
        return self._by_id.get(rule_id)

    def __len__(self) -> int:
        return len(self.rules)

    def __repr__(self) -> str:
        return f"CompiledRuleSet(version={self.version!r}, rules={len(self.rules)})"


def compile_rules(ruleset: RuleSet) -> CompiledRuleSet:
    """Compile a RuleSet (see CompiledRuleSet)."""
    return CompiledRuleSet(ruleset)
