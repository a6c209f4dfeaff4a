"""Real record batches through kafka_wire.records: written by librdkafka and by the Java
producer with every codec, returned by the broker (LogAppendTime, compaction gaps,
transaction markers, a cut last batch), re-encoded, produced back, and read by real
consumers (librdkafka and Java) from Fetch responses we rewrote.

Batches are captured with raw Fetch requests (kafka_wire over a socket) to the broker.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import kafka_wire
from kafka_wire import ApiKey
from kafka_wire.records import (
    BatchHeader,
    BatchView,
    Compression,
    ControlType,
    OpaqueEntry,
    Record,
    TimestampType,
    control_type,
    decode_records,
    encode_batch,
    iter_batches,
    record_offset,
    rewrite_records,
    verify_crc,
)
from keg.embedded.kafka import EmbeddedKafka, run_java_tool
from tests.integration.raw_kafka import RawConnection, read_frame

pytestmark = pytest.mark.integration

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
INVALID_RECORD = 87
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
MESSAGES = 40  # per producer run

Message = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


# --------------------------------------------------------------------------- raw protocol


# UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER
_RETRIABLE = frozenset({3, 5, 6})


class RawBroker(RawConnection):
    """One connection speaking kafka_wire: Fetch v12, Produce v9, InitProducerId v4."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(bootstrap, "records-test", timeout=30)

    def fetch(self, topic: str, offset: int = 0, max_bytes: int = 8 << 20,
              isolation: int = 0) -> bytes:
        body = {
            "ReplicaId": -1, "MaxWaitMs": 0, "MinBytes": 0, "MaxBytes": 64 << 20,
            "IsolationLevel": isolation, "SessionId": 0, "SessionEpoch": -1,
            "Topics": [{"Topic": topic, "Partitions": [{
                "Partition": 0, "CurrentLeaderEpoch": -1, "FetchOffset": offset,
                "LastFetchedEpoch": -1, "LogStartOffset": -1, "PartitionMaxBytes": max_bytes,
            }]}],
        }
        response = self.request(ApiKey.FETCH, 12, body)
        (partition,) = response["Responses"][0]["Partitions"]
        assert partition["ErrorCode"] == 0, partition
        return bytes(partition["Records"] or b"")

    def produce(self, topic: str, records: bytes) -> dict[str, Any]:
        body = {"TransactionalId": None, "Acks": -1, "TimeoutMs": 30_000, "TopicData": [
            {"Name": topic, "PartitionData": [{"Index": 0, "Records": records}]}]}
        # A topic just created may not have its leader yet: retry what Kafka calls retriable.
        deadline = time.monotonic() + 30
        while True:
            response = self.request(ApiKey.PRODUCE, 9, body)
            result: dict[str, Any] = response["Responses"][0]["PartitionResponses"][0]
            if result["ErrorCode"] not in _RETRIABLE or time.monotonic() > deadline:
                return result
            time.sleep(0.2)

    def init_producer_id(self) -> tuple[int, int]:
        response = self.request(ApiKey.INIT_PRODUCER_ID, 4, {
            "TransactionalId": None, "TransactionTimeoutMs": 60_000,
            "ProducerId": -1, "ProducerEpoch": -1})
        assert response["ErrorCode"] == 0, response
        return response["ProducerId"], response["ProducerEpoch"]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def raw(kafka: EmbeddedKafka) -> Iterator[RawBroker]:
    conn = RawBroker(kafka.bootstrap)
    yield conn
    conn.close()


def make_topic(bootstrap: str, **config: str) -> str:
    topic = f"rb-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, 1, 1, config=config)], operation_timeout=30)
    futures[topic].result(30)
    return topic


def v2_batches(records: bytes) -> list[BatchView]:
    return [e for e in iter_batches(records) if isinstance(e, BatchView)]


# --------------------------------------------------------------------------- clients


def messages(origin: str, codec: str) -> list[Message]:
    out: list[Message] = []
    for i in range(MESSAGES):
        key = None if i % 5 == 0 else f"key-{i % 7}".encode()
        value = None if i % 9 == 4 else f"{origin}-{codec}-{i}-".encode() + b"payload " * (i % 6)
        headers: list[tuple[str, bytes | None]] = [("origin", origin.encode()), ("i", b"%d" % i)]
        if i % 4 == 1:
            headers.append(("empty", None))
        out.append((key, value, headers))
    return out


def rdkafka_produce(bootstrap: str, topic: str, batch: list[Message], **conf: Any) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 200,
                         "enable.idempotence": False, **conf})
    for key, value, headers in batch:
        producer.produce(topic, value=value, key=key, partition=0,
                         headers=[(name, header) for name, header in headers])
    assert producer.flush(30) == 0


