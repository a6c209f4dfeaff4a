"""Request-level enforcement of the rule set: observe, deny, API allow/deny lists.

`RuleEngine` holds the live compiled rule set for the whole process (a reload swaps
it; live connections see the new rules on their next request). `RulesFilter` is
per connection: it asks for a request only when some rule may apply to its API and
version (a dict lookup), decodes it, and decides per topic:

- every topic (or the request as a whole) denied: the gateway answers with the
  API's error and the broker never sees the request;
- some topics denied: they are removed from the request, the rest is forwarded,
  and their error entries are merged into the broker's answer;
- dry-run rules only record what they would have done: they never change a
  request (a dry-run `max_fetch_bytes` reports "would-limit", the Fetch goes on as
  the client wrote it) and never answer one.

A refusal tells the client which rule refused and why: "keg rule <id>: <reason>" in
every ErrorMessage field of the answer, and for a Produce refused for one record, that
record in RecordErrors (v8+). A Produce with acks=0 cannot be answered at all (Kafka
never answers one): its refusals are marked `answered=False`, so they are counted and
audited whatever the rule's audit setting.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import kafka_wire
from ext_proc.connection import ConnectionInfo
from ext_proc.filters import (
    REQUEST,
    SELECTED_APIS,
    Alternative,
    Direction,
    RequestJudge,
    RequestVerdict,
    ResponsePatch,
    TopicSelector,
    WhoScope,
    match_scope,
    match_who,
    union_scope,
    union_who,
)
from ext_proc.filters.rates import RateBuckets, RateLimiter
from ext_proc.filters.safeguards import (
    ProduceChecks,
    clamp_fetch,
    fetch_over_limit,
    produce_bytes,
    produce_checks,
    produce_violations,
)
from ext_proc.identity import IdentityTracker, principal_for_envelope
from ext_proc.sequences import Ledger, SequenceLedger
from filter_rules import CompiledRule, CompiledRuleSet, MatchContext, RuleSet
from filter_rules.errors import default_deny_error, error_code
from interceptors import BuildContext
from interceptors.engine import DEFAULT_LIMITS, RecordEngine, RecordLimits
from kafka_wire import ApiKey, ErrorCode
from kafka_wire.entity_names import named_entities
from kafka_wire.envelope import read_envelope_request
from kafka_wire.error_responses import (
    AUTHORIZED_OPERATIONS_OMITTED,
    PARTIAL_APIS,
    answers_groups_apart,
    error_response,
    expects_response,
    merge_error_entries,
    merge_group_entries,
    partial_error_entries,
    remove_topics,
    split_groups,
)
from kafka_wire.errors import KafkaWireError
from kafka_wire.records import BatchView, iter_batches
from kafka_wire.topic_ids import TopicIds, topic_name

log = logging.getLogger(__name__)

DENYING_KINDS = frozenset({"deny", "deny_apis", "allow_apis"})
ENFORCED_KINDS = DENYING_KINDS | {"observe", "safeguard", "rate"}

# APIs whose requests are split when only some topics are refused, as Kafka authorizes
# them topic by topic: every API kafka_wire can split but two. Fetch is refused in its
# answer instead (`_refuse_in_answer`): a fetch session must keep every partition the
# client put in it, or the broker would never send a partition again once its rule
# goes. AddPartitionsToTxn is all or nothing in Kafka too (the others of a refused
# request are not attempted). ShareFetch naming a refused topic is answered whole:
# forwarded, the broker would acquire records of the refused partitions that no member
# is given until their locks end.
_PARTIAL_DENIAL_APIS = PARTIAL_APIS - {ApiKey.FETCH, ApiKey.ADD_PARTITIONS_TO_TXN}
# Fetches in a session (KIP-227, KIP-932): their answers carry partitions they do not name.
_SESSION_FETCHES = frozenset({ApiKey.FETCH, ApiKey.SHARE_FETCH})
# Group descriptions (KIP-848, KIP-932) that list the topics their members subscribe to
# and are assigned.
_GROUP_DESCRIBES = frozenset({ApiKey.CONSUMER_GROUP_DESCRIBE, ApiKey.SHARE_GROUP_DESCRIBE})
# Kafka's own message for such a group when the caller may not describe one of its topics.
_GROUP_USES_DENIED_TOPICS = ("The group has described topic(s) that the client is not "
                             "authorized to describe.")
# Answers that list topics their requests do not name: an open transaction's partitions
# (the request names transactional ids), config resources (it names resource types), and
# every topic's log directories, reassignments and leader elections (the request names
# none: null topics).
_TOPIC_LISTING_APIS = frozenset({ApiKey.DESCRIBE_TRANSACTIONS, ApiKey.LIST_CONFIG_RESOURCES,
                                 ApiKey.DESCRIBE_LOG_DIRS, ApiKey.LIST_PARTITION_REASSIGNMENTS,
                                 ApiKey.ELECT_LEADERS})
_TOPIC_RESOURCE = 2  # Kafka's ConfigResource.Type.TOPIC
# The CreateTopics a Metadata request's auto-creation is judged as (rules bounding
# CreateTopics' versions admit what Kafka's clients send today).
_CREATE_TOPICS_VERSION: Final = (kafka_wire.supported_versions(ApiKey.CREATE_TOPICS) or (0, 7))[1]
# Metadata from this version says whether the broker may create the topics it names
# (AllowAutoTopicCreation); before, a broker with auto-creation creates whatever it lacks.
_METADATA_ASKS_TO_CREATE = 4
# What a Metadata answer says of a topic the broker lacks: not asked to create it
# (UNKNOWN_TOPIC_OR_PARTITION), or creating it (LEADER_NOT_AVAILABLE, also said of a
# topic that exists and is electing a leader: it only ever makes a dry run report).
_MISSING = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})
_MISSING_OR_CREATED = _MISSING | {ErrorCode.LEADER_NOT_AVAILABLE}
# A list of an answer: the dict holding it, its key, the topic an entry names (or None).
TopicListing = tuple[dict[str, Any], str, Callable[[dict[str, Any]], str | None]]
# Refused per topic even when every topic it names is: the rest of the request (other
# groups asking for all their topics) still has an answer to get.
_ALWAYS_PARTIAL_APIS = frozenset({ApiKey.OFFSET_FETCH, ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS})
# Groups' offsets, asked for all of a group's topics (null topics): the answer lists them.
# What a partition of a topic the gateway cannot name says instead of its offsets.
_UNJUDGED_OFFSETS: Final[dict[int, dict[str, Any]]] = {
    ApiKey.OFFSET_FETCH: {"CommittedOffset": -1, "Metadata": ""},
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: {"StartOffset": -1, "LeaderEpoch": -1},
}


def _always_partial(api_key: int, api_version: int) -> bool:
    """Whether a request is split even when every topic it names is refused:
    OffsetFetch (`_ALWAYS_PARTIAL_APIS`), and Metadata from v1, whose answer also lists
    the brokers (answered by the gateway it listed none, as Kafka never does; v0 reads
    an empty topic list as all topics, so it cannot go on without its topics)."""
    return api_key in _ALWAYS_PARTIAL_APIS or (api_key == ApiKey.METADATA and api_version >= 1)


@dataclass(frozen=True)
class RuleDecision:
    """One rule's effect on one request (and topic): what audit and metrics record."""

    rule: CompiledRule
    outcome: str  # observed | denied | would-deny | limited | would-limit | ...
    header: kafka_wire.RequestHeader
    conn: ConnectionInfo
    principal: str
    security_protocol: str
    topic: str | None = None
    error_code: int | None = None
    reason: str | None = None
    partition: int | None = None
    records: int = 1  # record rules report per batch: how many records had this outcome
    # False: a refusal no answer can carry (Produce acks=0); the client never learns.
    answered: bool = True
    # (bytes, records) of what the decision concerns: a Produce topic's record batches,
    # or the records a record rule acted on; None: the whole request, which carries none.
    volume: tuple[int, int] | None = None
    rule_version: str | None = None  # the content hash of the rule set that decided


