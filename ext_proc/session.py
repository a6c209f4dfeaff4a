"""One Kafka connection as the processor sees it: both directions, framed and tracked.

The session is sans-IO like the framing it builds on: `from_client` and
`from_broker` take the chunks Envoy read and return the bytes to inject in their
place. Frames no filter asked for pass through untouched and unbuffered; only
responses a filter wants (decided when their request passed) are held, decoded,
filtered and, if changed, re-encoded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ext_proc.chain import FilterChain
from ext_proc.connection import ConnectionInfo
from ext_proc.filters import REQUEST, Filter
from ext_proc.metrics import ConnectionMeter
from ext_proc.sasl.termination import LoginFailed, TerminationState
from kafka_wire.errors import FrameError, KafkaWireError
from kafka_wire.framing import (
    DEFAULT_MAX_FRAME_SIZE,
    REQUEST_HEAD_SIZE,
    CorrelationTracker,
    Decision,
    Frame,
    FrameSplitter,
    Head,
    HeldBytes,
    InFlight,
    Inspector,
    Piece,
    RequestHead,
)


class ProtocolViolation(Exception):
    """The peer broke the Kafka protocol; the connection must be closed."""


class KafkaSession:
    def __init__(
        self,
        conn: ConnectionInfo,
        filters: Sequence[Filter],
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        meter: ConnectionMeter | None = None,
        held_bytes: HeldBytes | None = None,
        termination: TerminationState | None = None,
    ) -> None:
        self.conn = conn
        # SASL termination: once the gateway let the client in, the session logs the
        # broker connection in as the service account (its frames ride this connection,
        # their answers never reach the client) and holds the client's bytes meanwhile.
        self._termination = termination
        self._waiting_for_login: list[bytes | memoryview | bytearray] = []
        self._to_broker: list[bytes] = []
        self._meter = meter
        self._budget = held_bytes or HeldBytes()  # shared by the process's connections
        self._holding = 0  # of it, what this connection holds now
        self.chain = FilterChain(filters)
        self._tracker = CorrelationTracker()
        self._held_requests: deque[InFlight] = deque()  # slots of requests being held
        self._held: deque[InFlight] = deque()  # requests whose held response is coming
        self._requests = FrameSplitter(
            requests=True, decide=self._on_request_head, max_frame_size=max_frame_size
        )
        self._responses = FrameSplitter(
            requests=False, decide=self._on_response_head, max_frame_size=max_frame_size
        )
        self.frames_rewritten = 0
        self._delay_s = 0.0

    # -- the two directions -------------------------------------------------------

    def from_client(self, chunk: bytes) -> bytes:
        """Bytes for the broker in place of `chunk` (see also `take_client_bytes`)."""
        if self._termination is not None:
            return self._run_terminated(chunk, self._termination)
        return self._run(self._requests, chunk, "request")

    def take_broker_bytes(self) -> bytes:
        """Bytes due to the broker that no client chunk carries: the service account's
        login steps, then the client's requests that waited for it."""
        out, self._to_broker = b"".join(self._to_broker), []
        return out

    def _run_terminated(self, chunk: bytes, state: TerminationState) -> bytes:
        """Requests of a terminating connection: the bytes before the client got in go
        on; the login starts right after the request that let it in; what comes later
        waits for the broker's yes."""
        try:
            out: list[bytes | memoryview | bytearray] = []
            for piece in self._requests.feed(chunk):
                rendered = self._render(piece)
                (self._waiting_for_login if state.login_pending else out).append(rendered)
                if state.login_due:
                    out.append(state.upstream.start())
            return b"".join(out)
        except KafkaWireError as err:
            raise ProtocolViolation(f"malformed request: {err}") from err

    def _login_answer(self, frame: Frame, state: TerminationState) -> bytes:
        """A broker answer to the service account's login: never the client's."""
        try:
            following = state.upstream.on_response(bytes(frame.raw))
        except LoginFailed as err:
            raise ProtocolViolation(f"the broker refused keg's service account: {err}") from None
        if following is not None:
            self._to_broker.append(following)
        elif state.upstream.done:
            self._to_broker.extend(bytes(b) for b in self._waiting_for_login)
            self._waiting_for_login.clear()
        return b""

    def from_broker(self, chunk: bytes) -> bytes:
        out = self._run(self._responses, chunk, "response")
        due = self.take_client_bytes()
        return out + due if due else out

    def take_client_bytes(self) -> bytes:
        """The gateway's own answers that are due now, in their place in the stream."""
        if not self._responses.at_frame_boundary:
            return b""
        return b"".join(self._tracker.take_due_answers())

    def take_delay(self) -> float:
        """Seconds the requests just processed should be held (rate limits), once."""
        delay, self._delay_s = self._delay_s, 0.0
        return delay

    def _hold(self, size: int) -> Decision:
        self._budget.take(size)  # FrameError beyond the process's budget
        self._holding += size
        return Decision.HOLD

    def close(self) -> None:
        self._budget.give(self._holding)
        self._holding = 0
        if self._meter is not None:
            self._meter.close()

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

    def _render(self, piece: Piece) -> bytes | memoryview | bytearray:
        if isinstance(piece, Frame):
            size = piece.head.size
            self._budget.give(size)
            self._holding -= size
            if isinstance(piece.head, RequestHead):
                return self._process_request(piece, piece.head)
            state = self._termination
            if state is not None and state.upstream.expects(piece.head.correlation_id):
                return self._login_answer(piece, state)
            return self._filter_response(piece, self._held.popleft())
        return piece

    # -- decisions, made on each frame's first bytes ------------------------------

    def _on_request_head(self, head: Head) -> Decision:
        assert isinstance(head, RequestHead)
        if head.api_key < 0 or head.api_version < 0:
            raise FrameError(
                f"request header has api key {head.api_key}, version {head.api_version}"
            )
        if self._meter is not None:
            self._meter.request(head.api_key, head.api_version, head.size + 4,
                                self._requests.body_view)
        # The answer order is fixed here, before any filter runs (see InFlight).
        slot = self._tracker.reserve(head)
        if self.chain.wants(head.api_key, head.api_version, REQUEST):
            self._held_requests.append(slot)  # its fate is decided in _process_request
            return self._hold(head.size)
        slot.forward(hold_response=self.chain.response_plan(head.api_key, head.api_version).hold)
        if self._meter is not None:
            self._meter.forwarded()
            # Its topics are read as it passes, never held for it.
            rest = self._meter.topics(head.api_key, head.api_version, self._requests.body_view)
            if rest is not None:
                self._requests.follow(rest)
        return Decision.PASS

    def _on_response_head(self, head: Head) -> Decision:
        state = self._termination
        if state is not None and state.upstream.expects(head.correlation_id):
            return self._hold(head.size)  # the service account's login, see _login_answer
        entry, due = self._tracker.answered(head.correlation_id)
        if self._meter is not None:
            self._meter.bytes(entry.api_key, "response", head.size + 4)
        for answer in due:
            self._responses.inject_before_current(answer)
        if not entry.hold_response:
            inspectors = self.chain.response_plan(entry.api_key, entry.api_version).inspectors
            if inspectors:
                self._responses.inspect_current(_together([new() for new in inspectors]))
            return Decision.PASS
        self._held.append(entry)
        return self._hold(head.size)

    # -- held frames ---------------------------------------------------------------

    def _process_request(self, frame: Frame, head: RequestHead) -> bytes:
        slot = self._held_requests.popleft()
        if self._meter is not None:  # the topics the client named, before any filter
            self._meter.topics(head.api_key, head.api_version,
                               memoryview(frame.raw)[REQUEST_HEAD_SIZE:])
        judged = self.chain.judge_frame(frame.raw, self.conn)
        self._delay_s = max(self._delay_s, judged.delay_s)
        if not judged.expects_response:
            slot.drop_answer()
        elif judged.answer is not None:
            slot.answer_with(judged.answer)
        else:
            slot.forward(judged.want_response, patch=judged.patch)
        if not judged.answered and self._meter is not None:
            self._meter.forwarded()
        return judged.to_broker

    def _filter_response(self, frame: Frame, entry: InFlight) -> bytes:
        patch = entry.patch if callable(entry.patch) else None
        out = self.chain.filter_response_frame(frame.raw, entry.api_key, entry.api_version,
                                               self.conn, patch)
        if out is not frame.raw:
            self.frames_rewritten += 1
        return out


def _together(inspectors: list[Inspector]) -> Inspector:
    if len(inspectors) == 1:
        return inspectors[0]

    def inspect(chunk: memoryview, base: int) -> list[tuple[int, int]]:
        return [change for inspector in inspectors for change in inspector(chunk, base)]

    return inspect
