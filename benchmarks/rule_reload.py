"""A large rule-directory reload on the control plane as deployed, and what its REST API
and its fleet see meanwhile.

    .venv/bin/python -m benchmarks.rule_reload [--rules 100000] [--bootstrap host:port]
                                               [--no-ext-proc]

The control plane is `keg.gateway.ControlPlaneApp` (SQLite store, REST API on the real
uvicorn server, xDS) watching a rule directory that holds one rule; with an ext_proc
service subscribed (a real `keg ext-proc` child) unless --no-ext-proc. Without
--bootstrap an embedded Kafka broker is started (the control plane needs a topology).
Then:

1. a probe thread sends real HTTP requests, one after the other, to `/healthz`,
   `/readyz`, `/v1/rules/base` and `/v1/versions?limit=5` (their latencies), and reads
   every version's rule count it is shown;
2. the rules are written as a copy or a checkout writes them: files of 1,000 rules, one
   every 0.25 s;
3. measured from the last file written: the store's new version visible in the API
   (`reload_s`: the directory held still, read, validated, stored), and the ext_proc
   service's ACK of it (`delivered_s`).

Reported: both times, the rule counts of every version the API ever showed (only the
one-rule version and the whole directory: never a part of it), and the latencies of the
requests sent between the last file written and the ext_proc ACK (p50, p99, max).
Results are appended to `benchmarks/results/rule_reload.jsonl`. No assertions on the
numbers: they depend on the machine (2 shared cores here).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from itertools import cycle
from pathlib import Path
from typing import Any

from control_plane.service import ControlPlaneSettings, free_port
from control_plane.snapshot import RULES
from keg.gateway import ApiOptions, BackgroundLoop, ControlPlaneApp

RESULTS = Path(__file__).resolve().parent / "results" / "rule_reload.jsonl"
RULE_SET_TYPE = RULES.rsplit("/", 1)[-1]  # how /v1/fleet names it
PROBED = ("/healthz", "/readyz", "/v1/rules/base", "/v1/versions?limit=5")
BASE = "rules:\n  - id: base\n    action: {observe: {audit: false}}\n"


@dataclass(frozen=True)
class Request:
    path: str
    started: float  # time.monotonic()
    ended: float
    status: int  # 0: no answer (connection error, timeout)

    @property
    def seconds(self) -> float:
        return self.ended - self.started


class Probe:
    """Real HTTP requests to the API, one after another, on a thread of their own."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.requests: list[Request] = []
        self.rule_counts: set[int] = set()  # of every version the API showed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="api-probe", daemon=True)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(120)

    def _run(self) -> None:
        for path in cycle(PROBED):
            if self._stop.is_set():
                return
            started = time.monotonic()
            try:
                with urllib.request.urlopen(self.api + path, timeout=120) as response:
                    body = response.read()
                    status = response.status
            except urllib.error.HTTPError as err:
                body, status = b"", err.code
            except OSError:
                body, status = b"", 0
            self.requests.append(Request(path, started, time.monotonic(), status))
            if path.startswith("/v1/versions") and status == 200:
                self.rule_counts.update(v["rule_count"] for v in json.loads(body)["versions"])


def write_rules(directory: Path, count: int, pause_s: float = 0.25) -> None:
    """`count` deny rules, 1,000 a file, a file every `pause_s` (a copy in progress)."""
    for start in range(0, count, 1000):
        text = "rules:\n" + "".join(
            f"  - id: deny-{i}\n    match: {{apis: [Produce], topics: {{prefix: [t{i}.]}}}}\n"
            "    action: {deny: {}}\n" for i in range(start, min(count, start + 1000)))
        (directory / f"rules-{start // 1000:04d}.yaml").write_text(text)
        time.sleep(pause_s)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


@dataclass
class Results:
    rules: int
    reload_s: float = 0.0  # last file written -> the new version visible in the API
    delivered_s: float | None = None  # last file written -> the ext_proc ACK
    rule_counts: list[int] = field(default_factory=list)  # of every version shown
    answered: int = 0  # requests sent and answered in the measured window
    failed: int = 0  # requests without a 200 (in the window)
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    requests: list[Request] = field(default_factory=list)  # the window's
    slowest: list[str] = field(default_factory=list)  # "path at +s: ms"

    def lines(self) -> list[str]:
        delivered = ("" if self.delivered_s is None
                     else f", ext_proc ACK after {self.delivered_s:.1f} s")
        return [
            f"{self.rules} rules: new version visible {self.reload_s:.1f} s after the last "
            f"file was written{delivered}",
            f"versions shown by the API had {sorted(self.rule_counts)} rules",
            f"REST meanwhile: {self.answered} requests answered, {self.failed} failed; "
            f"p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms, max {self.max_ms:.1f} ms",
            f"slowest (sent at + seconds after the last file): {'; '.join(self.slowest)}",
        ]