DecisionSink = Callable[[RuleDecision], None]


@dataclass(frozen=True, slots=True)
class RequestEntities:
    """What a request names, for matching: topics (ids mapped to names), groups, and
    the topic ids the gateway cannot name yet."""

    topics: list[str]
    groups: list[str]
    unknown_topic_ids: list[uuid.UUID]


@dataclass(frozen=True)
class Refusal:
    """What the client is told of a rule's refusal: the error code, a message naming the
    rule and its reason and, for a Produce refused for a record, that record
    (topic, partition, index in its batch, message) for RecordErrors."""

    code: int
    message: str
    records: tuple[tuple[str, int, int, str], ...] = ()


def _refusal_message(rule: CompiledRule, reason: str) -> str:
    """The text a client sees for a rule's refusal (Kafka's ErrorMessage fields)."""
    return f"keg rule {rule.id}: {reason}"[:1000]


def request_entities(api_key: int, api_version: int, body: dict[str, Any],
                     topic_ids: TopicIds) -> RequestEntities:
    """Every topic and group a request names, wherever Kafka's schemas put them."""
    named = named_entities(api_key, api_version, "request", body)
    by_id, unknown = topic_ids.resolve(named.topic_ids)
    return RequestEntities(list(dict.fromkeys(named.topics + by_id)),
                           list(dict.fromkeys(named.groups)), unknown)


class RuleEngine:
    """The process's live rules and where decisions go.

    Each filter reads its own view of the rule set: `requests` (request-level rules),
    `records` (record rules, built), `compiled` (all of them: virtual topics). A new
    rule set is installed only when all of it can be built (`install` raises
    RuleSetInvalid otherwise and the running set stays).
    """

    def __init__(self, compiled: CompiledRuleSet, sink: DecisionSink | None = None,
                 context: BuildContext | None = None,
                 limits: RecordLimits = DEFAULT_LIMITS,
                 on_over_budget: Callable[[str], None] | None = None,
                 rates: RateBuckets | None = None, sequences: Ledger | None = None,
                 topic_ids: TopicIds | None = None) -> None:
        self.sink = sink or (lambda decision: None)
        self.limits = limits  # what record rules may do for one frame
        self.over_budget = on_over_budget or (lambda topic: None)
        # The pool's (SharedRates, SharedSequenceLedger, shared TopicIds) when the
        # service is one of several workers: a rate, a producer's sequences and what the
        # pool learned of topic ids are not one process's.
        self.rates = rates or RateLimiter()
        self.sequences = sequences or SequenceLedger()
        # Learned from the answers every connection sees (and, in a pool, the answers
        # the other workers saw: ext_proc.shared_topic_ids).
        self.topic_ids = topic_ids if topic_ids is not None else TopicIds()
        self.context = context or BuildContext()
        self.records = RecordEngine(CompiledRuleSet(RuleSet()), self.context, builders={})
        self.compiled = compiled
        self.requests = compiled.subset(ENFORCED_KINDS)
        self.install(compiled)

    def prepare(self, compiled: CompiledRuleSet) -> tuple[RecordEngine, CompiledRuleSet]:
        """What `install` builds, in any thread (seconds for 100,000 rules): the record
        engine (raises RuleSetInvalid) and the request rules, their indexes built."""
        requests = compiled.subset(ENFORCED_KINDS)
        requests.warm()
        return RecordEngine(compiled, self.context), requests

    def install(self, compiled: CompiledRuleSet,
                prepared: tuple[RecordEngine, CompiledRuleSet] | None = None) -> None:
        records, requests = prepared or self.prepare(compiled)
        previous = self.records
        # Reference swaps: live connections pick the new views up on their next frame.
        self.requests = requests
        self.records = records
        self.compiled = compiled
        if previous is not records:
            previous.close()


class RuleSetJudge(RequestJudge):
    """A filter that judges requests by the live rule set (so its interest follows it):
    the request rules, record rules and virtual topics. It sees the rules through the
    engine and the client as the rules match it (`MatchContext`)."""

    dynamic = True

    def __init__(self, engine: RuleEngine, identity: IdentityTracker) -> None:
        self._engine = engine
        self._identity = identity

    def _principal(self) -> str | None:
        """Who rules match the connection as: no one for a login the gateway could not
        read (an opaque token)."""
        return self._identity.principal if self._identity.principal_known else None

    @staticmethod
    def _match_context(header: kafka_wire.RequestHeader, conn: ConnectionInfo,
                       principal: str | None, client_host: str | None) -> MatchContext:
        return MatchContext(
            api_key=header.api_key, api_version=header.api_version, principal=principal,
            client_id=header.client_id, client_host=client_host,
            listener=conn.gateway_address or None, broker_id=conn.broker_id,
        )


