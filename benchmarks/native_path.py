"""The data paths side by side: direct, Envoy tcp_proxy alone, keg's native filter, ext_proc.

    python -m benchmarks.native_path [--records 200000] [--repeat 1]

One broker. Four ways to reach it, measured step by step back to back (the steps of
``benchmarks.gateway_vs_direct``: Kafka's ProducerPerformance and ConsumerPerformance,
librdkafka produce acks=all and consume, 1 KiB records, fresh topics per round):

- ``direct``: the broker's own listener;
- ``tcp_proxy``: Envoy with only tcp_proxy (the physical limit of any Envoy path). The
  broker has an extra listener that advertises the proxy's port, so clients stay on it;
- ``native``: keg's gateway on the native data path (the Rust module -> tcp_proxy);
- ``ext_proc``: keg's gateway on today's path (network ext_proc -> Python service);
- ``native_unmetered`` (ask for it with ``--paths``): the native path without the
  module's labelled metrics (``module_metrics_port=None``: no client id compared, no
  Produce topic read), to measure what those metrics cost side by side.

Ratios are path / direct (medians over rounds). Results are appended to
benchmarks/results/native_path.jsonl; native_path.md holds the latest table.

The hand-off step (``--handoff-records``, 0 skips it) measures what the native filter
costs when rules need the Python service: librdkafka produces (acks=all) and consumes
1 KiB JSON orders (``benchmarks.record_rules``) directly, through the native gateway
without rules, with a rule that hands every Produce to the Python chain and lets it go
unchanged (``native_handoff``), and with rules that mask two fields of every record at
produce and at consume time (``native_mask``; ``ext_proc_mask``: the same rules on the
ext_proc path, for comparison).

Topic-selective hand-off (docs/native.md, the interest table): ``native_other_topic``
runs a mask rule on ANOTHER topic (``other.*``) than the one produced to, so the module
lets every Produce pass natively; ``native_other_unselected`` runs the same rule written
so the module cannot read its topics (``(?s)`` is outside the pattern subset the module
is given), which hands every Produce to the Python chain: what any record rule cost
before topic selectors. Who-selective hand-off: ``native_other_network`` runs a deny on
Produce for another network than the clients', which the module lets pass natively;
``native_handoff`` the same deny naming a client id instead (every Produce handed off,
what a rule naming a principal, network or listener cost before who-selectors).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import record_rules
from benchmarks.gateway_vs_direct import (
    CPU_S_PER_GB,
    DIRECT,
    METRICS,
    RESULTS_DIR,
    CpuClock,
    Params,
    Sample,
    create_topics,
    git_commit,
    machine_info,
    process_cpu_seconds,
    run_round,
    warm_up,
)
from control_plane.service import free_port

if TYPE_CHECKING:
    from keg.gateway import Gateway

log = logging.getLogger("benchmarks.native_path")

TCP_PROXY, NATIVE, EXT_PROC = "tcp_proxy", "native", "ext_proc"
NATIVE_UNMETERED = "native_unmetered"
PATHS = (DIRECT, TCP_PROXY, NATIVE, EXT_PROC)
# path -> (data path, the module's metrics port: 0 a free one, None none)
GATEWAYS = {NATIVE: ("native", 0), EXT_PROC: ("ext-proc", None),
            NATIVE_UNMETERED: ("native", None)}
STEP_PREFIXES = ("java_produce", "java_consume", "rdkafka_produce", "rdkafka_consume")
# CPU seconds per GB moved of Envoy and keg's workers: tcp_proxy alone is the limit.
CPU_KEYS = tuple(f"{prefix}.{CPU_S_PER_GB}" for prefix in STEP_PREFIXES)
CPU_LABELS = dict(zip(CPU_KEYS, ("Java producer", "Java consumer", "librdkafka producer",
                                 "librdkafka consumer"), strict=True))
SUMMARY_KEYS = (
    "java_produce.records_per_s",
    "java_consume.records_per_s",
    "java_consume.fetch_records_per_s",
    "rdkafka_produce.records_per_s",
    "rdkafka_produce.p50_ms",
    "rdkafka_produce.p99_ms",
    "rdkafka_consume.records_per_s",
    *CPU_KEYS,
)


NATIVE_HANDOFF, NATIVE_MASK, EXT_PROC_MASK = "native_handoff", "native_mask", "ext_proc_mask"
NATIVE_OTHER, NATIVE_OTHER_UNSELECTED = "native_other_topic", "native_other_unselected"
NATIVE_OTHER_NETWORK, NATIVE_SAFEGUARD = "native_other_network", "native_safeguard"
HANDOFF_PATHS = (DIRECT, NATIVE, NATIVE_OTHER, NATIVE_OTHER_UNSELECTED, NATIVE_OTHER_NETWORK,
                 NATIVE_SAFEGUARD, NATIVE_HANDOFF, NATIVE_MASK, EXT_PROC_MASK)
HANDOFF_KEYS = ("produce_records_per_s", "consume_records_per_s")
# A rule that matches no request the benchmark sends, its client id written as a
# pattern the module is not given ((?s) changes nothing for a client id): no
# who-selector, every Produce request is handed to the Python chain (a topic, principal
# or client id the module reads would let it pass them: topic and who selectors), which
# forwards it unchanged.
HANDOFF_RULES = """
rules:
  - id: judge-every-produce
    match: {apis: [Produce], client_ids: {regex: ['(?s)nobody']}}
    action: {deny: {}}
