"""A connection's filter chain: its ordered filters, and the one place they are run.

The order of the list is the order of the chain, both ways: requests go through the
filters that want them first to last, each seeing the body the earlier ones left;
responses likewise, then the requests' patches, innermost first (see
`ext_proc.filters`). The network ext_proc path (`ext_proc.session.KafkaSession`) and
the native path's hand-off (`ext_proc.frames.FramesSession`) both run a connection's
whole frames through one `FilterChain` (`judge_frame`, `filter_response_frame`); the
REST dry run runs the rule filters of the same factory (`ext_proc.filters.order`).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import kafka_wire
from ext_proc.connection import ConnectionInfo
from ext_proc.filters import (
    REQUEST,
    RESPONSE,
    Direction,
    Filter,
    RequestContext,
    RequestVerdict,
    ResponseContext,
    ResponsePatch,
    combine,
)
from kafka_wire import ApiKey, ErrorCode
from kafka_wire.errors import KafkaWireError
from kafka_wire.framing import Inspector, frame_bytes

log = logging.getLogger(__name__)

_ERROR_CODE = struct.Struct(">h")
_REQUEST_KEY = struct.Struct(">hh")  # api key, api version after the size prefix

Slot = tuple[int, int, Direction]


class FilterChain:
    def __init__(self, filters: Sequence[Filter]) -> None:
        self.filters: tuple[Filter, ...] = tuple(filters)
        self._dynamic = any(f.dynamic for f in self.filters)
        # (api key, version, direction) -> the fixed-interest filters that want it.
        self._fixed: dict[Slot, tuple[Filter, ...]] = {}
        self._plans: dict[tuple[int, int], ResponsePlan] = {}

    def interested(self, api_key: int, api_version: int,
                   direction: Direction) -> tuple[Filter, ...]:
        """The filters that want this frame, in chain order."""
        slot = (api_key, api_version, direction)
        fixed = self._fixed.get(slot)
        if fixed is None:
            fixed = self._fixed[slot] = tuple(
                f for f in self.filters if not f.dynamic and f.wants(*slot))
        if not self._dynamic:
            return fixed
        return tuple(f for f in self.filters
                     if (f in fixed) or (f.dynamic and f.wants(*slot)))

    def wants(self, api_key: int, api_version: int, direction: Direction) -> bool:
        slot = (api_key, api_version, direction)
        fixed = self._fixed.get(slot)
        if fixed is None:
            fixed = self._fixed[slot] = tuple(
                f for f in self.filters if not f.dynamic and f.wants(*slot))
        if fixed:
            return True
        return self._dynamic and any(f.dynamic and f.wants(*slot) for f in self.filters)

    def response_plan(self, api_key: int, api_version: int) -> ResponsePlan:
        """Whether a response must be held, or may pass with inspectors (every filter
        that wants it works on its passing bytes)."""
        slot = (api_key, api_version)
        plan = self._plans.get(slot)
        if plan is None or self._dynamic:
            wanting = self.interested(api_key, api_version, RESPONSE)
            streams = [f.stream_response(api_key, api_version) for f in wanting]
            if not wanting:
                plan = _PASS
            elif all(s is not None for s in streams):
                plan = ResponsePlan(False, tuple(s for s in streams if s is not None))
            else:
                plan = _HOLD
            self._plans[slot] = plan
        return plan

    def on_request(self, header: kafka_wire.RequestHeader, body: dict[str, Any],
                   conn: ConnectionInfo) -> RequestVerdict | None:
        """Run a decoded request through the filters that want it; None when none
        decided anything. An answer ends the chain."""
        verdict: RequestVerdict | None = None
        for f in self.interested(header.api_key, header.api_version, REQUEST):
            ctx = RequestContext(header, body, conn)
            f.on_request(ctx)
            decided = ctx.verdict
            if decided is None:
                continue
            verdict = decided if verdict is None else combine(verdict, decided)
            if decided.answer is not None:
                break
        return verdict

    def on_response(self, api_key: int, api_version: int, body: dict[str, Any],
                    conn: ConnectionInfo, patch: ResponsePatch | None = None) -> bool:
        """Run a decoded response through the filters that want it, then the patch its
        request's verdict left; True when the body changed."""
        ctx = ResponseContext(api_key, api_version, body, conn)
        for f in self.interested(api_key, api_version, RESPONSE):
            f.on_response(ctx)
        if patch is not None:
            ctx.changed(bool(patch(body)))
        return ctx.was_changed


    # -- whole frames (both data paths) ------------------------------------------------

    def judge_frame(self, raw: bytes, conn: ConnectionInfo) -> Judged:
        """A whole request frame (size prefix included) through the chain.

        Raises KafkaWireError for a frame a rule must read but that does not decode;
        one only observers wanted goes on as it was, unobserved."""
        try:
            header, body = kafka_wire.decode_request(memoryview(raw)[4:], trailing=True)
        except KafkaWireError:
            api_key, api_version = _REQUEST_KEY.unpack_from(raw, 4)
            if any(f.dynamic for f in self.interested(api_key, api_version, REQUEST)):
                raise  # a rule must see this request: never let it through unread
            log.info("request forwarded unobserved: api %d v%d (%s)", api_key, api_version,
                     conn.describe())
            return Judged(raw, want_response=self.response_plan(api_key, api_version).hold)
        verdict = self.on_request(header, body, conn) or RequestVerdict()
        if verdict.answer is not None:
            answer = kafka_wire.encode_response(header.correlation_id, header.api_key,
                                                header.api_version, verdict.answer)
            return Judged(b"", answer if verdict.expects_response else None,
                          expects_response=verdict.expects_response, delay_s=verdict.delay_s)
        want = verdict.expects_response and (
            verdict.patch is not None
            or self.response_plan(header.api_key, header.api_version).hold)
        return Judged(kafka_wire.encode_request(header, body) if verdict.changed else raw,
                      expects_response=verdict.expects_response, want_response=want,
                      patch=verdict.patch, delay_s=verdict.delay_s, changed=verdict.changed)

    def filter_response_frame(self, raw: bytes, api_key: int, api_version: int,
                              conn: ConnectionInfo, patch: ResponsePatch | None) -> bytes:
        """A whole response frame through the chain; the original bytes when unchanged."""
        data = memoryview(raw)[4:]
        correlation_id, tags, offset = kafka_wire.read_response_header(data, api_key,
                                                                       api_version)
        if api_key == ApiKey.API_VERSIONS and api_version > 0:
            # A broker answers an ApiVersions version it does not support in v0.
            (error,) = _ERROR_CODE.unpack_from(data, offset)
            if error == ErrorCode.UNSUPPORTED_VERSION:
                api_version = 0
        body, _ = kafka_wire.decode_body(api_key, api_version, "response", data, offset)
        if not self.on_response(api_key, api_version, body, conn, patch):
            return raw
        header = kafka_wire.write_response_header(correlation_id, api_key, api_version, tags)
        return frame_bytes(header + kafka_wire.encode_body(api_key, api_version, "response",
                                                           body))


@dataclass(frozen=True, slots=True)
class ResponsePlan:
    """`hold`: decode the response through the chain; else pass it, each of
    `inspectors` (factories: one inspector per frame) shown its bytes as they go."""

    hold: bool
    inspectors: tuple[Callable[[], Inspector], ...] = ()


_PASS: Final = ResponsePlan(False)
_HOLD: Final = ResponsePlan(True)


@dataclass(frozen=True, slots=True)
class Judged:
    """What became of one whole request frame.

    `to_broker`: the bytes to forward (the frame as it came, or re-encoded), b"" when
    the gateway answered it or nobody answers it; `answer`: the gateway's own answer
    frame; `expects_response`: an answer is due to the client (not an acks=0 Produce);
    `want_response`: the broker's answer must come back through the chain, with
    `patch` for it; `delay_s`: how long to hold the request first.
    """

    to_broker: bytes
    answer: bytes | None = None
    expects_response: bool = True
    want_response: bool = False
    patch: ResponsePatch | None = None
    delay_s: float = 0.0
    changed: bool = False

    @property
    def answered(self) -> bool:
        return not self.to_broker
