"""Fuzz the sans-IO Kafka core: framing, correlation, the codec, group payloads, envelopes.

    .venv/bin/python -m tests.fuzz.fuzz_frames --runs 1000000 --jobs 2
    .venv/bin/python -m tests.fuzz.fuzz_frames --engine atheris --runs 200000

The contract under test: whatever bytes arrive, kafka_wire raises only its own
errors (KafkaWireError subclasses). Anything else escaping `target` is a bug.

An input is `mode byte | payload`:

- mode 0, streams: `chunk seed | int32 n | n bytes of requests | responses`. The
  requests go through a FrameSplitter (cut into chunks chosen by the seed) that holds
  every frame and records it in a CorrelationTracker; each frame is decoded with
  `decode_request` and re-encoded. The responses go through a response FrameSplitter;
  each is matched to its request by correlation id and decoded with `decode_response`
  at that request's api key and version (ApiVersions retried at v0, as Kafka does).
  Decoded JoinGroup/SyncGroup messages feed a GroupProtocolTracker (which must never
  raise), Envelope requests and responses are opened with kafka_wire.envelope. A
  second splitter that passes everything checks the bytes come out unchanged.
- mode 1, group payload: `selector | bytes` decoded as a consumer/Connect subscription
  or assignment; what decodes must re-encode to the same bytes.
- mode 2, envelope parts: principal bytes, client address bytes, an EnvelopeRequest
  body built from the payload.

Two engines: "random" (default, no dependency): seeded mutations (bit flips,
interesting integers over size and count fields, insertions, deletions, truncation,
splices) of valid inputs built from every schema (api key, version, kind) plus pure
random bytes; "atheris" (coverage-guided libFuzzer, when `atheris` is installed),
seeded with the same corpus.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import multiprocessing
import os
import random
import struct
import sys
import tempfile
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kafka_wire as kw
from kafka_wire import ApiKey, _catalog, framing, group_protocol
from kafka_wire._schema import FieldSpec, StructSpec, in_versions, registry
from kafka_wire.envelope import (
    Principal,
    decode_client_address,
    decode_envelope_request,
    decode_principal,
    envelope_request_body,
    envelope_response_body,
    read_envelope_request,
    read_envelope_response,
)
from kafka_wire.errors import KafkaWireError
from tests.unit.kafka_wire.test_codec import INT_RANGES

MODE_STREAMS, MODE_GROUP, MODE_ENVELOPE = 0, 1, 2
MAX_FRAME = 1 << 20  # fuzz inputs are small: bigger sizes must be refused, not buffered
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")


# -- the target -------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one input did (summed over a run for the report)."""

    frames_ok: int = 0
    frames_rejected: int = 0
    streams_cut: int = 0
    group_payloads: int = 0
    envelopes: int = 0
    payloads_ok: int = 0
    payloads_rejected: int = 0

    def add(self, other: Outcome) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def target(data: bytes, out: Outcome | None = None) -> None:
    """The fuzz target: only KafkaWireError subclasses may escape."""
    out = out if out is not None else Outcome()
    if not data:
        return
    mode, payload = data[0] % 3, data[1:]
    if mode == MODE_STREAMS:
        _streams(payload, out)
    elif mode == MODE_GROUP:
        _group_payload(payload, out)
    else:
        _envelope_parts(payload, out)


def _chunks(data: bytes, seed: int) -> Iterator[bytes]:
    if seed == 0 or not data:
        yield data
        return
    rng = random.Random(seed)
    pos = 0
    while pos < len(data):
        n = rng.choice((1, 2, 3, 5, 8, 13, 64, 1000))
        yield data[pos : pos + n]
        pos += n


def _check_passthrough(stream: bytes, requests: bool, seed: int) -> None:
    """A splitter that passes every frame gives back exactly the bytes it was fed."""
    splitter = framing.FrameSplitter(
        requests=requests, decide=lambda head: framing.Decision.PASS, max_frame_size=MAX_FRAME
    )
    got = bytearray()
    try:
        for chunk in _chunks(stream, seed):
            for piece in splitter.feed(chunk):
                assert not isinstance(piece, framing.Frame)
                got += piece
    except KafkaWireError:
        assert stream.startswith(got)
        return
    assert stream.startswith(got) and len(stream) - len(got) < framing.REQUEST_HEAD_SIZE


