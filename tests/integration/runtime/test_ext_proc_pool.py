"""The ext_proc service as a pool of worker processes, on both data paths.

Connections spread over the workers (Envoy's ext_proc cluster on the ext_proc path, the
native filter's hand-off endpoints on the native path); kill -9 of one worker costs only
the frames it held: idempotent producers on every connection finish with every record
stored exactly once, and the worker comes back by itself.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, Producer

from ext_proc.filters.rates import MAX_DEBT_S
from interceptors.capture import directory_bytes
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import Gateway, GatewaySettings
from tests.integration.conftest import create_topic
from tests.integration.rules.records_io import consume_records
from tests.integration.runtime.faults import stored_values, wait_serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

RULES = """
rules:
  - id: mask-pool
    match: {topics: {prefix: [pool.]}}
    action: {mask: {fields: [$.card]}}
  - id: mask-fetched
    match: {direction: response, topics: {prefix: [fetched.]}}
    action: {mask: {fields: [$.card]}}
  - id: drop-noise
    match: {topics: {prefix: [dropping.]}}
    action: {drop: {when: {fields: {$.kind: {exact: [noise]}}}}}
  - id: capture-pool
    match: {topics: {prefix: [captured.]}}
    action: {capture: {path: captures, max_bytes: 100000}}
  - id: rate-pool
    match: {apis: [Produce], topics: {prefix: [rated.]}}
    action: {rate: {per: topic, bytes_per_second: 100, burst_seconds: 1000}}
"""
WORKERS = 2
BURST_BYTES = 100 * 1000  # rate-pool's bucket: 100 KB, refilled at 100 B/s
CAPTURE_CAP = 100_000  # capture-pool's max_bytes
HUNG_AFTER_S = 4.0  # a worker not answering this long is killed (20 s in keg up)


@pytest.fixture(scope="module", params=["ext-proc", "native"])
def pool(request: pytest.FixtureRequest, kafka: EmbeddedKafka,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    base = tmp_path_factory.mktemp(f"pool-{request.param}")
    rules = base / "rules"
    rules.mkdir()
    (rules / "rules.yaml").write_text(RULES)
    settings = GatewaySettings(bootstrap_servers=kafka.bootstrap, listen_port_base=0,
                               rules_dir=rules, work_dir=base / "work", metrics_port=0,
                               ext_proc_workers=WORKERS, envoy_concurrency=2,
                               data_path=request.param, ext_proc_log_level="WARNING",
                               worker_hung_after_s=HUNG_AFTER_S)
    with Gateway(settings) as gateway:
        yield gateway


def metric_sum(port: int, name: str, *labels: str) -> float:
    """The sum of a worker's series `name` whose labels include all of `labels`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and all(label in line for label in labels))


def connections_served(port: int) -> float:
    return metric_sum(port, "keg_connections_total")


