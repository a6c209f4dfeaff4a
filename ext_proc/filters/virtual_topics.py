"""Virtual topics: each tenant sees its own namespace of topics.

A `virtual_topics` rule (`{prefix: "tenant-a.", groups: true, transactional_ids:
true}`) matched by the usual matchers (principals, listeners, client addresses, client
ids, ...) gives the matching connections a namespace: the client says `orders`, the
broker stores `tenant-a.orders`. The first matching rule in evaluation order decides,
per request; a connection no rule matches is left alone, and with no such rule in the
rule set the filter asks for no request at all.

Requests are renamed client -> broker in place (every later filter and rule sees the
broker's names); the broker's answer, or a later filter's own answer, is renamed back
by the verdict's patch, which also drops what lies outside the namespace (other
tenants' topics in a Metadata of all topics, their groups in ListGroups, internal
topics). The walk is `kafka_wire.entity_names`; here are what it cannot know alone:

- group payloads (KIP-559): the ConsumerProtocol bytes of JoinGroup and SyncGroup,
  decoded with the protocol type the message carries, or the one this connection's
  JoinGroup said (SyncGroup before v5);
- regular expressions (ConsumerGroupHeartbeat SubscribedTopicRegex, ListTransactions
  TransactionalIdPattern): the broker matches them in full (RE2/J `matches()`), so
  the client's `R` becomes `<escaped prefix>(?:R)`, which matches only names of the
  namespace. A `^` (or `\\A`) where the client's name starts is dropped, wherever the
  pattern puts it (`^a`, `(^a.*)` as librdkafka sends it, `^a|^b`): after the prefix it
  could never match. A pattern RE2 refuses is answered INVALID_REGULAR_EXPRESSION with
  the reason, never forwarded, and the broker's messages quote the client's pattern.

Dry-run `virtual_topics` rules rename nothing (renaming cannot be half done).
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import kafka_wire
from ext_proc.connection import ConnectionInfo
from ext_proc.filters import RequestVerdict
from ext_proc.filters.rules import RuleEngine, RuleSetJudge
from ext_proc.identity import IdentityTracker
from filter_rules import CompiledRuleSet
from filter_rules.patterns import PatternError, compile_re2
from filter_rules.record_actions import VirtualTopicsAction
from kafka_wire import ApiKey, ErrorCode
from kafka_wire.entity_names import (
    GROUP,
    TOPIC,
    TRANSACTIONAL_ID,
    EntityNameError,
    Rename,
    named_entities,
    names_entities,
    names_topic_ids,
    rename_entities,
    rename_group_payload,
)
from kafka_wire.error_responses import error_response

log = logging.getLogger(__name__)



class ForeignTopicId(EntityNameError):
    """A request names a topic id outside the connection's namespace (or unknown)."""


class InvalidTopicName(EntityNameError):
    """A client's topic name Kafka would refuse, which its prefix would make valid."""


# Kafka's limit on a topic name, and the characters it allows (Topic.validate).
_MAX_TOPIC_LENGTH = 249
_LEGAL_TOPIC_CHARACTERS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
# The requests that create topics (Metadata by auto-creation).
_CREATING = frozenset({ApiKey.CREATE_TOPICS, ApiKey.METADATA})

# Kafka's CreateTopics refusal of a name that differs from an existing topic's only by
# '.' and '_' (Topic.hasCollision): the topic it names may be outside the namespace.
_COLLIDES = re.compile(r"collides with existing topic: ([A-Za-z0-9._-]+)")

# Kafka 4.0's error for a refused regex subscription (KIP-848); not in older tables.
_MAX_GROUPS = 64  # JoinGroup protocol types remembered per connection


