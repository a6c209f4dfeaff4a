"""Hostile records through the real gateway: bombs are refused, masks fail closed.

Regression tests (hardening): a 660-byte zstd batch holding a million records,
or batches decompressing to tens of MiB, blocked the single event loop for seconds,
and Envoy's message timeout then dropped every healthy client; a JSON value nested
deeper than the parser follows skipped masking, and the card number was stored in
clear. Now the bombs are refused with MESSAGE_TOO_LARGE on their own connection, which
stays open, while a healthy producer next to them delivers everything; the deep value
is refused at produce and withheld at fetch.
"""

from __future__ import annotations

import select
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicCollection, TopicPartition

import kafka_wire
from benchmarks.hostile import bomb_loop
from benchmarks.wire import produce_frame, read_frame
from kafka_wire import ApiKey
from kafka_wire.records import (
    BatchHeader,
    BatchView,
    Record,
    decode_records,
    encode_batch,
    iter_batches,
)
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway
from tests.integration.conftest import create_topic, gateway_settings, rule_dir

pytestmark = pytest.mark.integration

RULES = """
rules:
  - id: mask-cards
    match: {topics: {prefix: [pii.]}}
    action: {mask: {fields: [$.card]}}
  - id: mask-cards-on-read
    match: {direction: response, topics: {prefix: [fpii.]}}
    action: {mask: {fields: [$.card]}}
"""
MESSAGE_TOO_LARGE, INVALID_RECORD = 10, 87
DEEP = 1100  # past orjson's 1024 levels


@pytest.fixture(scope="module")
def guarded(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    base = tmp_path_factory.mktemp("hostile")
    rules = rule_dir(base / "rules", {"rules.yaml": RULES})
    with Gateway(gateway_settings(kafka, base / "envoy", rules_dir=rules)) as gateway:
        yield gateway


def test_bombs_are_refused_on_their_connection_while_a_healthy_producer_delivers(
        kafka: EmbeddedKafka, guarded: Gateway) -> None:
    bombed = create_topic(kafka.bootstrap, name=f"pii.bombed-{uuid.uuid4().hex[:6]}")
    healthy = create_topic(kafka.bootstrap, name=f"pii.healthy-{uuid.uuid4().hex[:6]}")
    answers: list[Any] = []
    bomber = threading.Thread(target=bomb_loop, args=(guarded.bootstrap, bombed, 40, answers))
    bomber.start()
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": guarded.bootstrap, "linger.ms": 5,
                         "enable.idempotence": True, "message.timeout.ms": 60000})
    count = 20000
    def done(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    for i in range(count):
        producer.produce(healthy, orjson.dumps({"card": "4111", "n": i}), on_delivery=done)
        producer.poll(0)
    assert producer.flush(120) == 0
    bomber.join(120)
    assert errors == []
    assert len(answers) == 40  # every bomb answered on the same, still open connection
    assert {code for code, _ in answers} == {MESSAGE_TOO_LARGE}
    assert "1000000 records exceeds the gateway's 100000 per batch" in answers[0][1]
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"c-{uuid.uuid4()}"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(healthy, 0), timeout=10)
        assert high - low == count
        assert consumer.get_watermark_offsets(TopicPartition(bombed, 0), timeout=10) == (0, 0)
    finally:
        consumer.close()


