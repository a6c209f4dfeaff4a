"""TLS through the gateway vs TLS straight to the broker, side by side.

    python -m benchmarks.tls_path [--records 100000] [--repeat 2]

One broker with an SSL listener (certificates from a throw-away CA). Three ways to it,
each step run on every path back to back (librdkafka produce acks=all, then consume,
1 KiB records, 3 partitions, fresh topics per round):

- ``direct_tls``: the broker's SSL listener;
- ``native_tls``: keg's gateway, TLS terminated by Envoy on its listener and opened
  again to the broker, keg's Kafka filter inside Envoy (the pass-through path);
- ``ext_proc_tls``: the same TLS, with every byte through the ext_proc service.

No rules: this measures what TLS termination and re-encryption cost on each data path.
Ratios are path / direct_tls (medians over rounds); results are appended to
benchmarks/results/tls_path.jsonl and the latest table written to tls_path.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.gateway_vs_direct import (
    RESULTS_DIR,
    Params,
    Sample,
    create_topics,
    git_commit,
    machine_info,
    rdkafka_consume,
    rdkafka_produce,
)

log = logging.getLogger("benchmarks.tls_path")

DIRECT, NATIVE, EXT_PROC = "direct_tls", "native_tls", "ext_proc_tls"
PATHS = (DIRECT, NATIVE, EXT_PROC)
KEYS = ("produce.records_per_s", "produce.p50_ms", "produce.p99_ms",
        "consume.records_per_s")


@contextlib.contextmanager
def environment(work: Path) -> Iterator[tuple[dict[str, str], dict[str, Any]]]:
    """(bootstrap per path, librdkafka TLS settings) with the broker and both gateways up."""
    from control_plane.tls import ListenerTls, UpstreamTls
    from keg.embedded.certs import DevCa
    from keg.embedded.kafka import BrokerTls, EmbeddedKafka, ensure_kafka
    from keg.gateway import Gateway, GatewaySettings

    ensure_kafka()
    ca = DevCa(work / "ca")
    broker = ca.server("broker")
    with contextlib.ExitStack() as stack:
        kafka = stack.enter_context(EmbeddedKafka(
            tls=BrokerTls(broker.cert, broker.key, ca.cert_file), heap="1g"))
        bootstraps = {DIRECT: kafka.ssl_bootstrap}
        for path, data_path in ((NATIVE, "native"), (EXT_PROC, "ext-proc")):
            server = ca.server(f"gateway-{data_path}")
            gateway = stack.enter_context(Gateway(GatewaySettings(
                bootstrap_servers=kafka.ssl_bootstrap, listen_port_base=0,
                work_dir=work / path, ext_proc_log_level="WARNING", data_path=data_path,
                tls=ListenerTls(server.cert, server.key),
                upstream_tls=UpstreamTls(ca.cert_file))))
            bootstraps[path] = gateway.bootstrap
        bootstraps["plaintext"] = kafka.bootstrap
        yield bootstraps, {"security.protocol": "SSL", "ssl.ca.location": str(ca.cert_file)}


def run_round(bootstraps: Mapping[str, str], security: Mapping[str, Any],
              params: Params) -> dict[str, Sample]:
    topics = {path: f"tls-bench-{path}-{uuid.uuid4().hex[:8]}" for path in PATHS}
    create_topics(bootstraps["plaintext"], list(topics.values()), params.partitions)
    samples: dict[str, Sample] = {path: {} for path in PATHS}
    for step in ("produce", "consume"):
        for path in PATHS:
            run = rdkafka_produce if step == "produce" else rdkafka_consume
            result = run(bootstraps[path], topics[path], params, security)
            samples[path].update({f"{step}.{key}": value for key, value in result.items()})
            log.info("%s %s: %.0f records/s", path, step, result["records_per_s"])
    return samples


def summarise(rounds: list[dict[str, Sample]]) -> dict[str, dict[str, float]]:
    return {path: {key: statistics.median(r[path][key] for r in rounds) for key in KEYS}
            for path in PATHS}


def markdown(summary: Mapping[str, Mapping[str, float]], params: Params, rounds: int) -> str:
    direct = summary[DIRECT]
    lines = [f"TLS through the gateway vs direct TLS: librdkafka, {params.records:,} x "
             f"{params.record_size} B, {params.partitions} partitions, median of {rounds} "
             "round(s)", "",
             "| metric | " + " | ".join(PATHS) + " |", "|---|" + "---:|" * len(PATHS)]
    for key in KEYS:
        cells = []
        for path in PATHS:
            value = summary[path][key]
            ratio = "" if path == DIRECT else f" ({value / direct[key]:.2f}x)"
            cells.append(f"{value:,.0f}{ratio}")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("librdkafka").setLevel(logging.WARNING)
    params = Params(records=args.records, repeat=args.repeat)
    with tempfile.TemporaryDirectory(prefix="keg-tls-bench-") as work, \
            environment(Path(work)) as (bootstraps, security):
        warm = Params(records=5_000, partitions=params.partitions)
        run_round(bootstraps, security, warm)
        rounds = [run_round(bootstraps, security, params) for _ in range(params.repeat)]
    summary = summarise(rounds)
    table = markdown(summary, params, len(rounds))
    print(table)
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "tls_path.md").write_text(table)
    with (RESULTS_DIR / "tls_path.jsonl").open("a") as out:
        out.write(json.dumps({"time": datetime.now(UTC).isoformat(), "commit": git_commit(),
                              "machine": machine_info(), "records": params.records,
                              "rounds": rounds, "summary": summary}) + "\n")


if __name__ == "__main__":
    main()