"""
# A record rule on a topic the benchmark does not produce to: with its topic selector
# the module passes the benchmark's Produce requests natively.
OTHER_TOPIC_RULES = """
rules:
  - id: mask-other
    match: {topics: {prefix: [other.]}}
    action: {mask: {fields: [$.customer.email, $.card.number]}}
"""
# The same rule, its topics written as a pattern the module is not given ((?s) changes
# nothing for topic names): no selector, every Produce handed off, as before selectors.
OTHER_TOPIC_UNSELECTED_RULES = """
rules:
  - id: mask-other
    match: {topics: {regex: ['(?s)other\\..*']}}
    action: {mask: {fields: [$.customer.email, $.card.number]}}
"""
# A deny rule on Produce for clients of a network the benchmark's clients are not in:
# with its who-selector the module passes their Produce requests natively (compare
# `native_handoff`, the same deny naming a client id by a pattern the module is not given).
OTHER_NETWORK_RULES = """
rules:
  - id: nothing-from-far-away
    match: {apis: [Produce], client_addresses: ["10.0.0.0/8"]}
    action: {deny: {}}
"""
# A producer-hygiene safeguard on the produced topics that the benchmark's producer keeps
# (acks=all, batches far below the limit): the module checks it on each Produce itself
# and passes it natively (before: every such Produce was handed off, as native_handoff).
SAFEGUARD_RULES = """
rules:
  - id: producer-hygiene
    match: {topics: {prefix: [p.]}}
    action: {safeguard: {forbid_acks_zero: true, max_batch_bytes: 16777216}}
"""
# Every record masked on its way in (topics p.*) and on its way out (topics c.*).
MASK_RULES = """
rules:
  - id: mask-produced
    match: {topics: {prefix: [p.]}}
    action: {mask: {fields: [$.customer.email, $.card.number]}}
  - id: mask-consumed
    match: {direction: response, topics: {prefix: [c.]}}
    action: {mask: {fields: [$.customer.email, $.card.number]}}