def test_connections_spread_over_the_workers_and_a_killed_worker_costs_only_its_frames(
        pool: Gateway, kafka: EmbeddedKafka) -> None:
    assert len({w.port for w in pool.workers}) == WORKERS
    topic = create_topic(kafka.bootstrap, 4, name=f"pool.{uuid.uuid4().hex[:8]}")
    producers = [Producer({"bootstrap.servers": pool.bootstrap, "enable.idempotence": True,
                           "linger.ms": 5, "message.timeout.ms": 120000})
                 for _ in range(6)]
    errors: list[KafkaError] = []

    def done(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    per_producer = 3000
    values = []
    victim = pool.workers[1]
    pid = victim.current_pid()
    assert pid is not None
    for i in range(per_producer):
        for n, producer in enumerate(producers):
            value = orjson.dumps({"card": "4111", "p": n, "i": i})
            values.append(value)
            producer.produce(topic, value, partition=n % 4, on_delivery=done)
            producer.poll(0)
        if i == per_producer // 2:
            for producer in producers:
                producer.poll(1)  # some frames through each connection first
            # Both workers serve connections, then one dies midway: its frames fail,
            # retriably, and the producers' retries go through once it is back.
            assert all(connections_served(w.metrics_port or 0) > 0 for w in pool.workers)
            os.kill(pid, signal.SIGKILL)
    for producer in producers:
        assert producer.flush(120) == 0
    assert errors == []
    wait_serving(pool.bootstrap, also=lambda: victim.current_pid() not in (None, pid))
    # Every connection of both workers got its records in, each exactly once, masked.
    stored = stored_values(kafka.bootstrap, topic)
    expected = Counter(v.decode().replace('"4111"', '"****"') for v in values)
    assert stored == expected  # 0 lost, 0 duplicated, every card masked


def test_a_stopped_worker_is_killed_and_restarted_and_its_clients_go_on(
        pool: Gateway, kafka: EmbeddedKafka) -> None:
    """SIGSTOP of one worker (a hung process, there but not answering): nothing noticed,
    its connections waited for as long as it was stopped and new ones went on reaching
    it (a new user's report: 30 s for 50 records during a 30 s stop). The supervisor now
    kills a worker whose /metrics page has not answered for worker_hung_after_s, and so
    restarts it; idempotent producers on every connection finish, each record once."""
    topic = create_topic(kafka.bootstrap, 4, name=f"pool.{uuid.uuid4().hex[:8]}")
    producers = [Producer({"bootstrap.servers": pool.bootstrap, "enable.idempotence": True,
                           "linger.ms": 5, "message.timeout.ms": 120000})
                 for _ in range(4)]
    errors: list[KafkaError] = []
    values: list[bytes] = []

    def send(count: int) -> None:
        for _ in range(count):
            for n, producer in enumerate(producers):
                value = orjson.dumps({"card": "4111", "p": n, "i": len(values)})
                values.append(value)
                producer.produce(topic, value, partition=n % 4, on_delivery=lambda err, _m:
                                 errors.append(err) if err is not None else None)
                producer.poll(0)

    send(100)
    for producer in producers:
        assert producer.flush(60) == 0
    victim = pool.workers[1]
    pid = victim.current_pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        send(100)  # the stopped worker's connections hold theirs
        deadline = time.monotonic() + HUNG_AFTER_S + 30
        while victim.current_pid() in (None, pid):
            assert time.monotonic() < deadline, "the stopped worker was never restarted"
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # not killed: let it go on
    send(100)
    for producer in producers:
        assert producer.flush(120) == 0
    assert errors == []
    stored = stored_values(kafka.bootstrap, topic)
    expected = Counter(v.decode().replace('"4111"', '"****"') for v in values)
    assert stored == expected  # 0 lost, 0 duplicated, every card masked


def test_a_consumer_reads_through_the_pool_whichever_worker_learnt_the_topic_ids(
        pool: Gateway, kafka: EmbeddedKafka) -> None:
    """A Fetch (v13+) names topics by id, learnt from Metadata answers, which librdkafka
    asks on another connection, so often another worker: the worker that does not know
    the id answers UNKNOWN_TOPIC_ID, the client refreshes its metadata, then reads. With
    a rule at fetch time every Fetch response is judged, topics without a rule too."""
    docs = [{"n": n, "card": "4111-1111"} for n in range(200)]
    for prefix in ("plain.", "fetched."):
        topic = create_topic(kafka.bootstrap, name=f"{prefix}{uuid.uuid4().hex[:8]}")
        producer = Producer({"bootstrap.servers": kafka.bootstrap})  # directly
        for doc in docs:
            producer.produce(topic, orjson.dumps(doc))
        assert producer.flush(30) == 0
        read = [orjson.loads(value or b"") for _key, value, _headers
                in consume_records({"bootstrap.servers": pool.bootstrap}, topic, timeout=60)]
        masked = prefix == "fetched."
        assert read == [{**doc, "card": "****"} if masked else doc for doc in docs], prefix


def test_a_rate_limit_is_one_budget_for_every_worker(pool: Gateway, kafka: EmbeddedKafka) -> None:
    """A rate's buckets belong to the host, not to each worker: the budget a topic spent
    through one worker's connection is spent for every other worker's too. (Each worker
    had its own buckets: a pool of N workers let N times the rate through.)"""
    topic = create_topic(kafka.bootstrap, 1, name=f"rated.{uuid.uuid4().hex[:8]}")
    spender = Producer({"bootstrap.servers": pool.bootstrap, "linger.ms": 20})
    for _ in range(BURST_BYTES // 1000 + 20):  # the whole burst and more, one connection
        spender.produce(topic, b"s" * 1000)
    assert spender.flush(60) == 0

    def throttled() -> list[float]:
        return [metric_sum(w.metrics_port or 0, "keg_decisions_total", 'rule="rate-pool"',
                           'outcome="throttled"') for w in pool.workers]

    before = throttled()
    told_to_wait = []
    for _ in range(10):  # new connections, spread over both workers
        throttles: list[float] = []
        late = Producer({"bootstrap.servers": pool.bootstrap,
                         "throttle_cb": lambda event, seen=throttles: seen.append(
                             event.throttle_time)})
        late.produce(topic, b"late" * 250)
        # Its answer comes at once, with the throttle time (as Kafka's quotas answer,
        # KIP-219): on the native path it was held the whole throttle time (10 s): its
        # delivery report, and a flush, waited that long.
        assert late.flush(MAX_DEBT_S / 2) == 0
        told_to_wait.append(bool(throttles) and max(throttles) > 0)
    after = throttled()
    # Every late producer found the topic's budget spent, whichever worker judged it.
    assert told_to_wait == [True] * 10
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)


def test_an_idempotent_producer_keeps_its_sequences_whichever_worker_it_reaches(
        pool: Gateway, kafka: EmbeddedKafka) -> None:
    """Records a rule drops from an idempotent producer's batch shift its later batches'
    sequence numbers down (the broker must see no gap). That ledger was one worker's:
    after the workers' restart (or on another worker) the producer's next batch reached
    the broker unshifted, and the broker refused it (OUT_OF_ORDER_SEQUENCE_NUMBER)."""
    topic = create_topic(kafka.bootstrap, 1, name=f"dropping.{uuid.uuid4().hex[:8]}")
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": pool.bootstrap, "enable.idempotence": True,
                         "linger.ms": 50, "message.timeout.ms": 60000})

    def send(docs: list[dict[str, Any]]) -> None:
        for doc in docs:
            producer.produce(topic, orjson.dumps(doc), on_delivery=lambda err, _m: (
                errors.append(err) if err is not None else None))
        assert producer.flush(90) == 0

    first = [{"n": n, "kind": "noise" if n % 2 else "data"} for n in range(10)]
    send(first)  # 5 of its 10 records dropped: later batches move 5 sequences down
    pids = [w.current_pid() for w in pool.workers]
    for pid in pids:
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
    wait_serving(pool.bootstrap, also=lambda: all(
        w.current_pid() not in (None, pid) for w, pid in zip(pool.workers, pids, strict=True)))
    second = [{"n": n, "kind": "data"} for n in range(10, 30)]
    send(second)
    assert errors == []
    kept = [orjson.dumps(doc).decode() for doc in first + second if doc["kind"] == "data"]
    assert stored_values(kafka.bootstrap, topic) == Counter(kept)  # each once, none lost


