"""Topic ids to names (KIP-516), learned from the answers that carry both.

Newer clients name topics by id (Fetch v13+, Produce v13+, DeleteTopics v6+, the share
group APIs) and learn the ids from Metadata. A gateway that matches rules on topic
names must map them back: `TopicIds` remembers every (name, id) pair a Metadata,
CreateTopics or DescribeTopicPartitions answer showed, and forgets the ids of topics
a DeleteTopics answer reports deleted. An id the map has not seen (the gateway
restarted since the client's last Metadata) is the caller's to refuse with
UNKNOWN_TOPIC_ID, which makes the client refresh its metadata through the gateway.

One map serves every connection of a process; it is bounded (oldest ids forgotten
first) because ids of deleted topics are otherwise never dropped. Processes that serve
one client's connections between them (a pool of workers: its Metadata answer reaches
one, its group heartbeat another) share what they learn through `shared`, a
`SharedNames` the caller provides: learned ids are published to it, and an id this
process has not seen is looked up there before it counts as unknown.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Final, Protocol

from kafka_wire.entity_names import topic_id_pairs
from kafka_wire.enums import ApiKey

# The answers that pair topic names with ids.
LEARNING_APIS: Final = frozenset({ApiKey.METADATA, ApiKey.CREATE_TOPICS,
                                  ApiKey.DESCRIBE_TOPIC_PARTITIONS, ApiKey.DELETE_TOPICS})
DEFAULT_CAPACITY: Final = 1_000_000


class SharedNames(Protocol):
    """Topic names by id that other processes learned too (see the module's text)."""

    def publish(self, topic_id: uuid.UUID, name: str) -> None: ...

    def lookup(self, topic_id: uuid.UUID) -> str | None: ...

    def forget(self, topic_id: uuid.UUID) -> None: ...


class TopicIds:
    def __init__(self, capacity: int = DEFAULT_CAPACITY,
                 shared: SharedNames | None = None) -> None:
        self._names: OrderedDict[uuid.UUID, str] = OrderedDict()
        self._capacity = capacity
        self._shared = shared

    def __len__(self) -> int:
        return len(self._names)

    def learn(self, api_key: int, api_version: int, response: dict[str, Any]) -> None:
        """Remember (or, for DeleteTopics, forget) the pairs an answer shows."""
        if api_key not in LEARNING_APIS:
            return
        pairs = topic_id_pairs(api_key, api_version, "response", response)
        if api_key == ApiKey.DELETE_TOPICS:
            deleted = {(t.get("Name"), t.get("TopicId")) for t in response.get("Responses") or ()
                       if t.get("ErrorCode") == 0}
            for name, topic_id in pairs:
                if (name, topic_id) in deleted:
                    self._names.pop(topic_id, None)
                    if self._shared is not None:
                        self._shared.forget(topic_id)
            return
        for name, topic_id in pairs:
            self.add(topic_id, name)

    def add(self, topic_id: uuid.UUID, name: str, publish: bool = True) -> None:
        names = self._names
        if names.get(topic_id) != name:
            names[topic_id] = name
            if publish and self._shared is not None:
                self._shared.publish(topic_id, name)
        names.move_to_end(topic_id)
        while len(names) > self._capacity:
            names.popitem(last=False)

    def name(self, topic_id: uuid.UUID | None) -> str | None:
        if topic_id is None:
            return None
        name = self._names.get(topic_id)
        if name is None and self._shared is not None:
            name = self._shared.lookup(topic_id)
            if name is not None:  # another process learned it: keep it here too
                self.add(topic_id, name, publish=False)
        return name

    def names_of(self, topic_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
        """The known ones of `topic_ids`, with their names."""
        found = {}
        for topic_id in topic_ids:
            name = self.name(topic_id)
            if name is not None:
                found[topic_id] = name
        return found

    def resolve(self, topic_ids: Iterable[uuid.UUID]) -> tuple[list[str], list[uuid.UUID]]:
        """(names of the known ids, the unknown ids)."""
        names: list[str] = []
        unknown: list[uuid.UUID] = []
        for topic_id in topic_ids:
            name = self.name(topic_id)
            if name is None:
                unknown.append(topic_id)
            else:
                names.append(name)
        return names, unknown


def topic_name(entry: dict[str, Any], ids: TopicIds) -> str | None:
    """The name of the topic a Produce/Fetch topic entry is about, by name or by id."""
    name = entry.get("Name", entry.get("Topic"))
    if isinstance(name, str):
        return name
    return ids.name(entry.get("TopicId"))
