"""Observe classic group rebalances (KIP-559): decode every JoinGroup/SyncGroup payload.

An observing filter: it never changes a frame. Per connection it keeps a
`kafka_wire.GroupProtocolTracker`, fed with

- JoinGroup/SyncGroup *requests*, through `on_request` (the session holds such a
  request until it is complete, decodes it and forwards it unchanged), and
- their *responses*, through `on_response`.

Each member subscription and assignment is decoded with the decoder of its protocol
type ("consumer", "connect"), taken from the message when it says (JoinGroupRequest,
JoinGroupResponse v7+, SyncGroup v5+) and from the connection's JoinGroup exchange
when it does not; every result names the path it took. A SyncGroupRequest v5+ whose
ProtocolType/ProtocolName disagree with the group's is logged as a warning, and its
companion `GroupProtocolGuard` (a request filter sharing the observer's tracker)
answers it with INCONSISTENT_GROUP_PROTOCOL, as the coordinator would (KIP-559): the
request never reaches the broker. The guard judges only groups whose protocol a
successful JoinGroup response on this connection established.

Without request observation (a session that does not hold requests) responses are
still decoded when they carry their protocol type (JoinGroupResponse v7+, SyncGroup
v5+); older ones are reported with path "unknown".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import kafka_wire
from ext_proc.connection import ConnectionInfo
from ext_proc.filters import (
    REQUEST,
    BaseFilter,
    Direction,
    RequestContext,
    RequestJudge,
    RequestVerdict,
    ResponseContext,
)
from kafka_wire import ApiKey, ErrorCode
from kafka_wire.codec import RequestHeader
from kafka_wire.error_responses import error_response
from kafka_wire.group_protocol import (
    GroupObservation,
    GroupProtocolTracker,
)

log = logging.getLogger(__name__)

ObservationSink = Callable[[ConnectionInfo, GroupObservation], None]


class GroupProtocolObserver(BaseFilter):
    api_keys = frozenset({ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})
    # It reports and feeds the guard below, whose answer the broker gives as well
    # (KIP-559: the coordinator checks a SyncGroup's protocol type and name too). A
    # hand-off that fails forwards both ways, so the tracker never sees half a pair.
    may_miss_frames = True

    def __init__(self, sink: ObservationSink | None = None) -> None:
        self.tracker = GroupProtocolTracker()
        self._sink = sink
        self._known: dict[tuple[int, int], bool] = {}

    # -- the contract --------------------------------------------------------------

    def wants(self, api_key: int, api_version: int, direction: Direction = REQUEST) -> bool:
        """Both directions of JoinGroup and SyncGroup, in the versions the codec reads."""
        if api_key not in self.api_keys:
            return False
        known = self._known.get((api_key, api_version))
        if known is None:
            versions = kafka_wire.supported_versions(api_key)
            known = versions is not None and versions[0] <= api_version <= versions[1]
            self._known[(api_key, api_version)] = known
        return known

    def on_request(self, ctx: RequestContext) -> None:
        header = ctx.header
        observation = self.tracker.on_request(
            header.api_key, header.api_version, ctx.body, header.correlation_id
        )
        self._report(observation, ctx.conn)

    def on_response(self, ctx: ResponseContext) -> None:
        # The response contract carries no correlation id: Kafka answers in order, so
        # the tracker matches the oldest unanswered request of this API.
        self._report(self.tracker.on_response(ctx.api_key, ctx.api_version, ctx.body),
                     ctx.conn)

    def guard(self) -> GroupProtocolGuard:
        """The request filter that answers inconsistent SyncGroups from this tracker."""
        return GroupProtocolGuard(self)

    # -- reporting -----------------------------------------------------------------

    def _report(self, observation: GroupObservation, conn: ConnectionInfo) -> None:
        for p in observation.payloads:
            if p.error is not None:
                log.info("%s of group %r member %r (%s, path %s) not decoded: %s (%s)",
                         p.api, p.group_id, p.member_id, p.protocol_type, p.path, p.error,
                         conn.describe())
            elif log.isEnabledFor(logging.DEBUG):
                log.debug("%s group %r member %r %s/%s via %s: %r (%s)", p.api, p.group_id,
                          p.member_id, p.protocol_type, p.protocol_name, p.path,
                          p.payload, conn.describe())
        for i in observation.inconsistencies:
            log.warning("SyncGroup of group %r member %r: %s %r differs from the group's %r "
                        "(INCONSISTENT_GROUP_PROTOCOL) (%s)", i.group_id, i.member_id,
                        i.field, i.actual, i.expected, conn.describe())
        if self._sink is not None and (observation.payloads or observation.inconsistencies):
            self._sink(conn, observation)


# SyncGroup carries ProtocolType/ProtocolName from v5 (KIP-559).
SYNC_GROUP_PROTOCOL_VERSION = 5


class GroupProtocolGuard(RequestJudge):
    """Answers a SyncGroup v5+ that names another protocol than its group's.

    Runs after the observer (observers see a request before request filters), so the
    observer's tracker has already recorded the request; an answered request gets no
    broker response, so it is cancelled there.
    """

    may_miss_frames = True  # the broker answers INCONSISTENT_GROUP_PROTOCOL itself

    def __init__(self, observer: GroupProtocolObserver) -> None:
        self._observer = observer

    def wants_request(self, api_key: int, api_version: int) -> bool:
        return (api_key == ApiKey.SYNC_GROUP and api_version >= SYNC_GROUP_PROTOCOL_VERSION
                and self._observer.wants(api_key, api_version))

    def judge(self, header: RequestHeader, body: dict[str, Any],
              conn: ConnectionInfo) -> RequestVerdict | None:
        """The answer to an inconsistent SyncGroup, None for a consistent one."""
        tracker = self._observer.tracker
        conflicts = tracker.conflicts(body["GroupId"], body["MemberId"], body.get("ProtocolType"),
                                      body.get("ProtocolName"), confirmed=True)
        if not conflicts:
            return None
        tracker.cancel(ApiKey.SYNC_GROUP, header.correlation_id)
        first = conflicts[0]
        message = (f"{first.field} {first.actual!r} differs from the group's {first.expected!r}")
        log.info("SyncGroup of group %r answered INCONSISTENT_GROUP_PROTOCOL: %s (%s)",
                 first.group_id, message, conn.describe())
        return RequestVerdict(answer=error_response(
            ApiKey.SYNC_GROUP, header.api_version, body, ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
            message))