@dataclass(frozen=True)
class Namespace:
    """One prefix, and the two directions of renaming it implies."""

    prefix: str
    groups: bool = True
    transactional_ids: bool = True
    to_broker: dict[str, Rename] = field(init=False, repr=False, compare=False)
    to_client: dict[str, Rename] = field(init=False, repr=False, compare=False)
    # The prefix where a name starts (not inside another name): a literal, escaped, so
    # linear whatever the message.
    quoted: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        prefix, size = self.prefix, len(self.prefix)

        # "": no name (Kafka's Java client names a topic it looks up by id so in Metadata).
        def add(name: str) -> str:
            return prefix + name if name else name

        def strip(name: str) -> str | None:
            return name[size:] if name.startswith(prefix) else None if name else name

        kinds = [TOPIC] + ([GROUP] if self.groups else []) + (
            [TRANSACTIONAL_ID] if self.transactional_ids else [])
        object.__setattr__(self, "to_broker", dict.fromkeys(kinds, add))
        object.__setattr__(self, "to_client", dict.fromkeys(kinds, strip))
        object.__setattr__(self, "quoted", re.compile(r"(?<![A-Za-z0-9._-])" + re.escape(prefix)))

    @property
    def regex_prefix(self) -> str:
        # RE2 and RE2/J accept a backslash before any punctuation.
        return "".join(c if c.isalnum() or c == "_" else "\\" + c for c in self.prefix)

    def anchor(self, pattern: str) -> str:
        """The broker-side regex for a client's; PatternError if RE2 refuses it."""
        inner = _without_start_anchors(pattern)
        compile_re2(inner)  # balanced on its own: `(?:inner)` cannot be left
        anchored = f"{self.regex_prefix}(?:{inner})"
        compile_re2(anchored)  # e.g. a `\Q` without `\E` swallows the `)`
        return anchored

    def check_topic(self, name: str) -> None:
        """InvalidTopicName, with Kafka's reason, when the broker would refuse `name`
        were it not prefixed (`""` would become the topic `tenant-a.`); the length
        left is what the prefix leaves of Kafka's 249."""
        longest = _MAX_TOPIC_LENGTH - len(self.prefix)
        if name in ("", ".", ".."):
            why = "the empty string is not allowed" if not name else f"'{name}' is not allowed"
        elif len(name) > longest:
            why = f"the length of '{name}' is longer than the max allowed length {longest}"
        elif not _LEGAL_TOPIC_CHARACTERS.issuperset(name):
            why = (f"'{name}' contains one or more characters other than ASCII "
                   "alphanumerics, '.', '_' and '-'")
        else:
            return
        raise InvalidTopicName(f"Topic name is invalid: {why}")

    def strip_from_message(self, message: str, patterns: dict[str, str] | None = None) -> str:
        """A broker's error message without the prefix of the names it quotes: it would
        tell the tenant its namespace (`Topic 'tenant-a.orders' already exists.`), with
        the client's own patterns for the ones sent in their place (`patterns`), and
        without a name outside the namespace (a topic a new one collides with)."""
        for anchored, pattern in (patterns or {}).items():
            message = message.replace(anchored, pattern)
        message = _COLLIDES.sub(
            lambda m: m.group() if m.group(1).startswith(self.prefix)
            else "collides with an existing topic", message)
        return self.quoted.sub("", message) if self.prefix in message else message

    def unanchor(self, pattern: str) -> str | None:
        head = f"{self.regex_prefix}(?:"
        if pattern.startswith(head) and pattern.endswith(")"):
            return pattern[len(head):-1]
        return None


