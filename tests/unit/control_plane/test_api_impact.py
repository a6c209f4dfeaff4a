"""/v1/impact and the impact files it reads (control_plane.impact): per-minute rows per
rule, topic, principal and outcome, replaced by key, filtered by time and names."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from control_plane import impact
from control_plane.store import RuleStore
from tests.unit.control_plane.conftest import ADMIN, make_client, store

__all__ = ["store"]

T0 = datetime(2026, 5, 1, 11, 58, tzinfo=UTC)


def row(minute: datetime, rule: str = "mask", outcome: str = "modified", **kw: Any
        ) -> dict[str, Any]:
    base = {"minute": minute, "rule_id": rule, "topic": "orders", "principal": "User:alice",
            "outcome": outcome, "decisions": 1, "bytes": 100, "records": 10, "errors": 0,
            "p50_latency_ms": 1.0, "p99_latency_ms": 2.0}
    return {**base, **kw}


def test_rows_are_replaced_by_key_one_file_per_hour(tmp_path: Path) -> None:
    # Four minutes across an hour boundary, then an update of one of them.
    minutes = [T0 + timedelta(minutes=i) for i in range(4)]
    assert impact.merge(tmp_path, [row(m) for m in minutes]) == 2
    impact.merge(tmp_path, [row(minutes[1], decisions=7, bytes=700),
                            row(minutes[1].replace(tzinfo=None), rule="deny", outcome="denied",
                                errors=3)])
    assert sorted(p.parent.name for p in tmp_path.glob("hour=*/impact.parquet")) == [
        "hour=2026-05-01T11", "hour=2026-05-01T12"]
    rows, truncated = impact.query(tmp_path, impact.ImpactQuery())
    assert not truncated and len(rows) == 5
    assert [(r["minute"], r["rule_id"], r["decisions"]) for r in rows
            if r["minute"] == minutes[1]] == [(minutes[1], "deny", 1), (minutes[1], "mask", 7)]
    assert not list(tmp_path.rglob("*.tmp"))


def test_the_query_filters_by_time_and_names(tmp_path: Path) -> None:
    impact.merge(tmp_path, [row(T0 + timedelta(minutes=i), rule=f"r{i % 2}") for i in range(6)])
    rows, _ = impact.query(tmp_path, impact.ImpactQuery(
        since=T0 + timedelta(minutes=1), until=T0 + timedelta(minutes=5), rule_id="r1"))
    assert [r["minute"] for r in rows] == [T0 + timedelta(minutes=1), T0 + timedelta(minutes=3)]
    newest, truncated = impact.query(tmp_path, impact.ImpactQuery(limit=2))
    assert truncated and [r["minute"] for r in newest] == [T0 + timedelta(minutes=4),
                                                             T0 + timedelta(minutes=5)]


def test_the_api_serves_the_rows(store: RuleStore, tmp_path: Path) -> None:
    impact.merge(tmp_path, [row(T0), row(T0 + timedelta(minutes=1), rule="deny",
                                         outcome="denied", errors=1, topic=None)])
    client = make_client(store, impact_dir=tmp_path)
    assert client.get("/v1/impact").status_code == 401  # reads need a token
    got = client.get("/v1/impact", headers=ADMIN).json()
    assert got["available"] and not got["truncated"]
    assert [(r["rule_id"], r["topic"], r["outcome"], r["errors"]) for r in got["rows"]] == [
        ("mask", "orders", "modified", 0), ("deny", None, "denied", 1)]
    assert got["rows"][0]["minute"] in ("2026-05-01T11:58:00Z", "2026-05-01T11:58:00+00:00")
    only = client.get("/v1/impact", params={"rule_id": "deny",
                                             "since": "2026-05-01T11:59:00"}, headers=ADMIN)
    assert [r["rule_id"] for r in only.json()["rows"]] == ["deny"]
    bad = client.get("/v1/impact", params={"since": "2026-05-01T12:00:00Z",
                                            "until": "2026-05-01T11:00:00Z"}, headers=ADMIN)
    assert bad.status_code == 400
    assert bad.headers["content-type"].startswith("application/problem+json")
    assert client.get("/v1/impact", params={"limit": 0}, headers=ADMIN).status_code == 422


def test_without_an_impact_directory_it_says_so(store: RuleStore) -> None:
    got = make_client(store).get("/v1/impact", headers=ADMIN).json()
    assert got == {"available": False, "truncated": False, "rows": []}