def test_a_bomb_loop_writes_a_few_log_lines_not_one_per_bomb(
        kafka: EmbeddedKafka, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Each refused bomb wrote a warning to the ext_proc service's log: a client sending
    them in a loop (hundreds a second) filled the operator's terminal and disk at its
    own pace (regression). A kind of line now passes ten at once, then one per five
    seconds, saying how many like it were left out; every bomb is still answered."""
    rules = rule_dir(tmp_path / "rules", {"rules.yaml": RULES})
    topic = create_topic(kafka.bootstrap, name=f"pii.flood-{uuid.uuid4().hex[:6]}")
    answers: list[Any] = []
    with Gateway(gateway_settings(kafka, tmp_path / "envoy", rules_dir=rules)) as gateway:
        capfd.readouterr()  # what the start wrote
        bomb_loop(gateway.bootstrap, topic, 200, answers)
        time.sleep(0.5)  # the workers' last lines
        logged = capfd.readouterr().err
    assert {code for code, _ in answers} == {MESSAGE_TOO_LARGE} and len(answers) == 200
    refusals = [line for line in logged.splitlines() if "record rules refused" in line]
    assert 1 <= len(refusals) <= 12, len(refusals)  # 10 at once, one per 5 s after


def deep_card() -> bytes:
    return b'{"card": "4111111111111111", "x": ' + b"[" * DEEP + b"]" * DEEP + b"}"


def test_a_value_too_deep_to_mask_is_refused_at_produce(kafka: EmbeddedKafka,
                                                        guarded: Gateway) -> None:
    topic = create_topic(kafka.bootstrap, name=f"pii.deep-{uuid.uuid4().hex[:6]}")
    results: list[tuple[int, str]] = []
    producer = Producer({"bootstrap.servers": guarded.bootstrap, "retries": 0})

    def done(err: KafkaError | None, _msg: Any) -> None:
        results.append((0, "") if err is None else (err.code(), str(err)))

    producer.produce(topic, deep_card(), on_delivery=done)
    producer.produce(topic, b'{"card": "4111111111111111"}', on_delivery=done)
    assert producer.flush(30) == 0
    assert [code for code, _ in results] == [KafkaError.INVALID_RECORD] * 2  # one batch
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"c-{uuid.uuid4()}"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 0)
    finally:
        consumer.close()


def test_a_value_too_deep_to_mask_is_withheld_at_fetch(kafka: EmbeddedKafka,
                                                       guarded: Gateway) -> None:
    topic = create_topic(kafka.bootstrap, name=f"fpii.deep-{uuid.uuid4().hex[:6]}")
    direct = Producer({"bootstrap.servers": kafka.bootstrap})
    direct.produce(topic, deep_card())
    assert direct.flush(30) == 0
    direct.produce(topic, b'{"card": "4111111111111111"}')
    assert direct.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": guarded.bootstrap, "group.id": f"c-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    try:
        for _ in range(30):
            msg = consumer.poll(1)
            if msg is not None and msg.error() is None:
                got.append(bytes(msg.value() or b""))
            if got:
                break
    finally:
        consumer.close()
    # The deep record never leaves the gateway; the next one comes, masked.
    assert got == [b'{"card":"****"}']
    assert not any(b"4111" in value for value in got)


CORRUPT_MESSAGE = 2
# A header name that is not UTF-8, as kafka_wire reads it (surrogateescape): clients that
# take header names as bytes (librdkafka's C API, Go's) can write one.
ODD_HEADER = b"\xff\xfebad".decode("utf-8", "surrogateescape")


# What a broker answers while a topic it just created is not yet led here: clients retry it.
NOT_YET_LED = {3, 6}  # UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER


def produce_answer(bootstrap: str, topic: str, records: bytes) -> int:
    """The error code of a Produce of `records` to `topic`, on a raw connection; retried,
    as a client retries, while the broker has not yet taken the new topic's leadership."""
    host, port = bootstrap.rsplit(":", 1)
    deadline = time.monotonic() + 15
    while True:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(produce_frame(1, topic, records))
            _, answer = kafka_wire.decode_response(read_frame(sock), ApiKey.PRODUCE, 9)
        code = int(answer["Responses"][0]["PartitionResponses"][0]["ErrorCode"])
        if code not in NOT_YET_LED or time.monotonic() > deadline:
            return code
        time.sleep(0.1)


def test_a_produced_batch_whose_crc_is_wrong_is_refused_as_the_broker_refuses_it(
        kafka: EmbeddedKafka, guarded: Gateway) -> None:
    """A batch corrupted on its way in (its CRC no longer matches its bytes) was masked
    and written again with a CRC of its own: the broker stored the corrupted key and the
    changed amount as sound (regression). keg now checks a produced batch's CRC before a
    rule reads it, and answers CORRUPT_MESSAGE as the broker does."""
    topic = create_topic(kafka.bootstrap, name=f"pii.crc-{uuid.uuid4().hex[:6]}")
    plain = create_topic(kafka.bootstrap, name=f"plain.crc-{uuid.uuid4().hex[:6]}")
    sound = encode_batch(BatchHeader(base_timestamp=1_700_000_000_000), [
        Record(0, 0, b"KEY-A", b'{"card": "4111111111111111", "amount": 100}', [])])
    corrupted = bytearray(sound)
    corrupted[sound.index(b"KEY-A") + 4] = ord("Z")
    corrupted[sound.index(b"100")] = ord("9")  # the CRC is left as it was
    crc_flipped = bytearray(sound)
    crc_flipped[17] ^= 0xFF  # the bytes are sound, their CRC is not
    magic_7 = bytearray(sound)
    magic_7[16] = 7  # a magic no Kafka knows: the connection was closed
    for batch in (bytes(corrupted), bytes(crc_flipped), bytes(magic_7)):
        assert produce_answer(kafka.bootstrap, plain, batch) == CORRUPT_MESSAGE  # the broker
        assert produce_answer(guarded.bootstrap, topic, batch) == CORRUPT_MESSAGE
    assert produce_answer(guarded.bootstrap, topic, sound) == 0
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"c-{uuid.uuid4()}"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 1)
    finally:
        consumer.close()


