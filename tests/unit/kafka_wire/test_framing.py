"""FrameSplitter and CorrelationTracker: every split of the stream yields the same frames."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_wire import ApiKey
from kafka_wire.errors import FrameError
from kafka_wire.framing import (
    CorrelationTracker,
    Decision,
    Frame,
    FrameSplitter,
    Head,
    InFlight,
    Piece,
    RequestHead,
    ResponseHead,
)


def request(api_key: int, correlation_id: int, payload: bytes) -> bytes:
    body = struct.pack(">hhih", api_key, 1, correlation_id, -1) + payload
    return struct.pack(">i", len(body)) + body


def response(correlation_id: int, payload: bytes) -> bytes:
    body = struct.pack(">i", correlation_id) + payload
    return struct.pack(">i", len(body)) + body


HOLD_KEY = ApiKey.METADATA  # the frames these tests hold


def hold_metadata(head: Head) -> Decision:
    assert isinstance(head, RequestHead)
    return Decision.HOLD if head.api_key == HOLD_KEY else Decision.PASS


def run(splitter: FrameSplitter, chunks: list[bytes]) -> tuple[bytes, list[Frame]]:
    """Feed chunks; return the verbatim bytes (held frames replaced by a marker) and frames."""
    passed = bytearray()
    frames: list[Frame] = []
    for chunk in chunks:
        pieces: list[Piece] = splitter.feed(chunk)
        for piece in pieces:
            if isinstance(piece, Frame):
                frames.append(piece)
                passed += b"<HELD>"
            else:
                passed += piece
    return bytes(passed), frames


STREAM = (
    request(ApiKey.PRODUCE, 1, b"produce-1" * 7)
    + request(HOLD_KEY, 2, b"meta")
    + request(ApiKey.FETCH, 3, b"")
    + request(HOLD_KEY, 4, b"meta-2" * 40)
    + request(ApiKey.PRODUCE, 5, b"x")
)
EXPECTED = (
    request(ApiKey.PRODUCE, 1, b"produce-1" * 7)
    + b"<HELD>"
    + request(ApiKey.FETCH, 3, b"")
    + b"<HELD>"
    + request(ApiKey.PRODUCE, 5, b"x")
)


def test_whole_chunk_of_pass_frames_is_returned_as_is() -> None:
    splitter = FrameSplitter(requests=True, decide=lambda h: Decision.PASS)
    chunk = request(ApiKey.PRODUCE, 1, b"a" * 100) + request(ApiKey.FETCH, 2, b"b")
    out = splitter.feed(chunk)
    assert len(out) == 1 and out[0] is chunk
    assert splitter.at_frame_boundary


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_every_two_way_split_gives_same_output(cut: int) -> None:
    splitter = FrameSplitter(requests=True, decide=hold_metadata)
    passed, frames = run(splitter, [STREAM[:cut], STREAM[cut:]])
    assert passed == EXPECTED
    assert [f.head.correlation_id for f in frames] == [2, 4]
    assert frames[1].data == request(HOLD_KEY, 4, b"meta-2" * 40)[4:]
    assert splitter.at_frame_boundary


def test_byte_at_a_time() -> None:
    splitter = FrameSplitter(requests=True, decide=hold_metadata)
    passed, frames = run(splitter, [STREAM[i : i + 1] for i in range(len(STREAM))])
    assert passed == EXPECTED
    assert len(frames) == 2


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split(cuts: list[int]) -> None:
    points = sorted(set(cuts) | {0, len(STREAM)})
    chunks = [STREAM[a:b] for a, b in itertools.pairwise(points) if b > a]
    passed, frames = run(FrameSplitter(requests=True, decide=hold_metadata), chunks)
    assert passed == EXPECTED
    assert len(frames) == 2


def test_responses_are_split_on_correlation_id() -> None:
    seen: list[int] = []

    def decide(head: Head) -> Decision:
        assert isinstance(head, ResponseHead)
        seen.append(head.correlation_id)
        return Decision.HOLD if head.correlation_id == 8 else Decision.PASS

    stream = response(7, b"abc") + response(8, b"defg") + response(9, b"")
    passed, frames = run(FrameSplitter(requests=False, decide=decide), [stream])
    assert seen == [7, 8, 9]
    assert passed == response(7, b"abc") + b"<HELD>" + response(9, b"")
    assert frames[0].data == response(8, b"defg")[4:]


@pytest.mark.parametrize(
    "size",
    [-1, -(2**31), 0, 9, 2**31 - 1],
    ids=["minus-one", "min-int", "zero", "below-header", "huge"],
)
def test_bad_sizes_are_rejected(size: int) -> None:
    splitter = FrameSplitter(requests=True, decide=hold_metadata, max_frame_size=1 << 20)
    with pytest.raises(FrameError):
        splitter.feed(struct.pack(">ihhi", size, 0, 0, 1) + b"\0" * 20)


def forwarded(tracker: CorrelationTracker, cid: int, api_key: int = 0,
              hold_response: bool = False) -> InFlight:
    slot = tracker.reserve(RequestHead(10, api_key, 3, cid))
    slot.forward(hold_response)
    return slot


def test_tracker_skips_unanswered_produce_requests() -> None:
    tracker = CorrelationTracker()
    for cid in (1, 2, 3):
        forwarded(tracker, cid, hold_response=cid == 3)
    entry, due = tracker.answered(3)  # 1 and 2 were acks=0 produces: no response comes
    assert entry.hold_response and entry.api_key == ApiKey.PRODUCE and due == []
    assert len(tracker) == 0
    with pytest.raises(FrameError):
        tracker.answered(4)


def test_tracker_refuses_a_skipped_answer_to_anything_but_produce() -> None:
    tracker = CorrelationTracker()
    forwarded(tracker, 1, api_key=ApiKey.METADATA)  # Metadata is always answered
    forwarded(tracker, 2, api_key=ApiKey.METADATA)
    with pytest.raises(FrameError, match="request 1 was due"):
        tracker.answered(2)


def test_tracker_refuses_an_answer_before_a_held_request_is_forwarded() -> None:
    tracker = CorrelationTracker()
    tracker.reserve(RequestHead(10, ApiKey.METADATA, 12, 1))  # held, still undecided
    forwarded(tracker, 2, api_key=ApiKey.METADATA)
    assert tracker.take_due_answers() == []
    with pytest.raises(FrameError, match="before request 1 was forwarded"):
        tracker.answered(2)


def test_tracker_bounds_in_flight() -> None:
    tracker = CorrelationTracker(max_in_flight=2)
    forwarded(tracker, 1)
    forwarded(tracker, 2)
    with pytest.raises(FrameError):
        forwarded(tracker, 3)


def test_gateway_answers_keep_their_place_in_the_response_order() -> None:
    tracker = CorrelationTracker()
    forwarded(tracker, 1)
    tracker.reserve(RequestHead(10, ApiKey.PRODUCE, 3, 2)).answer_with(b"answer-2")
    forwarded(tracker, 3)
    tracker.reserve(RequestHead(10, ApiKey.PRODUCE, 3, 4)).answer_with(b"answer-4")
    tracker.reserve(RequestHead(10, ApiKey.PRODUCE, 3, 5)).drop_answer()  # refused acks=0 produce
    assert tracker.take_due_answers() == []  # the broker still owes the answer to 1
    assert tracker.answered(1)[1] == []
    assert tracker.take_due_answers() == [b"answer-2"]
    entry, due = tracker.answered(3)
    assert entry.correlation_id == 3 and due == []
    assert tracker.take_due_answers() == [b"answer-4"]
    assert len(tracker) == 0


def test_slots_decided_out_of_order_answer_in_request_order() -> None:
    """A held request decided after later requests passed keeps its place."""
    tracker = CorrelationTracker()
    held = tracker.reserve(RequestHead(10, ApiKey.METADATA, 12, 1))
    forwarded(tracker, 2, api_key=ApiKey.LIST_OFFSETS)  # passed while 1 was still held
    held.forward(hold_response=True)  # decided afterwards
    entry, _ = tracker.answered(1)
    assert entry is held
    assert tracker.answered(2)[0].correlation_id == 2


def split_with_injection(stream: bytes, cut: int) -> bytes:
    holder: list[FrameSplitter] = []

    def decide(head: Head) -> Decision:
        if head.correlation_id == 2:
            holder[0].inject_before_current(b"<INJECTED>")
        return Decision.PASS

    holder.append(FrameSplitter(requests=False, decide=decide))
    passed, _ = run(holder[0], [stream[:cut], stream[cut:]])
    return passed


def test_injected_bytes_land_before_the_decided_frame_at_every_split() -> None:
    stream = response(1, b"first") + response(2, b"second") + response(3, b"third")
    expected = response(1, b"first") + b"<INJECTED>" + response(2, b"second") \
        + response(3, b"third")
    for cut in range(1, len(stream)):
        assert split_with_injection(stream, cut) == expected


def test_body_view_and_follow_give_every_passing_frame_whole_at_every_split() -> None:
    """What metrics read of a passing frame (kafka_wire.produce_topics): `body_view` in `decide`
    plus what `follow` gets later is exactly the frame after its head, however the
    stream is cut; held frames give nothing to follow."""
    stream = STREAM
    expected = []
    offset = 0
    while offset < len(stream):
        size = struct.unpack_from(">i", stream, offset)[0]
        api_key = struct.unpack_from(">h", stream, offset + 4)[0]
        expected.append((api_key, stream[offset + 12:offset + 4 + size]))
        offset += 4 + size
    # Three pieces: every pair of cuts at most 2 bytes apart (so every single cut), and
    # every pair on a 5-byte grid: the full square of pairs takes seconds.
    cuts = [(a, b) for a, b in itertools.combinations(range(1, len(stream)), 2)
            if b - a <= 2 or (a % 5 == 0 and b % 5 == 0)]
    for cut_a, cut_b in cuts:
        reader = _BodyReader()
        run(reader.splitter, [stream[:cut_a], stream[cut_a:cut_b], stream[cut_b:]])
        for body, (api_key, whole) in zip(reader.seen, expected, strict=True):
            if api_key != HOLD_KEY:  # passing frames only
                assert bytes(body) == whole, (cut_a, cut_b)
            else:
                assert whole.startswith(bytes(body)), (cut_a, cut_b)


class _BodyReader:
    """Reads each frame as metrics do: `body_view` in `decide`, then `follow`."""

    def __init__(self) -> None:
        self.seen: list[bytearray] = []
        self.splitter = FrameSplitter(requests=True, decide=self.decide)

    def decide(self, head: Head) -> Decision:
        body = bytearray(self.splitter.body_view)
        self.seen.append(body)
        decision = hold_metadata(head)
        if decision is Decision.PASS:
            self.splitter.follow(body.extend)
        return decision
