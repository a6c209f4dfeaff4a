"""One Kafka connection as the processor sees it: both directions, framed and tracked.

The session is sans-IO like the framing it builds on: `from_client` and
`from_broker` take the chunks Envoy read and return the bytes to inject in their
place. Frames no filter asked for pass through untouched and unbuffered; only
responses a filter wants (decided when their request passed) are held, decoded,
filtered and, if changed, re-encoded.
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from collections.abc import Sequence

import kafka_wire
from ext_proc.connection import ConnectionInfo
from ext_proc.filters import RequestObserver, ResponseFilter
from kafka_wire.api_keys import API_VERSIONS
from kafka_wire.errors import FrameError, KafkaWireError
from kafka_wire.framing import (
    DEFAULT_MAX_FRAME_SIZE,
    CorrelationTracker,
    Decision,
    Frame,
    FrameSplitter,
    Head,
    InFlight,
    Piece,
    RequestHead,
    frame_bytes,
)

log = logging.getLogger(__name__)

_UNSUPPORTED_VERSION = 35
_ERROR_CODE = struct.Struct(">h")


class ProtocolViolation(Exception):
    """The peer broke the Kafka protocol; the connection must be closed."""


class KafkaSession:
    def __init__(
        self,
        conn: ConnectionInfo,
        filters: Sequence[ResponseFilter],
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        self.conn = conn
        self._filters = filters
        self._tracker = CorrelationTracker()
        self._held: deque[InFlight] = deque()
        self._wanted: dict[tuple[int, int], bool] = {}
        self._observers = [f for f in filters if isinstance(f, RequestObserver)]
        self._observed: dict[tuple[int, int], bool] = {}
        self._requests = FrameSplitter(
            requests=True, decide=self._on_request_head, max_frame_size=max_frame_size
        )
        self._responses = FrameSplitter(
            requests=False, decide=self._on_response_head, max_frame_size=max_frame_size
        )
        self.frames_rewritten = 0

    # -- the two directions -------------------------------------------------------

    def from_client(self, chunk: bytes) -> bytes:
        return self._run(self._requests, chunk, "request")

    def from_broker(self, chunk: bytes) -> bytes:
        return self._run(self._responses, chunk, "response")

    def pending_bytes(self) -> bool:
        """True when a direction stopped mid-frame (relevant at end of stream)."""
        return not (self._requests.at_frame_boundary and self._responses.at_frame_boundary)

    def _run(self, splitter: FrameSplitter, chunk: bytes, what: str) -> bytes:
        try:
            pieces = splitter.feed(chunk)
            if len(pieces) == 1 and pieces[0] is chunk:
                return chunk
            return b"".join(self._render(piece) for piece in pieces)
        except KafkaWireError as err:
            raise ProtocolViolation(f"malformed {what}: {err}") from err

    def _render(self, piece: Piece) -> bytes | memoryview:
        if isinstance(piece, Frame):
            if isinstance(piece.head, RequestHead):
                return self._observe_request(piece)
            return self._filter_response(piece, self._held.popleft())
        return piece

    # -- decisions, made on each frame's first bytes ------------------------------

    def _on_request_head(self, head: Head) -> Decision:
        assert isinstance(head, RequestHead)
        if head.api_key < 0 or head.api_version < 0:
            raise FrameError(
                f"request header has api key {head.api_key}, version {head.api_version}"
            )
        key = (head.api_key, head.api_version)
        wanted = self._wanted.get(key)
        if wanted is None:
            wanted = self._wanted[key] = any(
                f.wants(head.api_key, head.api_version) for f in self._filters
            )
        self._tracker.sent(head, hold_response=wanted)
        if self._observers:
            observed = self._observed.get(key)
            if observed is None:
                observed = self._observed[key] = any(
                    o.wants_request(head.api_key, head.api_version) for o in self._observers
                )
            if observed:
                return Decision.HOLD
        return Decision.PASS

    def _on_response_head(self, head: Head) -> Decision:
        entry = self._tracker.answered(head.correlation_id)
        if not entry.hold_response:
            return Decision.PASS
        self._held.append(entry)
        return Decision.HOLD

    # -- held frames ---------------------------------------------------------------

    def _observe_request(self, frame: Frame) -> bytes:
        try:
            header, body = kafka_wire.decode_request(frame.data)
        except KafkaWireError as err:
            log.info("request forwarded unobserved: %s (%s)", err, self.conn.describe())
        else:
            for o in self._observers:
                if o.wants_request(header.api_key, header.api_version):
                    o.observe_request(header, body, self.conn)
        return frame_bytes(frame.data)

    def _filter_response(self, frame: Frame, entry: InFlight) -> bytes:
        data = frame.data
        api_key, version = entry.api_key, entry.api_version
        correlation_id, tags, offset = kafka_wire.read_response_header(data, api_key, version)
        if api_key == API_VERSIONS and version > 0:
            # A broker answers an ApiVersions version it does not support in v0.
            (error,) = _ERROR_CODE.unpack_from(data, offset)
            if error == _UNSUPPORTED_VERSION:
                version = 0
        body, _ = kafka_wire.decode_body(api_key, version, "response", data, offset)
        changed = False
        for f in self._filters:
            if f.wants(api_key, version):
                changed |= f.filter_response(api_key, version, body, self.conn)
        if not changed:
            return frame_bytes(data)
        self.frames_rewritten += 1
        header = kafka_wire.write_response_header(correlation_id, api_key, version, tags)
        return frame_bytes(header + kafka_wire.encode_body(api_key, version, "response", body))
