"""Kafka stream framing without I/O: cut a byte stream into frames, decide per frame.

A Kafka connection carries size-prefixed frames:

    request  := int32 size | int16 api_key | int16 api_version | int32 correlation_id | rest
    response := int32 size | int32 correlation_id | rest

Chunks from the network do not follow frame boundaries. `FrameSplitter` is fed
chunks and, as soon as it has seen the first bytes of a frame (the "head"), asks its
`decide` callback what to do with that frame:

- PASS: the frame's bytes are forwarded as they arrive, never copied or buffered
  beyond the head. Most frames (Produce, Fetch) take this path, so the cost per
  byte of a pass-through frame is zero Python work.
- HOLD: the frame is buffered until complete and emitted as a `Frame`, for a
  filter to decode and perhaps replace.

`feed` returns the output in stream order: `bytes`/`memoryview` pieces to forward
verbatim and `Frame` objects to be processed. When a whole chunk passes through,
the chunk object itself is returned (no copy).
"""

from __future__ import annotations

import enum
import struct
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from kafka_wire.enums import ApiKey
from kafka_wire.errors import FrameError

_INT32 = struct.Struct(">i")
_REQUEST_HEAD = struct.Struct(">ihhi")  # size, api_key, api_version, correlation_id
_RESPONSE_HEAD = struct.Struct(">ii")  # size, correlation_id

REQUEST_HEAD_SIZE = _REQUEST_HEAD.size
RESPONSE_HEAD_SIZE = _RESPONSE_HEAD.size
# Kafka's socket.request.max.bytes default; responses are bounded by fetch.max.bytes (50 MiB).
DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024


class Decision(enum.Enum):
    PASS = "pass"
    HOLD = "hold"


@dataclass(frozen=True, slots=True)
class RequestHead:
    size: int
    api_key: int
    api_version: int
    correlation_id: int


@dataclass(frozen=True, slots=True)
class ResponseHead:
    size: int
    correlation_id: int


@dataclass(frozen=True, slots=True)
class Frame:
    """A complete held frame: `raw` is the whole frame as it arrived, size prefix
    included; `data` a zero-copy view of it without the prefix."""

    head: RequestHead | ResponseHead
    raw: bytes

    @property
    def data(self) -> memoryview:
        return memoryview(self.raw)[4:]


Piece = bytes | memoryview | bytearray | Frame
# Shown the bytes of a passing frame (and their offset in the frame after its size
# prefix); returns the (frame offset, new byte) changes to make, within those bytes.
Inspector = Callable[[memoryview, int], list[tuple[int, int]]]
Head = RequestHead | ResponseHead


def parse_request_head(buf: bytes | memoryview) -> RequestHead:
    size, api_key, api_version, correlation_id = _REQUEST_HEAD.unpack_from(buf)
    return RequestHead(size, api_key, api_version, correlation_id)


def parse_response_head(buf: bytes | memoryview) -> ResponseHead:
    size, correlation_id = _RESPONSE_HEAD.unpack_from(buf)
    return ResponseHead(size, correlation_id)


