"""Topic names by id, shared by every process of an ext_proc pool.

A client's connections reach different workers of keg up's pool: its Metadata answer,
which pairs its topics' names with their ids (KIP-516), goes to one; its group heartbeat
(KIP-848), which names its partitions by id alone, may go to another. Each worker learns
ids from the answers it sees (`kafka_wire.topic_ids.TopicIds`); one that had not seen the
topic named refused the heartbeat UNKNOWN_TOPIC_ID, and Java's consumer took that as
fatal. Ids a worker learns are published here, and one a worker has not seen is looked
up here before it counts as unknown.

The table is a file of fixed-size slots every worker maps (`ext_proc.shared_slots`): it
never grows; a full set gives the slot used longest ago to a new id, which then is only
as unknown as it was before this table. A topic name is at most 249 bytes (Kafka's
limit); a longer one is not shared.
"""

from __future__ import annotations

import struct
import time
import uuid
from pathlib import Path
from typing import Final

from ext_proc.shared_slots import Clock, SharedSlots, key_hash

MAX_NAME_BYTES: Final = 249  # Kafka's longest topic name
_ENTRY: Final = struct.Struct(f"<16sH{MAX_NAME_BYTES}s")  # id, name length, name
DEFAULT_SETS: Final = 2048  # x 8 ways: 16,384 ids, 4.6 MiB


class SharedTopicIds:
    """`kafka_wire.topic_ids.SharedNames` in a file the pool's workers map."""

    def __init__(self, path: Path, sets: int = DEFAULT_SETS,
                 clock: Clock = time.monotonic) -> None:
        self._slots = SharedSlots(path, _ENTRY, sets, clock)

    def publish(self, topic_id: uuid.UUID, name: str) -> None:
        encoded = name.encode()
        if len(encoded) > MAX_NAME_BYTES:
            return
        with self._slots.slot(key_hash(topic_id.hex)) as slot:
            slot.write(topic_id.bytes, len(encoded), encoded)

    def lookup(self, topic_id: uuid.UUID) -> str | None:
        if not self._slots.any_taken:
            return None
        with self._slots.existing(key_hash(topic_id.hex)) as slot:
            if slot is None:
                return None
            stored, length, name = slot.read()
        if stored != topic_id.bytes:  # another id with the same hash, or forgotten
            return None
        return bytes(name[:length]).decode(errors="replace")

    def forget(self, topic_id: uuid.UUID) -> None:
        """A deleted topic's id (an id never names another topic: this only frees it)."""
        if not self._slots.any_taken:
            return
        with self._slots.existing(key_hash(topic_id.hex)) as slot:
            if slot is not None and slot.read()[0] == topic_id.bytes:
                slot.write(bytes(16), 0, b"")

    def close(self) -> None:
        self._slots.close()