"""
HANDOFF_GATEWAYS = {NATIVE_OTHER: ("native", OTHER_TOPIC_RULES),
                    NATIVE_OTHER_UNSELECTED: ("native", OTHER_TOPIC_UNSELECTED_RULES),
                    NATIVE_OTHER_NETWORK: ("native", OTHER_NETWORK_RULES),
                    NATIVE_SAFEGUARD: ("native", SAFEGUARD_RULES),
                    NATIVE_HANDOFF: ("native", HANDOFF_RULES),
                    NATIVE_MASK: ("native", MASK_RULES),
                    EXT_PROC_MASK: ("ext-proc", MASK_RULES)}


def handoff_round(number: int, paths: Mapping[str, str], admin: str,
                  values: Sequence[bytes]) -> dict[str, dict[str, float]]:
    """One round of the hand-off step: per path, produce `values` to a fresh p.* topic
    and consume them from a c.* topic filled directly (one partition each)."""
    round_: dict[str, dict[str, float]] = {}
    for path, bootstrap in paths.items():
        produced, consumed = (f"{d}.{uuid.uuid4().hex[:8]}" for d in "pc")
        create_topics(admin, [produced, consumed], 1)
        produce = record_rules.produce(bootstrap, produced, list(values), "none")
        record_rules.produce(admin, consumed, list(values), "none")
        consume = record_rules.consume(bootstrap, consumed, len(values))
        if path in (NATIVE_MASK, EXT_PROC_MASK):
            _check_masked(admin, produced)  # stored masked
            _check_masked(bootstrap, consumed)  # read masked
        round_[path] = {"produce_records_per_s": produce, "consume_records_per_s": consume}
        log.info("hand-off round %d, %s: produce %.0f/s, consume %.0f/s", number, path,
                 produce, consume)
    return round_


def _check_masked(bootstrap: str, topic: str) -> None:
    """The first record of `topic` read through `bootstrap` is masked (the rules ran)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        msg = consumer.poll(30)
        if msg is None or msg.error() is not None or b"@example.com" in (msg.value() or b""):
            raise RuntimeError(f"{topic}: the stored records are not masked")
    finally:
        consumer.close()


def proxied_kafka(proxied_port: int, proxy_port: int) -> Any:
    """The embedded broker plus a listener on `proxied_port` that advertises `proxy_port`."""
    from keg.embedded.kafka import EmbeddedKafka

    class ProxiedKafka(EmbeddedKafka):
        def server_properties(self) -> dict[str, str]:
            props = super().server_properties()
            props["listeners"] += f",PROXIED://127.0.0.1:{proxied_port}"
            props["advertised.listeners"] += f",PROXIED://127.0.0.1:{proxy_port}"
            props["listener.security.protocol.map"] += ",PROXIED:PLAINTEXT"
            return props

    return ProxiedKafka()


TCP_PROXY_BOOTSTRAP = """\
static_resources:
  listeners:
  - name: proxy
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: proxy
          cluster: broker
  clusters:
  - name: broker
    type: STATIC
    connect_timeout: 5s
    load_assignment:
      cluster_name: broker
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address:
        {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}}}
"""


@contextlib.contextmanager
def tcp_proxy_envoy(listen: int, upstream: int, concurrency: int) -> Iterator[tuple[str, int]]:
    """Envoy with only tcp_proxy from `listen` to `upstream`: (its bootstrap, its pid)."""
    from keg.embedded.envoy import envoy_binary
    from keg.gateway import wait_for_port

    with tempfile.TemporaryDirectory(prefix="keg-tcp-proxy-") as tmp:
        bootstrap = Path(tmp) / "bootstrap.yaml"
        bootstrap.write_text(TCP_PROXY_BOOTSTRAP.format(listen=listen, upstream=upstream))
        with (Path(tmp) / "envoy.log").open("wb") as out:
            process = subprocess.Popen(
                [str(envoy_binary()), "-c", str(bootstrap), "--use-dynamic-base-id",
                 "--concurrency", str(concurrency), "--log-level", "warning"],
                stdout=out, stderr=subprocess.STDOUT)
            try:
                wait_for_port("127.0.0.1", listen, 30)
                yield f"127.0.0.1:{listen}", process.pid
            finally:
                process.terminate()
                process.wait(10)


