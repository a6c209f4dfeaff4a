"""The contract every filter of the data path follows (after Kroxylicious' filters).

A filter is one object in a connection's ordered filter list (`ext_proc.chain`). It
says which frames it wants, per API key, version and direction, and is called with a
context for each frame it asked for:

- `wants(api_key, api_version, direction)`: asked when the frame's first bytes
  arrive. A request is decoded only when some filter wants it; a response only when
  some filter wants it, decided when its *request* passed (responses carry no API
  key). A filter whose interest follows the live rule set says `dynamic = True` and
  is asked every time; the others are asked once per (API, version, direction).
- `on_request(ctx)`: the decoded request, in `ctx.body`, as the earlier filters left
  it. The filter may only look (an observer), or decide through the context:
  `ctx.changed()` (it changed the body in place: the request is re-encoded),
  `ctx.answer(body)` (the gateway answers; the broker never sees it; later filters
  are not called), `ctx.on_answer(patch)` (change the answer the client gets, the
  broker's or a later filter's), `ctx.hold(seconds)` (throttling),
  `ctx.no_response()` (an acks=0 Produce: nobody answers it), or `ctx.decide(verdict)`
  for all of it at once.
- `on_response(ctx)`: the decoded response; `ctx.changed()` when it changed the body.
  An unchanged response is forwarded as its original bytes.
- `topic_scope(api_key, api_version, direction)`: for a frame the filter wants, the
  topics that can make it act (a `TopicSelector`), or None when it may act whatever
  the topics (the default). Keg's native module hands a Produce (or Fetch) to the
  Python chain only when one of its topics is in the union of the scopes of every
  filter that wants it, and every frame when one of them says None
  (`ext_proc.frames.interest_ranges`). A scope must be a necessary condition: a topic
  outside it never makes the filter act. When unsure, say None.
- `who_scope(api_key, api_version, direction)`: the same for who sends the frame (a
  set of `WhoClause`s: principals, client networks, listeners): the module hands a
  frame to the chain only when its connection is admitted by a clause of every
  wanting filter's scope (`ext_proc.frames.interest_ranges`). None (the default):
  anyone.
- `stream_response(api_key, api_version)`: a filter that wants a response may offer
  to do its work on the bytes as they pass instead (an `Inspector` factory, see
  kafka_wire.framing): when every filter that wants a response offers one, the
  response is not held; when it is held anyway, `on_response` does the work.

Patches nest like middleware: the first filter's patch sees the answer last, so a
filter that renames topics on the way in renames them back on the way out, whoever
answers. Filters run one frame at a time, in stream order; they must not block and
must not keep references to bodies after returning. Audit and metrics: filters hold
the data path's sinks (see `ext_proc.filters.rules.RuleEngine.sink`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal, Protocol

import kafka_wire
from ext_proc.connection import ConnectionInfo
from filter_rules import Match, StringMatch
from filter_rules.compiled import principal_pattern
from kafka_wire.framing import Inspector

Direction = Literal["request", "response"]
REQUEST: Direction = "request"
RESPONSE: Direction = "response"

# Changes a decoded answer in place; returns True when it changed it.
ResponsePatch = Callable[[dict[str, Any]], bool]


@dataclass
class RequestVerdict:
    """What became of a request. Fields left at their defaults mean "as it was".

    - `answer`: the response body the gateway sends the client itself; the request
      never reaches the broker. Its place in the response order is kept.
    - `changed`: the (in place) changed request body is forwarded instead.
    - `patch`: applied to the broker's answer before the client sees it (e.g. error
      entries for the topics a partial denial removed from the request).
    - `expects_response`: False for a request Kafka never answers (acks=0 Produce).
    - `delay_s`: how long to hold the request before it goes on (throttling).
    """

    answer: dict[str, Any] | None = None
    changed: bool = False
    patch: ResponsePatch | None = None
    expects_response: bool = True
    delay_s: float = 0.0  # hold the request this long first (rate limits)


def combine(earlier: RequestVerdict, later: RequestVerdict) -> RequestVerdict:
    """One verdict for two filters that ran in this order on the same request.

    Changes accumulate; the later filter's patch runs first on the answer, then the
    earlier's (onion order). A later answer is patched by the earlier filters too
    (they changed the request it answers); an answer ends the chain.
    """
    inner, outer = later.patch, earlier.patch
    patch: ResponsePatch | None
    if inner is None or outer is None:
        patch = inner or outer
    else:
        def patch(response: dict[str, Any]) -> bool:
            changed = inner(response)
            return outer(response) or changed

    answer = later.answer
    if answer is not None and outer is not None:
        outer(answer)
    return RequestVerdict(
        answer=answer,
        changed=earlier.changed or later.changed,
        patch=None if answer is not None else patch,
        expects_response=earlier.expects_response and later.expects_response,
        delay_s=max(earlier.delay_s, later.delay_s),
    )


class RequestContext:
    """One filter's view of one request: what it is, and what the filter may decide."""

    __slots__ = ("body", "conn", "header", "verdict")

    def __init__(self, header: kafka_wire.RequestHeader, body: dict[str, Any],
                 conn: ConnectionInfo) -> None:
        self.header = header
        self.body = body
        self.conn = conn
        self.verdict: RequestVerdict | None = None  # this filter's, once it decided

    def _own(self) -> RequestVerdict:
        if self.verdict is None:
            self.verdict = RequestVerdict()
        return self.verdict

    def changed(self) -> None:
        self._own().changed = True

    def answer(self, body: dict[str, Any], *, expects_response: bool = True) -> None:
        verdict = self._own()
        verdict.answer, verdict.expects_response = body, expects_response

    def on_answer(self, patch: ResponsePatch) -> None:
        verdict = self._own()
        earlier = verdict.patch
        if earlier is None:
            verdict.patch = patch
        else:  # this filter's own patches apply in the order it gave them
            def both(response: dict[str, Any]) -> bool:
                first = earlier(response)
                return patch(response) or first

            verdict.patch = both

    def hold(self, seconds: float) -> None:
        verdict = self._own()
        verdict.delay_s = max(verdict.delay_s, seconds)

    def no_response(self) -> None:
        self._own().expects_response = False

    def decide(self, verdict: RequestVerdict | None) -> None:
        """Everything at once (a filter that builds its verdict itself)."""
        if verdict is not None:
            self.verdict = verdict if self.verdict is None else combine(self.verdict, verdict)