NULL = "<null>"


def java_produce(bootstrap: str, topic: str, codec: str, batch: list[Message]) -> None:
    def text(b: bytes | None) -> str:
        return NULL if b is None else b.decode()

    lines = [
        ",".join(f"{k}:{text(v)}" for k, v in headers) + f"\t{text(key)}\t{text(value)}"
        for key, value, headers in batch
    ]
    run_java_tool(
        "console-producer", "--bootstrap-server", bootstrap, "--topic", topic,
        "--compression-codec", codec,
        "--producer-property", "linger.ms=500",
        "--property", "parse.key=true", "--property", "parse.headers=true",
        "--property", f"null.marker={NULL}",
        input="\n".join(lines) + "\n", check=True, timeout=90,
    )


def consume(bootstrap: str, topic: str, count: int, timeout: float = 30.0,
            linger: float = 0.0) -> list[Any]:
    """``count`` messages of partition 0 from the start (librdkafka, no group join), then
    ``linger`` seconds more of polling, which must bring nothing."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "topic.metadata.refresh.interval.ms": 60_000,
    })
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append(msg)
        deadline = time.monotonic() + linger
        while time.monotonic() < deadline:
            assert consumer.poll(0.25) is None
    finally:
        consumer.close()
    return out


def as_message(record: Record) -> Message:
    return record.key, record.value, record.headers


# --------------------------------------------------------------------------- fixtures


@dataclasses.dataclass
class Written:
    topics: dict[tuple[str, str], str]  # (origin, codec) -> topic
    sent: dict[tuple[str, str], list[Message]]


@pytest.fixture(scope="module")
def compacted(kafka: EmbeddedKafka) -> str:
    """Started first (`_compaction_starts_first`) so the log cleaner works meanwhile."""
    topic = make_topic(kafka.bootstrap, **{
        "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
        "segment.ms": "100", "min.compaction.lag.ms": "0", "delete.retention.ms": "100",
    })
    rdkafka_produce(kafka.bootstrap, topic,
                    [(b"k%d" % (i % 5), b"v%d" % i, []) for i in range(100)])
    time.sleep(0.3)  # past segment.ms: the next append rolls the segment, making it cleanable
    rdkafka_produce(kafka.bootstrap, topic, [(b"other", b"roll", [])])
    return topic


@pytest.fixture(scope="module")
def written(kafka: EmbeddedKafka) -> Written:
    topics: dict[tuple[str, str], str] = {}
    sent: dict[tuple[str, str], list[Message]] = {}
    for codec in CODECS:
        for origin in ("rdkafka", "java"):
            topics[origin, codec] = make_topic(kafka.bootstrap)
            sent[origin, codec] = messages(origin, codec)
    with ThreadPoolExecutor(3) as pool:  # JVM start-ups overlap
        futures = [
            pool.submit(java_produce, kafka.bootstrap, topics["java", c], c, sent["java", c])
            for c in CODECS
        ]
        for codec in CODECS:
            rdkafka_produce(kafka.bootstrap, topics["rdkafka", codec], sent["rdkafka", codec],
                            **{"compression.type": codec})
        for future in futures:
            future.result()
    return Written(topics, sent)


# --------------------------------------------------------------------------- checks


def check_round_trip(field: bytes) -> list[tuple[BatchView, list[Record]]]:
    """Every batch verifies, decodes, and re-encodes: byte-exact when uncompressed, to the
    same records and header when compressed; the whole field passes through untouched."""
    entries = list(iter_batches(field))
    assert b"".join(bytes(e.raw) for e in entries) == field
    assert rewrite_records(field, lambda b: None) is field
    out = []
    for entry in entries:
        if isinstance(entry, OpaqueEntry):
            assert entry.kind == "truncated" and entry is entries[-1]
            continue
        assert verify_crc(entry)
        records = decode_records(entry, verify=True)
        assert len(records) == entry.records_count
        again = encode_batch(entry, records)
        if entry.compression == Compression.NONE:
            assert again == bytes(entry.raw)
        else:
            view = BatchView.from_bytes(again)
            assert view.header._replace(crc=0, batch_length=0) == entry.header._replace(
                crc=0, batch_length=0)
            assert view.is_xerial == entry.is_xerial
            assert decode_records(view, verify=True) == records
        out.append((entry, records))
    return out


@pytest.fixture(scope="module", autouse=True)
def _compaction_starts_first(compacted: str) -> None:
    """The compacted topic is made before the module's first test, so the log cleaner
    works while the others run; its check is the module's last test."""


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("origin", ["rdkafka", "java"])
def test_client_batches_round_trip(written: Written, raw: RawBroker, origin: str,
                                   codec: str) -> None:
    field = raw.fetch(written.topics[origin, codec])
    batches = check_round_trip(field)
    assert {b.compression.name.lower() for b, _ in batches} == {codec}
    if codec == "snappy":
        # The Java producer frames snappy as xerial; librdkafka writes raw snappy.
        assert {b.is_xerial for b, _ in batches} == {origin == "java"}
    got = [as_message(r) for _, records in batches for r in records]
    assert got == written.sent[origin, codec]
    assert all(b.timestamp_type == TimestampType.CREATE_TIME for b, _ in batches)
    # The Java producer is idempotent by default (Kafka 3.0+); ours asked librdkafka not to be.
    assert {b.producer_id >= 0 for b, _ in batches} == {origin == "java"}
    assert any(len(records) > 1 for _, records in batches)
    offsets = [record_offset(b, r) for b, records in batches for r in records]
    assert offsets == list(range(MESSAGES))