def _streams(payload: bytes, out: Outcome) -> None:
    if len(payload) < 5:
        return
    seed = payload[0]
    (n,) = _U32.unpack_from(payload, 1)
    requests, responses = payload[5 : 5 + n], payload[5 + n :]
    _check_passthrough(requests, True, seed)
    _check_passthrough(responses, False, seed)

    tracker = framing.CorrelationTracker(max_in_flight=1000)
    groups = group_protocol.GroupProtocolTracker()
    envelopes: dict[int, kw.RequestHeader] = {}

    def on_request(head: framing.Head) -> framing.Decision:
        assert isinstance(head, framing.RequestHead)
        tracker.reserve(head).forward(hold_response=True)
        return framing.Decision.HOLD

    _each_held_frame(
        requests, True, on_request, seed, out,
        lambda frame: _request_frame(frame, groups, envelopes, out),
    )

    answered: deque[framing.InFlight] = deque()

    def on_response(head: framing.Head) -> framing.Decision:
        answered.append(tracker.answered(head.correlation_id)[0])
        return framing.Decision.HOLD

    _each_held_frame(
        responses, False, on_response, seed, out,
        lambda frame: _response_frame(frame, answered.popleft(), groups, envelopes, out),
    )


def _each_held_frame(
    stream: bytes,
    requests: bool,
    decide: Callable[[framing.Head], framing.Decision],
    seed: int,
    out: Outcome,
    on_frame: Callable[[bytes], None],
) -> None:
    """Split `stream` holding every frame; each frame's bytes after the size go to on_frame."""
    splitter = framing.FrameSplitter(requests=requests, decide=decide, max_frame_size=MAX_FRAME)
    try:
        for chunk in _chunks(stream, seed):
            for piece in splitter.feed(chunk):
                assert isinstance(piece, framing.Frame)
                on_frame(piece.raw[4:])
    except KafkaWireError:
        out.streams_cut += 1


def _request_frame(
    frame: bytes,
    groups: group_protocol.GroupProtocolTracker,
    envelopes: dict[int, kw.RequestHeader],
    out: Outcome,
) -> None:
    try:
        header, body = kw.decode_request(frame)
        kw.encode_request(header, body)
    except KafkaWireError:
        out.frames_rejected += 1
        return
    out.frames_ok += 1
    if header.api_key in (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP):
        observation = groups.on_request(
            header.api_key, header.api_version, body, header.correlation_id
        )
        out.group_payloads += len(observation.payloads)
    elif header.api_key == ApiKey.ENVELOPE:
        with contextlib.suppress(KafkaWireError):
            _, forwarded = decode_envelope_request(frame)
            assert forwarded == read_envelope_request(body)
            envelopes[header.correlation_id] = forwarded.header
            out.envelopes += 1


def _response_frame(
    frame: bytes,
    entry: framing.InFlight,
    groups: group_protocol.GroupProtocolTracker,
    envelopes: dict[int, kw.RequestHeader],
    out: Outcome,
) -> None:
    version = entry.api_version
    try:
        try:
            correlation_id, body = kw.decode_response(frame, entry.api_key, version)
        except KafkaWireError:
            if entry.api_key != ApiKey.API_VERSIONS:
                raise
            version = 0
            correlation_id, body = kw.decode_response(frame, entry.api_key, version)
        kw.encode_response(correlation_id, entry.api_key, version, body)
    except KafkaWireError:
        out.frames_rejected += 1
        return
    out.frames_ok += 1
    if entry.api_key in (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP):
        observation = groups.on_response(entry.api_key, version, body, correlation_id)
        out.group_payloads += len(observation.payloads)
    elif entry.api_key == ApiKey.ENVELOPE and correlation_id in envelopes:
        with contextlib.suppress(KafkaWireError):
            read_envelope_response(body, envelopes[correlation_id])
            out.envelopes += 1