class VirtualTopicsFilter(RuleSetJudge):
    def __init__(self, engine: RuleEngine, identity: IdentityTracker) -> None:
        super().__init__(engine, identity)
        self._seen: CompiledRuleSet | None = None
        self._active = False
        self._namespaces: dict[tuple[str, bool, bool], Namespace] = {}
        # broker group id -> protocol type of this connection's last JoinGroup
        self._protocol_types: OrderedDict[str, str] = OrderedDict()

    # -- the contract --------------------------------------------------------------

    def wants_request(self, api_key: int, api_version: int) -> bool:
        compiled = self._engine.compiled
        if compiled is not self._seen:
            self._seen = compiled
            self._active = any(r.kind == "virtual_topics" and not r.dry_run
                               for r in compiled.rules)
        return self._active and _names_anything(api_key, api_version)

    def judge(
        self, header: kafka_wire.RequestHeader, body: dict[str, Any], conn: ConnectionInfo
    ) -> RequestVerdict | None:
        ns = self.namespace(header, conn)
        if ns is None:
            return None
        key, version = header.api_key, header.api_version
        patterns: dict[str, str] = {}
        try:
            changed = self._rename_request(key, version, body, ns, patterns)
        except (EntityNameError, PatternError) as err:
            return self._refuse(header, body, ns, err)
        protocol_type = self._request_protocol_type(key, version, body)

        def patch(response: dict[str, Any]) -> bool:
            return self._rename_response(key, version, response, ns, protocol_type, patterns)

        return RequestVerdict(changed=changed, patch=patch)

    # -- who is a tenant -------------------------------------------------------------

    def namespace(self, header: kafka_wire.RequestHeader,
                  conn: ConnectionInfo) -> Namespace | None:
        """The namespace of the connection's first matching virtual-topics rule, if any."""
        compiled = self._engine.compiled
        ctx = self._match_context(header, conn, self._principal(), conn.client_host)
        for rule in compiled.candidates(header.api_key, header.api_version, "request"):
            if rule.kind != "virtual_topics" or rule.dry_run or not rule.matches(ctx):
                continue
            assert isinstance(rule.action, VirtualTopicsAction)
            spec = rule.action.virtual_topics
            key = (spec.prefix, spec.groups, spec.transactional_ids)
            ns = self._namespaces.get(key)
            if ns is None:
                ns = self._namespaces[key] = Namespace(*key)
            return ns
        return None

    # -- requests ----------------------------------------------------------------------

    def _rename_request(self, key: int, version: int, body: dict[str, Any],
                        ns: Namespace, patterns: dict[str, str]) -> bool:
        """Rename `body` for the broker; `patterns` gets each regex sent in place of the
        client's (the broker's messages quote it)."""
        topics = body.get("Topics") or []
        if key == ApiKey.DELETE_TOPICS and any(t.get("Name") is None for t in topics):
            # The answer would hide a foreign topic, but only after the broker deleted it.
            raise EntityNameError("virtual topics: DeleteTopics by topic id is not supported; "
                                  "name the topics")
        self._confine_topic_ids(key, version, body, ns)
        if key in _CREATING:
            for topic in topics:
                if isinstance(topic.get("Name"), str) and not _by_id(topic):
                    ns.check_topic(topic["Name"])
        changed = self._anchor_patterns(key, body, ns, patterns)  # may refuse: before renames
        changed |= rename_entities(key, version, "request", body, ns.to_broker)
        if key == ApiKey.JOIN_GROUP:
            protocol_type = body.get("ProtocolType")
            for p in body.get("Protocols") or []:
                new = rename_group_payload(protocol_type, "subscription", p.get("Metadata"),
                                           ns.to_broker)
                if new is not None:
                    p["Metadata"], changed = new, True
            if isinstance(protocol_type, str):
                self._remember(body["GroupId"], protocol_type)
        elif key == ApiKey.SYNC_GROUP:
            protocol_type = self._request_protocol_type(key, version, body)
            for a in body.get("Assignments") or []:
                new = rename_group_payload(protocol_type, "assignment", a.get("Assignment"),
                                           ns.to_broker)
                if new is not None:
                    a["Assignment"], changed = new, True
        return changed

    def _confine_topic_ids(self, key: int, version: int, body: dict[str, Any],
                           ns: Namespace) -> None:
        """Ids are not renamed (a tenant's id is its broker topic's): an id must name a
        topic of the namespace. One the gateway cannot name, or another tenant's, is
        answered as unknown (a foreign topic's existence is not confirmed)."""
        if not names_topic_ids(key, version, "request"):
            return
        topic_ids = self._engine.topic_ids
        for topic_id in named_entities(key, version, "request", body).topic_ids:
            name = topic_ids.name(topic_id)
            if name is None or ns.to_client[TOPIC](name) is None:
                raise ForeignTopicId(f"topic id {topic_id} is not a topic of this namespace")

    @staticmethod
    def _anchor_patterns(key: int, body: dict[str, Any], ns: Namespace,
                         patterns: dict[str, str]) -> bool:
        field_name = ("SubscribedTopicRegex" if key == ApiKey.CONSUMER_GROUP_HEARTBEAT
                      else "TransactionalIdPattern"
                      if key == ApiKey.LIST_TRANSACTIONS and ns.transactional_ids else None)
        if field_name is None or not (pattern := body.get(field_name)):
            return False
        anchored = body[field_name] = ns.anchor(pattern)
        patterns[anchored] = pattern
        return True

    def _request_protocol_type(self, key: int, version: int, body: dict[str, Any]) -> str | None:
        if key == ApiKey.JOIN_GROUP:
            found = body.get("ProtocolType")
            return found if isinstance(found, str) else None
        if key != ApiKey.SYNC_GROUP:
            return None
        said = body.get("ProtocolType") if version >= 5 else None
        if isinstance(said, str):
            return said
        return self._protocol_types.get(body.get("GroupId", ""))

    def _remember(self, group_id: str, protocol_type: str) -> None:
        self._protocol_types[group_id] = protocol_type
        self._protocol_types.move_to_end(group_id)
        while len(self._protocol_types) > _MAX_GROUPS:
            self._protocol_types.popitem(last=False)

    def _refuse(self, header: kafka_wire.RequestHeader, body: dict[str, Any], ns: Namespace,
                err: Exception) -> RequestVerdict:
        if isinstance(err, ForeignTopicId):
            code, what = ErrorCode.UNKNOWN_TOPIC_ID, "topic id"
        elif isinstance(err, InvalidTopicName):
            code, what = ErrorCode.INVALID_TOPIC_EXCEPTION, "topic name"
        elif isinstance(err, PatternError):
            code, what = ErrorCode.INVALID_REGULAR_EXPRESSION, "regular expression"
        else:
            code, what = ErrorCode.INVALID_REQUEST, "request"
        message = f"virtual topics: {what} refused: {err}"
        log.info("%s (%s)", message, header.client_id)
        answer = error_response(header.api_key, header.api_version, body, code, message)
        if not isinstance(err, InvalidTopicName):  # refused before any name was renamed
            rename_entities(header.api_key, header.api_version, "response", answer, ns.to_client)
        return RequestVerdict(answer=answer)

    # -- responses -----------------------------------------------------------------

    def _rename_response(self, key: int, version: int, response: dict[str, Any],
                         ns: Namespace, protocol_type: str | None,
                         patterns: dict[str, str]) -> bool:
        changed = rename_entities(key, version, "response", response, ns.to_client)
        changed |= _strip_messages(response, ns, patterns)
        if key == ApiKey.JOIN_GROUP:
            said = response.get("ProtocolType") if version >= 7 else None
            ptype = said if isinstance(said, str) else protocol_type
            for m in response.get("Members") or []:
                new = rename_group_payload(ptype, "subscription", m.get("Metadata"),
                                           ns.to_client)
                if new is not None:
                    m["Metadata"], changed = new, True
        elif key == ApiKey.SYNC_GROUP:
            said = response.get("ProtocolType") if version >= 5 else None
            ptype = said if isinstance(said, str) else protocol_type
            new = rename_group_payload(ptype, "assignment", response.get("Assignment"),
                                       ns.to_client)
            if new is not None:
                response["Assignment"], changed = new, True
        elif key == ApiKey.CONSUMER_GROUP_DESCRIBE:
            for group in response.get("Groups") or []:
                for member in group.get("Members") or []:
                    regex = member.get("SubscribedTopicRegex")
                    if regex:
                        member["SubscribedTopicRegex"] = ns.unanchor(regex)
                        changed = True
        return changed