def test_reencoded_batches_are_accepted(written: Written, raw: RawBroker,
                                        kafka: EmbeddedKafka) -> None:
    """Each client batch, decoded and re-encoded with its codec (one value changed), is
    accepted by the broker and read back by librdkafka."""
    target = make_topic(kafka.bootstrap)
    expected: list[Message] = []
    for key in written.topics:
        for batch, records in check_round_trip(raw.fetch(written.topics[key])):
            records[0] = dataclasses.replace(records[0], value=b"changed " + key[0].encode())
            result = raw.produce(target, encode_batch(batch, records))
            assert result["ErrorCode"] == 0, str(result)
            expected += [as_message(r) for r in records]
    got = consume(kafka.bootstrap, target, len(expected))
    assert [(m.key(), m.value(), m.headers() or []) for m in got] == expected


def test_log_append_time(raw: RawBroker, kafka: EmbeddedKafka) -> None:
    topic = make_topic(kafka.bootstrap, **{"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    for codec in ("none", "lz4"):
        rdkafka_produce(kafka.bootstrap, topic, messages("lat", codec)[:10],
                        **{"compression.type": codec})
    batches = check_round_trip(raw.fetch(topic))
    assert [b.compression for b, _ in batches] == [Compression.NONE, Compression.LZ4]
    for batch, records in batches:
        assert batch.timestamp_type == TimestampType.LOG_APPEND_TIME
        assert batch.max_timestamp >= before
        # Dropping records keeps the broker's append time.
        again = BatchView.from_bytes(encode_batch(batch, records[1:]))
        assert again.max_timestamp == batch.max_timestamp
        assert again.timestamp_type == TimestampType.LOG_APPEND_TIME


def test_transaction_markers(raw: RawBroker, kafka: EmbeddedKafka) -> None:
    topic = make_topic(kafka.bootstrap)
    producer = Producer({"bootstrap.servers": kafka.bootstrap,
                         "transactional.id": f"tx-{uuid.uuid4().hex[:8]}",
                         "compression.type": "zstd"})
    producer.init_transactions(30)
    for commit in (True, False):
        producer.begin_transaction()
        for i in range(3):
            producer.produce(topic, value=b"tx %s %d" % (b"commit" if commit else b"abort", i),
                             key=b"k", partition=0)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    del producer
    deadline = time.monotonic() + 20  # the coordinator writes the markers after EndTxn
    while len(batches := check_round_trip(raw.fetch(topic))) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    kinds = [
        (b.is_control, control_type(records[0]) if b.is_control else len(records))
        for b, records in batches
    ]
    assert kinds == [(False, 3), (True, ControlType.COMMIT), (False, 3), (True, ControlType.ABORT)]
    assert all(b.is_transactional and b.producer_id >= 0 for b, _ in batches)
    data = [b for b, _ in batches if not b.is_control]
    assert [b.compression for b in data] == [Compression.ZSTD] * 2
    assert all(b.compression == Compression.NONE for b, _ in batches if b.is_control)
    # Rewriting values leaves the markers byte-exact.
    field = raw.fetch(topic)
    out = rewrite_records(field, lambda b: [dataclasses.replace(r, value=b"x")
                                            for r in decode_records(b)])
    markers = [bytes(b.raw) for b in v2_batches(field) if b.is_control]
    assert [bytes(b.raw) for b in v2_batches(out) if b.is_control] == markers


def test_fetch_cut_inside_a_batch(written: Written, raw: RawBroker, kafka: EmbeddedKafka) -> None:
    topic = make_topic(kafka.bootstrap)
    for i in range(4):
        rdkafka_produce(kafka.bootstrap, topic, messages(f"cut{i}", "none")[:10])
    full = raw.fetch(topic)
    sizes = [len(b.raw) for b in v2_batches(full)]
    # At least one batch per flush; a loaded machine can split a flush's ten records in two.
    assert len(sizes) >= 4
    cut = raw.fetch(topic, max_bytes=sizes[0] + sizes[1] + 25)
    entries = list(iter_batches(cut))
    assert len(cut) == sizes[0] + sizes[1] + 25  # the broker cut the third batch
    assert isinstance(entries[-1], OpaqueEntry) and entries[-1].kind == "truncated"
    check_round_trip(cut)
    out = rewrite_records(cut, lambda b: decode_records(b)[:3])
    assert bytes(out).endswith(bytes(entries[-1].raw))


def test_produce_rules_for_dropped_records(raw: RawBroker, kafka: EmbeddedKafka) -> None:
    """What a broker accepts from a producer: gaps are refused, renumbered batches taken,
    and renumbering breaks an idempotent producer's sequence (why encode_batch refuses)."""
    topic = make_topic(kafka.bootstrap)
    records = [Record(i, i, b"k", b"v%d" % i) for i in range(5)]
    header = BatchHeader(base_timestamp=int(time.time() * 1000))
    kept_gap = encode_batch(header, [r for r in records if r.offset_delta != 2])
    result = raw.produce(topic, kept_gap)
    assert result["ErrorCode"] == INVALID_RECORD, result  # "Inconsistent batch offset range"
    renumbered = encode_batch(header, [r for r in records if r.offset_delta != 2], renumber=True)
    assert raw.produce(topic, renumbered)["ErrorCode"] == 0
    assert [m.value() for m in consume(kafka.bootstrap, topic, 4)] == [b"v0", b"v1", b"v3", b"v4"]

    producer_id, epoch = raw.init_producer_id()
    idempotent = header._replace(producer_id=producer_id, producer_epoch=epoch,
                                 base_sequence=0, last_offset_delta=4)
    with pytest.raises(kafka_wire.EncodeError, match="sequence"):
        encode_batch(idempotent, records[:4], renumber=True)
    # Forced anyway: the broker takes it, then refuses the producer's next batch.
    forced = encode_batch(idempotent._replace(last_offset_delta=3), records[:4], renumber=True)
    assert raw.produce(topic, forced)["ErrorCode"] == 0
    following = encode_batch(idempotent._replace(base_sequence=5), records)
    assert raw.produce(topic, following)["ErrorCode"] == OUT_OF_ORDER_SEQUENCE_NUMBER


# --------------------------------------------------------------------------- consumers


class RewritingProxy:
    """A Kafka proxy for one broker, inside the test: requests go through in order; the
    broker address in Metadata/FindCoordinator responses becomes the proxy's, and the
    records of Fetch responses go through ``rewrite_records(records, fn)``."""

    def __init__(self, broker: str, fn: Callable[[BatchView], list[Record] | None]) -> None:
        host, _, port = broker.rpartition(":")
        self.upstream = (host, int(port))
        self.fn = fn
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.rewritten_fetches = 0
        self.fetch_offsets: list[int] = []
        self.errors: list[BaseException] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            with client, socket.create_connection(self.upstream) as upstream:
                while (frame := read_frame(client)) is not None:
                    header, offset = kafka_wire.read_request_header(frame)
                    if header.api_key == ApiKey.FETCH:
                        self._note_offsets(header.api_version, frame, offset)
                    upstream.sendall(struct.pack(">i", len(frame)) + frame)
                    response = read_frame(upstream)
                    if response is None:
                        return
                    client.sendall(self._rewrite(header.api_key, header.api_version, response))
        except OSError:
            return
        except BaseException as exc:  # surfaced by the test
            self.errors.append(exc)

    def _note_offsets(self, version: int, frame: bytes, offset: int) -> None:
        body, _ = kafka_wire.decode_body(ApiKey.FETCH, version, "request", frame, offset)
        for topic in body["Topics"]:
            self.fetch_offsets += [p["FetchOffset"] for p in topic["Partitions"]]

    def _rewrite(self, api_key: int, version: int, frame: bytes) -> bytes:
        if api_key not in (ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.FETCH):
            return struct.pack(">i", len(frame)) + frame
        correlation, tags, offset = kafka_wire.read_response_header(frame, api_key, version)
        body, _ = kafka_wire.decode_body(api_key, version, "response", frame, offset)
        if api_key == ApiKey.FETCH:
            for topic in body["Responses"]:
                for partition in topic["Partitions"]:
                    new = rewrite_records(partition["Records"], self.fn)
                    if new is not partition["Records"]:
                        self.rewritten_fetches += 1
                    partition["Records"] = new
        else:
            self._readdress(body)
        return kafka_wire.encode_response(correlation, api_key, version, body, tags)

    def _readdress(self, value: Any) -> None:
        if isinstance(value, list):
            for item in value:
                self._readdress(item)
        elif isinstance(value, dict):
            if "Host" in value and "Port" in value:
                value["Host"], value["Port"] = "127.0.0.1", self.port
            for item in value.values():
                self._readdress(item)


def mask_and_drop(batch: BatchView) -> list[Record]:
    """Drop the second record of every batch (an offset gap), upper-case the values;
    empty the gzip batches (mid-partition) and the Java zstd ones (the partition's end)."""
    records = decode_records(batch)
    if any(r.value and (b"-gzip-" in r.value or b"java-zstd" in r.value) for r in records):
        return []
    return [
        dataclasses.replace(r, value=r.value.upper() if r.value is not None else None)
        for r in records
        if r.offset_delta != 1
    ]


def test_consumers_read_rewritten_fetch_responses(written: Written, raw: RawBroker,
                                                  kafka: EmbeddedKafka) -> None:
    """Every client batch (original bytes: every codec, raw and xerial snappy) goes into
    one topic; librdkafka and the Java consumer read it through a proxy that drops a
    record per batch and changes the others, re-compressing with the batch's codec, and
    empties some batches (in the middle and at the end of the partition)."""
    mixed = make_topic(kafka.bootstrap)
    expected: list[tuple[int, bytes | None]] = []
    emptied = end = 0
    for key in written.topics:
        for batch in v2_batches(raw.fetch(written.topics[key])):
            result = raw.produce(mixed, bytes(batch.raw))  # passed through untouched
            assert result["ErrorCode"] == 0, result
            end = result["BaseOffset"] + batch.last_offset_delta + 1
            kept = mask_and_drop(batch)
            emptied += not kept
            for record in kept:
                expected.append((result["BaseOffset"] + record.offset_delta, record.value))
    assert emptied >= 3 and len(expected) < len(written.topics) * MESSAGES
    proxy = RewritingProxy(kafka.bootstrap, mask_and_drop)
    try:
        got = consume(proxy.bootstrap, mixed, len(expected), linger=1.0)
        assert [(m.offset(), m.value()) for m in got] == expected
        # librdkafka stepped over the empty batches at the end: it next fetched after them.
        assert max(proxy.fetch_offsets) == end
        java = run_java_tool(
            "console-consumer", "--bootstrap-server", proxy.bootstrap, "--topic", mixed,
            "--partition", "0", "--offset", "earliest", "--max-messages", str(len(expected)),
            "--timeout-ms", "30000", "--property", "print.offset=true",
            "--property", "print.value=true", "--property", f"null.literal={NULL}",
            check=True, timeout=90,
        )
        lines = [line for line in java.stdout.splitlines() if line.startswith("Offset:")]
        parsed = []
        for line in lines:
            match = re.match(r"Offset:(\d+)\t(.*)$", line)
            assert match, line
            value = None if match[2] == NULL else match[2].encode()
            parsed.append((int(match[1]), value))
        assert parsed == expected
        assert proxy.rewritten_fetches > 0 and not proxy.errors
    finally:
        proxy.close()


# --------------------------------------------------------------------------- compaction


def test_compacted_topic_has_offset_gaps(compacted: str, raw: RawBroker) -> None:
    """The log cleaner leaves the last value of each key; batches keep their offset span."""
    deadline = time.monotonic() + 60
    while True:
        batches = check_round_trip(raw.fetch(compacted))
        first, records = batches[0]
        if first.records_count < first.last_offset_delta + 1 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert first.records_count == 5, "the log cleaner did not run within 60 s"
    assert first.last_offset_delta == 99
    assert [record_offset(first, r) for r in records] == [95, 96, 97, 98, 99]
    assert [r.value for r in records] == [b"v95", b"v96", b"v97", b"v98", b"v99"]
    # Our re-encoding of a gapped batch keeps the gaps (byte-exact, uncompressed).
    assert encode_batch(first, records) == bytes(first.raw)