_GROUP_DECODERS: tuple[tuple[str, Callable[[str, bytes], group_protocol.GroupPayload]], ...] = (
    (group_protocol.CONSUMER, group_protocol.decode_subscription),
    (group_protocol.CONSUMER, group_protocol.decode_assignment),
    (group_protocol.CONNECT, group_protocol.decode_subscription),
    (group_protocol.CONNECT, group_protocol.decode_assignment),
)


def _group_payload(payload: bytes, out: Outcome) -> None:
    if not payload:
        return
    protocol_type, decode = _GROUP_DECODERS[payload[0] % 4]
    data = payload[1:]
    try:
        decoded = decode(protocol_type, data)
    except KafkaWireError:
        out.payloads_rejected += 1
        return
    out.payloads_ok += 1
    assert group_protocol.encode_payload(decoded) == data, (
        "a decoded payload must re-encode to its bytes")


def _envelope_parts(payload: bytes, out: Outcome) -> None:
    for attempt in (
        lambda: decode_principal(payload),
        lambda: decode_client_address(payload[: 4 if len(payload) < 16 else 16]),
        lambda: read_envelope_request(
            {"RequestData": payload, "RequestPrincipal": payload[::-1], "ClientHostAddress":
             bytes(4)}
        ),
    ):
        try:
            attempt()
            out.payloads_ok += 1
        except KafkaWireError:
            out.payloads_rejected += 1


# -- valid inputs from the schemas -------------------------------------------------------