@contextmanager
def control_plane(bootstrap: str, work: Path) -> Iterator[tuple[str, int]]:
    """The control plane process as `keg up` runs it, watching `work/rules`: (its API
    URL, its xDS port)."""
    rules = work / "rules"
    rules.mkdir(parents=True)
    (rules / "base.yaml").write_text(BASE)
    loop = BackgroundLoop()
    app = ControlPlaneApp(
        ControlPlaneSettings(bootstrap_servers=bootstrap, ext_proc_host="127.0.0.1",
                             ext_proc_port=1, listen_port_base=0),
        ApiOptions(data_dir=work / "store", port=0, public_reads=True, rules_dir=rules))
    try:
        plane = loop.run(app.start(), timeout=120)
        yield f"http://127.0.0.1:{app.api_server.port}", plane.xds_port
    finally:
        loop.run(app.stop(), timeout=120)
        loop.close()


@contextmanager
def ext_proc_child(xds_port: int, work: Path) -> Iterator[None]:
    child = subprocess.Popen([
        sys.executable, "-m", "keg", "ext-proc", "--port", str(free_port()),
        "--control-plane", f"127.0.0.1:{xds_port}", "--node-id", "bench-ext-proc",
        "--rules-cache", str(work / "ext-proc-rules.json"), "--log-level", "WARNING"])
    try:
        yield
    finally:
        child.terminate()
        child.wait(60)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=120) as response:
        return json.loads(response.read())


def wait_until(what: str, predicate: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(0.1)
    return time.monotonic()


def run(bootstrap: str, rules: int, work: Path, ext_proc: bool = True,
        report: Callable[[str], None] = print, timeout: float = 1800.0) -> Results:
    results = Results(rules)
    with control_plane(bootstrap, work) as (api, xds_port), \
            (ext_proc_child(xds_port, work) if ext_proc else _nothing()):

        def applied() -> str | None:
            for node in _get(f"{api}/v1/fleet")["nodes"]:
                if node["role"] == "ext_proc" and node["connected"]:
                    version: str | None = node["types"].get(RULE_SET_TYPE, {}).get(
                        "applied_version")
                    return version
            return None

        if ext_proc:
            wait_until("the ext_proc service runs version 1", lambda: applied() == "1", 120)
        with Probe(api) as probe:
            time.sleep(1.0)  # a few requests before anything happens
            write_rules(work / "rules", rules)
            written = time.monotonic()

            def latest_count() -> int:
                versions = _get(f"{api}/v1/versions?limit=1")["versions"]
                return int(versions[0]["rule_count"]) if versions else 0

            visible = wait_until("the new version", lambda: latest_count() == rules + 1,
                                 timeout)
            results.reload_s = visible - written
            end = visible
            if ext_proc:
                number = str(_get(f"{api}/v1/versions?limit=1")["versions"][0]["number"])
                end = wait_until("the ext_proc ACK", lambda: applied() == number, timeout)
                results.delivered_s = end - written
            time.sleep(1.0)
        every = _get(f"{api}/v1/versions?limit=1000")["versions"]
        results.rule_counts = sorted(probe.rule_counts | {v["rule_count"] for v in every})
    window = [r for r in probe.requests if r.started >= written and r.ended <= end]
    results.requests = window
    results.answered = sum(r.status == 200 for r in window)
    results.failed = sum(r.status != 200 for r in probe.requests)
    latencies = [r.seconds * 1000 for r in window]
    results.p50_ms = statistics.median(latencies) if latencies else 0.0
    results.p99_ms = percentile(latencies, 0.99)
    results.max_ms = max(latencies, default=0.0)
    results.slowest = [f"{r.path} at +{r.started - written:.1f} s: {r.seconds * 1000:.0f} ms"
                       for r in sorted(window, key=lambda r: -r.seconds)[:5]]
    for line in results.lines():
        report(line)
    return results


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", type=int, default=100_000)
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: embedded)")
    parser.add_argument("--no-ext-proc", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="keg-reload-") as tmp:
        if args.bootstrap:
            results = run(args.bootstrap, args.rules, Path(tmp), not args.no_ext_proc)
        else:
            from keg.embedded.kafka import EmbeddedKafka, ensure_kafka

            ensure_kafka()
            with EmbeddedKafka(data_dir=Path(tmp) / "kafka", port=free_port()) as broker:
                results = run(broker.bootstrap, args.rules, Path(tmp), not args.no_ext_proc)
    record = {k: v for k, v in asdict(results).items() if k != "requests"}
    record.update(at=datetime.now(UTC).isoformat(timespec="seconds"),
                  load_average=os.getloadavg())
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
