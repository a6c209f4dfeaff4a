"""What the data path did, as the console shows it: rule decisions and the audit tail.

The control plane decides nothing on the data path, so neither comes from its own
state:

- **Decisions** (`GET /v1/decisions`) are the ext_proc instances' own counters
  (`keg_decisions_total{rule,action,mode,outcome}`), scraped from the `/metrics` URLs the
  control plane is given (`Observability.metrics_urls`) and summed per rule. A URL whose
  host resolves to several addresses (a Kubernetes headless Service) is scraped at each.
- **The audit tail** (`GET /v1/audit`) is the newest lines of the audit log files the
  control plane can read (`Observability.audit_logs`), merged by time: `keg up` gives
  the ones its ext_proc workers write (one file each). Where ext_proc instances write
  in their own containers, the control plane has no file to read and says so: a shared
  audit sink would be needed (the instances shipping events to one topic or store). It
  answers 404 then: this control plane has no audit tail to show.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final
from urllib.parse import urlsplit, urlunsplit

from fastapi import APIRouter, Depends, Query, Request
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict, Field

from control_plane.api.deps import Reader
from control_plane.api.problems import Problem, problem_responses

log = logging.getLogger(__name__)
router = APIRouter(tags=["observability"])

DECISIONS: Final = "keg_decisions_total"
SCRAPE_TIMEOUT_S: Final = 3.0
MAX_AUDIT_LINES: Final = 1000
_TAIL_CHUNK: Final = 64 * 1024


@dataclass(frozen=True)
class Observability:
    """Where the control plane reads what the data path did (see module docstring)."""

    metrics_urls: tuple[str, ...] = ()  # ext_proc /metrics URLs
    audit_logs: tuple[Path, ...] = ()  # JSON Lines audit files this process can read


def observability(request: Request) -> Observability:
    found = getattr(request.app.state, "keg_observability", None)
    return found if isinstance(found, Observability) else Observability()


Observed = Annotated[Observability, Depends(observability)]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TargetOut(_Out):
    url: str = Field(description="The /metrics URL scraped (one per address of its host).")
    ok: bool
    error: str | None = None


class RuleDecisionsOut(_Out):
    rule: str
    action: str
    mode: str = Field(description="enforce or dry-run")
    outcomes: dict[str, float] = Field(description="Decisions per outcome (denied, ...).")
    total: float


class DecisionsOut(_Out):
    source: str = Field(description="Where the counts come from: the ext_proc instances' "
                                    "keg_decisions_total, since each instance started.")
    at: datetime
    targets: list[TargetOut]
    rules: list[RuleDecisionsOut]


class AuditOut(_Out):
    source: str
    events: list[dict[str, Any]] = Field(description="Audit events, newest first.")


@router.get("/v1/decisions", response_model=DecisionsOut,
            responses=problem_responses(401, 403))
def decisions(observed: Observed, _: Reader) -> DecisionsOut:
    """Rule decisions per rule (action, mode and outcome), summed over the ext_proc
    instances this control plane scrapes; counters since each instance started."""
    targets: list[TargetOut] = []
    totals: dict[tuple[str, str, str], dict[str, float]] = {}
    for url in _expand(observed.metrics_urls):
        try:
            with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
                text = response.read().decode()
        except (OSError, ValueError) as err:
            targets.append(TargetOut(url=url, ok=False, error=str(err)))
            continue
        targets.append(TargetOut(url=url, ok=True))
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name != DECISIONS:
                    continue
                labels = sample.labels
                key = (labels.get("rule", ""), labels.get("action", ""), labels.get("mode", ""))
                outcomes = totals.setdefault(key, {})
                outcome = labels.get("outcome", "")
                outcomes[outcome] = outcomes.get(outcome, 0.0) + sample.value
    rules = [RuleDecisionsOut(rule=rule, action=action, mode=mode, outcomes=outcomes,
                              total=sum(outcomes.values()))
             for (rule, action, mode), outcomes in sorted(totals.items())]
    return DecisionsOut(source="ext_proc metrics (keg_decisions_total)", at=datetime.now(UTC),
                        targets=targets, rules=rules)


@router.get("/v1/audit", response_model=AuditOut,
            responses=problem_responses(401, 403, 404, 422, 503))
def audit(observed: Observed, _: Reader,
          limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_LINES)] = 100) -> AuditOut:
    """The newest audit events of the logs this control plane can read (newest first,
    merged over the ext_proc processes' files). 404 when it has none (the ext_proc
    instances write theirs elsewhere)."""
    if not observed.audit_logs:
        raise Problem(404, "No audit log here", "this control plane reads no audit log: the "
                      "ext_proc instances write theirs where it cannot read (keg up gives it "
                      "its own; a fleet needs a shared audit sink)", kind="no-audit-log")
    events: list[dict[str, Any]] = []
    for path in observed.audit_logs:
        events.extend(_newest_events(path, limit))
    # Every writer stamps `ts` in one fixed-width UTC format: text order is time order.
    events.sort(key=lambda event: str(event.get("ts", "")), reverse=True)
    return AuditOut(source=", ".join(str(path) for path in observed.audit_logs),
                    events=events[:limit])


def _newest_events(path: Path, limit: int) -> list[dict[str, Any]]:
    """The last `limit` events of one audit file, newest first (none yet when it does not
    exist)."""
    try:
        lines = _last_lines(path, limit)
    except FileNotFoundError:
        return []  # nothing audited yet
    except OSError as err:
        raise Problem(503, "Audit log unreadable", f"cannot read the audit log {path.name}: "
                      f"{err.strerror}", kind="no-audit-log") from None
    events = []
    for line in reversed(lines):
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(event, dict):
            events.append(event)
    return events


def _expand(urls: tuple[str, ...]) -> Iterator[str]:
    """Each URL once per address its host resolves to (a headless Service: every pod)."""
    for url in urls:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or 80
        try:
            addresses = sorted({str(info[4][0]) for info in socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM)}) if host else []
        except OSError:
            addresses = []
        if len(addresses) <= 1:
            yield url
            continue
        for address in addresses:
            netloc = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
            yield urlunsplit(parts._replace(netloc=netloc))


def _last_lines(path: Path, count: int) -> list[str]:
    """The last `count` complete lines of a file, read from its end."""
    with path.open("rb") as file:
        end = file.seek(0, os.SEEK_END)
        data = b""
        position = end
        while position > 0 and data.count(b"\n") <= count:
            step = min(_TAIL_CHUNK, position)
            position -= step
            file.seek(position)
            data = file.read(step) + data
    complete = data[:data.rfind(b"\n") + 1]  # the last line may still be being written
    lines = complete.decode("utf-8", "replace").splitlines()
    if position > 0:
        lines = lines[1:]  # the first one may be cut
    return lines[-count:]
