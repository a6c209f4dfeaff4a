"""Learn topic ids (KIP-516) from the answers that name topics both ways.

Rules and record rules match topic names; newer clients send ids. The learner reads
Metadata, CreateTopics, DescribeTopicPartitions and DeleteTopics answers into the
process-wide `TopicIds` map (kafka_wire.topic_ids) and never changes them.
"""

from __future__ import annotations

from typing import Any

from ext_proc.connection import ConnectionInfo
from kafka_wire.topic_ids import LEARNING_APIS, TopicIds


class TopicIdLearner:
    api_keys = LEARNING_APIS

    def __init__(self, topic_ids: TopicIds) -> None:
        self._topic_ids = topic_ids

    def wants(self, api_key: int, api_version: int) -> bool:
        return api_key in LEARNING_APIS

    def filter_response(
        self, api_key: int, api_version: int, body: dict[str, Any], conn: ConnectionInfo
    ) -> bool:
        self._topic_ids.learn(api_key, api_version, body)
        return False