class RulesFilter(RuleSetJudge):
    def __init__(self, engine: RuleEngine, identity: IdentityTracker) -> None:
        super().__init__(engine, identity)
        self._audit_principal = identity.principal
        self._acks_zero = False  # the request being judged is a Produce with acks=0
        # Of the request being judged: the topics it names, and a Produce's (bytes,
        # records) per topic, so a decision on the whole request is one per topic.
        self._topics: list[str] = []
        self._volumes: dict[str, tuple[int, int]] = {}

    def wants_request(self, api_key: int, api_version: int) -> bool:
        compiled = self._engine.requests
        if api_key == ApiKey.ENVELOPE:  # any rule may apply to the request inside
            return bool(compiled.rules)
        return compiled.interested(api_key, api_version, "request") or bool(
            self._creation_judges(api_key))

    def _creation_judges(self, api_key: int) -> tuple[CompiledRule, ...]:
        """Of a Metadata request, the rules that may refuse creating topics: a broker
        with auto-creation (Kafka's default) creates the topics a Metadata request names
        that it lacks, and producers create topics that way, not with CreateTopics."""
        if api_key != ApiKey.METADATA:
            return ()
        return tuple(r for r in self._engine.requests.candidates(
            ApiKey.CREATE_TOPICS, _CREATE_TOPICS_VERSION, "request") if r.kind in DENYING_KINDS)

    def misses_harmlessly(self, api_key: int, api_version: int) -> bool:
        """Dry-run rules alone may judge the request (or its answer): they never change
        or answer one, so it may pass unjudged when the service cannot take it (a
        would-deny is then not reported). An Envelope carries any request."""
        return all(rule.dry_run for rule in self._judging(api_key, api_version))

    def enforced_scope(self, api_key: int, api_version: int) -> TopicSelector | None:
        """The topics of the rules that may judge the request and are no dry runs."""
        return rules_scope(r for r in self._judging(api_key, api_version) if not r.dry_run)

    def _judging(self, api_key: int, api_version: int) -> tuple[CompiledRule, ...]:
        compiled = self._engine.requests
        if api_key == ApiKey.ENVELOPE:
            return compiled.rules
        return (*compiled.candidates(api_key, api_version, "request"),
                *compiled.candidates(api_key, api_version, "response"),
                *self._creation_judges(api_key))

    def topic_scope(self, api_key: int, api_version: int,
                    direction: Direction) -> TopicSelector | None:
        """Produce, Fetch and ShareFetch: the topics of every rule that may judge them
        (a rule without a topic matcher, or whose topics only a `not` names, opens it
        to all). Other APIs: any (a Metadata for all topics names none, yet rules hide
        some)."""
        if direction != REQUEST or api_key not in SELECTED_APIS:
            return None
        return rules_scope(self._engine.requests.candidates(api_key, api_version, "request"))

    def who_scope(self, api_key: int, api_version: int,
                  direction: Direction) -> WhoScope | None:
        """Who the rules that may judge the request (or its answer) may apply to. An
        Envelope carries another client's request, judged as that client's: anyone."""
        if direction != REQUEST or api_key == ApiKey.ENVELOPE:
            return None
        return rules_who(self._judging(api_key, api_version))

    def alternatives(self, api_key: int, api_version: int,
                     direction: Direction) -> list[Alternative] | None:
        """One per rule that may judge the request (or its answer): its topics (Produce,
        Fetch, ShareFetch requests) and who it names; None where `topic_scope` and
        `who_scope` say it all (an answer, an Envelope)."""
        if direction != REQUEST or api_key == ApiKey.ENVELOPE:
            return None
        compiled = self._engine.requests
        selects = api_key in SELECTED_APIS
        return [*((match_scope(r.rule.match.topics) if selects else None, rule_who(r))
                  for r in compiled.candidates(api_key, api_version, "request")),
                *((None, rule_who(r))
                  for r in (*compiled.candidates(api_key, api_version, "response"),
                            *self._creation_judges(api_key)))]

    def safeguard_checks(self, api_key: int, api_version: int,
                         direction: Direction) -> ProduceChecks | None:
        """A Produce only safeguards may act on: what it must keep for none of them to
        act (`safeguards.produce_checks`); None when another rule may, or a check the
        module cannot read."""
        if direction != REQUEST or api_key != ApiKey.PRODUCE:
            return None
        compiled = self._engine.requests
        rules = compiled.candidates(api_key, api_version, "request")
        if not rules or compiled.candidates(api_key, api_version, "response") or any(
                r.kind != "safeguard" for r in rules):
            return None
        return produce_checks(r.action.safeguard for r in rules)

    def judge(
        self, header: kafka_wire.RequestHeader, body: dict[str, Any], conn: ConnectionInfo
    ) -> RequestVerdict | None:
        if header.api_key == ApiKey.ENVELOPE:
            return self._envelope(header, body, conn)
        return self._evaluate(header, body, conn, self._principal(), conn.client_host)

    def _envelope(self, header: kafka_wire.RequestHeader, body: dict[str, Any],
                  conn: ConnectionInfo) -> RequestVerdict | None:
        """KIP-590: judge the envelope as the connection's (a rule may refuse whoever
        sent it), then the forwarded request as its original client's, and wrap the
        outcome back into the envelope. The inner principal is only what the sender
        wrote: judged as it alone, a client denied by its own principal could name
        another in an envelope of its own making."""
        outer = self._evaluate(header, body, conn, self._principal(), conn.client_host)
        if outer is not None and outer.answer is not None:
            return outer
        try:
            inner = read_envelope_request(body)
        except KafkaWireError as err:
            log.warning("envelope refused, its request is unreadable: %s (%s)", err,
                        conn.describe())
            return RequestVerdict(answer={"ErrorCode": ErrorCode.INVALID_REQUEST})
        ih = inner.header
        verdict = self._evaluate(ih, inner.body, conn, principal_for_envelope(inner.principal),
                                 str(inner.client_address))
        if verdict is None:
            return None
        if verdict.answer is not None:
            data = kafka_wire.write_response_header(ih.correlation_id, ih.api_key,
                                                    ih.api_version) + kafka_wire.encode_body(
                ih.api_key, ih.api_version, "response", verdict.answer)
            return RequestVerdict(answer={"ErrorCode": 0, "ResponseData": data},
                                  delay_s=verdict.delay_s)
        if verdict.changed:
            body["RequestData"] = kafka_wire.write_request_header(ih) + kafka_wire.encode_body(
                ih.api_key, ih.api_version, "request", inner.body)
        inner_patch = verdict.patch

        def patch(response: dict[str, Any]) -> bool:
            data = response.get("ResponseData")
            if inner_patch is None or data is None:
                return False
            cid, tags, offset = kafka_wire.read_response_header(data, ih.api_key, ih.api_version)
            answer, _ = kafka_wire.decode_body(ih.api_key, ih.api_version, "response", data,
                                               offset)
            if not inner_patch(answer):
                return False
            response["ResponseData"] = kafka_wire.write_response_header(
                cid, ih.api_key, ih.api_version, tags) + kafka_wire.encode_body(
                ih.api_key, ih.api_version, "response", answer)
            return True

        return RequestVerdict(changed=verdict.changed,
                              patch=patch if inner_patch is not None else None,
                              delay_s=verdict.delay_s)

    def _evaluate(self, header: kafka_wire.RequestHeader, body: dict[str, Any],
                  conn: ConnectionInfo, principal: str | None,
                  client_host: str) -> RequestVerdict | None:
        compiled = self._engine.requests
        api_key, version = header.api_key, header.api_version
        if not (compiled.interested(api_key, version, "request")
                or self._creation_judges(api_key)):
            return None
        self._audit_principal = principal or self._identity.principal
        self._acks_zero = not expects_response(api_key, version, body)
        ctx = self._match_context(header, conn, principal, client_host)
        unassigned = (self._leave_out_denied_partitions(ctx, body)
                      if api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT else None)
        named = request_entities(api_key, version, body, self._engine.topic_ids)
        # Metadata for all topics (null; v0: an empty list), DescribeTopicPartitions
        # naming none: the answer lists every topic, and is judged (its cursor says where
        # a page starts, nothing more).
        lists_all = (_asks_all_topics(version, body) if api_key == ApiKey.METADATA
                     else api_key == ApiKey.DESCRIBE_TOPIC_PARTITIONS and not body.get("Topics"))
        topics = [] if lists_all else named.topics
        self._topics = topics
        self._volumes = (produce_volumes(body, self._engine.topic_ids) if api_key == ApiKey.PRODUCE
                         else {})
        groups: list[str | None] = [*named.groups] or [None]
        # Metadata is how a client learns the names of ids (a KIP-848 consumer learns its
        # assignment as ids): refusing it would leave nothing to refresh with. It changes
        # nothing, so it goes on and its answer, which names them, is judged.
        by_id = api_key == ApiKey.METADATA and bool(named.unknown_topic_ids)
        if named.unknown_topic_ids and not by_id and any(
                r.uses_topics and not r.dry_run for r in compiled.candidates(api_key, version)):
            # A topic rule may concern a topic the gateway cannot name: refuse with the
            # retriable error that makes the client refresh its metadata (through here).
            log.info("%s names topic ids the gateway has not seen (%s): UNKNOWN_TOPIC_ID",
                     kafka_wire.api_name(api_key), named.unknown_topic_ids[0])
            return self._answer(header, body, Refusal(
                ErrorCode.UNKNOWN_TOPIC_ID, "keg: a topic id this gateway has not seen named yet; "
                "refresh metadata"), per_topic=True)
        rules = compiled.relevant(api_key, version, "request", topics, ctx.principal)
        denied: dict[str, Refusal] = {}
        denied_groups: dict[str, Refusal] = {}
        changed = False
        throttle_s = 0.0
        for rule in rules:
            if rule.kind not in ENFORCED_KINDS:
                continue
            if rule.uses_topics and topics:
                hits: list[str | None] = [
                    t for t in topics
                    if t not in denied and any(rule.matches(ctx, t, g) for g in groups)]
            else:
                hits = [None] if any(rule.matches(ctx, None, g) for g in groups) else []
            if not hits:
                continue
            if rule.kind == "observe":
                self._record(rule, "observed", header, conn, hits)
                continue
            if rule.kind == "rate":
                throttle_s = max(throttle_s, self._rate(rule, header, conn, body, hits))
                continue
            if rule.kind == "safeguard":
                if api_key == ApiKey.FETCH:
                    changed |= self._limit_fetch(rule, header, conn, body, hits)
                    continue
                refused = self._safeguard(rule, header, conn, body, hits)
                if None in refused:
                    return self._answer(header, body, refused[None], throttle_s)
                denied.update((t, r) for t, r in refused.items() if t is not None)
                continue
            code = self._deny_error(rule, api_key, hits, named.groups)
            reason = self._deny_reason(rule, api_key)
            if rule.dry_run:
                self._record(rule, "would-deny", header, conn, hits, code, reason)
                continue
            refusal = Refusal(code, _refusal_message(rule, reason))
            self._record(rule, "denied", header, conn, hits, code, reason)
            if None in hits and (own := self._groups_apart(
                    rule, ctx, header, body, named.groups, denied_groups)) is not None:
                # Some of the groups the request names: refused each, as Kafka does.
                denied_groups.update(dict.fromkeys(own, refusal))
                continue
            if None in hits:  # the request as a whole
                return self._answer(header, body, refusal, throttle_s)
            denied.update(dict.fromkeys((t for t in hits if t is not None), refusal))
        creation: ResponsePatch | None = None
        if api_key == ApiKey.METADATA and topics:
            asked = body.get("AllowAutoTopicCreation")
            creation = self._judge_creation(ctx, header, conn, body,
                                            [t for t in topics if t not in denied], denied)
            changed |= body.get("AllowAutoTopicCreation") != asked
        apart: ResponsePatch | None = None
        if denied_groups:
            answer, apart = self._refuse_groups(header, body, denied_groups, throttle_s,
                                                len(denied_groups) == len(named.groups))
            if answer is not None:
                return answer
        verdict: RequestVerdict | None
        if not denied:
            verdict = (self._hide_topics(ctx, named.unknown_topic_ids)
                       if lists_all or by_id
                       else self._deny_in_session(ctx, header, conn, body)
                       if api_key in _SESSION_FETCHES
                       else self._refuse_groups_of_denied_topics(ctx, header, conn)
                       if api_key in _GROUP_DESCRIBES
                       else self._hide_listed_topics(ctx)
                       if api_key in _TOPIC_LISTING_APIS
                       else self._hide_listed_groups(ctx)
                       if api_key == ApiKey.LIST_GROUPS else None)
        elif api_key == ApiKey.FETCH and (not set(denied) >= set(topics)
                                          or _incremental_fetch(body)):
            # Recorded above, each denied topic once. An incremental fetch goes on even
            # when it only adds denied partitions: answered here, its session epoch would
            # never reach the broker, which then refuses the client's next fetch
            # (INVALID_FETCH_SESSION_EPOCH) and every partition of the session waits.
            verdict = self._refuse_in_answer(ctx, header, conn, recorded=set(denied))
        elif api_key == ApiKey.ADD_PARTITIONS_TO_TXN and not set(denied) >= set(topics):
            return self._refuse_all_or_nothing(header, body, denied, throttle_s)
        elif api_key not in _PARTIAL_DENIAL_APIS or (
                set(denied) >= set(topics) and not _always_partial(api_key, version)):
            return self._answer(header, body, next(iter(denied.values())), throttle_s,
                                per_topic=True)
        else:
            verdict = self._partial(header, body, denied)
            if by_id:
                hide = self._hide_topics(ctx, named.unknown_topic_ids)
                verdict.patch = _both(verdict.patch, hide)
        if (api_key in _UNJUDGED_OFFSETS
                and (hide_offsets := self._hide_offsets(ctx, api_key, body))):
            verdict = verdict or RequestVerdict()
            verdict.patch = _both(verdict.patch, hide_offsets)
        if apart is not None:
            verdict = verdict or RequestVerdict()
            verdict.changed = True
            verdict.patch = _both(apart, verdict)
        if creation is not None:
            verdict = verdict or RequestVerdict()
            verdict.patch = _both(creation, verdict)
        if unassigned is not None:
            verdict = verdict or RequestVerdict()
            changed |= unassigned.changed
            verdict.patch = _both(unassigned.patch, verdict)
        if changed or throttle_s:
            verdict = verdict or RequestVerdict()
            verdict.changed |= changed
            if throttle_s:
                _throttle(verdict, throttle_s)
        return verdict

    def _judge_creation(self, ctx: MatchContext, header: kafka_wire.RequestHeader,
                        conn: ConnectionInfo, body: dict[str, Any], topics: list[str],
                        denied: dict[str, Refusal]) -> ResponsePatch | None:
        """A Metadata request naming topics a rule refuses to create, judged as Kafka's
        authorizer judges its auto-creation (CREATE on each topic it would create).

        From v4 the broker is told not to create any (AllowAutoTopicCreation false: the
        flag is the whole request's, so a topic no rule refuses that it names is not
        created this time either; clients ask again, producers for new topics alone);
        its answer says which were missing (UNKNOWN_TOPIC_OR_PARTITION): those a rule
        refuses become TOPIC_AUTHORIZATION_FAILED, as Kafka answers them, and are
        recorded then (a topic that exists is not refused: the rule is about creating
        it). Before v4 the broker creates whatever it lacks: a refused topic is refused
        in `denied` whether it exists or not. Returns the answer's patch (v4+: it
        refuses, or only records for dry runs), else None."""
        create_ctx = ctx.for_frame(ApiKey.CREATE_TOPICS, _CREATE_TOPICS_VERSION)
        # As the request's own rules, through the index: a large rule set costs lookups.
        judges = [r for r in self._engine.requests.relevant(
            ApiKey.CREATE_TOPICS, _CREATE_TOPICS_VERSION, "request", topics, ctx.principal)
            if r.kind in DENYING_KINDS]
        hits = {t: [r for r in judges if r.matches(create_ctx, t)] for t in topics}
        enforced = {t: next(r for r in rules if not r.dry_run)
                    for t, rules in hits.items() if any(not r.dry_run for r in rules)}
        tried = {t: next(r for r in rules if r.dry_run)
                 for t, rules in hits.items() if rules and t not in enforced}
        reason = "creating the topic is denied (a Metadata request's auto-creation)"
        if ctx.api_version < _METADATA_ASKS_TO_CREATE:
            for topic, rule in tried.items():
                self._record(rule, "would-deny", header, conn, [topic],
                             ErrorCode.TOPIC_AUTHORIZATION_FAILED, reason)
            for topic, rule in enforced.items():
                self._record(rule, "denied", header, conn, [topic],
                             ErrorCode.TOPIC_AUTHORIZATION_FAILED, reason)
                denied[topic] = Refusal(ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                        _refusal_message(rule, reason))
            return None
        if not body.get("AllowAutoTopicCreation", True) or not (enforced or tried):
            return None
        if enforced:
            body["AllowAutoTopicCreation"] = False
        outcomes = {**{t: (r, "would-deny") for t, r in tried.items()},
                    **{t: (r, "denied") for t, r in enforced.items()}}

        def refuse_missing(response: dict[str, Any]) -> bool:
            changed = False
            for topic in response.get("Topics") or ():
                name = topic.get("Name")
                if name not in outcomes:
                    continue
                rule, outcome = outcomes[name]
                if topic.get("ErrorCode") not in (_MISSING if outcome == "denied"
                                                  else _MISSING_OR_CREATED):
                    continue
                self._record(rule, outcome, header, conn, [name],
                             ErrorCode.TOPIC_AUTHORIZATION_FAILED, reason)
                if outcome == "denied":
                    topic["ErrorCode"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                    changed = True
            return changed

        return refuse_missing if enforced else _unchanged(refuse_missing)

    def _leave_out_denied_partitions(self, ctx: MatchContext,
                                     body: dict[str, Any]) -> RequestVerdict | None:
        """A KIP-848 member's partitions of topics a rule denies, left out of what it says
        it owns and of the assignment it is given.

        The broker resolves a subscription's pattern knowing no keg rule, and assigns the
        denied topics it matches (Kafka's own authorizer leaves out the topics a member
        may not describe). librdkafka then reported owning them, and each heartbeat was
        refused whole: the broker expelled the member after its session timeout while
        the client went on with its assignment, and another member read its records
        again. Topics the member subscribes to by name are judged as ever. A topic id the
        gateway cannot name is left as it is (the member learns its name through
        Metadata, which hides a denied topic and teaches the gateway its name). None when
        no rule denies a topic of the heartbeat."""
        rules = self._topic_denials(ctx)
        if not rules:
            return None
        ids = self._engine.topic_ids
        group = body.get("GroupId")

        def denied(entry: dict[str, Any]) -> bool:
            name = ids.name(entry.get("TopicId"))
            return name is not None and bool(_denying(rules, ctx, name, group))

        owned = body.get("TopicPartitions")
        kept = [t for t in owned or () if not denied(t)]
        changed = owned is not None and len(kept) != len(owned)
        if changed:
            body["TopicPartitions"] = kept

        def unassign(response: dict[str, Any]) -> bool:
            assignment = response.get("Assignment")
            given = (assignment or {}).get("TopicPartitions") or []
            left = [t for t in given if not denied(t)]
            if assignment is None or len(left) == len(given):
                return False
            assignment["TopicPartitions"] = left
            return True

        return RequestVerdict(changed=changed, patch=unassign)

    def _limit_fetch(self, rule: CompiledRule, header: kafka_wire.RequestHeader,
                     conn: ConnectionInfo, body: dict[str, Any], hits: list[str | None]) -> bool:
        """A `max_fetch_bytes` safeguard: caps the Fetch's byte limits (True: changed); in
        dry-run it only reports the cap it would apply and leaves the request alone."""
        spec = rule.action.safeguard
        asked = fetch_over_limit(spec, body)
        if asked is None:
            return False
        reason = f"fetch of up to {asked} bytes capped at {spec.max_fetch_bytes}"
        if rule.dry_run:
            self._record(rule, "would-limit", header, conn, hits, reason=reason)
            return False
        clamp_fetch(spec, body)
        self._record(rule, "limited", header, conn, hits, reason=reason)
        return True

    def _safeguard(self, rule: CompiledRule, header: kafka_wire.RequestHeader,
                   conn: ConnectionInfo, body: dict[str, Any],
                   hits: list[str | None]) -> dict[str | None, Refusal]:
        """The topics (None: the request) a Produce safeguard refuses, and why."""
        if header.api_key != ApiKey.PRODUCE:
            return {}
        spec = rule.action.safeguard
        refused: dict[str | None, Refusal] = {}
        for topic in hits:
            found = produce_violations(spec, body, topic, self._engine.topic_ids)
            if not found:
                continue
            first = found[0]
            outcome = "would-deny" if rule.dry_run else "denied"
            self._record(rule, outcome, header, conn, [topic], first.error_code, first.reason)
            records = tuple((*v.record, _refusal_message(rule, v.reason)) for v in found
                            if v.record is not None and v.check == first.check)
            refused[topic] = Refusal(first.error_code, _refusal_message(rule, first.reason),
                                     records)
        return {} if rule.dry_run else refused

    def _rate(self, rule: CompiledRule, header: kafka_wire.RequestHeader, conn: ConnectionInfo,
              body: dict[str, Any], hits: list[str | None]) -> float:
        spec = rule.action.rate
        nbytes = produce_bytes(body) if header.api_key == ApiKey.PRODUCE else 0
        keys: list[str | None]
        if spec.per == "topic":
            keys = hits
        elif spec.per == "client_id":
            keys = [header.client_id or ""]
        else:
            keys = [self._identity.principal]
        wait = max(self._engine.rates.take(rule.id, spec, key or "", nbytes) for key in keys)
        if wait > 0:
            self._record(rule, "would-throttle" if rule.dry_run else "throttled", header, conn,
                         hits, reason=f"over the rate by {wait * 1000:.0f} ms")
        return 0.0 if rule.dry_run else wait

    def _topic_denials(self, ctx: MatchContext) -> list[CompiledRule]:
        """The enforced rules that deny topics of this API: those an answer listing
        topics the request did not name is judged by."""
        return [r for r in self._engine.requests.candidates(ctx.api_key, ctx.api_version)
                if r.kind in DENYING_KINDS and r.uses_topics and not r.dry_run]

    def _hide_topics(self, ctx: MatchContext,
                     by_id: Iterable[uuid.UUID] = ()) -> RequestVerdict | None:
        """Metadata for all topics, or naming ids the gateway cannot name yet: judge
        the answer, which names them. A topic a rule denies is left out of an answer for
        all topics, as Kafka's own authorizer does, instead of telling the client it
        exists; one asked for by id is answered TOPIC_AUTHORIZATION_FAILED, without its
        name or partitions."""
        rules = self._topic_denials(ctx)
        if not rules:
            return None
        asked = set(by_id)

        ids = self._engine.topic_ids

        def hide(response: dict[str, Any]) -> bool:
            topics = response.get("Topics") or []
            kept = []
            for topic in topics:
                if not any(r.matches(ctx, topic.get("Name")) for r in rules):
                    kept.append(topic)
                elif topic.get("TopicId") in asked:
                    # Known here, the id's partitions are left out of a KIP-848 member's
                    # heartbeats (`_leave_out_denied_partitions`); the learner, which
                    # reads the answer after this, sees it without its name.
                    ids.add(topic["TopicId"], topic["Name"])
                    kept.append({**topic, "Name": None, "Partitions": [], "IsInternal": False,
                                 "ErrorCode": ErrorCode.TOPIC_AUTHORIZATION_FAILED})
            changed = kept != topics
            response["Topics"] = kept
            return changed

        return RequestVerdict(patch=hide)

    def _deny_in_session(self, ctx: MatchContext, header: kafka_wire.RequestHeader,
                         conn: ConnectionInfo, body: dict[str, Any]) -> RequestVerdict | None:
        """An incremental Fetch (KIP-227) or ShareFetch (a share session) names only the
        partitions that changed; its answer also carries the session's others. A deny
        that arrived after the session began must refuse those too, as Kafka authorizes
        every partition of a session on every fetch: each partition of the answer whose
        topic a rule denies is answered with the rule's error and no records (one of an
        id the gateway cannot name, UNKNOWN_TOPIC_ID: records a rule could not see are
        never handed out)."""
        epoch = body.get("ShareSessionEpoch" if ctx.api_key == ApiKey.SHARE_FETCH
                         else "SessionEpoch", -1)
        if int(epoch) <= 0:
            return None  # a full fetch names every partition: judged above
        return self._refuse_in_answer(ctx, header, conn)

    def _refuse_in_answer(self, ctx: MatchContext, header: kafka_wire.RequestHeader,
                          conn: ConnectionInfo,
                          recorded: frozenset[str] | set[str] = frozenset()
                          ) -> RequestVerdict | None:
        """The request goes on; in its answer, each partition of a topic a rule denies
        is refused (`withhold_partitions`), the others answered. `recorded`: denied
        topics whose decision the request's judgement already recorded."""
        rules = self._topic_denials(ctx)
        if not rules:
            return None
        ids = self._engine.topic_ids

        def refuse(response: dict[str, Any]) -> bool:
            changed = False
            for topic in response.get("Responses") or ():
                name = topic_name(topic, ids)
                hits = _denying(rules, ctx, name)
                if not hits:
                    continue
                code = (ErrorCode.UNKNOWN_TOPIC_ID if name is None
                        else self._deny_error(hits[0], ctx.api_key, [name], []))
                refused = withhold_partitions(topic.get("Partitions") or (), code)
                if name is not None and refused and name not in recorded:
                    self._record(hits[0], "denied", header, conn, [name], code,
                                 self._deny_reason(hits[0], ctx.api_key))
                changed |= refused
            return changed

        return RequestVerdict(patch=refuse)

    def _refuse_groups_of_denied_topics(self, ctx: MatchContext,
                                        header: kafka_wire.RequestHeader,
                                        conn: ConnectionInfo) -> RequestVerdict | None:
        """ConsumerGroupDescribe and ShareGroupDescribe answers name the topics each
        member subscribes to and is assigned. A group that uses a topic a rule denies is
        answered as Kafka answers a caller that may not describe one of its topics:
        TOPIC_AUTHORIZATION_FAILED, without its members (a topic of an id the gateway
        cannot name counts as denied: what a rule could not see is not handed out)."""
        rules = self._topic_denials(ctx)
        if not rules:
            return None
        ids = self._engine.topic_ids

        def refuse(response: dict[str, Any]) -> bool:
            changed = False
            for i, group in enumerate(response.get("Groups") or ()):
                group_id = group.get("GroupId")
                denied = next(((name, hits) for name in _group_topics(group, ids)
                               if (hits := _denying(rules, ctx, name, group_id))), None)
                if denied is None:
                    continue
                name, hits = denied
                response["Groups"][i] = {
                    "ErrorCode": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    "ErrorMessage": _GROUP_USES_DENIED_TOPICS, "GroupId": group_id,
                    "Members": [], "AuthorizedOperations": AUTHORIZED_OPERATIONS_OMITTED}
                if name is not None:
                    self._record(hits[0], "denied", header, conn, [name],
                                 ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                 f"group {group_id} uses a denied topic")
                changed = True
            return changed

        return RequestVerdict(patch=refuse)

    def _hide_listed_topics(self, ctx: MatchContext) -> RequestVerdict | None:
        """An answer that lists topics its request did not name (`_topic_listings`):
        the entries of a topic a rule denies are left out, as Kafka leaves out the topics
        a caller may not describe (and as Metadata for all topics does here)."""
        rules = self._topic_denials(ctx)
        if not rules:
            return None

        def hide(response: dict[str, Any]) -> bool:
            changed = False
            for owner, key, topic_of in _topic_listings(ctx.api_key, response):
                entries = owner.get(key) or []
                kept = [e for e in entries if (name := topic_of(e)) is None
                        or not any(r.matches(ctx, name) for r in rules)]
                changed |= kept != entries
                owner[key] = kept
            return changed

        return RequestVerdict(patch=hide)

    def _hide_listed_groups(self, ctx: MatchContext) -> RequestVerdict | None:
        """ListGroups: the groups a rule denies are left out, as Kafka leaves out the
        groups a caller may not describe (an admin tool that lists, then describes every
        group, failed on the first denied one)."""
        rules = [r for r in self._engine.requests.candidates(ctx.api_key, ctx.api_version)
                 if r.kind in DENYING_KINDS and r.uses_groups and not r.dry_run]
        if not rules:
            return None

        def hide(response: dict[str, Any]) -> bool:
            groups = response.get("Groups") or []
            kept = [g for g in groups
                    if not any(r.matches(ctx, None, g.get("GroupId")) for r in rules)]
            response["Groups"] = kept
            return kept != groups

        return RequestVerdict(patch=hide)

    def _hide_offsets(self, ctx: MatchContext, api_key: int,
                      body: dict[str, Any]) -> RequestVerdict | None:
        """An OffsetFetch or DescribeShareGroupOffsets for all of a group's topics (null
        topics): leave the topics a rule denies out of the answer, as Kafka does with
        topics the caller may not describe. A topic of an id the gateway cannot name
        (OffsetFetch v10) keeps its place with UNKNOWN_TOPIC_ID: offsets a rule could not
        judge are not handed out."""
        groups = body.get("Groups")
        if not (body.get("Topics", []) is None
                or any(g.get("Topics") is None for g in groups or ())):
            return None
        rules = self._topic_denials(ctx)
        if not rules:
            return None
        ids = self._engine.topic_ids
        every = {g.get("GroupId") for g in groups or () if g.get("Topics") is None}

        def judged(topics: list[dict[str, Any]]) -> list[dict[str, Any]]:
            kept = []
            for topic in topics:
                name = topic.get("TopicName") or topic_name(topic, ids)
                if name is None:
                    kept.append({**topic, "Partitions": [
                        {**p, **_UNJUDGED_OFFSETS[api_key],
                         "ErrorCode": ErrorCode.UNKNOWN_TOPIC_ID}
                        for p in topic.get("Partitions") or ()]})
                elif not any(r.matches(ctx, name) for r in rules):
                    kept.append(topic)
            return kept

        def hide(response: dict[str, Any]) -> bool:
            changed = False
            owners = ([response] if groups is None else
                      [g for g in response.get("Groups") or () if g.get("GroupId") in every])
            for owner in owners:
                topics = owner.get("Topics") or []
                kept = judged(topics)
                changed |= kept != topics
                owner["Topics"] = kept
            return changed

        return RequestVerdict(patch=hide)

    def _answer(self, header: kafka_wire.RequestHeader, body: dict[str, Any],
                refusal: Refusal, throttle_s: float = 0.0,
                per_topic: bool = False) -> RequestVerdict:
        expects = expects_response(header.api_key, header.api_version, body)
        answer = error_response(header.api_key, header.api_version, body, refusal.code,
                                refusal.message, throttle_time_ms=int(throttle_s * 1000),
                                per_topic=per_topic)
        if header.api_key == ApiKey.PRODUCE:
            _name_records(answer.get("Responses") or (), refusal.records,
                          self._engine.topic_ids)
        return RequestVerdict(answer=answer, expects_response=expects, delay_s=throttle_s)

    @staticmethod
    def _groups_apart(rule: CompiledRule, ctx: MatchContext, header: kafka_wire.RequestHeader,
                      body: dict[str, Any], groups: list[str],
                      refused: Mapping[str, Refusal]) -> list[str] | None:
        """The groups `rule` denies (that no earlier rule did) when the request answers
        each group apart (`split_groups`) and names one the rule lets through; None when
        the request is refused whole (the rule denies every group, or is not about
        groups)."""
        if not rule.uses_groups or len(groups) < 2 or not answers_groups_apart(
                header.api_key, header.api_version, body):
            return None
        own = [g for g in groups if g not in refused and rule.matches(ctx, None, g)]
        return own if len(own) < len(groups) else None

    def _refuse_groups(self, header: kafka_wire.RequestHeader, body: dict[str, Any],
                       denied: dict[str, Refusal], throttle_s: float, every: bool
                       ) -> tuple[RequestVerdict | None, ResponsePatch | None]:
        """Take the denied groups out of the request, and their refusals into its answer:
        (None, the patch adding them) when groups are left to forward, (the gateway's
        answer, None) when none are (`every` group the request names is denied)."""
        api_key, version = header.api_key, header.api_version
        entries: list[dict[str, Any]] = []
        rest: dict[str, Any] = body
        for refusal in dict.fromkeys(denied.values()):
            names = {g for g, r in denied.items() if r == refusal}
            split = split_groups(api_key, version, rest, names, refusal.code, refusal.message)
            assert split is not None  # (_groups_apart checked that the request splits)
            rest, found = split
            entries += found
        body.clear()
        body.update(rest)

        def merge(response: dict[str, Any]) -> bool:
            return merge_group_entries(api_key, version, body, response, entries)

        if not every:
            return None, merge
        first = next(iter(denied.values()))
        answer = self._answer(header, body, first, throttle_s)
        assert answer.answer is not None
        merge(answer.answer)
        return answer, None

    def _refuse_all_or_nothing(self, header: kafka_wire.RequestHeader, body: dict[str, Any],
                               denied: dict[str, Refusal], throttle_s: float) -> RequestVerdict:
        """AddPartitionsToTxn naming a denied and an allowed topic: as Kafka answers it,
        nothing is added, the denied topics are refused and the others are
        OPERATION_NOT_ATTEMPTED (librdkafka takes the authorization error of all of them
        for a fatal state of the transaction)."""
        api_key, version = header.api_key, header.api_version
        rest = remove_topics(api_key, version, body, set(denied))
        verdict = self._answer(header, rest, Refusal(ErrorCode.OPERATION_NOT_ATTEMPTED,
                                                     "keg: another topic of it was refused"),
                               throttle_s, per_topic=True)
        assert verdict.answer is not None
        merge_error_entries(api_key, version, verdict.answer,
                            self._refused_entries(header, body, denied, {}))
        return verdict

    def _refused_entries(self, header: kafka_wire.RequestHeader, body: dict[str, Any],
                         denied: dict[str, Refusal], id_names: dict[uuid.UUID, str]
                         ) -> list[dict[str, Any]]:
        """The answer's entries for the denied topics of `body`, each with its refusal."""
        api_key, version = header.api_key, header.api_version
        entries: list[dict[str, Any]] = []
        for refusal in dict.fromkeys(denied.values()):
            names = {t for t, r in denied.items() if r == refusal}
            found = partial_error_entries(api_key, version, body, names, refusal.code,
                                          refusal.message, topic_ids=id_names)
            if api_key == ApiKey.PRODUCE:
                _name_records(found, refusal.records, self._engine.topic_ids)
            entries += found
        return entries

    def _partial(self, header: kafka_wire.RequestHeader, body: dict[str, Any],
                 denied: dict[str, Refusal]) -> RequestVerdict:
        api_key, version = header.api_key, header.api_version
        # The request's topic ids with their names: entries named by id match too.
        id_names = self._engine.topic_ids.names_of(
            named_entities(api_key, version, "request", body).topic_ids)
        entries = self._refused_entries(header, body, denied, id_names)
        forwarded = remove_topics(api_key, version, body, set(denied), topic_ids=id_names)
        body.clear()
        body.update(forwarded)

        def merge(response: dict[str, Any]) -> bool:
            return merge_error_entries(api_key, version, response, entries)

        expects = expects_response(api_key, version, body)
        return RequestVerdict(changed=True, patch=merge, expects_response=expects)

    @staticmethod
    def _deny_error(rule: CompiledRule, api_key: int, hits: list[str | None],
                    groups: list[str]) -> int:
        """The rule's error, else the authorization error of what the rule refused, as
        Kafka's authorizer answers: the topic, the group, or the API's own resource."""
        spec = getattr(rule.action, "deny", None)
        name = getattr(spec, "error", None)
        if name and not (api_key == ApiKey.ADD_PARTITIONS_TO_TXN and rule.api_keys is not None
                         and ApiKey.PRODUCE in rule.api_keys):
            return error_code(name)  # (a Produce rule's error is Produce's, not a transaction's)
        if rule.uses_topics and None not in hits:
            return ErrorCode.TOPIC_AUTHORIZATION_FAILED
        if rule.uses_groups and groups:
            return ErrorCode.GROUP_AUTHORIZATION_FAILED
        return default_deny_error(api_key)

    @staticmethod
    def _deny_reason(rule: CompiledRule, api_key: int) -> str:
        message = getattr(getattr(rule.action, "deny", None), "message", None)
        if message:
            return str(message)
        if rule.kind == "deny":
            return "denied"
        return f"{kafka_wire.api_name(api_key) or f'API {api_key}'} is not allowed"

    def _record(self, rule: CompiledRule, outcome: str, header: kafka_wire.RequestHeader,
                conn: ConnectionInfo, topics: list[str | None], code: int | None = None,
                reason: str | None = None) -> None:
        answered = not (self._acks_zero and outcome == "denied")
        if None in topics and self._topics:  # the whole request: one decision per topic
            topics = [*(t for t in topics if t is not None),
                      *(t for t in self._topics if t not in topics)]
        version = self._engine.requests.version
        for topic in topics:
            self._engine.sink(RuleDecision(
                rule, outcome, header, conn, self._audit_principal,
                self._identity.security_protocol, topic, code, reason, answered=answered,
                volume=self._volumes.get(topic) if topic is not None else None,
                rule_version=version,
            ))


def rules_scope(rules: Iterable[CompiledRule]) -> TopicSelector | None:
    """The topics that can make any of `rules` trigger: the union of their top-level
    topic matchers (a rule matches a topic only if that matcher does, whatever else it
    says); None when one of them has none."""
    return union_scope(match_scope(rule.rule.match.topics) for rule in rules)


def rule_who(rule: CompiledRule) -> WhoScope | None:
    """Who can make `rule` trigger: the clause of its top-level identity matchers
    (`match_who`); None when it names no one."""
    clause = match_who(rule.rule.match)
    return None if clause is None else frozenset((clause,))


def rules_who(rules: Iterable[CompiledRule]) -> WhoScope | None:
    """Who can make any of `rules` trigger; None when one of them names no one."""
    return union_who(rule_who(rule) for rule in rules)


def produce_volumes(body: dict[str, Any], topic_ids: TopicIds) -> dict[str, tuple[int, int]]:
    """A Produce request's (record bytes, records) per topic, from the batch headers
    (nothing is decompressed)."""
    volumes: dict[str, tuple[int, int]] = {}
    for topic in body.get("TopicData") or ():
        name = topic_name(topic, topic_ids)
        if name is None:
            continue
        size, count = volumes.get(name, (0, 0))
        for partition in topic.get("PartitionData") or ():
            data = partition.get("Records")
            if not data:
                continue
            size += len(data)
            # A corrupt batch counts its bytes only; the broker or a rule refuses it.
            with contextlib.suppress(KafkaWireError):
                count += sum(b.records_count for b in iter_batches(data)
                             if isinstance(b, BatchView))
        volumes[name] = (size, count)
    return volumes


def _name_records(topics: Iterable[dict[str, Any]],
                  records: tuple[tuple[str, int, int, str], ...], topic_ids: TopicIds) -> None:
    """Name the refused records in a Produce answer's RecordErrors (the field is there
    from v8 on, with ErrorMessage; older answers carry the error code alone)."""
    if not records:
        return
    by_partition: dict[tuple[Any, Any], tuple[int, str]] = {
        (topic, partition): (index, message) for topic, partition, index, message in records}
    for topic in topics:
        for answer in topic.get("PartitionResponses") or ():
            found = by_partition.get((topic_name(topic, topic_ids), answer.get("Index")))
            if found is not None and "RecordErrors" in answer:
                answer["RecordErrors"] = [{"BatchIndex": found[0],
                                           "BatchIndexErrorMessage": found[1]}]


def withhold_partitions(partitions: Any, code: int) -> bool:
    """Answer fetched partitions (Fetch, ShareFetch) with an error instead of their
    records.

    The records become empty, as the broker answers an error, never null: librdkafka
    refuses a null record set as a malformed response and fetches again without ever
    seeing the error (UNKNOWN_TOPIC_ID would have made it refresh its metadata). A share
    consumer acquires nothing of them. Offsets are not told either: Kafka answers a
    partition it refuses with -1 for each of them."""
    changed = False
    for partition in partitions:
        if partition.get("Records") or not partition.get("ErrorCode"):
            partition["ErrorCode"] = code
            partition["Records"] = b""
            if partition.get("AcquiredRecords"):
                partition["AcquiredRecords"] = []
            for offset in _FETCHED_OFFSETS.intersection(partition):
                partition[offset] = -1
            if partition.get("AbortedTransactions"):
                partition["AbortedTransactions"] = None
            changed = True
    return changed


# What a Fetch answer tells of a partition's log, which a refused one does not tell.
_FETCHED_OFFSETS = frozenset({"HighWatermark", "LastStableOffset", "LogStartOffset"})


def _denying(rules: list[CompiledRule], ctx: MatchContext, name: str | None,
             group: str | None = None) -> list[CompiledRule]:
    """The rules of `rules` that deny topic `name` in an answer; every one of them for
    a topic id the gateway cannot name (None): what no rule could judge is refused."""
    return [r for r in rules if name is None or r.matches(ctx, name, group)]


def _topic_listings(api_key: int, response: dict[str, Any]) -> Iterator[TopicListing]:
    """Where an answer of `_TOPIC_LISTING_APIS` lists topics: (the dict holding a list,
    the list's key, the topic an entry of it names, None for an entry of no topic)."""
    if api_key == ApiKey.DESCRIBE_TRANSACTIONS:
        for state in response.get("TransactionStates") or ():
            yield state, "Topics", lambda entry: entry.get("Topic")
    elif api_key == ApiKey.LIST_CONFIG_RESOURCES:
        yield response, "ConfigResources", lambda entry: (
            entry.get("ResourceName") if entry.get("ResourceType") == _TOPIC_RESOURCE else None)
    elif api_key == ApiKey.DESCRIBE_LOG_DIRS:
        for log_dir in response.get("Results") or ():
            yield log_dir, "Topics", lambda entry: entry.get("Name")
    elif api_key == ApiKey.LIST_PARTITION_REASSIGNMENTS:
        yield response, "Topics", lambda entry: entry.get("Name")
    elif api_key == ApiKey.ELECT_LEADERS:
        yield response, "ReplicaElectionResults", lambda entry: entry.get("Topic")


def _incremental_fetch(body: dict[str, Any]) -> bool:
    """A Fetch in an existing session (KIP-227: epoch 1 and up; 0 opens a session, -1
    fetches without one)."""
    return int(body.get("SessionEpoch", -1)) > 0


def _asks_all_topics(api_version: int, body: dict[str, Any]) -> bool:
    """Whether a Metadata request asks for every topic: null topics, or in v0 (which
    has no null) an empty list."""
    topics = body.get("Topics")
    return topics is None or (api_version == 0 and not topics)


def _group_topics(group: dict[str, Any], ids: TopicIds) -> Iterable[str | None]:
    """The topics a described group's members subscribe to and are (to be) assigned;
    None for an id without a name."""
    for member in group.get("Members") or ():
        yield from member.get("SubscribedTopicNames") or ()
        for assignment in (member.get("Assignment"), member.get("TargetAssignment")):
            for topic in (assignment or {}).get("TopicPartitions") or ():
                yield topic.get("TopicName") or ids.name(topic.get("TopicId"))


def _unchanged(patch: ResponsePatch) -> ResponsePatch:
    """`patch` for what it records, the answer left as the broker wrote it."""
    def run(response: dict[str, Any]) -> bool:
        patch(response)
        return False

    return run


def _both(first: ResponsePatch | None, then: RequestVerdict | None) -> ResponsePatch | None:
    """`first`, then the patch of `then`."""
    second = then.patch if then is not None else None
    if first is None or second is None:
        return first or second

    def both(response: dict[str, Any]) -> bool:
        return first(response) | second(response)

    return both


def _throttle(verdict: RequestVerdict, seconds: float) -> None:
    """Tell the client to back off (throttle_time_ms, as Kafka's quotas do) and hold
    the request for that long (bounded by the processor so Envoy's timeout holds)."""
    millis = int(seconds * 1000)
    earlier = verdict.patch

    def patch(response: dict[str, Any]) -> bool:
        changed = bool(earlier(response)) if earlier is not None else False
        if "ThrottleTimeMs" in response and response["ThrottleTimeMs"] < millis:
            response["ThrottleTimeMs"] = millis
            return True
        return changed

    verdict.patch = patch
    verdict.delay_s = max(verdict.delay_s, seconds)