def gateway_cpu_seconds(gateway: Gateway) -> float:
    """CPU seconds keg's Envoy and ext_proc workers used so far (the control plane runs in
    this process, idle while records flow, and is not counted)."""
    envoy = gateway.envoy.pid if gateway.envoy is not None else None
    return process_cpu_seconds([envoy, *(w.current_pid() for w in gateway.workers)])


def median(rounds: Sequence[Mapping[str, Sample]], path: str, key: str) -> float | None:
    import statistics

    values = [r[path][key] for r in rounds if key in r.get(path, {})]
    return statistics.median(values) if values else None


def measured(rounds: Sequence[Mapping[str, Sample]]) -> list[str]:
    """The paths the rounds measured, direct first."""
    return [p for p in (*PATHS, NATIVE_UNMETERED) if p == DIRECT or any(p in r for r in rounds)]


def table(rounds: Sequence[Mapping[str, Sample]], keys: Sequence[str]) -> list[list[str]]:
    labels = {m.key: m.label for m in METRICS} | {
        key: f"{label}: Envoy + keg CPU s per GB" for key, label in CPU_LABELS.items()}
    rows = []
    for key in keys:
        direct = median(rounds, DIRECT, key)
        cells = [labels.get(key, key), f"{direct:,.1f}" if direct is not None else "-"]
        for path in measured(rounds)[1:]:
            value = median(rounds, path, key)
            ratio = value / direct if value is not None and direct else None
            cells.append("-" if value is None else f"{value:,.1f} ({ratio:.2f}x)"
                         if ratio is not None else f"{value:,.1f}")
        rows.append(cells)
    return rows


def handoff_table(rounds: Sequence[Mapping[str, Sample]], paths: Sequence[str]) -> list[list[str]]:
    rows = []
    for key in HANDOFF_KEYS:
        direct = median(rounds, DIRECT, key)
        cells = [key.replace("_", " "), f"{direct:,.0f}" if direct else "-"]
        for path in paths[1:]:
            value = median(rounds, path, key)
            cells.append("-" if value is None else
                         f"{value:,.0f} ({value / direct:.2f}x)" if direct else f"{value:,.0f}")
        rows.append(cells)
    return rows


