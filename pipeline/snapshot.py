"""`keg capture`: a topic range read straight from Kafka into the capture format.

Partitions are assigned (no consumer group offsets are committed); each starts at
`--from-offset` or the first offset at `--from-time`, and ends before `--to-offset`
or the first offset at `--to-time`, or at the high watermark when the snapshot
starts. Records are written with `interceptors.capture.CaptureWriter`, the same
writer the `capture` action uses, so `keg backtest` reads both alike.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from interceptors.capture import ROW_GROUP_ROWS, CaptureWriter, Row, to_row
from interceptors.contract import InterceptedRecord, RecordDirection
from pipeline.errors import PipelineError

IDLE_TIMEOUT_S: Final = 30.0
METADATA_TIMEOUT_S: Final = 15.0


@dataclass(frozen=True)
class Range:
    partition: int
    start: int
    end: int  # exclusive

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


@dataclass
class SnapshotResult:
    records: int
    ranges: list[Range]
    files: list[Path] = field(default_factory=list)
    full: bool = False  # max_bytes reached before the end


def _consumer(bootstrap: str, extra: dict[str, Any] | None) -> Any:
    from confluent_kafka import Consumer

    return Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"keg-capture-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        **(extra or {}),
    })


def _partitions(consumer: Any, topic: str) -> list[int]:
    """The topic's partitions; PipelineError, in a line, when Kafka cannot be reached or
    the topic is not there for this client."""
    from confluent_kafka import KafkaError, KafkaException

    try:
        meta = consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S)
    except KafkaException as exc:
        raise PipelineError(f"cannot reach Kafka: {exc.args[0]}") from None
    info = meta.topics.get(topic)
    if info is not None and info.error is not None and \
            info.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        raise PipelineError(f"topic '{topic}': not authorized ({info.error.str()})")
    if info is None or info.error is not None or not info.partitions:
        # A gateway leaves the topics a rule denies out of Metadata, as Kafka's authorizer
        # leaves out those a client may not describe: to this client they do not exist.
        raise PipelineError(f"topic '{topic}' does not exist (or is hidden from this "
                            "client: a gateway or broker that denies it leaves it out)")
    return sorted(info.partitions)


def check_topic(bootstrap: str, topic: str) -> None:
    """Before a Spark job reads `topic` (a backtest from kafka://, `analyze --follow`):
    one clear line when Kafka cannot be reached or has no such topic, where Spark hung
    for minutes or printed a JVM trace that never named the topic."""
    consumer = _consumer(bootstrap, None)
    try:
        _partitions(consumer, topic)
    finally:
        consumer.close()


def plan_ranges(consumer: Any, topic: str, partitions: list[int] | None,
                from_offset: int | None, to_offset: int | None,
                from_time_ms: int | None, to_time_ms: int | None) -> list[Range]:
    """The offset range to read per partition (empty ranges included)."""
    from confluent_kafka import TopicPartition

    known = _partitions(consumer, topic)
    chosen = partitions if partitions else known
    missing = sorted(set(chosen) - set(known))
    if missing:
        raise PipelineError(f"topic '{topic}' has no partition {missing[0]} "
                            f"(partitions 0..{known[-1]})")

    def at_time(ms: int | None, fallback: list[int]) -> list[int]:
        if ms is None:
            return fallback
        found = consumer.offsets_for_times([TopicPartition(topic, p, ms) for p in chosen],
                                           timeout=METADATA_TIMEOUT_S)
        # -1: no record at or after that time: the range ends (or starts) at the end.
        return [f.offset if f.offset >= 0 else high for f, high in zip(found, highs,
                                                                        strict=True)]

    lows, highs = [], []
    for p in chosen:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                   timeout=METADATA_TIMEOUT_S)
        lows.append(low)
        highs.append(high)
    starts = at_time(from_time_ms, [max(low, from_offset or 0) for low in lows])
    ends = at_time(to_time_ms, [min(high, to_offset) if to_offset is not None else high
                                for high in highs])
    return [Range(p, s, max(s, e)) for p, s, e in zip(chosen, starts, ends, strict=True)]


def snapshot(bootstrap: str, topic: str, out: Path, *, partitions: list[int] | None = None,
             from_offset: int | None = None, to_offset: int | None = None,
             from_time_ms: int | None = None, to_time_ms: int | None = None,
             direction: RecordDirection = "produce", include_values: bool = True,
             max_bytes: int = 1 << 30, rotate_bytes: int = 64 << 20,
             on_progress: Callable[[int, int], None] | None = None,
             consumer_config: dict[str, Any] | None = None) -> SnapshotResult:
    """Copy the range to `out`; `on_progress(done, total)` after every poll.

    PipelineError when `out` already holds a capture of `topic`: a backtest reads every
    file there, so records captured twice counted twice (1,800 for a 900-record topic)."""
    held = sorted(out.glob(f"date=*/topic={topic}/*.parquet"))
    if held:
        raise PipelineError(
            f"{out} already holds a capture of {topic} ({len(held)} file(s), e.g. "
            f"{held[0].relative_to(out)}): a backtest reads every file there, so records "
            "captured again would count twice; capture into another --out, or remove "
            "those files first")
    consumer = _consumer(bootstrap, consumer_config)
    try:
        ranges = plan_ranges(consumer, topic, partitions, from_offset, to_offset,
                             from_time_ms, to_time_ms)
        total = sum(r.size for r in ranges)
        writer = CaptureWriter(out, max_bytes=max_bytes, rotate_bytes=rotate_bytes)
        try:
            return _copy(consumer, topic, ranges, total, writer, direction, include_values,
                         on_progress)
        except BaseException:
            # Cut short (Ctrl-C, an error): nothing of it stays, so it is never read as a
            # whole capture, and capturing again into `out` is not refused for it.
            writer.abort()
            raise
    finally:
        consumer.close()


def _copy(consumer: Any, topic: str, ranges: list[Range], total: int, writer: CaptureWriter,
          direction: RecordDirection, include_values: bool,
          on_progress: Callable[[int, int], None] | None) -> SnapshotResult:
    """Copies `ranges` of `topic` through `writer` (snapshot's loop)."""
    from confluent_kafka import KafkaError, TopicPartition

    result = SnapshotResult(0, ranges)
    pending = {r.partition: r for r in ranges if r.size}
    position = {r.partition: r.start for r in ranges}
    if pending:
        consumer.assign([TopicPartition(topic, r.partition, r.start)
                         for r in pending.values()])
    rows: list[Row] = []
    last_progress = time.monotonic()
    while pending and not writer.full:
        messages = consumer.consume(num_messages=1000, timeout=1.0)
        now_ms = int(time.time() * 1000)
        for msg in messages:
            p = msg.partition()
            if p not in pending:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    position[p] = pending[p].end  # nothing more: markers or compaction
                    del pending[p]
                    continue
                raise PipelineError(f"reading {topic}[{p}]: {error.str()}")
            offset = msg.offset()
            if offset >= pending[p].end:
                position[p] = pending[p].end
                del pending[p]
                continue
            position[p] = offset + 1
            ts_type, ts = msg.timestamp()
            record = InterceptedRecord(topic, p, msg.key(), msg.value(),
                                       list(msg.headers() or ()), ts if ts_type else -1,
                                       offset, None, direction)
            rows.append(to_row(record, include_value=include_values, now_ms=now_ms))
            if offset + 1 >= pending[p].end:
                del pending[p]
        if len(rows) >= ROW_GROUP_ROWS or not pending:
            result.records += writer.write(rows)
            rows = []
        if messages:
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > IDLE_TIMEOUT_S:
            raise PipelineError(f"no records from {topic} for {IDLE_TIMEOUT_S:.0f} s "
                                f"({len(pending)} partition(s) unfinished)")
        if on_progress is not None:
            on_progress(sum(position[r.partition] - r.start for r in ranges), total)
    if rows:
        result.records += writer.write(rows)
    if not result.records:
        writer.write_empty(topic)
    result.full = writer.full and bool(pending)
    writer.close()
    result.files = writer.files
    return result


__all__ = ["Range", "SnapshotResult", "plan_ranges", "snapshot"]
