"""Record rules on every record: gateway vs direct, side by side, in one run.

    python -m benchmarks.record_rules [--records 50000] [--repeat 1] [--actions a,b]
                                      [--data-path native|ext-proc]
                                      [--ext-proc-workers N] [--output record_rules]

One broker, one gateway whose rule set holds, per action (mask, validate, encrypt,
schema), a produce-time rule on topics `p.<action>.*` and a consume-time rule on topics
`c.<action>.*`. Values are 1 KiB JSON orders; every record matches. `schemaid` requires
a Confluent-framed schema id registered for the topic (a real schema registry, Apicurio,
started for the run; each topic's `<topic>-value` subject registered before its cell),
`schemavalid` also validates each payload against the registered JSON Schema. Each cell is
librdkafka producing (acks=all) or consuming the same records directly and through
the gateway, uncompressed and with lz4, measured back to back. A `plain` row (topics
no rule matches) shows the gateway's own cost. Ratios are gateway / direct records/s.
Results: benchmarks/results/record_rules.json and record_rules.md.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import statistics
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson

from benchmarks.gateway_vs_direct import (
    RESULTS_DIR,
    create_topics,
    gateway_with_rules,
    git_commit,
    machine_info,
)

log = logging.getLogger("benchmarks.record_rules")

KEY_ENV = "KEG_BENCH_KEY"
ACTIONS = ("plain", "mask", "validate", "encrypt", "schemaid", "schemavalid")
SCHEMA_ACTIONS = ("schemaid", "schemavalid")
ORDER_SCHEMA = {"type": "object", "required": ["id", "amount", "customer"],
                "properties": {"amount": {"type": "number", "minimum": 0},
                               "id": {"type": "integer"}}}
CODECS = ("none", "lz4")

RULES = f"""
rules:
  - id: p-mask
    match: {{topics: {{prefix: [p.mask.]}}}}
    action: {{mask: {{fields: [$.customer.email, $.card.number]}}}}
  - id: c-mask
    match: {{direction: response, topics: {{prefix: [c.mask.]}}}}
    action: {{mask: {{fields: [$.customer.email, $.card.number]}}}}
  - id: p-validate
    match: {{topics: {{prefix: [p.validate.]}}}}
    action: {{validate: {{json_schema: {{type: object, required: [id, amount, customer],
              properties: {{amount: {{type: number, minimum: 0}}, id: {{type: integer}}}}}}}}}}
  - id: c-validate
    match: {{direction: response, topics: {{prefix: [c.validate.]}}}}
    action: {{validate: {{json_schema: {{type: object, required: [id, amount, customer],
              properties: {{amount: {{type: number, minimum: 0}}, id: {{type: integer}}}}}}}}}}
  - id: p-encrypt
    match: {{topics: {{prefix: [p.encrypt.]}}}}
    action: {{encrypt: {{fields: [$.card.number], key: {{id: k1, secret: {{env: {KEY_ENV}}}}}}}}}
  - id: c-encrypt
    match: {{direction: response, topics: {{prefix: [c.encrypt.]}}}}
    action: {{encrypt: {{fields: [$.card.number], key: {{id: k1, secret: {{env: {KEY_ENV}}}}}}}}}
"""


def schema_rules(registry_url: str) -> str:
    """The schema rules: id only, and id plus payload validation."""
    return f"""
  - id: p-schemaid
    match: {{topics: {{prefix: [p.schemaid.]}}}}
    action: {{schema: {{registry: {{url: "{registry_url}"}}}}}}
  - id: c-schemaid
    match: {{direction: response, topics: {{prefix: [c.schemaid.]}}}}
    action: {{schema: {{registry: {{url: "{registry_url}"}}}}}}
  - id: p-schemavalid
    match: {{topics: {{prefix: [p.schemavalid.]}}}}
    action: {{schema: {{registry: {{url: "{registry_url}"}}, validate_payload: true}}}}
  - id: c-schemavalid
    match: {{direction: response, topics: {{prefix: [c.schemavalid.]}}}}
    action: {{schema: {{registry: {{url: "{registry_url}"}}, validate_payload: true}}}}
"""


def order_value(i: int, size: int = 1024) -> bytes:
    """A JSON order padded to `size` bytes."""
    doc: dict[str, Any] = {"id": i, "amount": i % 500, "kind": "order",
                           "customer": {"email": f"user{i}@example.com", "name": f"User {i}"},
                           "card": {"number": f"4111-0000-{i % 10000:04d}-{i % 7777:04d}"},
                           "note": ""}
    raw = orjson.dumps(doc)
    doc["note"] = "x" * max(0, size - len(raw))
    return orjson.dumps(doc)


def produce(bootstrap: str, topic: str, values: list[bytes], codec: str) -> float:
    """Records/s of producing `values` with acks=all until flushed."""
    from confluent_kafka import Producer

    errors: list[str] = []
    # Batches below the broker's 1 MiB limit: encryption makes each record longer
    # on its way through, and a batch the gateway grows past the limit is refused.
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "compression.type": codec, "batch.size": 256 * 1024})
    started = time.perf_counter()
    for value in values:
        while True:
            try:
                producer.produce(topic, value, on_delivery=lambda err, msg: None if err is None
                                 else errors.append(str(err)))
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(600) or errors:
        raise RuntimeError(f"produce to {topic} failed: {errors[:1]}")
    return len(values) / (time.perf_counter() - started)


def consume(bootstrap: str, topic: str, count: int) -> float:
    """Records/s of reading `count` records from the beginning of partition 0."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "enable.auto.commit": False})
    got = 0
    try:
        started = last = time.perf_counter()
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        while got < count:
            for msg in consumer.consume(10_000, 1.0):
                if msg.error() is not None:
                    raise RuntimeError(f"consume {topic}: {msg.error()}")
                got += 1
                last = time.perf_counter()
            if time.perf_counter() - last > 30:
                raise RuntimeError(f"consumer stalled at {got}/{count} on {topic}")
    finally:
        consumer.close()
    return got / (last - started)