def markdown(rows: Sequence[Sequence[str]], title: str,
             paths: Sequence[str] = PATHS) -> str:
    header = ["metric", *paths]
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=1, help="rounds; tables show medians")
    parser.add_argument("--warmup", type=int, default=10_000)
    parser.add_argument("--envoy-concurrency", type=int, default=1)
    parser.add_argument("--paths", default=",".join(PATHS[1:]),
                        help="paths besides direct, comma-separated")
    parser.add_argument("--handoff-records", type=int, default=50_000,
                        help="records of the hand-off step (0: skip it)")
    parser.add_argument("--handoff-paths", default=",".join(HANDOFF_PATHS[1:]),
                        help="hand-off step paths besides direct, comma-separated")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-save", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("librdkafka").setLevel(logging.ERROR)
    from keg.embedded.kafka import ensure_kafka
    from keg.gateway import Gateway, GatewaySettings

    wanted = [p for p in args.paths.split(",") if p]
    params = Params(records=args.records, record_size=args.record_size,
                    partitions=args.partitions, repeat=args.repeat, warmup=args.warmup)
    ensure_kafka()
    proxied, proxy = free_port(), free_port()
    rounds: list[dict[str, Sample]] = []
    handoff_rounds: list[dict[str, Sample]] = []
    handoff_wanted = [p for p in args.handoff_paths.split(",") if p] if args.handoff_records else []
    with contextlib.ExitStack() as stack:
        kafka = stack.enter_context(proxied_kafka(proxied, proxy))
        paths = {DIRECT: kafka.bootstrap}
        cpu_clocks: dict[str, CpuClock] = {}
        if TCP_PROXY in wanted:
            paths[TCP_PROXY], proxy_pid = stack.enter_context(
                tcp_proxy_envoy(proxy, proxied, args.envoy_concurrency))
            cpu_clocks[TCP_PROXY] = functools.partial(process_cpu_seconds, [proxy_pid])
        for path, (data_path, module_metrics) in GATEWAYS.items():
            if path in wanted:
                gateway = stack.enter_context(Gateway(GatewaySettings(
                    bootstrap_servers=kafka.bootstrap, listen_port_base=0,
                    envoy_concurrency=args.envoy_concurrency, ext_proc_log_level="WARNING",
                    data_path=data_path, module_metrics_port=module_metrics)))
                paths[path] = gateway.bootstrap
                cpu_clocks[path] = functools.partial(gateway_cpu_seconds, gateway)

        def status(text: str) -> contextlib.AbstractContextManager[Any]:
            log.info("%s", text)
            return contextlib.nullcontext()

        handoff_paths = {DIRECT: kafka.bootstrap}
        if NATIVE in handoff_wanted and NATIVE in paths:
            handoff_paths[NATIVE] = paths[NATIVE]
        for path, (data_path, rules) in HANDOFF_GATEWAYS.items():
            if path in handoff_wanted:
                rules_dir = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "rules"
                rules_dir.mkdir()
                (rules_dir / "bench.yaml").write_text(rules)
                gateway = stack.enter_context(Gateway(GatewaySettings(
                    bootstrap_servers=kafka.bootstrap, listen_port_base=0,
                    envoy_concurrency=args.envoy_concurrency, ext_proc_log_level="WARNING",
                    data_path=data_path, rules_dir=rules_dir)))
                handoff_paths[path] = gateway.bootstrap

        prefix = f"native-bench-{uuid.uuid4().hex[:6]}"
        warm_up(paths, kafka.bootstrap, params, status, prefix)
        values = [record_rules.order_value(i, args.record_size)
                  for i in range(args.handoff_records)]
        for number in range(1, params.repeat + 1):
            rounds.append(run_round(number, paths, kafka.bootstrap, params, status, prefix,
                                    cpu_clocks=cpu_clocks))
            if len(handoff_paths) > 1:
                handoff_rounds.append(handoff_round(number, handoff_paths, kafka.bootstrap,
                                                    values))
    title = (f"{params.records:,} x {params.record_size} B records, {params.partitions} "
             f"partitions, {params.repeat} round(s), Envoy concurrency {args.envoy_concurrency}; "
             f"value (ratio to direct)")
    rows = table(rounds, SUMMARY_KEYS)
    text = markdown(rows, title, measured(rounds))
    if handoff_rounds:
        handed = [p for p in HANDOFF_PATHS if any(p in r for r in handoff_rounds)]
        text += "\n" + markdown(
            handoff_table(handoff_rounds, handed),
            f"Hand-off step: {args.handoff_records:,} x {args.record_size} B JSON orders, "
            f"librdkafka acks=all, 1 partition; records/s (ratio to direct)", handed)
    print(text)
    if not args.no_save:
        record = {
            "benchmark": "native_path",
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "commit": git_commit(),
            "machine": machine_info(),
            "params": asdict(params),
            "envoy_concurrency": args.envoy_concurrency,
            "paths": list(paths),
            "rounds": rounds,
            "medians": {path: {k: median(rounds, path, k) for k in SUMMARY_KEYS}
                        for path in paths},
            "handoff_records": args.handoff_records,
            "handoff_rounds": handoff_rounds,
            "handoff_medians": {
                path: {k: median(handoff_rounds, path, k) for k in HANDOFF_KEYS}
                for path in HANDOFF_PATHS if any(path in r for r in handoff_rounds)},
        }
        args.results_dir.mkdir(parents=True, exist_ok=True)
        with (args.results_dir / "native_path.jsonl").open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        full = markdown(table(rounds, [m.key for m in METRICS]), title, measured(rounds))
        (args.results_dir / "native_path.md").write_text(
            f"# Data paths side by side ({record['at']}, commit {record['commit']})\n\n"
            f"{text}\n## Every metric\n\n{full}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
