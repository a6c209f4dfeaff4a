"""Group protocol payloads (KIP-559): the opaque bytes inside JoinGroup and SyncGroup.

A classic group's coordinator never reads the member metadata (JoinGroup) or the
assignments (SyncGroup): their format belongs to the *protocol type* the members
agreed on. Two are decoded here, keyed by protocol type:

- "consumer" (ConsumerProtocol): Subscription v0-v3 and Assignment v0-v3, from the
  schemas `ConsumerProtocolSubscription` / `ConsumerProtocolAssignment`. On the wire:

      int16 version | struct at that version (non-flexible)

  Like Kafka's ConsumerProtocol, a version above the newest known one is read with the
  newest format, and trailing bytes are kept (in `GroupPayload.extra`), never refused.

- "connect" (Kafka Connect's ConnectProtocol and IncrementalCooperativeConnectProtocol;
  subprotocols "default" = eager, v0; "compatible", v1; "sessioned", v2). These are
  Kafka's old `Schema` types, written by hand below (STRING: int16 length, BYTES:
  int32 length, -1 = null; ARRAY: int32 count, -1 = null where nullable):

      WorkerState (JoinGroup metadata)
        v0:   int16 version | Url STRING | ConfigOffset INT64
        v1+:  v0 | Allocation NULLABLE_BYTES   (an Assignment v1+, or null when empty)
      Assignment (SyncGroup)
        v0:   int16 version | Error INT16 | Leader STRING | LeaderUrl STRING
              | ConfigOffset INT64 | Assignment [Connector STRING, Tasks [INT32]]
        v1+:  v0 (Assignment nullable) | Revoked [Connector, Tasks] (nullable)
              | ScheduledDelay INT32

  A task id of -1 (`CONNECTOR_TASK`) stands for the connector instance itself. Kafka
  reads the v1+ fields after ConfigOffset "tolerating missing fields": a payload may end
  early, and the missing fields are then absent from `fields` (and not written back).

`GroupProtocolTracker` is the per-connection memory that decides which decoder applies
to each JoinGroup/SyncGroup payload: the message's own ProtocolType/ProtocolName when
it carries them (JoinGroupRequest always; JoinGroupResponse v7+, SyncGroup v5+), else
what this connection's JoinGroup exchange said. Every decode says which it used.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Literal

from kafka_wire.codec import Buffer, decode_struct, encode_struct
from kafka_wire.enums import ApiKey, ErrorCode
from kafka_wire.errors import DecodeError, EncodeError, KafkaWireError, UnknownApiError

CONSUMER = "consumer"
CONNECT = "connect"
PROTOCOL_TYPES = (CONSUMER, CONNECT)

# Kafka Connect's subprotocol names (JoinGroup protocol names) -> the version they write.
CONNECT_SUBPROTOCOLS: Mapping[str, int] = {"default": 0, "compatible": 1, "sessioned": 2}
CONNECTOR_TASK = -1


Kind = Literal["subscription", "assignment"]
DecodePath = Literal["message", "connection-memory", "unknown"]

_CONSUMER_SCHEMAS: Mapping[str, str] = {
    "subscription": "ConsumerProtocolSubscription",
    "assignment": "ConsumerProtocolAssignment",
}
CONSUMER_MAX_VERSION = 3

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class GroupPayload:
    """A decoded subscription or assignment.

    `version` is the int16 the bytes start with; `fields` are keyed like Kafka's schema
    ("Topics", "OwnedPartitions"; for Connect "Url", "ConfigOffset", "Allocation", ...);
    `extra` holds bytes after the known fields (a newer version), written back as-is.
    """

    protocol_type: str
    kind: Kind
    version: int
    fields: dict[str, Any]
    extra: bytes = b""


# -- public entry points ---------------------------------------------------------------


def decode_subscription(protocol_type: str, data: Buffer) -> GroupPayload:
    """Decode JoinGroup member metadata of `protocol_type` ("consumer" or "connect")."""
    return _decode(protocol_type, "subscription", data)


def decode_assignment(protocol_type: str, data: Buffer) -> GroupPayload:
    """Decode a SyncGroup member assignment of `protocol_type`."""
    return _decode(protocol_type, "assignment", data)


def encode_payload(payload: GroupPayload) -> bytes:
    """The bytes of a subscription or assignment (byte-exact for what was decoded)."""
    if payload.protocol_type == CONSUMER:
        return _encode_consumer(payload)
    if payload.protocol_type == CONNECT:
        return _encode_connect(payload)
    raise UnknownApiError(f"no codec for group protocol type {payload.protocol_type!r}")


def encode_subscription(
    protocol_type: str, version: int, fields: dict[str, Any], extra: bytes = b""
) -> bytes:
    return encode_payload(GroupPayload(protocol_type, "subscription", version, fields, extra))


def encode_assignment(
    protocol_type: str, version: int, fields: dict[str, Any], extra: bytes = b""
) -> bytes:
    return encode_payload(GroupPayload(protocol_type, "assignment", version, fields, extra))


def _decode(protocol_type: str, kind: Kind, data: Buffer) -> GroupPayload:
    if protocol_type == CONSUMER:
        return _decode_consumer(kind, data)
    if protocol_type == CONNECT:
        reader = _OldReader(data, f"connect {kind}")
        version = reader.int16()
        if version < 0:
            raise DecodeError(f"connect {kind}: unsupported version {version}")
        if kind == "subscription":
            fields = _read_worker_state(reader, version)
        else:
            fields = _read_connect_assignment(reader, version)
        return GroupPayload(CONNECT, kind, version, fields, reader.rest())
    raise UnknownApiError(f"no codec for group protocol type {protocol_type!r}")


# -- consumer protocol (schema-driven) ---------------------------------------------------


def _decode_consumer(kind: Kind, data: Buffer) -> GroupPayload:
    if len(data) < 2:
        raise DecodeError(f"consumer {kind}: {len(data)} bytes, no version")
    (version,) = _I16.unpack_from(data, 0)
    if version < 0:
        raise DecodeError(f"consumer {kind}: unsupported version {version}")
    fields, end = decode_struct(
        _CONSUMER_SCHEMAS[kind], min(version, CONSUMER_MAX_VERSION), data, 2
    )
    return GroupPayload(CONSUMER, kind, version, fields, bytes(data[end:]))


def _encode_consumer(payload: GroupPayload) -> bytes:
    if payload.kind not in _CONSUMER_SCHEMAS:
        raise EncodeError(f"consumer payload kind {payload.kind!r}")
    if not 0 <= payload.version <= 0x7FFF:
        raise EncodeError(f"consumer {payload.kind}: version {payload.version}")
    body = encode_struct(
        _CONSUMER_SCHEMAS[payload.kind],
        min(payload.version, CONSUMER_MAX_VERSION),
        payload.fields,
    )
    return _I16.pack(payload.version) + body + bytes(payload.extra)


# -- Kafka Connect (hand-written old-style Schema types) -------------------------------


class _OldReader:
    """Kafka's pre-KIP-482 types over a buffer; every short read is a DecodeError."""

    __slots__ = ("buf", "off", "what")

    def __init__(self, buf: Buffer, what: str) -> None:
        self.buf = buf
        self.off = 0
        self.what = what

    def remaining(self) -> int:
        return len(self.buf) - self.off

    def _take(self, n: int) -> int:
        start = self.off
        if n < 0 or start + n > len(self.buf):
            raise DecodeError(f"{self.what}: truncated at byte {start}")
        self.off = start + n
        return start

    def int16(self) -> int:
        value: int = _I16.unpack_from(self.buf, self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _I32.unpack_from(self.buf, self._take(4))[0]
        return value

    def int64(self) -> int:
        value: int = _I64.unpack_from(self.buf, self._take(8))[0]
        return value

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise DecodeError(f"{self.what}: string length {n}")
        start = self._take(n)
        try:
            return str(self.buf[start : start + n], "utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"{self.what}: {exc}") from exc

    def nullable_bytes(self) -> bytes | None:
        n = self.int32()
        if n == -1:
            return None
        if n < 0:
            raise DecodeError(f"{self.what}: bytes length {n}")
        start = self._take(n)
        return bytes(self.buf[start : start + n])

    def array_count(self, nullable: bool, min_item: int) -> int:
        n = self.int32()
        if n == -1 and nullable:
            return -1
        if n < 0:
            raise DecodeError(f"{self.what}: array count {n}")
        if n * min_item > self.remaining():
            raise DecodeError(f"{self.what}: array of {n} runs past the end")
        return n

    def rest(self) -> bytes:
        return bytes(self.buf[self.off :])


def _read_connector_assignments(r: _OldReader, nullable: bool) -> list[dict[str, Any]] | None:
    n = r.array_count(nullable, 6)  # a connector entry is at least 2 + 4 bytes
    if n < 0:
        return None
    out: list[dict[str, Any]] = []
    for _ in range(n):
        connector = r.string()
        tasks = [r.int32() for _ in range(r.array_count(False, 4))]
        out.append({"Connector": connector, "Tasks": tasks})
    return out


def _read_worker_state(r: _OldReader, version: int) -> dict[str, Any]:
    fields: dict[str, Any] = {"Url": r.string(), "ConfigOffset": r.int64()}
    if version >= 1 and r.remaining():
        raw = r.nullable_bytes()
        fields["Allocation"] = None if raw is None else decode_assignment(CONNECT, raw)
    return fields


def _read_connect_assignment(r: _OldReader, version: int) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "Error": r.int16(),
        "Leader": r.string(),
        "LeaderUrl": r.string(),
        "ConfigOffset": r.int64(),
    }
    if version == 0:
        fields["Assignment"] = _read_connector_assignments(r, nullable=False)
        return fields
    # v1+: Kafka reads these three "tolerating missing fields with defaults".
    if r.remaining():
        fields["Assignment"] = _read_connector_assignments(r, nullable=True)
    if r.remaining():
        fields["Revoked"] = _read_connector_assignments(r, nullable=True)
    if r.remaining():
        fields["ScheduledDelay"] = r.int32()
    return fields


def _put_string(out: bytearray, value: Any, what: str) -> None:
    if not isinstance(value, str):
        raise EncodeError(f"{what} must be a str, not {type(value).__name__}")
    raw = value.encode("utf-8")
    if len(raw) > 0x7FFF:
        raise EncodeError(f"{what}: {len(raw)} bytes do not fit an int16 length")
    out += _I16.pack(len(raw))
    out += raw


def _put_connector_assignments(out: bytearray, value: Any, nullable: bool, what: str) -> None:
    if value is None:
        if not nullable:
            raise EncodeError(f"{what} cannot be null in this version")
        out += _I32.pack(-1)
        return
    out += _I32.pack(len(value))
    for entry in value:
        _put_string(out, entry["Connector"], f"{what}.Connector")
        tasks = entry["Tasks"]
        out += _I32.pack(len(tasks))
        for task in tasks:
            out += _I32.pack(task)


def _encode_connect(payload: GroupPayload) -> bytes:
    fields, version = payload.fields, payload.version
    what = f"connect {payload.kind}"
    out = bytearray()
    try:
        out += _I16.pack(version)
        if version < 0:
            raise EncodeError(f"{what}: version {version}")
        if payload.kind == "subscription":
            _put_string(out, fields["Url"], "Url")
            out += _I64.pack(fields["ConfigOffset"])
            if version >= 1 and "Allocation" in fields:
                allocation = fields["Allocation"]
                if allocation is None:
                    out += _I32.pack(-1)
                else:
                    raw = encode_payload(allocation)
                    out += _I32.pack(len(raw))
                    out += raw
        elif payload.kind == "assignment":
            out += _I16.pack(fields["Error"])
            _put_string(out, fields["Leader"], "Leader")
            _put_string(out, fields["LeaderUrl"], "LeaderUrl")
            out += _I64.pack(fields["ConfigOffset"])
            if version == 0:
                _put_connector_assignments(out, fields["Assignment"], False, "Assignment")
            else:
                _write_tolerant_tail(out, fields)
        else:
            raise EncodeError(f"connect payload kind {payload.kind!r}")
    except EncodeError:
        raise
    except (KeyError, TypeError, AttributeError, struct.error, OverflowError) as exc:
        raise EncodeError(f"{what}: {exc!r}") from exc
    return bytes(out) + bytes(payload.extra)


def _write_tolerant_tail(out: bytearray, fields: Mapping[str, Any]) -> None:
    """Assignment, Revoked, ScheduledDelay: written up to the first absent one."""
    names = ("Assignment", "Revoked", "ScheduledDelay")
    present = [name in fields for name in names]
    if any(later and not earlier for earlier, later in pairwise(present)):
        raise EncodeError(f"connect assignment: {names} must be present up to the first absent")
    if present[0]:
        _put_connector_assignments(out, fields["Assignment"], True, "Assignment")
    if present[1]:
        _put_connector_assignments(out, fields["Revoked"], True, "Revoked")
    if present[2]:
        out += _I32.pack(fields["ScheduledDelay"])


# -- which decoder: the per-connection tracker -------------------------------------------


@dataclass(frozen=True, slots=True)
class DecodedGroupPayload:
    """One payload of a JoinGroup/SyncGroup message, decoded (or why not).

    `path` says where the protocol type came from: "message" (the message carries it),
    "connection-memory" (an earlier JoinGroup exchange on this connection) or "unknown"
    (neither: `payload` is None). `error` is set when the bytes did not decode.
    """

    api: str  # "JoinGroupRequest", "JoinGroupResponse", "SyncGroupRequest", ...
    group_id: str | None
    member_id: str
    protocol_type: str | None
    protocol_name: str | None
    path: DecodePath
    payload: GroupPayload | None
    error: str | None = None
    raw: bytes = b""


@dataclass(frozen=True, slots=True)
class Inconsistency:
    """A SyncGroupRequest v5+ naming another ProtocolType/ProtocolName than the group's
    (KIP-559: the coordinator answers INCONSISTENT_GROUP_PROTOCOL, error 23)."""

    group_id: str
    member_id: str
    field: str  # "ProtocolType" or "ProtocolName"
    expected: str | None  # what this connection's JoinGroup exchange established
    actual: str | None  # what the SyncGroupRequest says
    error_code: int = ErrorCode.INCONSISTENT_GROUP_PROTOCOL


@dataclass(frozen=True, slots=True)
class GroupObservation:
    payloads: tuple[DecodedGroupPayload, ...] = ()
    inconsistencies: tuple[Inconsistency, ...] = ()


_NOTHING = GroupObservation()


@dataclass(slots=True)
class _GroupMemory:
    protocol_type: str  # from the JoinGroupRequest (or the JoinGroupResponse v7+)
    offered: tuple[str, ...]  # the JoinGroupRequest's protocol names
    protocol_name: str | None = None  # the JoinGroupResponse's choice
    generation_id: int = -1
    member_id: str = ""


@dataclass(slots=True)
class _Pending:
    correlation_id: int | None
    group_id: str
    member_id: str
    protocol_type: str | None
    protocol_name: str | None


@dataclass(slots=True)
class TrackerCounters:
    """Payloads decoded per path, undecodable ones, inconsistencies reported."""

    message: int = 0
    connection_memory: int = 0
    unknown: int = 0
    errors: int = 0
    inconsistencies: int = 0


class GroupProtocolTracker:
    """Per-connection memory of JoinGroup exchanges; decodes group payloads (sans-IO).

    Feed it every decoded JoinGroup/SyncGroup request and response of one connection,
    in stream order (other API keys are ignored): `on_request(api_key, version, body,
    correlation_id)` and `on_response(api_key, version, body, correlation_id)`. A
    response is matched to its request by correlation id, or, when None is passed, to
    the oldest unanswered request of its API (Kafka answers in order).

    Nothing here raises for bad payload bytes: a payload that does not decode is
    reported with its `error`.
    """

    def __init__(self, max_groups: int = 64, max_pending: int = 1024) -> None:
        self._groups: OrderedDict[str, _GroupMemory] = OrderedDict()
        self._pending: dict[int, OrderedDict[int, _Pending]] = {
            ApiKey.JOIN_GROUP: OrderedDict(),
            ApiKey.SYNC_GROUP: OrderedDict(),
        }
        self._max_groups = max_groups
        self._max_pending = max_pending
        self._seq = 0
        self.counters = TrackerCounters()

    # -- inputs ----------------------------------------------------------------

    def on_request(
        self, api_key: int, version: int, body: Mapping[str, Any], correlation_id: int | None = None
    ) -> GroupObservation:
        if api_key == ApiKey.JOIN_GROUP:
            return self._join_request(body, correlation_id)
        if api_key == ApiKey.SYNC_GROUP:
            return self._sync_request(version, body, correlation_id)
        return _NOTHING

    def on_response(
        self, api_key: int, version: int, body: Mapping[str, Any], correlation_id: int | None = None
    ) -> GroupObservation:
        if api_key not in self._pending:
            return _NOTHING
        pending = self._answered(api_key, correlation_id)
        if api_key == ApiKey.JOIN_GROUP:
            return self._join_response(version, body, pending)
        return self._sync_response(version, body, pending)

    def group_protocol(self, group_id: str) -> tuple[str, str | None] | None:
        """(protocol type, chosen protocol name) this connection knows for a group."""
        memory = self._groups.get(group_id)
        return None if memory is None else (memory.protocol_type, memory.protocol_name)

    def conflicts(
        self,
        group_id: str,
        member_id: str,
        protocol_type: str | None,
        protocol_name: str | None,
        *,
        confirmed: bool = False,
    ) -> tuple[Inconsistency, ...]:
        """How a SyncGroup's ProtocolType/ProtocolName (None: not given) disagree with
        what this connection knows of the group. With `confirmed`, only a group whose
        protocol a successful JoinGroup response established is judged."""
        memory = self._groups.get(group_id)
        if memory is None or (confirmed and memory.protocol_name is None):
            return ()
        return tuple(
            Inconsistency(group_id, member_id, fname, expected, actual)
            for fname, expected, actual in (
                ("ProtocolType", memory.protocol_type, protocol_type),
                ("ProtocolName", memory.protocol_name, protocol_name),
            )
            if actual is not None and expected is not None and actual != expected
        )

    def cancel(self, api_key: int, correlation_id: int) -> bool:
        """Forget a request that will get no broker response (the gateway answered it):
        later responses must not be matched to it. True if it was pending."""
        queue = self._pending.get(api_key)
        if queue is None:
            return False
        found = next((k for k, e in queue.items() if e.correlation_id == correlation_id), None)
        if found is None:
            return False
        del queue[found]
        return True

    # -- JoinGroup -------------------------------------------------------------

    def _join_request(
        self, body: Mapping[str, Any], correlation_id: int | None
    ) -> GroupObservation:
        group_id, member_id = body["GroupId"], body["MemberId"]
        protocol_type = body["ProtocolType"]
        protocols = body.get("Protocols") or []
        offered = tuple(p["Name"] for p in protocols)
        memory = self._groups.get(group_id)
        if memory is None or memory.protocol_type != protocol_type or memory.offered != offered:
            memory = _GroupMemory(protocol_type, offered, member_id=member_id)
            self._remember(group_id, memory)
        else:
            self._groups.move_to_end(group_id)
        self._expect(
            ApiKey.JOIN_GROUP,
            _Pending(correlation_id, group_id, member_id, protocol_type, None),
        )
        payloads = tuple(
            self._decode(
                "JoinGroupRequest", "subscription", group_id, member_id,
                protocol_type, p["Name"], "message", p["Metadata"],
            )
            for p in protocols
        )
        return GroupObservation(payloads)

    def _join_response(
        self, version: int, body: Mapping[str, Any], pending: _Pending | None
    ) -> GroupObservation:
        group_id = pending.group_id if pending is not None else None
        name = body.get("ProtocolName")
        protocol_type: str | None
        path: DecodePath
        if version >= 7 and body.get("ProtocolType") is not None:
            protocol_type, path = body["ProtocolType"], "message"
        elif pending is not None:
            protocol_type, path = pending.protocol_type, "connection-memory"
        else:
            protocol_type, path = None, "unknown"
        if group_id is not None and body.get("ErrorCode", 0) == 0:
            memory = self._groups.get(group_id)
            if memory is None and protocol_type is not None:
                memory = _GroupMemory(protocol_type, ())
                self._remember(group_id, memory)
            if memory is not None:
                if protocol_type is not None:
                    memory.protocol_type = protocol_type
                memory.protocol_name = name
                memory.generation_id = body.get("GenerationId", -1)
                memory.member_id = body.get("MemberId", "")
        payloads = tuple(
            self._decode(
                "JoinGroupResponse", "subscription", group_id, m["MemberId"],
                protocol_type, name, path, m["Metadata"],
            )
            for m in body.get("Members") or []
        )
        return GroupObservation(payloads)

    # -- SyncGroup -------------------------------------------------------------

    def _sync_request(
        self, version: int, body: Mapping[str, Any], correlation_id: int | None
    ) -> GroupObservation:
        group_id, member_id = body["GroupId"], body["MemberId"]
        memory = self._groups.get(group_id)
        said_type = body.get("ProtocolType") if version >= 5 else None
        said_name = body.get("ProtocolName") if version >= 5 else None
        if memory is not None:
            self._groups.move_to_end(group_id)
        inconsistencies = self.conflicts(group_id, member_id, said_type, said_name)
        protocol_type: str | None
        protocol_name: str | None
        path: DecodePath
        if said_type is not None:
            protocol_type, path = said_type, "message"
            protocol_name = said_name if said_name is not None else (
                memory.protocol_name if memory is not None else None
            )
        elif memory is not None:
            protocol_type, protocol_name, path = (
                memory.protocol_type, memory.protocol_name, "connection-memory"
            )
        else:
            protocol_type, protocol_name, path = None, said_name, "unknown"
        self.counters.inconsistencies += len(inconsistencies)
        self._expect(
            ApiKey.SYNC_GROUP,
            _Pending(correlation_id, group_id, member_id, protocol_type, protocol_name),
        )
        payloads = tuple(
            self._decode(
                "SyncGroupRequest", "assignment", group_id, a["MemberId"],
                protocol_type, protocol_name, path, a["Assignment"],
            )
            for a in body.get("Assignments") or []
        )
        return GroupObservation(payloads, inconsistencies)

    def _sync_response(
        self, version: int, body: Mapping[str, Any], pending: _Pending | None
    ) -> GroupObservation:
        raw = body.get("Assignment") or b""
        protocol_type: str | None
        protocol_name: str | None
        path: DecodePath
        if version >= 5 and body.get("ProtocolType") is not None:
            protocol_type, protocol_name, path = (
                body["ProtocolType"], body.get("ProtocolName"), "message"
            )
        elif pending is not None and pending.protocol_type is not None:
            # What the request was decoded with: its own fields (v5+) or the memory.
            protocol_type, protocol_name = pending.protocol_type, pending.protocol_name
            path = "connection-memory"
        else:
            protocol_type, protocol_name, path = None, None, "unknown"
        if not raw:  # an error answer, or a member with nothing assigned yet
            return _NOTHING
        member_id = pending.member_id if pending is not None else ""
        group_id = pending.group_id if pending is not None else None
        return GroupObservation(
            (
                self._decode(
                    "SyncGroupResponse", "assignment", group_id, member_id,
                    protocol_type, protocol_name, path, raw,
                ),
            )
        )

    # -- helpers ---------------------------------------------------------------

    def _decode(
        self,
        api: str,
        kind: Kind,
        group_id: str | None,
        member_id: str,
        protocol_type: str | None,
        protocol_name: str | None,
        path: DecodePath,
        raw: Any,
    ) -> DecodedGroupPayload:
        data = bytes(raw)
        payload: GroupPayload | None = None
        error: str | None = None
        if protocol_type is None:
            path = "unknown"
            error = f"no protocol type known for group {group_id!r} on this connection"
        else:
            try:
                payload = _decode(protocol_type, kind, data)
            except KafkaWireError as exc:
                error = str(exc)
        c = self.counters
        if path == "message":
            c.message += 1
        elif path == "connection-memory":
            c.connection_memory += 1
        else:
            c.unknown += 1
        if error is not None:
            c.errors += 1
        return DecodedGroupPayload(
            api, group_id, member_id, protocol_type, protocol_name, path, payload, error, data
        )

    def _remember(self, group_id: str, memory: _GroupMemory) -> None:
        self._groups[group_id] = memory
        self._groups.move_to_end(group_id)
        while len(self._groups) > self._max_groups:
            self._groups.popitem(last=False)

    def _expect(self, api_key: int, pending: _Pending) -> None:
        queue = self._pending[api_key]
        self._seq += 1
        queue[self._seq] = pending
        while len(queue) > self._max_pending:
            queue.popitem(last=False)

    def _answered(self, api_key: int, correlation_id: int | None) -> _Pending | None:
        queue = self._pending[api_key]
        if correlation_id is None:
            return queue.popitem(last=False)[1] if queue else None
        found = next((k for k, e in queue.items() if e.correlation_id == correlation_id), None)
        if found is None:  # a request this tracker never saw: keep the others
            return None
        while True:  # older unanswered entries can no longer be answered
            key, entry = queue.popitem(last=False)
            if key == found:
                return entry


__all__ = [
    "CONNECT",
    "CONNECTOR_TASK",
    "CONNECT_SUBPROTOCOLS",
    "CONSUMER",
    "CONSUMER_MAX_VERSION",
    "PROTOCOL_TYPES",
    "DecodePath",
    "DecodedGroupPayload",
    "GroupObservation",
    "GroupPayload",
    "GroupProtocolTracker",
    "Inconsistency",
    "Kind",
    "TrackerCounters",
    "decode_assignment",
    "decode_subscription",
    "encode_assignment",
    "encode_payload",
    "encode_subscription",
]