def fetched(bootstrap: str, topics: dict[str, uuid.UUID]) -> dict[str, list[Record]]:
    """The records a raw Fetch v17 (by topic id) of partition 0 of each topic reads,
    after a Metadata request for them on the same connection."""
    host, port = bootstrap.rsplit(":", 1)
    body = {"ReplicaId": -1, "MaxWaitMs": 100, "MinBytes": 1, "MaxBytes": 1 << 20,
            "IsolationLevel": 0, "SessionId": 0, "SessionEpoch": -1, "Topics": [
                {"TopicId": topic_id, "Partitions": [
                    {"Partition": 0, "CurrentLeaderEpoch": -1, "FetchOffset": 0,
                     "LastFetchedEpoch": -1, "LogStartOffset": -1,
                     "PartitionMaxBytes": 1 << 20}]} for topic_id in topics.values()],
            "ForgottenTopicsData": [], "RackId": ""}
    names = {topic_id: name for name, topic_id in topics.items()}
    metadata = {"Topics": [{"Name": name, "TopicId": uuid.UUID(int=0)} for name in topics],
                "AllowAutoTopicCreation": False, "IncludeTopicAuthorizedOperations": False}
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        # As clients do: Metadata first, which names the ids (the gateway learns them).
        sock.sendall(kafka_wire.encode_request(
            kafka_wire.RequestHeader(ApiKey.METADATA, 12, 1, "raw-fetch", {}), metadata))
        read_frame(sock)
        sock.sendall(kafka_wire.encode_request(
            kafka_wire.RequestHeader(ApiKey.FETCH, 17, 2, "raw-fetch", {}), body))
        _, answer = kafka_wire.decode_response(read_frame(sock), ApiKey.FETCH, 17)
    got: dict[str, list[Record]] = {}
    for topic in answer["Responses"]:
        (partition,) = topic["Partitions"]
        assert partition["ErrorCode"] == 0, partition
        got[names[topic["TopicId"]]] = [
            r for b in iter_batches(partition["Records"]) if isinstance(b, BatchView)
            for r in decode_records(b)]
    return got


def topic_id(bootstrap: str, topic: str) -> uuid.UUID:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    found = admin.describe_topics(TopicCollection([topic]))[topic].result(30).topic_id
    high, low = found.get_most_significant_bits(), found.get_least_significant_bits()
    return uuid.UUID(int=((high % (1 << 64)) << 64) | (low % (1 << 64)))


