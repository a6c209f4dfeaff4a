"""Codec throughput side by side: kafka_wire vs kio vs kafka-python, one run.

    .venv/bin/python -m benchmarks.codec_messages            # ~1-2 minutes
    .venv/bin/python -m benchmarks.codec_messages --quick    # shorter timings
    .venv/bin/python -m benchmarks.codec_messages --no-save  # print only

What is measured (Python 3.11; best of 3 timings of at least `--min-time` each):

- header-only, frames/s: a stream of 1,000 ProduceRequest v9 frames (size-prefixed)
  cut into frames and each frame's request header read (api key, version,
  correlation id, client id, tags). "plain loop": every library, a Python loop slices
  memoryviews by the size prefix and calls its header reader. "FrameSplitter":
  kafka_wire's data path, fed 64 KiB chunks, holding each frame (a copy) then
  read_request_header; "pass-through": FrameSplitter deciding PASS (only the 12-byte
  head parsed, no copy), what the gateway does for frames no filter wants.
- decode, encode and decode+encode, msgs/s, of a ProduceRequest v9 frame (header and
  body), a FetchResponse v12 body and a MetadataResponse v12 body.

kio is not a project dependency: its numbers come from a subprocess running this
module with `--kio-worker` under the Python of a throwaway venv that has kio
(`--kio-python`, default /tmp/kio-venv/bin/python; skipped when missing). Every
row also says whether the library wrote back the very bytes it read.

Results: the table on stdout, and one JSON object appended to
benchmarks/results/codec.jsonl (unless --no-save).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kafka_wire import ApiKey

# kafka_wire is imported inside the functions that use it: the kio worker runs this
# module in another venv, which has kio but not keg's dependencies.

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "codec.jsonl"
DEFAULT_KIO_PYTHON = Path("/tmp/kio-venv/bin/python")
STREAM_FRAMES = 1000
CHUNK = 64 * 1024

PRODUCE_V, FETCH_V, METADATA_V = 9, 12, 12
MESSAGES = ("produce", "fetch", "metadata")
LABELS = {
    "produce": f"ProduceRequest v{PRODUCE_V} frame",
    "fetch": f"FetchResponse v{FETCH_V} body",
    "metadata": f"MetadataResponse v{METADATA_V} body",
}
LIBS = ("kafka_wire", "kio", "kafka-python")

Rates = dict[str, float | bool]  # "produce.decode" -> msgs/s, "produce.exact" -> bool


# -- the messages -----------------------------------------------------------------------


def produce_value(rng: random.Random) -> dict[str, Any]:
    return {
        "TransactionalId": None, "Acks": -1, "TimeoutMs": 30000,
        "TopicData": [
            {"Name": f"orders.t{t}",
             "PartitionData": [{"Index": p, "Records": rng.randbytes(1024)} for p in range(3)]}
            for t in range(2)
        ],
    }


def fetch_value(rng: random.Random) -> dict[str, Any]:
    return {
        "ThrottleTimeMs": 0, "ErrorCode": 0, "SessionId": 7,
        "Responses": [{
            "Topic": "orders.events",
            "Partitions": [
                {"PartitionIndex": p, "ErrorCode": 0, "HighWatermark": 100_000 + p,
                 "LastStableOffset": 100_000 + p, "LogStartOffset": 0,
                 "AbortedTransactions": None, "PreferredReadReplica": -1,
                 "Records": rng.randbytes(16 * 1024)}
                for p in range(6)
            ],
        }],
    }


def metadata_value(rng: random.Random) -> dict[str, Any]:
    brokers = [{"NodeId": i, "Host": f"broker-{i}.kafka.internal", "Port": 9092,
                "Rack": f"az{i}"} for i in range(3)]
    topics = [{
        "ErrorCode": 0, "Name": f"orders.events.v{t}", "TopicId": rng.randbytes(16),
        "IsInternal": False, "TopicAuthorizedOperations": -(2**31),
        "Partitions": [{"ErrorCode": 0, "PartitionIndex": p, "LeaderId": p % 3,
                        "LeaderEpoch": 4, "ReplicaNodes": [0, 1, 2], "IsrNodes": [0, 1, 2],
                        "OfflineReplicas": []} for p in range(6)],
    } for t in range(20)]
    return {"ThrottleTimeMs": 0, "Brokers": brokers, "ClusterId": "c-1", "ControllerId": 1,
            "Topics": topics}


def build_messages(seed: int = 7) -> dict[str, bytes]:
    import kafka_wire as kw

    rng = random.Random(seed)
    produce = kw.encode_request(kw.RequestHeader(ApiKey.PRODUCE, PRODUCE_V, 7, "producer-1"),
                                produce_value(rng))
    return {
        "produce": produce[4:],  # the frame without its size, as framing yields it
        "stream": produce * STREAM_FRAMES,  # size-prefixed frames back to back
        "fetch": kw.encode_body(ApiKey.FETCH, FETCH_V, "response", fetch_value(rng)),
        "metadata": kw.encode_body(ApiKey.METADATA, METADATA_V, "response", metadata_value(rng)),
    }


# -- timing -------------------------------------------------------------------------------


def rate(fn: Callable[[], object], min_time: float) -> float:
    """Calls per second: best of 3 timings of at least `min_time` each."""
    n = 1
    while timeit.timeit(fn, number=n) < min_time:
        n *= 2
    return n / min(timeit.repeat(fn, number=n, repeat=3))


def chunks(stream: bytes) -> list[bytes]:
    return [stream[i : i + CHUNK] for i in range(0, len(stream), CHUNK)]


def slice_frames(stream: bytes) -> list[memoryview]:
    """Frames (without size) cut by a plain loop: what a library without framing does."""
    view = memoryview(stream)
    out: list[memoryview] = []
    pos = 0
    while pos < len(stream):
        size = int.from_bytes(view[pos : pos + 4], "big", signed=True)
        out.append(view[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out


# -- kafka_wire -----------------------------------------------------------------------------


def kafka_wire_rates(msgs: dict[str, bytes], min_time: float) -> Rates:
    import kafka_wire as kw
    from kafka_wire.framing import Decision, Frame, FrameSplitter

    out: Rates = {}
    pieces = chunks(msgs["stream"])

    def split_and_read_headers() -> None:
        splitter = FrameSplitter(requests=True, decide=lambda head: Decision.HOLD)
        for chunk in pieces:
            for piece in splitter.feed(chunk):
                assert isinstance(piece, Frame)
                kw.read_request_header(piece.data)

    def split_only() -> None:
        splitter = FrameSplitter(requests=True, decide=lambda head: Decision.PASS)
        for chunk in pieces:
            splitter.feed(chunk)

    stream = msgs["stream"]

    def loop_and_read_headers() -> None:
        for f in slice_frames(stream):
            kw.read_request_header(f)

    out["header.rate"] = STREAM_FRAMES * rate(split_and_read_headers, min_time)
    out["header_loop.rate"] = STREAM_FRAMES * rate(loop_and_read_headers, min_time)
    out["header_pass.rate"] = STREAM_FRAMES * rate(split_only, min_time)

    frame = msgs["produce"]
    header, body = kw.decode_request(frame)
    out["produce.decode"] = rate(lambda: kw.decode_request(frame), min_time)
    out["produce.encode"] = rate(lambda: kw.encode_request(header, body), min_time)
    out["produce.roundtrip"] = rate(
        lambda: kw.encode_request(*kw.decode_request(frame)), min_time)
    out["produce.exact"] = kw.encode_request(header, body)[4:] == frame

    for name, key, version in (("fetch", 1, FETCH_V), ("metadata", 3, METADATA_V)):
        out.update(_kafka_wire_body(name, key, version, msgs[name], min_time))
    return out


def _kafka_wire_body(name: str, key: int, version: int, data: bytes, min_time: float) -> Rates:
    import kafka_wire as kw

    value, _ = kw.decode_body(key, version, "response", data)

    def decode() -> dict[str, Any]:
        return kw.decode_body(key, version, "response", data)[0]

    def encode() -> bytes:
        return kw.encode_body(key, version, "response", value)

    def roundtrip() -> bytes:
        return kw.encode_body(key, version, "response", decode())

    return {
        f"{name}.decode": rate(decode, min_time),
        f"{name}.encode": rate(encode, min_time),
        f"{name}.roundtrip": rate(roundtrip, min_time),
        f"{name}.exact": encode() == data,
    }


# -- kafka-python ------------------------------------------------------------------------------


def kafka_python_rates(msgs: dict[str, bytes], min_time: float) -> Rates:
    try:
        from kafka.protocol.consumer.fetch import FetchResponse
        from kafka.protocol.metadata import MetadataResponse
        from kafka.protocol.producer import ProduceRequest
    except ImportError:
        return {}
    out: Rates = {}
    stream = msgs["stream"]

    def read_headers() -> None:
        for f in slice_frames(stream):
            ProduceRequest.parse_header(io.BytesIO(f), version=PRODUCE_V)

    out["header_loop.rate"] = STREAM_FRAMES * rate(read_headers, min_time)

    frame = msgs["produce"]
    produce = ProduceRequest.decode(frame, version=PRODUCE_V, header=True)
    out["produce.decode"] = rate(
        lambda: ProduceRequest.decode(frame, version=PRODUCE_V, header=True), min_time)
    out["produce.encode"] = rate(lambda: produce.encode(version=PRODUCE_V, header=True), min_time)
    out["produce.roundtrip"] = rate(
        lambda: ProduceRequest.decode(frame, version=PRODUCE_V, header=True).encode(
            version=PRODUCE_V, header=True), min_time)
    out["produce.exact"] = bytes(produce.encode(version=PRODUCE_V, header=True)) == frame

    for name, cls, version in (("fetch", FetchResponse, FETCH_V),
                               ("metadata", MetadataResponse, METADATA_V)):
        out.update(_three_ops(name, msgs[name], min_time, *_kafka_python_ops(cls, version)))
    return out


def _kafka_python_ops(
    cls: Any, version: int
) -> tuple[Callable[[bytes], Any], Callable[[Any], bytes]]:
    def decode(data: bytes) -> Any:
        return cls.decode(data, version=version)

    def encode(obj: Any) -> bytes:
        return bytes(obj.encode())  # the version it was decoded with

    return decode, encode


def _three_ops(name: str, data: bytes, min_time: float, decode: Callable[[bytes], Any],
               encode: Callable[[Any], bytes]) -> Rates:
    """decode, encode, decode+encode rates and byte-exactness of one message."""
    value = decode(data)
    return {
        f"{name}.decode": rate(lambda: decode(data), min_time),
        f"{name}.encode": rate(lambda: encode(value), min_time),
        f"{name}.roundtrip": rate(lambda: encode(decode(data)), min_time),
        f"{name}.exact": encode(value) == data,
    }


# -- kio, in its own venv ------------------------------------------------------------------


def kio_worker(directory: Path, min_time: float) -> Rates:  # pragma: no cover - other venv
    """Runs under the kio venv's Python (see module docstring)."""
    from kio.schema.fetch.v12.response import FetchResponse
    from kio.schema.metadata.v12.response import MetadataResponse
    from kio.schema.produce.v9.request import ProduceRequest
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.serial import entity_reader, entity_writer

    msgs = {name: (directory / name).read_bytes() for name in ("produce", "stream", "fetch",
                                                               "metadata")}
    out: Rates = {}
    read_header = entity_reader(RequestHeader)
    write_header = entity_writer(RequestHeader)
    stream = msgs["stream"]

    def read_headers() -> None:
        for f in slice_frames(stream):
            read_header(f, 0)

    out["header_loop.rate"] = STREAM_FRAMES * rate(read_headers, min_time)

    def write(writer: Any, *entities: Any) -> bytes:
        buf = io.BytesIO()
        for w, e in zip(writer, entities, strict=True):
            w(buf, e)
        return buf.getvalue()

    read_produce, write_produce = entity_reader(ProduceRequest), entity_writer(ProduceRequest)
    frame = msgs["produce"]

    def decode_produce() -> tuple[Any, Any]:
        header, off = read_header(frame, 0)
        body, _ = read_produce(frame, off)
        return header, body

    header, body = decode_produce()
    out["produce.decode"] = rate(decode_produce, min_time)
    out["produce.encode"] = rate(
        lambda: write((write_header, write_produce), header, body), min_time)
    out["produce.roundtrip"] = rate(
        lambda: write((write_header, write_produce), *decode_produce()), min_time)
    out["produce.exact"] = write((write_header, write_produce), header, body) == frame

    for name, cls in (("fetch", FetchResponse), ("metadata", MetadataResponse)):
        reader, writer = entity_reader(cls), entity_writer(cls)

        def decode(data: bytes, reader: Any = reader) -> Any:
            return reader(data, 0)[0]

        def encode(value: Any, writer: Any = writer) -> bytes:
            return write((writer,), value)

        out.update(_three_ops(name, msgs[name], min_time, decode, encode))
    return out


