"""Topic ids one worker of a pool learned, known to the others (a file both map)."""

from __future__ import annotations

import multiprocessing
import uuid
from pathlib import Path

from ext_proc.shared_topic_ids import MAX_NAME_BYTES, SharedTopicIds
from kafka_wire import ApiKey
from kafka_wire.topic_ids import TopicIds


def metadata_answer(pairs: dict[str, uuid.UUID]) -> dict[str, object]:
    return {"Topics": [{"Name": name, "TopicId": topic_id, "ErrorCode": 0, "Partitions": []}
                       for name, topic_id in pairs.items()]}


def test_an_id_one_worker_learned_is_known_to_another(tmp_path: Path) -> None:
    first = TopicIds(shared=SharedTopicIds(tmp_path / "ids"))
    second = TopicIds(shared=SharedTopicIds(tmp_path / "ids"))
    orders, payments, never = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    first.learn(ApiKey.METADATA, 12, metadata_answer({"orders": orders, "payments": payments}))
    assert second.resolve([orders, never, payments]) == (["orders", "payments"], [never])
    assert second.names_of([payments]) == {payments: "payments"}


def _learn_in_another_process(path: Path, topic_id: uuid.UUID) -> None:
    TopicIds(shared=SharedTopicIds(path)).add(topic_id, "from-elsewhere")


def test_another_process_publishes_what_it_learned(tmp_path: Path) -> None:
    reader = TopicIds(shared=SharedTopicIds(tmp_path / "ids"))
    topic_id = uuid.uuid4()
    assert reader.name(topic_id) is None
    process = multiprocessing.get_context("spawn").Process(
        target=_learn_in_another_process, args=(tmp_path / "ids", topic_id))
    process.start()
    process.join(60)
    assert process.exitcode == 0
    assert reader.name(topic_id) == "from-elsewhere"


def test_a_deleted_topics_id_is_forgotten_everywhere(tmp_path: Path) -> None:
    first = TopicIds(shared=SharedTopicIds(tmp_path / "ids"))
    second = TopicIds(shared=SharedTopicIds(tmp_path / "ids"))
    gone = uuid.uuid4()
    first.add(gone, "gone")
    first.learn(ApiKey.DELETE_TOPICS, 6,
                {"Responses": [{"Name": "gone", "TopicId": gone, "ErrorCode": 0}]})
    assert first.name(gone) is None and second.name(gone) is None


def test_names_past_kafkas_limit_are_not_shared_and_the_table_never_grows(
        tmp_path: Path) -> None:
    shared = SharedTopicIds(tmp_path / "ids", sets=2)
    long_id = uuid.uuid4()
    shared.publish(long_id, "x" * (MAX_NAME_BYTES + 1))
    assert shared.lookup(long_id) is None
    size = (tmp_path / "ids").stat().st_size
    ids = [uuid.uuid4() for _ in range(100)]
    for n, topic_id in enumerate(ids):
        shared.publish(topic_id, f"t{n}")
    assert (tmp_path / "ids").stat().st_size == size
    assert shared.lookup(ids[-1]) == "t99"  # the newest stays; the oldest made room
    assert sum(shared.lookup(i) is not None for i in ids) == 16  # 2 sets x 8 ways


def test_a_process_alone_needs_no_table() -> None:
    ids = TopicIds()
    topic_id = uuid.uuid4()
    assert ids.name(topic_id) is None
    ids.add(topic_id, "t")
    assert ids.name(topic_id) == "t"