def register(registry_url: str, topics: list[str]) -> int:
    """Register the order schema (JSON Schema) under each topic's `<topic>-value` subject,
    as a Confluent serializer would; the schema id (one id for one schema's content)."""
    ids = set()
    for topic in topics:
        body = orjson.dumps({"schemaType": "JSON", "schema": orjson.dumps(ORDER_SCHEMA).decode()})
        request = urllib.request.Request(
            f"{registry_url}/subjects/{topic}-value/versions", data=body, method="POST",
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            ids.add(int(orjson.loads(answer.read())["id"]))
    (schema_id,) = ids
    return schema_id


def framed(schema_id: int, values: list[bytes]) -> list[bytes]:
    prefix = b"\x00" + schema_id.to_bytes(4, "big")
    return [prefix + value for value in values]


def run(records: int, repeat: int, actions: tuple[str, ...] = ACTIONS,
        data_path: str = "native", ext_proc_workers: int = 2) -> dict[str, Any]:
    from keg.embedded.kafka import EmbeddedKafka, ensure_kafka
    from keg.embedded.registry import EmbeddedRegistry

    os.environ[KEY_ENV] = base64.b64encode(os.urandom(32)).decode()
    plain_values = [order_value(i) for i in range(records)]
    cells: dict[str, dict[str, list[float]]] = {}
    ensure_kafka()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        kafka = stack.enter_context(EmbeddedKafka())
        registry = (stack.enter_context(EmbeddedRegistry())
                    if set(actions) & set(SCHEMA_ACTIONS) else None)
        rules = RULES + (schema_rules(registry.ccompat_url) if registry is not None else "")
        gateway = stack.enter_context(gateway_with_rules(
            kafka.bootstrap, Path(tmp), "bench.yaml", rules, data_path=data_path,
            envoy_concurrency=os.cpu_count() or 1,  # as keg up
            ext_proc_workers=ext_proc_workers))
        for _round in range(repeat):
            for action in actions:
                for codec in CODECS:
                    name = f"{action}/{codec}"
                    row = cells.setdefault(name, {})
                    for path, bootstrap in (("direct", kafka.bootstrap),
                                            ("gateway", gateway.bootstrap)):
                        prefix = "x" if action == "plain" else action
                        t, c = (f"{d}.{prefix}.{uuid.uuid4().hex[:8]}" for d in "pc")
                        create_topics(kafka.bootstrap, [t, c], 1)
                        values = plain_values
                        if action in SCHEMA_ACTIONS:
                            assert registry is not None
                            schema_id = register(registry.ccompat_url, [t, c])
                            values = framed(schema_id, plain_values)
                        rate = produce(bootstrap, t, values, codec)
                        row.setdefault(f"produce_{path}", []).append(rate)
                        # Consume: records stored directly, read by each path.
                        produce(kafka.bootstrap, c, values, codec)
                        rate = consume(bootstrap, c, records)
                        row.setdefault(f"consume_{path}", []).append(rate)
                    log.info("%s: %s", name, {k: round(v[-1]) for k, v in row.items()})
    table = {}
    for name, row in cells.items():
        med = {k: statistics.median(v) for k, v in row.items()}
        table[name] = {**{k: round(v) for k, v in med.items()},
                       "produce_ratio": round(med["produce_gateway"] / med["produce_direct"], 3),
                       "consume_ratio": round(med["consume_gateway"] / med["consume_direct"], 3)}
    return {"records": records, "record_bytes": 1024, "repeat": repeat, "data_path": data_path,
            "ext_proc_workers": ext_proc_workers,
            "commit": git_commit(),
            "machine": machine_info(), "cells": table}


def markdown(result: dict[str, Any]) -> str:
    lines = [f"Record rules on every record: {result['records']:,} x 1 KiB JSON, librdkafka, "
             f"acks=all, {result.get('data_path', 'ext-proc')} data path, "
             f"{result.get('ext_proc_workers', 1)} ext_proc worker(s), median of "
             f"{result['repeat']} (commit {result['commit']})", "",
             "| action / codec | produce direct rec/s | produce gateway rec/s | ratio | "
             "consume direct rec/s | consume gateway rec/s | ratio |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, c in result["cells"].items():
        lines.append(f"| {name} | {c['produce_direct']:,} | {c['produce_gateway']:,} | "
                     f"{c['produce_ratio']:.2f}x | {c['consume_direct']:,} | "
                     f"{c['consume_gateway']:,} | {c['consume_ratio']:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--actions", default=",".join(ACTIONS),
                        help=f"comma-separated subset of {','.join(ACTIONS)}")
    parser.add_argument("--data-path", default="native", choices=("ext-proc", "native"),
                        help="native (keg up's default) or ext-proc")
    parser.add_argument("--ext-proc-workers", type=int, default=os.cpu_count() or 1,
                        help="ext_proc worker processes (default: one per core, as keg up; "
                             "one connection's frames all go to one of them)")
    parser.add_argument("--output", default="record_rules",
                        help="results file name (benchmarks/results/<output>.json and .md)")
    args = parser.parse_args()
    actions = tuple(a for a in args.actions.split(",") if a)
    unknown = set(actions) - set(ACTIONS)
    if unknown:
        parser.error(f"unknown actions: {', '.join(sorted(unknown))}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    result = run(args.records, args.repeat, actions, args.data_path, args.ext_proc_workers)
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / f"{args.output}.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (RESULTS_DIR / f"{args.output}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
