"""Sequence numbers of idempotent producers whose records the gateway dropped.

A producer's next connection may reach another worker of the ext_proc pool (a hash, a
failover, a worker's restart): the pool's workers keep their ledger in one file
(`SharedSequenceLedger`), a single process in a dict (`SequenceLedger`).
"""

from __future__ import annotations

import bisect
import struct
import time
from collections import OrderedDict
from pathlib import Path
from typing import Final, Protocol

from ext_proc.shared_slots import Clock, SharedSlots, key_hash

ProducerKey = tuple[int, int, str, int]  # producer id, epoch, topic, partition


class Ledger(Protocol):
    def shift(self, key: ProducerKey, base_sequence: int) -> int:
        """How far to move a batch's base sequence down: the records dropped from the
        producer's batches before it."""

    def dropped(self, key: ProducerKey, base_sequence: int, count: int) -> None:
        """`count` records were dropped from the batch at `base_sequence` (a retry of a
        batch already counted changes nothing)."""


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
        return 0 if entry is None else shift_of(*entry, base_sequence)

    def dropped(self, key: ProducerKey, base_sequence: int, count: int) -> None:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = ([], [])
            if len(self._entries) > self.MAX_PRODUCERS:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        starts, totals = entry
        if add_drop(starts, totals, base_sequence, count) and len(starts) > self.MAX_ENTRIES:
            del starts[: len(starts) // 2], totals[: len(totals) // 2]


def shift_of(starts: list[int], totals: list[int], base_sequence: int) -> int:
    """The drops before `base_sequence`, from a producer partition's drop points (base
    sequences ascending, drops through each)."""
    index = bisect.bisect_left(starts, base_sequence)
    return totals[index - 1] if index else 0


def add_drop(starts: list[int], totals: list[int], base_sequence: int, count: int) -> bool:
    """Count `count` drops at `base_sequence` in the drop points (False: a retry of a
    batch already counted, nothing changed)."""
    index = bisect.bisect_left(starts, base_sequence)
    if index < len(starts) and starts[index] == base_sequence:
        return False
    before = totals[index - 1] if index else 0
    starts.insert(index, base_sequence)
    totals.insert(index, before + count)
    for later in range(index + 1, len(totals)):
        totals[later] += count
    return True


# Per producer and partition, the latest drop points (base sequence, drops through it);
# retries only concern the batches in flight (5 at most), so 16 points are plenty.
POINTS: Final = 16
_POINTS: Final = struct.Struct("<I" + "iq" * POINTS)
DEFAULT_SETS: Final = 16_384  # 131,072 producer partitions, 27 MiB (sparse)


class SharedSequenceLedger:
    """The ledger in a file every process of the pool maps (`ext_proc.shared_slots`):
    a few microseconds per idempotent batch of a topic with record rules. A producer
    partition forgotten (its set full of fresher ones) shifts nothing again."""

    def __init__(self, path: Path, sets: int = DEFAULT_SETS, clock: Clock = time.time) -> None:
        # The wall clock: the ledger is kept across restarts of the pool, and of the host
        # (a producer outlives both); its time only orders evictions.
        self._slots = SharedSlots(path, _POINTS, sets, clock, future_is_stale=False)

    def shift(self, key: ProducerKey, base_sequence: int) -> int:
        if not self._slots.any_taken:  # no record was ever dropped: every batch's case
            return 0
        with self._slots.existing(key_hash(*key)) as slot:
            if slot is None:
                return 0
            return shift_of(*_points(slot.read()), base_sequence)

    def dropped(self, key: ProducerKey, base_sequence: int, count: int) -> None:
        with self._slots.slot(key_hash(*key)) as slot:
            starts, totals = ([], []) if slot.fresh else _points(slot.read())
            if not add_drop(starts, totals, base_sequence, count):
                return
            del starts[:-POINTS], totals[:-POINTS]
            pairs = [v for pair in zip(starts, totals, strict=True) for v in pair]
            slot.write(len(starts), *pairs, *[0] * (2 * (POINTS - len(starts))))

    def close(self) -> None:
        self._slots.close()


def _points(values: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """A slot's drop points: base sequences ascending, and drops through each."""
    count = values[0]
    return list(values[1:1 + 2 * count:2]), list(values[2:2 + 2 * count:2])