def _strip_messages(value: Any, ns: Namespace, patterns: dict[str, str]) -> bool:
    """Every error message of an answer (`ErrorMessage`, Produce's
    `BatchIndexErrorMessage`, ShareAcknowledge's `AcknowledgeErrorMessage`), at any
    depth, without the namespace: its prefix, the regex sent for the client's, a name
    outside it."""
    changed = False
    if isinstance(value, dict):
        for key, item in value.items():
            if key.endswith("ErrorMessage") and isinstance(item, str):
                stripped = ns.strip_from_message(item, patterns)
                if stripped != item:
                    value[key], changed = stripped, True
            elif isinstance(item, (dict, list)):
                changed |= _strip_messages(item, ns, patterns)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)):
                changed |= _strip_messages(item, ns, patterns)
    return changed


def _by_id(topic: dict[str, Any]) -> bool:
    """A Metadata entry that looks its topic up by id (its name then says nothing)."""
    topic_id = topic.get("TopicId")
    return topic_id is not None and topic_id.int != 0


def _without_start_anchors(pattern: str) -> str:
    """`pattern` without the `^` and `\\A` that stand where a match begins: at its start,
    at the start of a group that starts there, after a `|` of such a group (flag groups
    and other anchors match nothing, so they leave a place where it was). Elsewhere an
    anchor cannot match after a prefix either, and there it never could: it stays."""
    out: list[str] = []
    at_start = [True]  # per open group: whether it begins where the match does
    here = True  # whether nothing has been matched since where the match begins
    i, size = 0, len(pattern)
    while i < size:
        c = pattern[i]
        if c == "\\":
            escaped = pattern[i + 1:i + 2]
            if escaped == "A" and here:
                i += 2
                continue
            if escaped == "Q":  # a literal up to \E
                end = pattern.find("\\E", i + 2)
                stop = size if end < 0 else end + 2
                here = here and stop - i <= 4
                out.append(pattern[i:stop])
                i = stop
                continue
            out.append(pattern[i:i + 2])
            here = here and escaped in ("b", "B", "z")
            i += 2
        elif c == "[":
            j = i + 1
            j += pattern.startswith("^", j)
            j += pattern.startswith("]", j)
            while j < size and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else (
                    pattern.find(":]", j) + 2 if pattern.startswith("[:", j)
                    and pattern.find(":]", j) > 0 else 1)
            out.append(pattern[i:j + 1])
            here, i = False, j + 1
        elif c == "(":
            flags = _FLAG_GROUP.match(pattern, i)
            if flags is not None:  # (?i): no group, matches nothing
                out.append(flags.group())
                i = flags.end()
                continue
            head = _GROUP_HEAD.match(pattern, i)
            length = head.end() - i if head is not None else 1
            out.append(pattern[i:i + length])
            at_start.append(here)
            i += length
        elif c == ")":
            if len(at_start) > 1:
                at_start.pop()
            out.append(c)
            here, i = False, i + 1
        elif c == "|":
            out.append(c)
            here, i = at_start[-1], i + 1
        elif c == "^":
            if not here:
                out.append(c)
            elif pattern[i + 1:i + 2] in ("*", "+", "?", "{"):
                out.append("(?:)")  # what the quantifier repeats
            i += 1
        elif c in "$*+?{":
            out.append(c)  # (a quantifier of a dropped anchor repeats nothing)
            i += 1
        else:
            out.append(c)
            here, i = False, i + 1
    return "".join(out)


# `(?flags)` alone, and the head of a group: `(?:`, `(?flags:`, `(?P<name>`, `(?<name>`.
_FLAG_GROUP = re.compile(r"\(\?[a-zA-Z-]+\)")
_GROUP_HEAD = re.compile(r"\(\?(?:P?<[^>]*>|[a-zA-Z-]*:)")


_NAMING: dict[tuple[int, int], bool] = {}


def _names_anything(api_key: int, api_version: int) -> bool:
    """Whether a request must pass through the renaming: it names an entity, or the
    codec cannot tell (an API or version it does not know: decoding then fails and the
    connection is closed rather than let a name through unprefixed)."""
    slot = (api_key, api_version)
    found = _NAMING.get(slot)
    if found is None:
        versions = kafka_wire.supported_versions(api_key)
        known = versions is not None and versions[0] <= api_version <= versions[1]
        found = _NAMING[slot] = (not known) or names_entities(api_key, api_version) or \
            names_topic_ids(api_key, api_version, "request")
    return found
