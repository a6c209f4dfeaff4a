"""Learn topic ids (KIP-516) from the answers that name topics both ways.

Rules and record rules match topic names; newer clients send ids. The learner reads
Metadata, CreateTopics, DescribeTopicPartitions and DeleteTopics answers into the
process-wide `TopicIds` map (kafka_wire.topic_ids) and never changes them.
"""

from __future__ import annotations

from ext_proc.filters import RESPONSE, BaseFilter, Direction, ResponseContext
from kafka_wire.topic_ids import LEARNING_APIS, TopicIds


class TopicIdLearner(BaseFilter):
    # A missed answer leaves an id unnamed: a rule that must name it answers
    # UNKNOWN_TOPIC_ID (filters.rules, filters.records), the client refreshes its
    # metadata, and that answer is learned.
    may_miss_frames = True

    def __init__(self, topic_ids: TopicIds) -> None:
        self._topic_ids = topic_ids

    def wants(self, api_key: int, api_version: int, direction: Direction) -> bool:
        return direction == RESPONSE and api_key in LEARNING_APIS

    def on_response(self, ctx: ResponseContext) -> None:
        self._topic_ids.learn(ctx.api_key, ctx.api_version, ctx.body)
