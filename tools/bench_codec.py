"""Decode/encode throughput of kafka_wire vs kafka-python (and kio when importable).

    .venv/bin/python tools/bench_codec.py            # kafka_wire and kafka-python
    /tmp/kio-venv/bin/python tools/bench_codec.py    # + kio, in a venv that has it

The messages: a MetadataResponse v12 (3 brokers, 20 topics x 6 partitions, 3 replicas)
and a ProduceRequest v9 frame, header included (2 topics x 3 partitions, 1 KiB records).
Run from the repository root so that `kafka_wire` is importable.
"""

from __future__ import annotations

import sys
import timeit
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kafka_wire as kw
from kafka_wire import ApiKey


def metadata_value() -> dict[str, Any]:
    brokers = [
        {"NodeId": i, "Host": f"broker-{i}.kafka.internal", "Port": 9092, "Rack": f"az{i}"}
        for i in range(3)
    ]
    topics = []
    for t in range(20):
        parts = [
            {
                "ErrorCode": 0,
                "PartitionIndex": p,
                "LeaderId": p % 3,
                "LeaderEpoch": 4,
                "ReplicaNodes": [0, 1, 2],
                "IsrNodes": [0, 1, 2],
                "OfflineReplicas": [],
            }
            for p in range(6)
        ]
        topics.append(
            {
                "ErrorCode": 0,
                "Name": f"orders.events.v{t}",
                "TopicId": uuid.uuid4(),
                "IsInternal": False,
                "Partitions": parts,
                "TopicAuthorizedOperations": -(2**31),
            }
        )
    return {
        "ThrottleTimeMs": 0,
        "Brokers": brokers,
        "ClusterId": "c-1",
        "ControllerId": 1,
        "Topics": topics,
    }


def produce_value() -> dict[str, Any]:
    records = b"\x00" * 1024
    topics = [
        {
            "Name": f"orders.t{t}",
            "PartitionData": [{"Index": p, "Records": records} for p in range(3)],
        }
        for t in range(2)
    ]
    return {"TransactionalId": None, "Acks": -1, "TimeoutMs": 30000, "TopicData": topics}


def rate(fn: Callable[[], object], seconds: float = 1.0) -> float:
    """Calls per second, best of 3 runs of about `seconds`."""
    n = 1
    while timeit.timeit(fn, number=n) < 0.2:
        n *= 2
    best = min(timeit.repeat(fn, number=n, repeat=3))
    return n / best


def main() -> None:
    md_body = kw.encode_body(ApiKey.METADATA, 12, "response", metadata_value())
    header = kw.RequestHeader(ApiKey.PRODUCE, 9, 7, "producer-1")
    produce_frame = kw.encode_request(header, produce_value())[4:]
    print(
        f"MetadataResponse v12: {len(md_body)} bytes; ProduceRequest v9 frame: "
        f"{len(produce_frame)} bytes"
    )
    results: list[tuple[str, str, float]] = []

    results.append(
        (
            "kafka_wire",
            "decode Metadata response",
            rate(lambda: kw.decode_body(ApiKey.METADATA, 12, "response", md_body)),
        )
    )
    results.append(
        (
            "kafka_wire",
            "decode Produce request (header+body)",
            rate(lambda: kw.decode_request(produce_frame)),
        )
    )
    md_value = kw.decode_body(ApiKey.METADATA, 12, "response", md_body)[0]
    results.append(
        (
            "kafka_wire",
            "encode Metadata response",
            rate(lambda: kw.encode_body(ApiKey.METADATA, 12, "response", md_value)),
        )
    )

    try:
        from kafka.protocol.metadata import MetadataResponse
        from kafka.protocol.producer import ProduceRequest
    except ImportError:
        pass
    else:
        results.append(
            (
                "kafka-python",
                "decode Metadata response",
                rate(lambda: MetadataResponse.decode(md_body, version=12)),
            )
        )
        results.append(
            (
                "kafka-python",
                "decode Produce request (header+body)",
                rate(lambda: ProduceRequest.decode(produce_frame, version=9, header=True)),
            )
        )
        kp_md = MetadataResponse.decode(md_body, version=12)
        results.append(("kafka-python", "encode Metadata response", rate(lambda: kp_md.encode())))

    try:
        import kio  # noqa: F401
    except ImportError:
        pass
    else:
        results += kio_results(md_body, produce_frame)

    for lib, what, r in results:
        print(f"{lib:13} {what:40} {r:>10,.0f} msgs/s")


def kio_results(md_body: bytes, produce_frame: bytes) -> list[tuple[str, str, float]]:
    import io

    from kio.schema.metadata.v12.response import MetadataResponse
    from kio.schema.produce.v9.request import ProduceRequest
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.serial import entity_reader, entity_writer

    read_md = entity_reader(MetadataResponse)
    read_header = entity_reader(RequestHeader)
    read_produce = entity_reader(ProduceRequest)
    write_md = entity_writer(MetadataResponse)

    # kio's readers (Rust) are (buffer, offset) -> (entity, offset); its writers are Python.
    def decode_produce() -> object:
        _header, off = read_header(produce_frame, 0)
        return read_produce(produce_frame, off)

    md, _ = read_md(md_body, 0)

    def encode_md() -> object:
        out = io.BytesIO()
        write_md(out, md)
        return out.getvalue()

    return [
        ("kio", "decode Metadata response", rate(lambda: read_md(md_body, 0))),
        ("kio", "decode Produce request (header+body)", rate(decode_produce)),
        ("kio", "encode Metadata response", rate(encode_md)),
    ]


if __name__ == "__main__":
    main()