class ResponseContext:
    """One filter's view of one decoded response."""

    __slots__ = ("api_key", "api_version", "body", "conn", "was_changed")

    def __init__(self, api_key: int, api_version: int, body: dict[str, Any],
                 conn: ConnectionInfo) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.body = body
        self.conn = conn
        self.was_changed = False

    def changed(self, changed: bool = True) -> None:
        self.was_changed = self.was_changed or changed


@dataclass(frozen=True)
class TopicSelector:
    """Topic names as rules match them (`filter_rules` StringMatch: exact names,
    prefixes, RE2 patterns matching the whole name); a union of matchers."""

    exact: frozenset[str] = frozenset()
    prefix: frozenset[str] = frozenset()
    regex: frozenset[str] = frozenset()

    def union(self, other: TopicSelector) -> TopicSelector:
        return TopicSelector(self.exact | other.exact, self.prefix | other.prefix,
                             self.regex | other.regex)

    def to_json(self) -> dict[str, list[str]]:
        """The module's form (envoy/kafka_filter/src/core/interest.rs), sorted so an
        unchanged rule set gives an unchanged table."""
        return {"exact": sorted(self.exact), "prefix": sorted(self.prefix),
                "regex": sorted(self.regex)}


# What keg's module compiles (Rust's `regex` crate, ASCII mode, on ASCII names only:
# every valid topic name is ASCII) must select what RE2 selects: only patterns of a
# small, plainly common subset are handed to it, where both engines agree (\w, \d and
# their negations included); anything else (\s, \b, \C, \Q..\E, \p{..}, POSIX
# classes, flags but (?i), octal, a "{" that starts no repeat, large repeats,
# non-ASCII) leaves the rule's scope open: every frame of the API is handed off.
_PORTABLE_ESCAPES: Final = frozenset(".-_\\*+?()[]{}|^$/dwDW")
_CLASS_ESCAPES: Final = frozenset(".-_\\*+?()[]{}|^$/")  # no \d in a class: [\d-z]
_MAX_PORTABLE_REPEAT: Final = 100
_COUNTED: Final = re.compile(r"\{(\d+)(,(\d*))?\}")