def kio_rates(msgs: dict[str, bytes], min_time: float, kio_python: Path) -> tuple[Rates, str]:
    if not kio_python.exists():
        return {}, f"kio skipped: {kio_python} not found"
    with tempfile.TemporaryDirectory(prefix="keg-bench-kio-") as tmp:
        for name in ("produce", "stream", "fetch", "metadata"):
            (Path(tmp) / name).write_bytes(msgs[name])
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [str(kio_python), "-m", "benchmarks.codec_messages", "--kio-worker", tmp,
             "--min-time", str(min_time)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
        )
    if done.returncode != 0:
        return {}, f"kio failed: {done.stderr.strip().splitlines()[-1:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["rates"], result["version"]


# -- the table ----------------------------------------------------------------------------


def rows(results: dict[str, Rates]) -> list[tuple[str, str, str]]:
    """(label, key, unit) for every table row."""
    out = [
        ("header-only: plain loop + read header", "header_loop.rate", "frames/s"),
        ("header-only: FrameSplitter + read header", "header.rate", "frames/s"),
        ("header-only: FrameSplitter pass-through", "header_pass.rate", "frames/s"),
    ]
    for name in MESSAGES:
        for op in ("decode", "encode", "roundtrip"):
            what = "decode+encode" if op == "roundtrip" else op
            out.append((f"{LABELS[name]}: {what}", f"{name}.{op}", "msgs/s"))
    return out


