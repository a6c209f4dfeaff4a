"""Synthetic audit logs for the analysis benchmark, and the analysis in DuckDB.

`write_audit` writes JSON lines shaped like ext_proc.audit's events (every field, ~560
bytes a line): 40 principals, 60 clients (each on one of a few hosts), 33 topics, four
APIs, five rules, six outcomes, log-normal latencies, an event every 10 ms.
`duckdb_analysis` runs the tables `keg analyze` computes (pipeline.audit_tables) as SQL
in DuckDB, the single-node engine a user would otherwise pick: the log is loaded once
(as `keg analyze` parses it once), then one query per table.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import kafka_wire
from ext_proc.audit import utc_timestamp
from kafka_wire import ApiKey

PRINCIPALS = [f'"User:svc-{i}"' for i in range(40)] + ["null"]
CLIENTS = [f"client-{i}" for i in range(60)]
TOPICS = [f'"orders.{i}"' for i in range(30)] + ['"events"', '"payments.eu"', "null"]
APIS = [(int(key), kafka_wire.api_name(key))
        for key in (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.CREATE_TOPICS)]
RULES = [("mask-pii", "mask"), ("deny-x", "deny"), ("observe-all", "observe"),
         ("cap-fetch", "safeguard"), ("validate-orders", "validate")]
OUTCOMES = {"observed": 0, "denied": 29, "would-deny": 29, "modified": 0, "rejected": 87,
            "limited": 0}
LINE = ('{"ts":"%s","event_id":"%032x","connection_id":"%d","principal":%s,'
        '"client_id":"%s","client_host":"%s","client_port":%d,"listener":"127.0.0.1:19092",'
        '"security_protocol":"SASL_PLAINTEXT","broker_id":%d,"api_key":%d,"api_name":"%s",'
        '"api_version":9,"correlation_id":%d,"topic":%s,"partition":%d,"rule_id":"%s",'
        '"rule_version":"5d41402abc4b2a76","action":"%s","mode":"%s","outcome":"%s",'
        '"error_code":%d,"bytes":%d,"records":%d,"latency_ms":%.3f,"reason":%s}\n')


def write_audit(path: Path, events: int, seed: int = 7) -> float:
    """`events` lines into `path`; returns the seconds it took."""
    rng = random.Random(seed)
    outcomes = list(OUTCOMES)
    start = time.perf_counter()
    base = 1_700_000_000.0
    second_text = ""
    current = -1
    with path.open("w") as out:
        chunk: list[str] = []
        for i in range(events):
            moment = base + i * 0.01
            if int(moment) != current:  # one RFC 3339 formatting per second
                current = int(moment)
                second_text = utc_timestamp(current)[:-4]
            ts = f"{second_text}{int(i % 100 * 10):03d}Z"
            client = rng.randrange(len(CLIENTS))
            api_key, api = APIS[rng.randrange(4)]
            rule, action = RULES[rng.randrange(5)]
            outcome = outcomes[rng.randrange(6)]
            chunk.append(LINE % (
                ts, rng.getrandbits(128), rng.randrange(5000), PRINCIPALS[rng.randrange(41)],
                CLIENTS[client], f"10.0.{client % 8}.{client * 3 % 250 + rng.randrange(3)}",
                rng.randrange(30000, 60000), rng.randrange(1, 4), api_key, api, i,
                TOPICS[rng.randrange(33)], rng.randrange(12), rule, action,
                "dry-run" if outcome.startswith("would") else "enforce", outcome,
                OUTCOMES[outcome], rng.randrange(100_000), rng.randrange(500),
                rng.lognormvariate(0.5, 1.0),
                '"not allowed"' if outcome == "denied" else "null"))
            if len(chunk) == 50_000:
                out.write("".join(chunk))
                chunk = []
        out.write("".join(chunk))
    return time.perf_counter() - start


COLUMNS = ("{ts: 'VARCHAR', principal: 'VARCHAR', client_id: 'VARCHAR', client_host: "
           "'VARCHAR', topic: 'VARCHAR', api_name: 'VARCHAR', rule_id: 'VARCHAR', action: "
           "'VARCHAR', mode: 'VARCHAR', outcome: 'VARCHAR', reason: 'VARCHAR', error_code: "
           "'INTEGER', bytes: 'BIGINT', latency_ms: 'DOUBLE'}")
METRICS = ("count(*) AS events, coalesce(sum(bytes), 0) AS bytes, "
           "count(*) FILTER (WHERE outcome = 'denied') AS denied, "
           "count(*) FILTER (WHERE outcome = 'would-deny') AS would_deny, "
           "count(*) FILTER (WHERE outcome = 'rejected') AS rejected, "
           "count(*) FILTER (WHERE error_code IS NOT NULL AND error_code <> 0) AS errors")
QUERIES = {
    "totals": f"SELECT {METRICS}, min(time), max(time), count(DISTINCT principal), "
              "count(DISTINCT topic) FROM audit",
    "outcomes": "SELECT outcome, count(*) AS events, coalesce(sum(bytes), 0) FROM audit "
                "GROUP BY ALL ORDER BY events DESC, outcome NULLS FIRST",
    **{name: f"SELECT {keys}, {METRICS} FROM audit GROUP BY ALL ORDER BY events DESC"
       for name, keys in (("topics", "topic"), ("principals", "principal"),
                          ("clients", "client_id"), ("rules", "rule_id, action, mode"),
                          ("apis", "api_name"))},
    "denied": "SELECT outcome, topic, principal, rule_id, error_code, reason, count(*) AS n "
              "FROM audit WHERE outcome IN ('denied', 'would-deny', 'rejected') "
              "GROUP BY ALL ORDER BY n DESC",
    "top_talkers": "SELECT principal, client_id, client_host, count(*) AS events, "
                   "coalesce(sum(bytes), 0) AS b FROM audit GROUP BY ALL "
                   "ORDER BY b DESC, events DESC LIMIT 20",
    "latency": "SELECT count(latency_ms), quantile_cont(latency_ms, [0.5, 0.9, 0.99]), "
               "max(latency_ms) FROM audit WHERE latency_ms IS NOT NULL",
    "latency_by_api": "SELECT api_name, count(*), quantile_cont(latency_ms, [0.5, 0.9, 0.99]),"
                      " max(latency_ms) FROM audit WHERE latency_ms IS NOT NULL GROUP BY ALL",
    "timeline": "WITH r AS (SELECT epoch(min(time))::BIGINT AS lo, "
                "greatest(1, ceil((epoch(max(time))::BIGINT - epoch(min(time))::BIGINT + 1) "
                "/ 60))::BIGINT AS w FROM audit) SELECT lo + (epoch(time)::BIGINT - lo) // w * w "
                "AS bucket, outcome, count(*), coalesce(sum(bytes), 0) FROM audit, r "
                "GROUP BY ALL ORDER BY bucket, outcome",
}


def duckdb_analysis(path: Path, threads: int | None = None) -> tuple[float, dict[str, Any]]:
    """The analysis in DuckDB: (seconds, results by table)."""
    import duckdb

    start = time.perf_counter()
    con = duckdb.connect()
    if threads is not None:
        con.execute(f"SET threads = {threads}")
    con.execute(f"CREATE TEMP TABLE audit AS SELECT * EXCLUDE (ts), "
                f"ts::TIMESTAMPTZ AS time FROM read_json('{path}', "
                f"format='newline_delimited', ignore_errors=true, columns={COLUMNS})")
    results = {name: con.execute(sql).fetchall() for name, sql in QUERIES.items()}
    seconds = time.perf_counter() - start
    con.close()
    return seconds, results


__all__ = ["QUERIES", "duckdb_analysis", "write_audit"]
