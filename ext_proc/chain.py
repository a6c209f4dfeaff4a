"""A connection's filter chain: its ordered filters, and the one place they are run.

The order of the list is the order of the chain, both ways: requests go through the
filters that want them first to last, each seeing the body the earlier ones left;
responses likewise, then the requests' patches, innermost first (see
`ext_proc.filters`). The network ext_proc path (`ext_proc.session.KafkaSession`) and
the native path's hand-off (frames mode) both run a connection's frames through one
`FilterChain`; the REST dry run runs the rule filters of the same factory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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

Slot = tuple[int, int, Direction]


class FilterChain:
    def __init__(self, filters: Sequence[Filter]) -> None:
        self.filters: tuple[Filter, ...] = tuple(filters)
        self._dynamic = any(f.dynamic for f in self.filters)
        # (api key, version, direction) -> the fixed-interest filters that want it.
        self._fixed: dict[Slot, tuple[Filter, ...]] = {}

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


def decide(filters: Sequence[Filter], header: kafka_wire.RequestHeader, body: dict[str, Any],
           conn: ConnectionInfo) -> RequestVerdict | None:
    """One request through `filters` as a chain (the REST dry run)."""
    return FilterChain(filters).on_request(header, body, conn)