def portable_regex(pattern: str) -> bool:
    """Whether `pattern` means the same to RE2 and to the module's regex engine (and
    both accept it: a pattern the module refuses would refuse the whole table)."""
    if not pattern.isascii() or any(op in pattern for op in ("[:", "&&", "--", "~~")):
        return False
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if not c.isprintable():
            return False
        if c == "\\":
            escapes = _CLASS_ESCAPES if in_class else _PORTABLE_ESCAPES
            if i + 1 >= len(pattern) or pattern[i + 1] not in escapes:
                return False
            i += 2
            continue
        if in_class:
            if c == "[":  # Rust nests classes, RE2 reads a literal "["
                return False
            in_class = c != "]"
        elif c == "[":
            in_class = True
            i += 1
            if pattern.startswith("^", i):
                i += 1
            if pattern.startswith("]", i):  # a literal "]" first, in both
                i += 1
            continue
        elif c == "(" and pattern.startswith("(?", i) and not (
                pattern.startswith("(?:", i) or pattern.startswith("(?i:", i)
                # RE2 repeats the empty flag group, Rust refuses to: (?i)*
                or (pattern.startswith("(?i)", i)
                    and not pattern.startswith(("*", "+", "?", "{"), i + 4))):
            return False
        elif c == "{":
            # RE2 reads a "{" that starts no repeat as a literal, Rust refuses it.
            counted = _COUNTED.match(pattern, i)
            if counted is None or i == 0 or pattern[i - 1] in "(|^$":
                return False
            low, high = int(counted[1]), counted[3]
            if low > _MAX_PORTABLE_REPEAT or (high and not low <= int(high)
                                              <= _MAX_PORTABLE_REPEAT):
                return False
            i = counted.end()
            continue
        i += 1
    return True


def match_scope(match: StringMatch | None) -> TopicSelector | None:
    """The selector of a rule's top-level topic matcher: None when the rule has none
    (it may act on any topic) or a pattern the module could read otherwise."""
    if match is None or not all(portable_regex(p) for p in match.regex):
        return None
    return TopicSelector(frozenset(match.exact), frozenset(match.prefix),
                         frozenset(match.regex))


@dataclass(frozen=True)
class WhoClause:
    """Who a rule may apply to, from its top-level identity matchers: a request is
    admitted when every matcher given admits it (None: that matcher is absent, or one
    the module cannot apply). Principals as Kafka names them ("User:alice", the
    rule's exact names and prefixes normalized as its matcher does), client networks
    in their canonical form, listeners as the module names its own ("host:port"),
    client ids as the request header carries them (a null one matches none)."""

    principals: TopicSelector | None = None
    client_addresses: frozenset[str] | None = None
    listeners: frozenset[str] | None = None
    client_ids: TopicSelector | None = None

    def to_json(self) -> dict[str, Any]:
        """The module's form (envoy/kafka_filter/src/core/who.rs), sorted."""
        clause: dict[str, Any] = {}
        if self.principals is not None:
            clause["principals"] = self.principals.to_json()
        if self.client_addresses is not None:
            clause["client_addresses"] = sorted(self.client_addresses)
        if self.listeners is not None:
            clause["listeners"] = sorted(self.listeners)
        if self.client_ids is not None:
            clause["client_ids"] = self.client_ids.to_json()
        return clause


# Who may make a filter act: a connection any of the clauses admits.
WhoScope = frozenset[WhoClause]


