"""A connection's frames as keg's native Envoy filter hands them over ("frames mode").

On the native data path keg's Kafka filter (a Rust module inside Envoy) frames the
stream, keeps the answer order, rewrites broker addresses and passes through every
frame no rule needs. Only the requests its interest table names reach the Python
service, each one whole, on one gRPC stream per Kafka connection; a response comes
only when the reply to its request asked for it. The protocol is written down in
docs/native-handoff.md; this module is its sans-IO core: one whole frame in,
its reply out, through the same `FilterChain` as the network ext_proc path.

What differs from `KafkaSession`: no framing or correlation (the module does both),
the connection's identity comes with each request (the module read the SASL
exchange), and the broker's addresses and versions are the module's business, so
the chain holds only the filters that judge or learn (`frames_filters`).
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import groupby
from typing import NamedTuple

import kafka_wire
from ext_proc.audit import RequestAudit, auditing
from ext_proc.chain import FilterChain
from ext_proc.connection import ConnectionInfo
from ext_proc.filters import (
    REQUEST,
    RESPONSE,
    SELECTED_APIS,
    Filter,
    ResponsePatch,
    Selection,
    TopicSelector,
    WhoScope,
    alternatives,
    select,
    topic_scope,
    union_scope,
)
from ext_proc.filters.group_protocol import GroupProtocolObserver
from ext_proc.filters.order import rule_filters
from ext_proc.filters.records import RecordsFilter, Vouch
from ext_proc.filters.rules import RuleEngine
from ext_proc.filters.safeguards import ProduceChecks, safeguard_checks, union_checks
from ext_proc.filters.topic_ids import TopicIdLearner
from ext_proc.identity import IdentityTracker
from ext_proc.metrics import ConnectionMeter
from kafka_wire.errors import FrameError
from kafka_wire.framing import REQUEST_HEAD_SIZE, RESPONSE_HEAD_SIZE, parse_request_head

MODE_HEADER = "x-keg-mode"
FRAMES_MODE = "frames"
# The module sends a request again when its reply says `defer_ms` (modules before it
# would have dropped the request: the service defers only for those that say so).
DEFER_HEADER = "x-keg-defer"
METADATA_NAMESPACE = "keg"  # ProcessingRequest.metadata.filter_metadata[...] key
MAX_VERSION = 0x7FFF  # Kafka versions are int16
# The APIs whose requests the module reads topics from (docs/native.md, the interest
# table): a selector on any other would not be applied.
# Of the APIs with topic selectors (SELECTED_APIS), those whose batches keg's module may
# pass on vouched schema ids.
_VOUCHED_APIS = frozenset({kafka_wire.ApiKey.PRODUCE, kafka_wire.ApiKey.FETCH})


def frames_filters(engine: RuleEngine, identity: IdentityTracker,
                   vouches: list[Vouch] | None = None) -> list[Filter]:
    """The chain of a handed-off connection: what learns topic ids and group protocols,
    then the rule filters in the data path's order (ext_proc.filters.order); `vouches`
    collects what the records filter vouches for (ext_proc.filters.records)."""
    groups = GroupProtocolObserver()
    return [TopicIdLearner(engine.topic_ids), groups, groups.guard(),
            *rule_filters(engine, identity), RecordsFilter(engine, identity, vouches)]


@dataclass(frozen=True, slots=True)
class RequestReply:
    """The reply to one handed-off request (see docs/native.md, the hand-off)."""

    to_broker: bytes  # the frame to forward, as it came or changed; b"": none
    answer: bytes | None  # the gateway's own answer frame, for the request's slot
    want_response: bool  # hand the broker's answer to this request back here
    vouched: tuple[Vouch, ...] = ()  # schema ids the module may pass by itself
    # Over a rate: how long the module holds the connection's next hand-offs back after
    # this one (Kafka mutes a throttled client's channel alike, KIP-219); 0: not throttled.
    throttle_ms: int = 0
    # Not judged: the request came while the connection was muted (the module sent it
    # before the throttle reached it); the module sends it again this much later.
    defer_ms: int = 0


class FramesSession:
    def __init__(self, conn: ConnectionInfo, engine: RuleEngine,
                 identity: IdentityTracker | None = None,
                 meter: ConnectionMeter | None = None) -> None:
        self.conn = conn
        self.identity = identity or IdentityTracker()
        self._topic_ids = engine.topic_ids
        self._vouches: list[Vouch] = []
        self.chain = FilterChain(frames_filters(engine, self.identity, self._vouches))
        self._meter = meter
        # (correlation id, the patch for the broker's answer, the request's audit) of
        # each request whose answer was asked for, in order: Kafka answers in order, the
        # module hands them in order. Not a map by id: a client may reuse one while it is
        # in flight, and the broker answers each (keyed by id, the second closed the
        # connection: "response 7 was not asked for").
        self._patches: deque[tuple[int, ResponsePatch | None, RequestAudit]] = deque()
        # Until when (time.monotonic()) the module holds this connection's hand-offs back
        # for the rates its requests were over (RequestReply.throttle_ms).
        self._muted_until = 0.0
        # Whether the module sends a deferred request again (DEFER_HEADER).
        self.module_defers = False

    def request(self, raw: bytes, principal: str | None = None,
                security_protocol: str | None = None,
                topic_ids: Mapping[str, str] | None = None) -> RequestReply:
        """One whole request frame (size prefix included). `topic_ids`: the names of the
        topic ids it carries, as the module knows them (hex id -> name): the Metadata
        answer that named them may have gone to another worker of the pool."""
        _check_whole(raw, REQUEST_HEAD_SIZE)
        muted_s = self._muted_until - time.monotonic()
        if muted_s > 0 and self.module_defers:
            # A pipelining client's requests the module sent before the throttle reached
            # it: judged now, each ran the bucket deeper into the debt it may owe (then
            # forgiven), and all went at the mute's end. Judged when the mute is over.
            return RequestReply(b"", None, False, defer_ms=math.ceil(muted_s * 1000))
        self._learn_ids(topic_ids)
        head = parse_request_head(raw)
        if self._meter is not None:
            body = memoryview(raw)[REQUEST_HEAD_SIZE:]
            # Topics: keg's Kafka filter counts those of every request itself.
            self._meter.request(head.api_key, head.api_version, len(raw), body)
        self.identity.learned_elsewhere(principal, security_protocol)
        # The module hands the frame over once whole: latency runs from here (the
        # module's own time before is not known to this side, docs/audit.md).
        audit = RequestAudit(len(raw))
        with auditing(audit):
            judged = self.chain.judge_frame(raw, self.conn)
        if judged.want_response:
            self._patches.append((head.correlation_id, judged.patch, audit))
        else:
            audit.finish()  # answered here, or forwarded with no answer coming back
            if self._meter is not None and not judged.answered:
                self._meter.forwarded()
        return RequestReply(judged.to_broker, judged.answer, judged.want_response,
                            self.take_vouched(), throttle_ms=self._pause_ms(judged.delay_s))

    def _pause_ms(self, over_s: float) -> int:
        """How much longer than already asked the module must hold the connection's next
        hand-offs for a request `over_s` over a rate. The module pauses after each reply
        in turn, and requests it sent before the first pause were all judged against one
        bucket (each owing what the ones before it left), so a pause is what this
        request's throttle adds to the connection's: the pauses then add up to the
        throttle of the last one, not to the sum of all."""
        if over_s <= 0:
            return 0
        now = time.monotonic()
        until = now + over_s
        pause = until - max(now, self._muted_until)
        self._muted_until = max(self._muted_until, until)
        return math.ceil(pause * 1000) if pause > 0 else 0

    def response(self, raw: bytes, api_key: int, api_version: int,
                 topic_ids: Mapping[str, str] | None = None) -> bytes:
        """One whole response frame this session asked for; the bytes for the client.
        `topic_ids` as for `request`: an answer to an incremental Fetch carries topics
        of its session its request did not name."""
        _check_whole(raw, RESPONSE_HEAD_SIZE)
        self._learn_ids(topic_ids)
        correlation_id = int.from_bytes(raw[4:8], "big", signed=True)
        while self._patches and self._patches[0][0] != correlation_id:
            # Asked for, but its answer never came here (its hand-off failed and the
            # module answered the client itself): its events go now.
            self._patches.popleft()[2].finish()
        if not self._patches:
            raise FrameError(f"response {correlation_id} was not asked for")
        _, patch, audit = self._patches.popleft()
        if self._meter is not None:
            self._meter.bytes(api_key, "response", len(raw))
        with auditing(audit):
            out = self.chain.filter_response_frame(raw, api_key, api_version, self.conn, patch)
        audit.finish()
        return out

    def _learn_ids(self, topic_ids: Mapping[str, str] | None) -> None:
        """The names the module gave for topic ids (hex id -> name); malformed entries
        are ignored (the frame's own checks decide what an unnamed id means)."""
        for topic_id, name in (topic_ids or {}).items():
            with contextlib.suppress(ValueError, TypeError):
                if isinstance(name, str):
                    self._topic_ids.add(uuid.UUID(hex=topic_id), name)

    def take_vouched(self) -> tuple[Vouch, ...]:
        """What the last frame's record rules vouched for (`Vouch`), once."""
        if not self._vouches:
            return ()
        vouched = tuple(self._vouches)
        self._vouches.clear()
        return vouched

    def close(self) -> None:
        for _id, _patch, audit in self._patches:  # never answered: their events go now
            audit.finish()
        self._patches.clear()
        if self._meter is not None:
            self._meter.close()


def _check_whole(raw: bytes, head_size: int) -> None:
    if len(raw) < head_size:
        raise FrameError(f"a frame of {len(raw)} bytes is shorter than its head")
    size = int.from_bytes(raw[:4], "big", signed=True)
    if size != len(raw) - 4:
        raise FrameError(f"frame size {size} does not match the {len(raw) - 4} bytes given")


def interest_table(engine: RuleEngine) -> list[tuple[int, int, int]]:
    """The requests the native module must hand over for the live rule set, as
    (api key, min version, max version) ranges: those the frames chain wants, or
    whose answers it wants (decided when the request passes)."""
    return list(_ranges((w.api_key, w.version) for w in _wanted(engine)))


class InterestRange(NamedTuple):
    """Versions `low`..`high` of an API the chain wants (see `interest_ranges`)."""

    api_key: int
    low: int
    high: int
    selector: TopicSelector | None  # None: whatever its topics
    unvouched: TopicSelector | None  # the vouch exception (see `_Wanted`)
    who: WhoScope | None = None  # None: whoever sends it
    # A Produce that keeps these passes (only safeguards may act on it); None: no such.
    checks: ProduceChecks | None = None
    # Requests these admit are needed whatever their topics (None: none by that).
    whole: WhoScope | None = None


def interest_ranges(engine: RuleEngine) -> list[InterestRange]:
    """`interest_table` with each range's topic selector: a Produce (Fetch) of that
    range needs the chain only if one of its topics is selected; None: every such
    request does. The selector is the union of the `topic_scope`s of every filter
    that wants the request or its answer (`ext_proc.filters`), so any filter that may
    act whatever the topics (virtual topics, a rule without topics, a filter that does
    not say) leaves the range unselected. Only Produce, Fetch and ShareFetch get selectors (the
    module reads their topics; docs/native.md says which versions).

    The fifth element, when some `vouchable` schema rule may act on the range: the
    topics anything else may act on. Of a Produce's (a Fetch answer's) selected topics,
    those it does not select need only the ids the service vouched for (docs/native.md,
    vouched schema ids).

    `who`: who anything that wants the range may act for (the union of the `who_scope`s
    of the filters, of their `alternatives` naming topics when some name none); a request
    from any other passes natively. None: anyone. `whole`: when alternatives that name
    topics and alternatives that name none (rules on principals only, say) want a
    Produce or Fetch range, the latter's who: what they admit is needed whatever its
    topics, the rest only by the selector (`ext_proc.filters.select`).

    `checks`: on a Produce range only safeguards act on (every filter that wants it
    says `safeguard_checks`), what a request must keep for none of them to act: the
    module passes a request that keeps them natively."""
    return handed_off_ranges(engine)[0]


def fail_open_ranges(engine: RuleEngine) -> list[FailOpenRange]:
    """The requests of `interest_table` that only filters which may miss them want
    (`BaseFilter.misses_harmlessly`: the topic-id learner, the group protocol observer,
    rules that are all dry runs): when the Python service cannot take one, the module
    forwards it and its answer as they are, whatever the failure mode. Without this every
    Metadata request needed the service, and a new client could not connect while it was
    down; and a dry-run rule, which never changes traffic, refused its requests then. A
    Produce range the others want fails open `unless` it names a topic they may act on
    (`BaseFilter.enforced_scope`): a dry-run rule's topic beside an enforced rule's."""
    return handed_off_ranges(engine)[1]


def handed_off_ranges(engine: RuleEngine) -> tuple[list[InterestRange], list[FailOpenRange]]:
    """`interest_ranges` and `fail_open_ranges` from one walk of the chain."""
    wanted = list(_wanted(engine))
    ranges: list[InterestRange] = []
    for (_, selector, unvouched, who, checks, whole), group in groupby(
            wanted, key=lambda w: (w.api_key, w.selector, w.unvouched, w.who, w.checks,
                                   w.whole)):
        versions = [(w.api_key, w.version) for w in group]
        ranges += [InterestRange(k, low, high, selector, unvouched, who, checks, whole)
                   for k, low, high in _ranges(versions)]
    fail_open: list[FailOpenRange] = []
    failing_open = [w for w in wanted if w.may_miss or w.unless is not None]
    for (_, unless), group in groupby(
            failing_open, key=lambda w: (w.api_key, None if w.may_miss else w.unless)):
        fail_open += [FailOpenRange(k, low, high, unless)
                      for k, low, high in _ranges((w.api_key, w.version) for w in group)]
    return ranges, fail_open


class FailOpenRange(NamedTuple):
    """Versions `low`..`high` of an API whose failed hand-off forwards the request; with
    `unless` (Produce), only a request naming none of those topics."""

    api_key: int
    low: int
    high: int
    unless: TopicSelector | None = None


@dataclass(frozen=True, slots=True)
class _Wanted:
    api_key: int
    version: int
    selector: TopicSelector | None  # None: every request of this version
    may_miss: bool  # every filter that wants it may miss frames
    # The selected topics something other than a vouchable schema rule may act on;
    # None: no vouching (no such rule, or anything may act on any topic).
    unvouched: TopicSelector | None = None
    who: WhoScope | None = None  # None: whoever sends it
    checks: ProduceChecks | None = None  # see `interest_ranges`
    whole: WhoScope | None = None  # see `interest_ranges`
    # A Produce some filters must see, not all (may_miss False): the topics of those;
    # a request naming none of them fails open. None: every request fails as it says.
    unless: TopicSelector | None = None


def _wanted(engine: RuleEngine) -> Iterator[_Wanted]:
    """Every request version the chain needs, in order; versions newer than keg reads
    as two entries, high + 1 and MAX_VERSION (never failing open: the chain must refuse
    what a rule must read and cannot)."""
    chain = FilterChain(frames_filters(engine, IdentityTracker()))

    def interested(api_key: int, version: int) -> list[Filter]:
        return [f for direction in (REQUEST, RESPONSE)
                for f in chain.interested(api_key, version, direction)]

    def selection(api_key: int, version: int) -> Selection:
        return select((alt for direction in (REQUEST, RESPONSE)
                       for f in chain.interested(api_key, version, direction)
                       for alt in alternatives(f, api_key, version, direction)),
                      api_key in SELECTED_APIS)

    def unvouched(api_key: int, version: int) -> TopicSelector | None:
        if api_key not in _VOUCHED_APIS:
            return None
        some = False
        scopes: list[TopicSelector | None] = []
        for direction in (REQUEST, RESPONSE):
            for f in chain.interested(api_key, version, direction):
                if isinstance(f, RecordsFilter) and direction == REQUEST:
                    vouchable, others = f.unvouchable_scope(api_key, version)
                    some |= vouchable
                    scopes.append(others)
                else:
                    scopes.append(topic_scope(f, api_key, version, direction))
        return union_scope(scopes) if some else None

    def checks(api_key: int, version: int) -> ProduceChecks | None:
        if api_key != kafka_wire.ApiKey.PRODUCE or chain.interested(api_key, version, RESPONSE):
            return None
        found = [safeguard_checks(f, api_key, version, REQUEST)
                 for f in chain.interested(api_key, version, REQUEST)]
        return union_checks(found)

    def unless(api_key: int, version: int, enforcing: list[Filter]) -> TopicSelector | None:
        if not enforcing or api_key != kafka_wire.ApiKey.PRODUCE:
            return None  # a Fetch's answer may name topics its request does not
        return union_scope(f.enforced_scope(api_key, version) for f in enforcing)

    for api_key in kafka_wire.known_api_keys():
        low, high = kafka_wire.supported_versions(api_key) or (0, -1)
        for v in range(low, high + 1):
            filters = interested(api_key, v)
            if filters:
                chosen = selection(api_key, v)
                enforcing = [f for f in filters if not f.misses_harmlessly(api_key, v)]
                yield _Wanted(api_key, v, chosen.selector, not enforcing, unvouched(api_key, v),
                              chosen.who, checks(api_key, v), chosen.whole,
                              unless(api_key, v, enforcing))
        if interested(api_key, MAX_VERSION):
            # Versions newer than keg reads: handed over, so the chain can refuse what
            # a rule must read and cannot (fail closed), never passed unread.
            yield _Wanted(api_key, high + 1, None, False)
            yield _Wanted(api_key, MAX_VERSION, None, False)


def _ranges(pairs: Iterable[tuple[int, int]]) -> Iterator[tuple[int, int, int]]:
    current: list[int] | None = None
    for api_key, version in pairs:
        if current is not None and current[0] == api_key and (
                current[2] == version - 1 or version == MAX_VERSION):
            current[2] = version
            continue
        if current is not None:
            yield (current[0], current[1], current[2])
        current = [api_key, version, version]
    if current is not None:
        yield (current[0], current[1], current[2])
