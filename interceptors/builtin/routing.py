"""drop and copy: a record filtered out, or a copy of it sent elsewhere.

drop returns None (KIP-905's skip) for the records its predicate matches. copy hands
a snapshot of each matching record to the side effects (another topic, an HTTP
endpoint) and returns the record itself untouched; the side effects queue and never
block, so a full queue loses the copy (counted there), never delays the record.
A copy is taken where the rule stands among the stages: after a mask, it is masked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from filter_rules.record_actions import CopySpec, DropSpec
from interceptors.contract import BuildContext, InterceptedRecord, SideEffects
from interceptors.predicate import CompiledPredicate, compile_predicate


class DropInterceptor:
    __slots__ = ("when",)

    def __init__(self, spec: DropSpec, ctx: BuildContext) -> None:
        self.when = CompiledPredicate(spec.when)

    def configure(self, config: Mapping[str, Any]) -> None:
        """Built when the rule set is compiled; nothing to configure."""

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord | None:
        return None if self.when(record) else record


class CopyInterceptor:
    __slots__ = ("http", "queue_size", "side_effects", "topic", "when")

    def __init__(self, spec: CopySpec, ctx: BuildContext) -> None:
        self.topic = spec.topic
        self.http = spec.http
        self.queue_size = spec.queue_size
        self.when: CompiledPredicate | None = compile_predicate(spec.when)
        self.side_effects: SideEffects = ctx.side_effects

    def configure(self, config: Mapping[str, Any]) -> None:
        """Built when the rule set is compiled; nothing to configure."""

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord | None:
        if self.when is not None and not self.when(record):
            return record
        # Later stages may change the record in place; the copy must not see that.
        snapshot = dataclasses.replace(record, headers=list(record.headers))
        if self.topic is not None:
            self.side_effects.to_topic(self.topic, snapshot)
        else:
            assert self.http is not None
            self.side_effects.to_http(self.http, snapshot, self.queue_size)
        return record


def build_drop(spec: DropSpec, ctx: BuildContext) -> DropInterceptor:
    return DropInterceptor(spec, ctx)


def build_copy(spec: CopySpec, ctx: BuildContext) -> CopyInterceptor:
    return CopyInterceptor(spec, ctx)