class RandomValues:
    """Random but valid values for any schema struct at a version."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def struct(self, s: StructSpec, version: int, depth: int = 0) -> dict[str, Any]:
        return {
            f.name: self.field(f, version, depth) for f in s.fields if f.present(version)
        }

    def field(self, f: FieldSpec, version: int, depth: int) -> Any:
        rng = self.rng
        if in_versions(version, f.nullable) and rng.random() < 0.15:
            return None
        if f.is_array:
            n = rng.choice((0, 1, 1, 2, 3)) if depth < 3 else 0
            return [self.scalar(f.elem_type, f, version, depth + 1) for _ in range(n)]
        return self.scalar(f.type, f, version, depth + 1)

    def scalar(self, t: str, f: FieldSpec, version: int, depth: int) -> Any:
        rng = self.rng
        if t in INT_RANGES:
            lo, hi = INT_RANGES[t]
            return rng.choice((0, -1, 1, lo, hi, rng.randint(lo, hi)))
        if t == "bool":
            return rng.random() < 0.5
        if t == "float64":
            return rng.uniform(-1e6, 1e6)
        if t == "string":
            return rng.choice(("", "a", "orders", "é-ü", "x" * rng.randint(0, 40)))
        if t in ("bytes", "records"):
            return rng.randbytes(rng.choice((0, 1, 7, 61)))
        if t == "uuid":
            return uuid.UUID(int=rng.getrandbits(128))
        assert f.struct is not None
        return self.struct(f.struct, version, depth)

    def message(self, api_key: int, version: int, kind: str) -> dict[str, Any]:
        spec = _catalog.message_file(api_key, version, kind).spec()
        return self.struct(spec.struct, version)


def all_messages() -> list[tuple[int, int, str]]:
    reg = registry()
    out: list[tuple[int, int, str]] = []
    for api_key, kind in sorted(reg.by_key):
        lo, hi = reg.key_range(api_key, kind)
        for version in range(lo, hi + 1):
            try:
                _catalog.message_file(api_key, version, kind)
            except KafkaWireError:
                continue
            out.append((api_key, version, kind))
    return out


def _pair(
    values: RandomValues, api_key: int, version: int, correlation_id: int
) -> tuple[bytes, bytes] | None:
    """A request frame and its response frame (both with size), or None."""
    rng = values.rng
    try:
        header = kw.RequestHeader(api_key, version, correlation_id,
                                  rng.choice((None, "", "fuzz-client")))
        request = kw.encode_request(header, values.message(api_key, version, "request"))
        response = kw.encode_response(
            correlation_id, api_key, version, values.message(api_key, version, "response")
        )
    except KafkaWireError:
        return None
    return request, response


def streams_input(requests: list[bytes], responses: list[bytes], seed: int = 0) -> bytes:
    req = b"".join(requests)
    return bytes((MODE_STREAMS, seed)) + _U32.pack(len(req)) + req + b"".join(responses)


def _group_seeds(rng: random.Random) -> list[bytes]:
    """JoinGroup/SyncGroup exchanges (old and new versions) and raw payloads."""
    sub = group_protocol.encode_subscription(group_protocol.CONSUMER, 3, {
        "Topics": ["orders"], "UserData": None,
        "OwnedPartitions": [{"Topic": "orders", "Partitions": [0, 1]}],
        "GenerationId": 2, "RackId": "az1",
    })
    assignment = group_protocol.encode_assignment(group_protocol.CONSUMER, 1, {
        "AssignedPartitions": [{"Topic": "orders", "Partitions": [0]}], "UserData": b"u",
    })
    connect_assignment = group_protocol.encode_assignment(group_protocol.CONNECT, 1, {
        "Error": 0, "Leader": "w1", "LeaderUrl": "http://w1:8083", "ConfigOffset": 5,
        "Assignment": [{"Connector": "c", "Tasks": [-1, 0]}], "Revoked": None,
        "ScheduledDelay": 0,
    })
    connect_sub = group_protocol.encode_subscription(group_protocol.CONNECT, 2, {
        "Url": "http://w1:8083", "ConfigOffset": 5,
        "Allocation": group_protocol.decode_assignment(group_protocol.CONNECT, connect_assignment),
    })
    seeds: list[bytes] = []
    for protocol_type, name, md, asg in (
        (group_protocol.CONSUMER, "range", sub, assignment),
        (group_protocol.CONNECT, "sessioned", connect_sub, connect_assignment),
    ):
        for join_v, sync_v in ((5, 3), (7, 5), (9, 5), (2, 0)):
            join = {
                "GroupId": "g", "SessionTimeoutMs": 10, "MemberId": "m",
                "ProtocolType": protocol_type, "Protocols": [{"Name": name, "Metadata": md}],
            }
            joined = {
                "GenerationId": 1, "ProtocolType": protocol_type, "ProtocolName": name,
                "Leader": "m", "MemberId": "m", "Members": [{"MemberId": "m", "Metadata": md}],
            }
            sync = {
                "GroupId": "g", "GenerationId": 1, "MemberId": "m",
                "ProtocolType": protocol_type, "ProtocolName": name,
                "Assignments": [{"MemberId": "m", "Assignment": asg}],
            }
            synced = {"ProtocolType": protocol_type, "ProtocolName": name, "Assignment": asg}
            seeds.append(streams_input(
                [kw.encode_request(kw.RequestHeader(ApiKey.JOIN_GROUP, join_v, 1, "c"), join),
                 kw.encode_request(kw.RequestHeader(ApiKey.SYNC_GROUP, sync_v, 2, "c"), sync)],
                [kw.encode_response(1, ApiKey.JOIN_GROUP, join_v, joined),
                 kw.encode_response(2, ApiKey.SYNC_GROUP, sync_v, synced)],
                seed=rng.randrange(256),
            ))
        for selector, data in enumerate((md, asg)):
            offset = 0 if protocol_type == group_protocol.CONSUMER else 2
            seeds.append(bytes((MODE_GROUP, selector + offset)) + data)
    return seeds


def _envelope_seeds(values: RandomValues) -> list[bytes]:
    seeds: list[bytes] = []
    for inner_key, inner_version in ((19, 7), (33, 2), (44, 1), (51, 0), (20, 6), (37, 3)):
        try:
            inner = kw.RequestHeader(inner_key, inner_version, 77, "admin")
            inner_body = values.message(inner_key, inner_version, "request")
            principal: Principal | bytes = Principal("User", "alice", values.rng.random() < .5)
            body = envelope_request_body(inner, inner_body, principal, "10.1.2.3")
            answer = values.message(inner_key, inner_version, "response")
        except KafkaWireError:
            continue
        request = kw.encode_request(kw.RequestHeader(ApiKey.ENVELOPE, 0, 9, "broker"), body)
        response = kw.encode_response(9, ApiKey.ENVELOPE, 0, envelope_response_body(inner, answer))
        seeds.append(streams_input([request], [response]))
        seeds.append(bytes((MODE_ENVELOPE,)) + body["RequestData"])
        seeds.append(bytes((MODE_ENVELOPE,)) + (body["RequestPrincipal"] or b""))
    return seeds


def build_corpus(seed: int, limit: int | None = None) -> list[bytes]:
    """Valid inputs: request/response streams over every (api key, version), group
    exchanges and payloads, envelopes. `limit` samples the (api key, version) pairs."""
    rng = random.Random(seed)
    values = RandomValues(rng)
    keys = sorted({(k, v) for k, v, kind in all_messages() if kind == "request"})
    if limit is not None and limit < len(keys):
        keys = rng.sample(keys, limit)
    corpus: list[bytes] = []
    for api_key, version in keys:
        pair = _pair(values, api_key, version, rng.randrange(1 << 16))
        if pair is not None:
            corpus.append(streams_input([pair[0]], [pair[1]], seed=rng.randrange(256)))
    # A few pipelined streams of several frames each.
    for _ in range(max(1, len(corpus) // 10)):
        pairs = [_pair(values, *rng.choice(keys), correlation_id=i) for i in range(1, 5)]
        ok = [p for p in pairs if p is not None]
        corpus.append(streams_input([p[0] for p in ok], [p[1] for p in ok],
                                    seed=rng.randrange(256)))
    corpus += _group_seeds(rng)
    corpus += _envelope_seeds(values)
    return corpus


# -- mutations ----------------------------------------------------------------------------

_INTERESTING_32 = (0, 1, -1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF,
                   -0x80000000, 4, 16, 1 << 20, (1 << 20) + 1)
_INTERESTING_8 = (0, 1, 0x7F, 0x80, 0xFE, 0xFF)


def mutate(data: bytes, rng: random.Random, corpus: list[bytes]) -> bytes:
    """One to four stacked mutations; the mode byte is kept most of the time."""
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3, 4))):
        if len(buf) < 2:
            buf += rng.randbytes(rng.randint(1, 16))
        op = rng.randrange(9)
        pos = rng.randrange(1, len(buf))
        if op == 0:  # flip a bit
            buf[pos] ^= 1 << rng.randrange(8)
        elif op == 1:  # an interesting byte
            buf[pos] = rng.choice(_INTERESTING_8)
        elif op == 2 and len(buf) - pos >= 4:  # an interesting int32 (sizes, counts)
            _I32.pack_into(buf, pos, rng.choice(_INTERESTING_32))
        elif op == 3 and len(buf) - pos >= 2:  # an interesting int16 (string lengths)
            struct.pack_into(">h", buf, pos, rng.choice((0, -1, 1, 0x7FFF, -2, 255)))
        elif op == 4:  # insert random bytes
            buf[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == 5:  # delete a run
            del buf[pos : pos + rng.randint(1, 8)]
        elif op == 6:  # truncate
            del buf[pos:]
        elif op == 7:  # splice from another input
            other = rng.choice(corpus)
            start = rng.randrange(len(other))
            buf[pos:] = other[start : start + rng.randint(1, 200)]
        else:  # duplicate a run
            run = buf[pos : pos + rng.randint(1, 32)]
            buf[pos:pos] = run
    if rng.random() < 0.02:
        buf[0] = rng.randrange(256)
    return bytes(buf)


def next_input(rng: random.Random, corpus: list[bytes]) -> bytes:
    r = rng.random()
    if r < 0.05:
        return bytes((rng.randrange(3),)) + rng.randbytes(rng.randint(0, 300))
    if r < 0.10:
        return rng.choice(corpus)
    return mutate(rng.choice(corpus), rng, corpus)


# -- the runner ---------------------------------------------------------------------------


@dataclass
class Report:
    runs: int = 0
    seconds: float = 0.0
    corpus: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (input hex, traceback)
    outcome: Outcome = field(default_factory=Outcome)

    def merge(self, other: Report) -> None:
        self.runs += other.runs
        self.corpus = max(self.corpus, other.corpus)
        self.failures += other.failures
        self.outcome.add(other.outcome)


def fuzz(runs: int, seed: int = 0, corpus_limit: int | None = None,
         max_failures: int = 20) -> Report:
    """Run `runs` inputs with the random-mutation engine; failures are collected."""
    started = time.perf_counter()
    corpus = build_corpus(seed, corpus_limit)
    rng = random.Random(seed ^ 0x5EED)
    report = Report(corpus=len(corpus))
    for _ in range(runs):
        data = next_input(rng, corpus)
        try:
            target(data, report.outcome)
        except KafkaWireError:
            pass
        except Exception:
            if len(report.failures) < max_failures:
                report.failures.append((data.hex(), traceback.format_exc()))
        report.runs += 1
    report.seconds = time.perf_counter() - started
    return report


def _worker(args: tuple[int, int, int | None]) -> Report:
    runs, seed, corpus_limit = args
    return fuzz(runs, seed, corpus_limit)


def fuzz_parallel(runs: int, jobs: int, seed: int = 0,
                  corpus_limit: int | None = None) -> Report:
    started = time.perf_counter()
    if jobs <= 1:
        report = fuzz(runs, seed, corpus_limit)
    else:
        shares = [runs // jobs + (1 if i < runs % jobs else 0) for i in range(jobs)]
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            parts = pool.map(_worker, [(n, seed + i, corpus_limit) for i, n in enumerate(shares)])
        report = Report()
        for part in parts:
            report.merge(part)
    report.seconds = time.perf_counter() - started
    return report


def run_atheris(runs: int, seed: int, extra: list[str]) -> None:  # pragma: no cover
    import atheris

    corpus_dir = Path(tempfile.mkdtemp(prefix="keg-fuzz-corpus-"))
    for data in build_corpus(seed):
        (corpus_dir / hashlib.sha1(data).hexdigest()).write_bytes(data)
    atheris.instrument_all()

    def one(data: bytes) -> None:
        with contextlib.suppress(KafkaWireError):
            target(data)

    atheris.Setup([sys.argv[0], f"-runs={runs}", f"-seed={seed or 1}", *extra,
                   str(corpus_dir)], one)
    atheris.Fuzz()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=1, help="processes (random engine)")
    parser.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(2), "big"))
    parser.add_argument("--engine", choices=("random", "atheris"), default="random")
    parser.add_argument("--corpus-limit", type=int, default=None,
                        help="sample this many (api key, version) pairs for the corpus")
    parser.add_argument("--crash-dir", type=Path, default=None)
    parser.add_argument("--reproduce", type=Path, default=None,
                        help="run one saved input and show the exception")
    args, extra = parser.parse_known_args(argv)
    if args.reproduce is not None:
        target(args.reproduce.read_bytes())
        print("no failure")
        return 0
    if args.engine == "atheris":
        run_atheris(args.runs, args.seed, extra)
        return 0
    report = fuzz_parallel(args.runs, args.jobs, args.seed, args.corpus_limit)
    o = report.outcome
    print(f"{report.runs:,} inputs in {report.seconds:.1f} s "
          f"({report.runs / max(report.seconds, 1e-9):,.0f}/s, {args.jobs} process(es), "
          f"seed {args.seed}, corpus {report.corpus}); failures: {len(report.failures)}")
    print(f"frames decoded {o.frames_ok:,}, rejected {o.frames_rejected:,}; streams cut "
          f"{o.streams_cut:,}; group payloads {o.group_payloads:,}; envelopes {o.envelopes:,};"
          f" payload decodes {o.payloads_ok:,} ok / {o.payloads_rejected:,} rejected")
    for data_hex, tb in report.failures:
        print(tb)
        if args.crash_dir is not None:
            args.crash_dir.mkdir(parents=True, exist_ok=True)
            data = bytes.fromhex(data_hex)
            path = args.crash_dir / f"crash-{hashlib.sha1(data).hexdigest()[:12]}.bin"
            path.write_bytes(data)
            print(f"saved {path}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