def test_a_worker_comes_back_while_another_is_down(pool: Gateway, kafka: EmbeddedKafka) -> None:
    """A restarting worker waited for its port while checking that every worker was
    alive: with another one down, each of its restarts was aborted and its backoff
    doubled (a new user saw the whole service down for 32 s after two workers were
    killed at once, one of them unable to listen). Each restart now waits on its own
    worker only. The other worker is kept down here by taking it from the supervisor."""
    down, other = pool.workers[1], pool.workers[0]
    down_pid, other_pid = down.current_pid(), other.current_pid()
    assert down_pid is not None and other_pid is not None
    topic = create_topic(kafka.bootstrap, 1, name=f"pool.{uuid.uuid4().hex[:8]}")
    pool.supervisor.unwatch(down.component)
    try:
        os.kill(down_pid, signal.SIGKILL)
        os.waitpid(down_pid, 0)
        os.kill(other_pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while other.current_pid() in (None, other_pid) or \
                not connections_served_answers(other.metrics_port or 0):
            assert time.monotonic() < deadline, \
                f"{other.component} not back 20 s after its kill while {down.component} is down"
            time.sleep(0.05)
        # And it serves: a masked record gets through the pool while one worker is down.
        errors: list[KafkaError | None] = []
        producer = Producer({"bootstrap.servers": pool.bootstrap, "message.timeout.ms": 60000})
        producer.produce(topic, orjson.dumps({"card": "4111"}),
                         on_delivery=lambda err, _m: errors.append(err))
        assert producer.flush(90) == 0
        assert errors == [None]
    finally:
        down.end()
        pool.start_ext_proc_worker(down)
    wait_serving(pool.bootstrap, also=lambda: connections_served_answers(down.metrics_port or 0))
    assert stored_values(kafka.bootstrap, topic) == Counter(['{"card":"****"}'])


def connections_served_answers(port: int) -> bool:
    try:
        connections_served(port)
    except OSError:
        return False
    return True


def test_workers_capturing_into_one_directory_keep_its_cap_together(
        pool: Gateway, kafka: EmbeddedKafka) -> None:
    """Each worker runs its own capture into the rule's directory; each wrote up to
    max_bytes there, so a pool of N wrote N times the cap."""
    topic = create_topic(kafka.bootstrap, 4, name=f"captured.{uuid.uuid4().hex[:8]}")
    noise = random.Random(11)  # values Parquet's zstd cannot shrink
    producers = [Producer({"bootstrap.servers": pool.bootstrap, "linger.ms": 5})
                 for _ in range(6)]
    for n in range(1200):  # 1.2 MB over six connections, so over both workers
        producers[n % 6].produce(topic, noise.randbytes(1000), partition=n % 4)
    for producer in producers:
        assert producer.flush(60) == 0
    assert pool.settings.rules_dir is not None
    captures = pool.settings.rules_dir / "captures"
    # The writers write every 5 s and close their files after 5 s idle: wait for every
    # file closed and nothing new for longer than that.
    deadline = time.monotonic() + 90
    seen, since = -1, time.monotonic()
    while True:
        assert time.monotonic() < deadline, "the captures did not settle in 90 s"
        names = [p.name for p in captures.rglob("*.parquet*")] if captures.exists() else []
        written = directory_bytes(captures) if names else 0
        if written != seen:
            seen, since = written, time.monotonic()
        elif names and not any(n.endswith(".tmp") for n in names) and (
                time.monotonic() - since > 7):
            break
        time.sleep(0.5)
    # The cap, but for the footers each worker adds to a file it closes (a few KB).
    assert CAPTURE_CAP // 2 < written <= CAPTURE_CAP + 2 * 8192, written
