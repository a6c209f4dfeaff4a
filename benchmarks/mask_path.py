"""The record-masking path of the ext_proc service, in-process: records/s of one core.

    python -m benchmarks.mask_path [--records 50000] [--batch-records 250]
                                   [--codec none|lz4|zstd] [--fetch-batches 4]
                                   [--repeat 3] [--direction both|produce|fetch]
                                   [--profile] [--no-write]

No broker, no Envoy: the frames are built with keg's own codecs (kafka_wire) and run
through a connection's whole filter chain (`ext_proc.filters.order.connection_filters`
in an `ext_proc.chain.FilterChain`), exactly as the data path runs every frame of a
connection (`FilterChain.judge_frame` for a request, `filter_response_frame` for the
broker's answer):

- produce: Produce v9 requests to topic `p.mask.bench`, each carrying one record batch
  of `--batch-records` 1 KiB JSON orders (`benchmarks.record_rules.order_value`, the
  record rules benchmark's values), compressed with `--codec`; the `p-mask` rule of
  `benchmarks.record_rules.RULES` masks `$.customer.email` and `$.card.number`.
- fetch: the same records stored on `c.mask.bench`, read with Fetch v12: each
  answer holds `--fetch-batches` batches; the consume-time `c-mask` rule masks them.

Prints records/s per direction (the best of `--repeat` rounds, and the median) and a
digest of every frame the chain put out, so two versions of the code can be shown to
write the same bytes; appends one JSON line to benchmarks/results/mask_path.jsonl.
`--profile` runs one round under cProfile and prints its top entries instead.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kafka_wire
from benchmarks.gateway_vs_direct import git_commit, git_dirty, machine_info
from benchmarks.record_rules import KEY_ENV, RULES, order_value
from ext_proc.chain import FilterChain
from ext_proc.connection import ConnectionInfo
from ext_proc.filters.order import connection_filters
from ext_proc.filters.rules import RuleEngine
from ext_proc.heap import building
from ext_proc.identity import IdentityTracker
from filter_rules import CompiledRuleSet, load_rule_text
from interceptors import BuildContext
from kafka_wire import ApiKey
from kafka_wire.compression import Compression
from kafka_wire.records import BatchHeader, Record, encode_batch

RESULTS = Path(__file__).resolve().parent / "results" / "mask_path.jsonl"
CODECS = {"none": Compression.NONE, "lz4": Compression.LZ4, "zstd": Compression.ZSTD}
PRODUCE_VERSION = 9
FETCH_VERSION = 12
PRODUCE_TOPIC = "p.mask.bench"
FETCH_TOPIC = "c.mask.bench"
BASE_TS = 1_700_000_000_000
CONN = ConnectionInfo(client_host="127.0.0.1", client_port=40000,
                      gateway_address="127.0.0.1:19092", connection_id="bench")


def make_batches(records: int, per_batch: int, codec: Compression,
                 base_offset: int = 0) -> list[bytes]:
    """Record batches of 1 KiB JSON orders, as a producer writes them (null keys, no
    headers, a millisecond between records); `base_offset` as a broker stores them."""
    batches = []
    for start in range(0, records, per_batch):
        count = min(per_batch, records - start)
        recs = [Record(i, i, None, order_value(start + i), []) for i in range(count)]
        header = BatchHeader(base_offset=base_offset + start, base_timestamp=BASE_TS + start)
        batches.append(encode_batch(header, recs, compression=codec))
    return batches


def produce_frames(batches: list[bytes]) -> list[bytes]:
    """One Produce request frame (size prefix included) per batch."""
    frames = []
    for n, batch in enumerate(batches):
        header = kafka_wire.RequestHeader(ApiKey.PRODUCE, PRODUCE_VERSION, n, "rdkafka", {})
        body = {"TransactionalId": None, "Acks": -1, "TimeoutMs": 30_000, "TopicData": [
            {"Name": PRODUCE_TOPIC, "PartitionData": [{"Index": 0, "Records": batch}]}]}
        frames.append(kafka_wire.encode_request(header, body))
    return frames


def fetch_request() -> bytes:
    header = kafka_wire.RequestHeader(ApiKey.FETCH, FETCH_VERSION, 1, "rdkafka", {})
    body = {"ClusterId": None, "ReplicaId": -1, "MaxWaitMs": 500, "MinBytes": 1,
            "MaxBytes": 52_428_800, "IsolationLevel": 0, "SessionId": 0, "SessionEpoch": -1,
            "Topics": [{"Topic": FETCH_TOPIC, "Partitions": [
                {"Partition": 0, "CurrentLeaderEpoch": 0, "FetchOffset": 0,
                 "LastFetchedEpoch": -1, "LogStartOffset": -1,
                 "PartitionMaxBytes": 1_048_576}]}],
            "ForgottenTopicsData": [], "RackId": ""}
    return kafka_wire.encode_request(header, body)


def fetch_responses(batches: list[bytes], per_response: int) -> list[bytes]:
    """Fetch answers (frames), each holding `per_response` consecutive batches."""
    frames = []
    for n, start in enumerate(range(0, len(batches), per_response)):
        records = b"".join(batches[start:start + per_response])
        body = {"ThrottleTimeMs": 0, "ErrorCode": 0, "SessionId": 0, "Responses": [
            {"Topic": FETCH_TOPIC, "Partitions": [
                {"PartitionIndex": 0, "ErrorCode": 0, "HighWatermark": 1 << 40,
                 "LastStableOffset": 1 << 40, "LogStartOffset": 0,
                 "AbortedTransactions": None, "PreferredReadReplica": -1,
                 "Records": records}]}]}
        frames.append(kafka_wire.encode_response(n, ApiKey.FETCH, FETCH_VERSION, body))
    return frames


def new_chain() -> FilterChain:
    """A connection's filter chain over the record rules benchmark's rule set (its mask
    rules are the ones these topics match; its encrypt rules get a fixed key), built as
    the service builds a rule set (`ext_proc.heap.building`: then what is alive is frozen,
    and garbage collections no longer walk it)."""
    context = BuildContext(environ={KEY_ENV: base64.b64encode(bytes(range(32))).decode()})
    with building():
        engine = RuleEngine(CompiledRuleSet(load_rule_text(RULES, "bench.yaml")),
                            context=context)
    return FilterChain(connection_filters(engine, IdentityTracker()))


def run_produce(chain: FilterChain, frames: list[bytes], out: list[bytes]) -> None:
    """Each request frame through the chain: what goes to the broker (or the answer)."""
    for frame in frames:
        judged = chain.judge_frame(frame, CONN)
        out.append(judged.to_broker)
        if judged.answer is not None:
            out.append(judged.answer)


def run_fetch(chain: FilterChain, request: bytes, frames: list[bytes],
              out: list[bytes]) -> None:
    """Each answer through the chain after its request (which leaves the patch)."""
    for frame in frames:
        judged = chain.judge_frame(request, CONN)
        out.append(chain.filter_response_frame(frame, ApiKey.FETCH, FETCH_VERSION, CONN,
                                               judged.patch))


def timed(fn: Callable[[list[bytes]], None]) -> tuple[float, str]:
    """Seconds one round takes, and a digest of what it put out (taken after the clock)."""
    out: list[bytes] = []
    started = time.perf_counter()
    fn(out)
    elapsed = time.perf_counter() - started
    digest = hashlib.sha256()
    for frame in out:
        digest.update(len(frame).to_bytes(4, "big"))
        digest.update(frame)
    return elapsed, digest.hexdigest()[:16]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=50_000, help="records per round")
    parser.add_argument("--batch-records", type=int, default=250, help="records per batch")
    parser.add_argument("--codec", choices=sorted(CODECS), default="none")
    parser.add_argument("--fetch-batches", type=int, default=4,
                        help="batches per Fetch answer")
    parser.add_argument("--direction", choices=("both", "produce", "fetch"), default="both")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (best and median kept)")
    parser.add_argument("--profile", action="store_true",
                        help="one round under cProfile; prints its top entries")
    parser.add_argument("--no-write", action="store_true", help="do not append a result line")
    args = parser.parse_args()
    if args.records < 1 or args.batch_records < 1 or args.fetch_batches < 1 or args.repeat < 1:
        parser.error("counts must be positive")
    codec = CODECS[args.codec]
    directions = ("produce", "fetch") if args.direction == "both" else (args.direction,)

    produced = produce_frames(make_batches(args.records, args.batch_records, codec))
    fetched = fetch_responses(make_batches(args.records, args.batch_records, codec),
                              args.fetch_batches)
    request = fetch_request()
    chain = new_chain()
    work: dict[str, Callable[[list[bytes]], None]] = {
        "produce": lambda out: run_produce(chain, produced, out),
        "fetch": lambda out: run_fetch(chain, request, fetched, out),
    }
    for direction in directions:  # warm up: plans, compiled paths, caches
        work[direction]([])

    if args.profile:
        import cProfile
        import pstats

        for direction in directions:
            profiler = cProfile.Profile()
            profiler.enable()
            elapsed, _ = timed(work[direction])
            profiler.disable()
            print(f"== {direction} ({args.codec}), {args.records} records: {elapsed:.2f} s "
                  "under cProfile")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return 0

    results: dict[str, Any] = {}
    for direction in directions:
        rates, digests = [], set()
        for _ in range(args.repeat):
            elapsed, digest = timed(work[direction])
            rates.append(args.records / elapsed)
            digests.add(digest)
        if len(digests) != 1:
            raise SystemExit(f"{direction}: the output differs between rounds: {digests}")
        results[direction] = {"records_per_s": round(max(rates)),
                              "median_records_per_s": round(statistics.median(rates)),
                              "output_sha256": digests.pop()}
        r = results[direction]
        print(f"{direction:8s} codec={args.codec:5s} batch={args.batch_records:5d} "
              f"{r['records_per_s']:>9,} records/s (median {r['median_records_per_s']:,}) "
              f"output {r['output_sha256']}")

    if not args.no_write:
        line = {"time": datetime.now(UTC).isoformat(timespec="seconds"),
                "commit": git_commit(), "dirty": git_dirty(),
                "params": {"records": args.records, "batch_records": args.batch_records,
                           "codec": args.codec, "fetch_batches": args.fetch_batches,
                           "repeat": args.repeat, "record_bytes": 1024},
                "machine": machine_info(),
                "results": results}
        RESULTS.parent.mkdir(exist_ok=True)
        with RESULTS.open("a") as out:
            out.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