def _fmt(value: float | bool | None) -> str:
    return "-" if value is None or isinstance(value, bool) else f"{value:,.0f}"


def table(results: dict[str, Rates]) -> str:
    head = (f"| {'':52} | {'kafka_wire':>11} | {'kio':>11} | {'kafka-python':>12} "
            f"| {'kw/kio':>6} | {'kw/k-py':>7} |")
    lines = [head, "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"]
    for label, key, unit in rows(results):
        vals = {lib: results.get(lib, {}).get(key) for lib in LIBS}
        kw_val = vals["kafka_wire"]

        def ratio(other: float | bool | None, kw_val: float | bool | None = kw_val) -> str:
            if not isinstance(other, float) or not isinstance(kw_val, float):
                return "-"
            return f"{kw_val / other:.2f}"

        lines.append(
            f"| {label + ' (' + unit + ')':52} | {_fmt(kw_val):>11} | {_fmt(vals['kio']):>11} "
            f"| {_fmt(vals['kafka-python']):>12} | {ratio(vals['kio']):>6} "
            f"| {ratio(vals['kafka-python']):>7} |")
    exact = []
    for lib in LIBS:
        flags = [name for name in MESSAGES if results.get(lib, {}).get(f"{name}.exact") is False]
        if results.get(lib):
            exact.append(f"{lib}: " + ("byte-exact re-encode" if not flags
                                       else "re-encode differs for " + ", ".join(flags)))
    return "\n".join(lines) + "\n\n" + "; ".join(exact)


