"""KIP-559 on a real consumer group through the real gateway.

Two kafka-python consumers form one group through the gateway: one speaks JoinGroup
v7 / SyncGroup v5 (self-describing: ProtocolType/ProtocolName in every message), the
other is pinned to Kafka 2.3's versions (JoinGroup v5 / SyncGroup v3, which lack
them). The gateway runs in child processes, so to see what went over the wire the
test puts a recording relay in front of it: a mini gateway that forwards bytes to
the gateway's listener, records every frame, and (like the gateway itself) rewrites
the broker addresses in Metadata/FindCoordinator answers to point at itself, so the
clients' every connection keeps going through it.

Each recorded connection is replayed through a `GroupProtocolTracker`, and the
subscriptions and assignments it decodes must agree with what the consumers report:
via the message for the new member, via connection memory for the pinned one.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from kafka import KafkaConsumer
from kafka.coordinator.assignors.range import RangePartitionAssignor

import kafka_wire as kw
from kafka_wire import ApiKey
from kafka_wire.group_protocol import CONSUMER, DecodedGroupPayload, GroupProtocolTracker
from keg.gateway import Gateway
from tests.integration.conftest import create_topic
from tests.integration.relay import Connection, RecordingRelay

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PARTITIONS = 4
OLD, NEW = "kip559-old", "kip559-new"  # client ids
OLD_API_VERSION = (2, 3)  # kafka-python: JoinGroup v5, SyncGroup v3


# -- the group --------------------------------------------------------------------------


class Member:
    """A kafka-python consumer polling on its own thread."""

    def __init__(self, client_id: str, bootstrap: str, topic: str, group: str,
                 api_version: tuple[int, int] | None) -> None:
        self.client_id = client_id
        config: dict[str, Any] = dict(
            bootstrap_servers=bootstrap, group_id=group, client_id=client_id,
            auto_offset_reset="earliest", enable_auto_commit=False,
            session_timeout_ms=10_000, heartbeat_interval_ms=300,
            partition_assignment_strategy=[RangePartitionAssignor],
        )
        if api_version is not None:
            config["api_version"] = api_version
        self.consumer = KafkaConsumer(topic, **config)
        self.assignment: frozenset[tuple[str, int]] = frozenset()
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=client_id, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.consumer.poll(timeout_ms=100)
                self.assignment = frozenset(
                    (tp.topic, tp.partition) for tp in self.consumer.assignment())
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def close(self) -> None:
        self.stop()
        self.consumer.close(autocommit=False)


def wait_until(predicate: Any, timeout: float, what: str, members: list[Member]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for m in members:
            assert not m.errors, f"{m.client_id}: {m.errors!r}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}: " + ", ".join(
            f"{m.client_id}={sorted(m.assignment)}" for m in members)
        time.sleep(0.1)


def settled(members: list[Member], topic: str) -> bool:
    a, b = (m.assignment for m in members)
    everything = {(topic, p) for p in range(PARTITIONS)}
    return bool(a) and bool(b) and a | b == everything and not a & b


# -- replaying the recording through the tracker ------------------------------------------


@dataclass
class Replay:
    client_id: str
    versions: dict[int, set[int]]  # api key -> versions this member used for it
    payloads: list[DecodedGroupPayload]
    member_id: str  # from this member's last successful JoinGroupResponse


def replay(connection: Connection) -> Replay:
    tracker = GroupProtocolTracker()
    versions: dict[int, set[int]] = {ApiKey.JOIN_GROUP: set(), ApiKey.SYNC_GROUP: set()}
    payloads: list[DecodedGroupPayload] = []
    member_id = ""
    for rec in sorted(connection.frames, key=lambda r: r.seq):
        if rec.api_key not in (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP):
            continue
        versions[rec.api_key].add(rec.api_version)
        if rec.direction == "request":
            header, body = kw.decode_request(rec.frame)
            observation = tracker.on_request(rec.api_key, rec.api_version, body,
                                             header.correlation_id)
        else:
            correlation_id, body = kw.decode_response(rec.frame, rec.api_key, rec.api_version)
            observation = tracker.on_response(rec.api_key, rec.api_version, body, correlation_id)
            if rec.api_key == ApiKey.JOIN_GROUP and body["ErrorCode"] == 0:
                member_id = body["MemberId"]
        assert observation.inconsistencies == ()
        payloads += observation.payloads
    assert connection.client_id is not None
    return Replay(connection.client_id, versions, payloads, member_id)


def assigned(p: DecodedGroupPayload) -> frozenset[tuple[str, int]]:
    assert p.payload is not None, p.error
    return frozenset(
        (tp["Topic"], partition)
        for tp in p.payload.fields["AssignedPartitions"] for partition in tp["Partitions"])


@pytest.mark.parametrize("leader", [OLD, NEW])
def test_group_payloads_decode_on_old_and_new_versions(
        gateway: Gateway, relay: RecordingRelay, leader: str) -> None:
    topic = create_topic(gateway.bootstrap, partitions=PARTITIONS)
    group = f"kip559-{uuid.uuid4().hex[:8]}"
    api_versions = {OLD: OLD_API_VERSION, NEW: None}
    follower = NEW if leader == OLD else OLD
    members: list[Member] = []
    try:
        # The first member alone owns everything; the second joins and the first,
        # which stays the group's leader, hands it half of the partitions.
        first = Member(leader, relay.bootstrap, topic, group, api_versions[leader])
        members.append(first)
        wait_until(lambda: len(first.assignment) == PARTITIONS, 60, "the first member", members)
        members.append(Member(follower, relay.bootstrap, topic, group, api_versions[follower]))
        wait_until(lambda: settled(members, topic), 60, "the group to settle", members)
        time.sleep(1.0)  # still settled a second later: no rebalance in flight
        wait_until(lambda: settled(members, topic), 30, "the group to settle", members)
        reported = {m.client_id: m.assignment for m in members}
        connections = relay.snapshot()
    finally:
        for m in members:
            m.close()

    # Each member's coordinator connection(s), replayed one by one (the tracker's memory
    # is per connection), in the order they were used.
    replays: dict[str, Replay] = {}
    group_conns = [c for c in connections if any(r.api_key == ApiKey.JOIN_GROUP for r in c.frames)]
    for conn in sorted(group_conns, key=lambda c: c.frames[0].seq):
        r = replay(conn)
        if r.client_id in replays:
            earlier = replays[r.client_id]
            for key, used in earlier.versions.items():
                r.versions[key] |= used
            r.payloads[:0] = earlier.payloads
            r.member_id = r.member_id or earlier.member_id
        replays[r.client_id] = r
    assert set(replays) == {OLD, NEW}

    # The versions each member really used.
    assert replays[OLD].versions == {ApiKey.JOIN_GROUP: {5}, ApiKey.SYNC_GROUP: {3}}
    assert min(replays[NEW].versions[ApiKey.JOIN_GROUP]) >= 7
    assert min(replays[NEW].versions[ApiKey.SYNC_GROUP]) >= 5
    expected_path = {OLD: "connection-memory", NEW: "message"}

    member_ids = {name: r.member_id for name, r in replays.items()}
    for name, r in replays.items():
        for p in r.payloads:
            assert p.error is None, p
            assert p.protocol_type == CONSUMER and p.group_id == group
            assert p.path == ("message" if p.api == "JoinGroupRequest" else expected_path[name])
            if p.api != "SyncGroupResponse":
                assert p.protocol_name == "range"  # JoinGroupRequest names what it offers

        # Every subscription (its own, and on the leader everyone's) names the topic.
        subs = [p for p in r.payloads if p.api in ("JoinGroupRequest", "JoinGroupResponse")]
        assert subs and all(p.payload is not None and p.payload.fields["Topics"] == [topic]
                            for p in subs)

        # Its last assignment, decoded from the SyncGroupResponse, is what it reports.
        answers = [p for p in r.payloads if p.api == "SyncGroupResponse"]
        assert answers[-1].member_id == member_ids[name]
        assert assigned(answers[-1]) == reported[name]

    # The leader's members' metadata (JoinGroupResponse) and the assignments it sent
    # (SyncGroupRequest) cover both members, on the leader's own path.
    lead = replays[leader]
    last_join = [p for p in lead.payloads if p.api == "JoinGroupResponse"][-2:]
    assert {p.member_id for p in last_join} == set(member_ids.values())
    assert {p.path for p in last_join} == {expected_path[leader]}
    sent = {p.member_id: assigned(p) for p in lead.payloads if p.api == "SyncGroupRequest"}
    assert sent == {member_ids[name]: reported[name] for name in (OLD, NEW)}
    # The follower's JoinGroupResponse carries no members and it assigns nothing.
    assert not [p for p in replays[follower].payloads
                if p.api in ("JoinGroupResponse", "SyncGroupRequest")]