class FrameSplitter:
    """Cuts one direction of a Kafka connection into frames (see module docstring).

    `decide` is called exactly once per frame, in stream order, with the parsed head;
    it may raise `FrameError` to reject the frame (the connection is then unusable).
    """

    def __init__(
        self,
        *,
        requests: bool,
        decide: Callable[[Head], Decision],
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        self._head_size = REQUEST_HEAD_SIZE if requests else RESPONSE_HEAD_SIZE
        self._parse_head = parse_request_head if requests else parse_response_head
        # The smallest legal body: a request header has a client_id length after
        # correlation id; a response is at least its correlation id.
        self._min_size = 10 if requests else 4
        self._decide = decide
        self._max_frame_size = max_frame_size
        self._head_buf = bytearray()  # a head split across chunks
        self._pass_remaining = 0  # bytes of the current PASS frame not yet seen
        self._hold_head: Head | None = None
        # The pieces of the frame being held, joined once when it is complete (one copy,
        # and the result is immutable bytes that decoders can slice without copying).
        self._hold_parts: list[bytes | memoryview] = []
        self._hold_remaining = 0
        self._injected: list[bytes] = []
        self._inspector: Inspector | None = None  # of the PASS frame going through
        self._inspected = 0  # frame offset (after the size prefix) of its next byte
        self.frames_seen = 0
        # In `decide`: the current frame's body bytes that are in this chunk (all of a
        # small frame; the first part of a big one: `follow` gives the rest).
        self.body_view: memoryview = memoryview(b"")

    def inject_before_current(self, data: bytes) -> None:
        """From inside `decide`: emit `data` in the stream just before the frame decided."""
        self._injected.append(data)

    def follow(self, sink: Callable[[memoryview], None]) -> None:
        """From inside `decide`, for a frame it passes: `sink` gets every later piece of
        the frame (what follows `body_view`), in order, as it goes by (a read-only
        inspector)."""
        seen = self._head_size - 4 + len(self.body_view)  # frame offset after body_view

        def rest(chunk: memoryview, base: int) -> list[tuple[int, int]]:
            if base + len(chunk) > seen:
                sink(chunk[max(0, seen - base):])
            return []

        self.inspect_current(rest)

    def inspect_current(self, inspector: Inspector) -> None:
        """From inside `decide`, for a PASS frame: show `inspector` the frame's bytes as
        they pass (after the size prefix) and apply the byte changes it asks for. The
        frame still passes as it arrives; a piece with a change goes on as a copy."""
        self._inspector = inspector

    @property
    def at_frame_boundary(self) -> bool:
        return not (self._head_buf or self._pass_remaining or self._hold_remaining)

    def feed(self, chunk: bytes) -> list[Piece]:
        out: list[Piece] = []
        view = memoryview(chunk)
        n = len(chunk)
        pos = 0
        pass_start = -1  # start of the current run of verbatim bytes in `chunk`

        while pos < n:
            if self._pass_remaining:
                if pass_start < 0:
                    pass_start = pos
                take = min(self._pass_remaining, n - pos)
                if self._inspector is not None:
                    patched = self._inspect(view, pos, take)
                    if patched is not None:  # this run goes on as a changed copy
                        if pos > pass_start:
                            out.append(view[pass_start:pos])
                        out.append(patched)
                        pass_start = pos + take
                pos += take
                self._pass_remaining -= take
                if not self._pass_remaining:
                    self._inspector = None
                continue
            if self._hold_remaining:
                take = min(self._hold_remaining, n - pos)
                self._hold_parts.append(view[pos : pos + take])
                pos += take
                self._hold_remaining -= take
                if not self._hold_remaining:
                    self._emit_held(out)
                continue

            # At a frame boundary: gather the head. A head split across chunks can
            # only be completed at the start of a chunk, so no verbatim run is open then.
            if self._head_buf or n - pos < self._head_size:
                if pass_start >= 0:
                    out.append(view[pass_start:pos])
                    pass_start = -1
                take = min(self._head_size - len(self._head_buf), n - pos)
                self._head_buf += view[pos : pos + take]
                pos += take
                if len(self._head_buf) < self._head_size:
                    break
                head_bytes: bytes | memoryview = bytes(self._head_buf)
                self._head_buf.clear()
                carried = True
            else:
                head_bytes = view[pos : pos + self._head_size]
                pos += self._head_size
                carried = False

            head = self._parse_head(head_bytes)
            self._check_size(head.size)
            body_left = head.size + 4 - self._head_size
            self.body_view = view[pos : pos + body_left]
            decision = self._decide(head)
            if self._injected:
                # Bytes the caller put before this frame: close the verbatim run first.
                if pass_start >= 0:
                    end = pos - self._head_size
                    if end > pass_start:
                        out.append(view[pass_start:end])
                    pass_start = -1
                out.extend(self._injected)
                self._injected.clear()
            if decision is Decision.PASS:
                if carried:
                    out.append(head_bytes)
                    pass_start = pos
                elif pass_start < 0:
                    pass_start = pos - self._head_size
                self._pass_remaining = body_left
                if self._inspector is not None:
                    self._inspected = 0
                    self._inspect(memoryview(head_bytes), 4, self._head_size - 4)
                    if not body_left:
                        self._inspector = None
            else:
                self._inspector = None
                if pass_start >= 0:
                    end = pos - self._head_size
                    if end > pass_start:
                        out.append(view[pass_start:end])
                    pass_start = -1
                self._hold_head = head
                self._hold_parts = [head_bytes]
                self._hold_remaining = body_left
                if not body_left:
                    self._emit_held(out)

        if pass_start >= 0:
            if pass_start == 0 and not out and pos == n:
                out.append(chunk)
            else:
                out.append(view[pass_start:pos])
        return out

    def _inspect(self, view: memoryview, start: int, length: int) -> bytearray | None:
        """Show the inspector `view[start:start+length]`; a changed copy if it asks."""
        inspector = self._inspector
        assert inspector is not None
        base = self._inspected
        self._inspected += length
        changes = inspector(view[start : start + length], base)
        if not changes:
            return None
        patched = bytearray(view[start : start + length])
        for offset, value in changes:
            patched[offset - base] = value
        return patched

    def _check_size(self, size: int) -> None:
        if size < self._min_size:
            raise FrameError(f"frame size {size} is below the minimum of {self._min_size}")
        if size > self._max_frame_size:
            raise FrameError(
                f"frame size {size} exceeds the maximum of {self._max_frame_size} bytes"
            )

    def _emit_held(self, out: list[Piece]) -> None:
        assert self._hold_head is not None
        out.append(Frame(self._hold_head, b"".join(self._hold_parts)))
        self._hold_head = None
        self._hold_parts = []


class Fate(enum.Enum):
    """What became of a request, as far as its answer is concerned."""

    PENDING = "pending"  # held: a filter has not decided yet
    FORWARDED = "forwarded"  # went to the broker, which owes an answer (unless acks=0)
    ANSWERED = "answered"  # the gateway answers it itself
    UNANSWERED = "unanswered"  # no answer comes (an acks=0 Produce, forwarded or refused)


@dataclass(slots=True)
class InFlight:
    """A request's place in the connection's answer order, and what its answer needs.

    A slot is reserved when the request's head is read, before any filter runs, so the
    order of answers is the order of requests whatever is held, answered or forwarded:
    it cannot be inverted by the order in which held requests are decided.
    `answer` holds the gateway's own response (it never reached the broker);
    `patch` is opaque to framing: the session's note of what to change in the answer.
    """

    correlation_id: int
    api_key: int
    api_version: int
    fate: Fate = Fate.PENDING
    hold_response: bool = False
    answer: bytes | None = None
    patch: object = None

    def forward(self, hold_response: bool, patch: object = None) -> None:
        self.fate, self.hold_response, self.patch = Fate.FORWARDED, hold_response, patch

    def answer_with(self, answer: bytes) -> None:
        self.fate, self.answer = Fate.ANSWERED, answer

    def drop_answer(self) -> None:
        self.fate = Fate.UNANSWERED


class CorrelationTracker:
    """The connection's requests in order, so responses (which carry no api key) can be
    read, and so the gateway's own answers go out in their place.

    Kafka answers requests on a connection in order. A Produce with acks=0 gets no
    answer, and whether it is one is only known from its body: a forwarded Produce a
    response skips is taken as such. Any other mismatch means the stream is out of sync.
    """

    def __init__(self, max_in_flight: int = 100_000) -> None:
        self._pending: deque[InFlight] = deque()
        self._max_in_flight = max_in_flight

    def __len__(self) -> int:
        return len(self._pending)

    def reserve(self, head: RequestHead) -> InFlight:
        """The request's slot, taken in stream order when its head is read."""
        if len(self._pending) >= self._max_in_flight:
            raise FrameError(f"more than {self._max_in_flight} requests in flight")
        slot = InFlight(head.correlation_id, head.api_key, head.api_version)
        self._pending.append(slot)
        return slot

    def answered(self, correlation_id: int) -> tuple[InFlight, list[bytes]]:
        """The request this response answers, and the gateway's own answers due before it."""
        pending = self._pending
        due: list[bytes] = []
        while pending:
            entry = pending[0]
            if entry.fate is Fate.PENDING:
                raise FrameError(f"response with correlation id {correlation_id} arrived "
                                 f"before request {entry.correlation_id} was forwarded")
            pending.popleft()
            if entry.fate is Fate.ANSWERED:
                assert entry.answer is not None
                due.append(entry.answer)
            elif entry.fate is Fate.FORWARDED:
                if entry.correlation_id == correlation_id:
                    return entry, due
                if entry.api_key != ApiKey.PRODUCE:  # only an acks=0 Produce goes unanswered
                    raise FrameError(f"response with correlation id {correlation_id} where "
                                     f"request {entry.correlation_id} was due")
        raise FrameError(f"response with correlation id {correlation_id} matches no request")

    def take_due_answers(self) -> list[bytes]:
        """Gateway answers at the head of the queue: nothing from the broker comes first."""
        pending = self._pending
        due: list[bytes] = []
        while pending and pending[0].fate in (Fate.ANSWERED, Fate.UNANSWERED):
            entry = pending.popleft()
            if entry.answer is not None:
                due.append(entry.answer)
        return due


class HeldBytes:
    """The bytes every connection of a process holds in frames being assembled.

    A held frame is buffered until complete; without a bound, a few connections
    sending large frames a rule must read take the process's memory. A frame is
    admitted (`take`) when its head is read, before any of its body is kept, and
    released (`give`) once processed; a frame that would exceed the budget is refused.
    Thread-safe: connections may be processed on worker threads.
    """

    DEFAULT_LIMIT: Final = 256 * 1024 * 1024

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self.held = 0
        self.refused = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> None:
        with self._lock:
            if self.held + size > self.limit:
                self.refused += 1
                raise FrameError(f"holding a {size}-byte frame would exceed the gateway's "
                                 f"{self.limit} bytes of held frames ({self.held} held)")
            self.held += size

    def give(self, size: int) -> None:
        with self._lock:
            self.held -= size


def frame_bytes(body: bytes) -> bytes:
    """Prefix a frame body with its size."""
    return _INT32.pack(len(body)) + body