def git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10)
    except OSError:
        return None
    return done.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-time", type=float, default=0.3,
                        help="seconds per timing (best of 3)")
    parser.add_argument("--quick", action="store_true", help="--min-time 0.05")
    parser.add_argument("--kio-python", type=Path, default=DEFAULT_KIO_PYTHON)
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--kio-worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    min_time = 0.05 if args.quick else args.min_time

    if args.kio_worker is not None:  # pragma: no cover - runs in the kio venv
        import importlib.metadata

        rates = kio_worker(args.kio_worker, min_time)
        print(json.dumps({"rates": rates, "version": importlib.metadata.version("kio")}))
        return 0

    started = time.monotonic()
    msgs = build_messages()
    results: dict[str, Rates] = {}
    notes: list[str] = []
    results["kafka_wire"] = kafka_wire_rates(msgs, min_time)
    results["kafka-python"] = kafka_python_rates(msgs, min_time)
    kio, kio_version = kio_rates(msgs, min_time, args.kio_python)
    if kio:
        results["kio"] = kio
    else:
        notes.append(kio_version)

    sizes = {name: len(msgs[name]) for name in MESSAGES}
    print(f"Messages: ProduceRequest v{PRODUCE_V} frame {sizes['produce']:,} bytes "
          f"(2 topics x 3 partitions x 1 KiB records); FetchResponse v{FETCH_V} "
          f"{sizes['fetch']:,} bytes (6 partitions x 16 KiB); MetadataResponse v{METADATA_V} "
          f"{sizes['metadata']:,} bytes (3 brokers, 20 topics x 6 partitions); header stream: "
          f"{STREAM_FRAMES} Produce frames in {CHUNK // 1024} KiB chunks.\n")
    print(table(results))
    for note in notes:
        print(note)

    record = {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git_commit": git_commit(),
        "elapsed_s": round(time.monotonic() - started, 1),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "versions": {"kio": kio_version if kio else None,
                     "kafka-python": _version("kafka-python")},
        "params": {"min_time_s": min_time, "stream_frames": STREAM_FRAMES, "chunk": CHUNK,
                   "sizes": sizes},
        "results": results,
    }
    if not args.no_save:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        with args.results.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        print(f"\nappended to {args.results}")
    return 0


def _version(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
