"""Sequence numbers of idempotent producers whose records the gateway dropped."""

from __future__ import annotations

import bisect
from collections import OrderedDict
from typing import Final

ProducerKey = tuple[int, int, str, int]  # producer id, epoch, topic, partition


class SequenceLedger:
    """Records dropped from idempotent producers' batches, per producer and partition.

    The shift of a batch is what was dropped from batches with lower base sequences:
    deterministic, so a retried batch is shifted exactly as its first attempt was
    and the broker's duplicate detection still works. Bounded: the oldest producers
    are forgotten first; per producer only the latest entries are kept (the broker
    itself only remembers the last five batches).
    """

    MAX_PRODUCERS: Final = 100_000
    MAX_ENTRIES: Final = 1024

    def __init__(self) -> None:
        # key -> (base sequences with drops, ascending; cumulative drops through each)
        self._entries: OrderedDict[ProducerKey, tuple[list[int], list[int]]] = OrderedDict()

    def shift(self, key: ProducerKey, base_sequence: int) -> int:
        entry = self._entries.get(key)
        if entry is None:
            return 0
        starts, totals = entry
        index = bisect.bisect_left(starts, base_sequence)
        return totals[index - 1] if index else 0

    def dropped(self, key: ProducerKey, base_sequence: int, count: int) -> None:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = ([], [])
            if len(self._entries) > self.MAX_PRODUCERS:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        starts, totals = entry
        index = bisect.bisect_left(starts, base_sequence)
        if index < len(starts) and starts[index] == base_sequence:
            return  # a retry: already counted
        before = totals[index - 1] if index else 0
        starts.insert(index, base_sequence)
        totals.insert(index, before + count)
        for later in range(index + 1, len(totals)):
            totals[later] += count
        if len(starts) > self.MAX_ENTRIES:
            del starts[: len(starts) // 2], totals[: len(totals) // 2]