def match_who(match: Match) -> WhoClause | None:
    """The clause of a rule's top-level match (a `not` only narrows it, so it is left
    out: the clause stays a necessary condition); None when it names no one."""
    principals = match_scope(match.principals)
    if principals is not None:  # compared as the rule's principal matcher compares them
        principals = TopicSelector(frozenset(map(principal_pattern, principals.exact)),
                                   frozenset(map(principal_pattern, principals.prefix)),
                                   principals.regex)
    networks = None
    if match.client_addresses is not None:
        networks = frozenset(str(ipaddress.ip_network(cidr, strict=False))
                             for cidr in match.client_addresses)
    listeners = frozenset(match.listeners) if match.listeners is not None else None
    client_ids = match_scope(match.client_ids)
    if principals is None and networks is None and listeners is None and client_ids is None:
        return None
    return WhoClause(principals, networks, listeners, client_ids)


def who_scope(f: Filter, api_key: int, api_version: int,
              direction: Direction) -> WhoScope | None:
    """`f`'s who-scope for a frame it wants; None for a filter that does not say."""
    scope = getattr(f, "who_scope", None)
    if scope is None:
        return None
    result = scope(api_key, api_version, direction)
    return result if isinstance(result, frozenset) else None


# The APIs whose requests keg's module reads topics of (topic selectors).
SELECTED_APIS: Final = frozenset({kafka_wire.ApiKey.PRODUCE, kafka_wire.ApiKey.FETCH,
                                  kafka_wire.ApiKey.SHARE_FETCH})


# Past this many names and patterns a selector is not made (every frame of the range is
# handed off): the module would compare each topic with all of them, and a rule set of
# 100,000 topic rules must not cost a quadratic union here either.
MAX_SELECTOR_ENTRIES: Final = 4096


def union_scope(scopes: Iterable[TopicSelector | None]) -> TopicSelector | None:
    """The union of scopes; None (every topic) as soon as one is None, or once the union
    holds more than MAX_SELECTOR_ENTRIES names and patterns. Linear in the scopes."""
    exact: set[str] = set()
    prefix: set[str] = set()
    regex: set[str] = set()
    for scope in scopes:
        if scope is None:
            return None
        exact |= scope.exact
        prefix |= scope.prefix
        regex |= scope.regex
        if len(exact) + len(prefix) + len(regex) > MAX_SELECTOR_ENTRIES:
            return None
    return TopicSelector(frozenset(exact), frozenset(prefix), frozenset(regex))


def union_who(scopes: Iterable[WhoScope | None]) -> WhoScope | None:
    """The union of who-scopes; None (anyone) as soon as one is None, or past
    MAX_SELECTOR_ENTRIES clauses."""
    clauses: set[WhoClause] = set()
    for scope in scopes:
        if scope is None:
            return None
        clauses |= scope
        if len(clauses) > MAX_SELECTOR_ENTRIES:
            return None
    return frozenset(clauses)


def topic_scope(f: Filter, api_key: int, api_version: int,
                direction: Direction) -> TopicSelector | None:
    """`f`'s scope for a frame it wants; None for a filter that does not say (it may
    act on any topic)."""
    scope = getattr(f, "topic_scope", None)
    if scope is None:
        return None
    result = scope(api_key, api_version, direction)
    return result if isinstance(result, TopicSelector) else None


# What may make a filter act on a frame: (its topics, who sends it), each None for
# "any"; a filter may say several (one per rule), and acts only if one of them admits.
Alternative = tuple[TopicSelector | None, WhoScope | None]


def alternatives(f: Filter, api_key: int, api_version: int,
                 direction: Direction) -> list[Alternative]:
    """`f`'s alternatives for a frame it wants: its own `alternatives` if it says them,
    else the one of its `topic_scope` and `who_scope`."""
    own = getattr(f, "alternatives", None)
    said = own(api_key, api_version, direction) if own is not None else None
    if isinstance(said, list):
        return said
    return [(topic_scope(f, api_key, api_version, direction),
             who_scope(f, api_key, api_version, direction))]


@dataclass(frozen=True)
class Selection:
    """Which frames of a range the chain needs: those `whole` admits (None: none by
    that), and those `who` admits (None: anyone) that name a topic `selector` selects
    (None: any topic)."""

    selector: TopicSelector | None
    who: WhoScope | None
    whole: WhoScope | None = None


EVERYTHING: Final = Selection(None, None)