def test_a_header_name_that_is_not_utf8_is_masked_around_not_a_closed_connection(
        kafka: EmbeddedKafka, guarded: Gateway) -> None:
    """A record whose header name is not UTF-8, on a ruled topic: the worker could not
    weigh the record and closed the connection. At produce the producer never got an
    answer; at fetch every partition the consumer read from that broker was lost with
    it, again at each retry (regression: a consumer of that partition and two others
    read nothing). The header name now goes through byte for byte."""
    produced = create_topic(kafka.bootstrap, name=f"pii.hdr-{uuid.uuid4().hex[:6]}")
    stored = create_topic(kafka.bootstrap, name=f"fpii.hdr-{uuid.uuid4().hex[:6]}")
    plain = create_topic(kafka.bootstrap, name=f"plain.hdr-{uuid.uuid4().hex[:6]}")
    batch = encode_batch(BatchHeader(base_timestamp=1_700_000_000_000), [
        Record(0, 0, b"k", b'{"card": "4111111111111111"}', [(ODD_HEADER, b"v")])])
    assert produce_answer(guarded.bootstrap, produced, batch) == 0
    assert produce_answer(kafka.bootstrap, stored, batch) == 0  # written directly
    assert produce_answer(kafka.bootstrap, plain, encode_batch(
        BatchHeader(base_timestamp=1_700_000_000_000), [Record(0, 0, b"k", b"plain", [])])) == 0
    ids = {name: topic_id(kafka.bootstrap, name) for name in (produced, stored, plain)}
    direct = fetched(kafka.bootstrap, {produced: ids[produced]})[produced]
    through = fetched(guarded.bootstrap, {stored: ids[stored], plain: ids[plain]})
    for record in (direct[0], through[stored][0]):
        assert record.value == b'{"card":"****"}'
        assert record.headers == [(ODD_HEADER, b"v")]
    assert [r.value for r in through[plain]] == [b"plain"]


def closed_sockets(sockets: list[socket.socket], at_least: int,
                   within_s: float) -> set[socket.socket]:
    """The sockets the peer closed, waiting until `at_least` are or `within_s` passed."""
    closed: set[socket.socket] = set()
    deadline = time.monotonic() + within_s
    while len(closed) < at_least and time.monotonic() < deadline:
        readable, _, _ = select.select([s for s in sockets if s not in closed], [], [], 0.5)
        for sock in readable:
            try:
                if sock.recv(1) == b"":
                    closed.add(sock)
            except OSError:  # reset
                closed.add(sock)
    return closed


def process_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_connections_holding_big_frames_are_bounded_together(
        kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> None:
    """12 connections each send most of a 10 MiB Produce a record rule must read, and
    never finish it: the ext_proc service holds at most its budget (32 MiB here), the
    connections past it are closed, and a healthy producer still delivers."""
    base = tmp_path_factory.mktemp("held")
    rules = rule_dir(base / "rules", {"rules.yaml": RULES})
    budget = 32 * 1024 * 1024
    settings = gateway_settings(kafka, base / "envoy", rules_dir=rules, max_held_bytes=budget)
    topic = create_topic(kafka.bootstrap, name=f"pii.held-{uuid.uuid4().hex[:6]}")
    big = produce_frame(1, topic, encode_batch(
        BatchHeader(base_timestamp=1_700_000_000_000),
        [Record(0, 0, None, b"x" * (10 * 1024 * 1024), [])]))
    with Gateway(settings) as gateway:
        ext_proc_pid = gateway.ext_proc_pid
        assert ext_proc_pid is not None
        before = process_rss(ext_proc_pid)
        host, port = gateway.bootstrap.rsplit(":", 1)
        sockets: list[socket.socket] = []
        # A connection past the budget may be closed while its frame is still being
        # sent (the refusal does not wait for the rest): that reset counts as closed.
        reset_while_sending: set[socket.socket] = set()
        try:
            for _ in range(12):
                sock = socket.create_connection((host, int(port)), timeout=10)
                sockets.append(sock)
                try:
                    sock.sendall(big[: len(big) - 1024])  # all but the last KiB: held
                except (ConnectionResetError, BrokenPipeError):
                    reset_while_sending.add(sock)
            still_open = [s for s in sockets if s not in reset_while_sending]
            closed = reset_while_sending | closed_sockets(
                still_open, at_least=12 - 3 - len(reset_while_sending), within_s=60)
            grown = process_rss(ext_proc_pid) - before
            healthy = Producer({"bootstrap.servers": gateway.bootstrap})
            healthy.produce(topic, b'{"card": "4111"}')
            assert healthy.flush(30) == 0
        finally:
            for sock in sockets:
                sock.close()
    assert len(closed) >= 12 - budget // (10 * 1024 * 1024)  # at most 3 fit in 32 MiB
    assert grown < budget + 64 * 1024 * 1024, f"ext_proc grew by {grown >> 20} MiB"