def select(alts: Iterable[Alternative], selects_topics: bool) -> Selection:
    """The selection of a range from every alternative of every filter that wants it: a
    frame is needed if an alternative admits it. Alternatives that name topics give
    the selector and its who (unions: a necessary condition); those that name none give
    `whole` (they act on every frame of whom they name). `selects_topics`: whether the
    module reads the API's topics (else only who is kept)."""
    alts = list(alts)
    if not selects_topics:
        return Selection(None, union_who(w for _, w in alts))
    topical = [(t, w) for t, w in alts if t is not None]
    whole_who = [w for t, w in alts if t is None]
    selector = union_scope(t for t, _ in topical) if topical else None
    if selector is None:  # no topics named, or too many: who alone
        return Selection(None, union_who(w for _, w in alts))
    if not whole_who:
        return Selection(selector, union_who(w for _, w in topical))
    whole = union_who(whole_who)
    if whole is None:  # an alternative for anyone, whatever the topics
        return EVERYTHING
    return Selection(selector, union_who(w for _, w in topical), whole)


class Filter(Protocol):
    """See the module docstring."""

    dynamic: ClassVar[bool]
    may_miss_frames: ClassVar[bool]

    def wants(self, api_key: int, api_version: int, direction: Direction) -> bool: ...

    def misses_harmlessly(self, api_key: int, api_version: int) -> bool: ...

    def enforced_scope(self, api_key: int, api_version: int) -> TopicSelector | None: ...

    def on_request(self, ctx: RequestContext) -> None: ...

    def on_response(self, ctx: ResponseContext) -> None: ...

    def stream_response(self, api_key: int, api_version: int
                        ) -> Callable[[], Inspector] | None: ...


class BaseFilter:
    """Defaults: wants nothing, does nothing, interest fixed for the connection."""

    dynamic: ClassVar[bool] = False
    # True for a filter the gateway is whole without when a frame cannot reach it (the
    # Python service down): it only learns for later frames, which fail safe without
    # what it missed, or guards what the broker checks again. A frame only such filters
    # want is forwarded when its hand-off fails (`ext_proc.frames.fail_open_ranges`).
    may_miss_frames: ClassVar[bool] = False

    def wants(self, api_key: int, api_version: int, direction: Direction) -> bool:
        return False

    def misses_harmlessly(self, api_key: int, api_version: int) -> bool:
        """Whether traffic stays as the rules want it when a request of this version (and
        its answer) cannot reach the filter: `may_miss_frames`, or a judge whose rules
        that may act on it are all dry runs."""
        return self.may_miss_frames

    def enforced_scope(self, api_key: int, api_version: int) -> TopicSelector | None:
        """The topics of the Produce requests the filter must see, or they fail as the
        rule set says (None: every request it wants)."""
        return self.topic_scope(api_key, api_version, REQUEST)

    def on_request(self, ctx: RequestContext) -> None:
        return None

    def on_response(self, ctx: ResponseContext) -> None:
        return None

    def topic_scope(self, api_key: int, api_version: int,
                    direction: Direction) -> TopicSelector | None:
        """Any topic: a filter narrows this only when it knows (see the docstring)."""
        return None

    def who_scope(self, api_key: int, api_version: int,
                  direction: Direction) -> WhoScope | None:
        """Anyone: a filter narrows this only when it knows (see the docstring)."""
        return None

    def stream_response(self, api_key: int, api_version: int
                        ) -> Callable[[], Inspector] | None:
        return None


class RequestJudge(BaseFilter):
    """A filter that decides requests: it wants those `wants_request` names, and `judge`
    gives each its verdict (None: it goes on unchanged)."""

    def wants_request(self, api_key: int, api_version: int) -> bool:
        raise NotImplementedError

    def judge(self, header: kafka_wire.RequestHeader, body: dict[str, Any],
              conn: ConnectionInfo) -> RequestVerdict | None:
        raise NotImplementedError

    def wants(self, api_key: int, api_version: int, direction: Direction) -> bool:
        return direction == REQUEST and self.wants_request(api_key, api_version)

    def on_request(self, ctx: RequestContext) -> None:
        ctx.decide(self.judge(ctx.header, ctx.body, ctx.conn))
