"""The interceptor contract (KIP-905, at the gateway) and what built-ins are given.

An interceptor is configured once, then sees records one at a time:

    class Interceptor(Protocol):
        def configure(self, config: Mapping[str, Any]) -> None: ...
        def intercept(self, record: InterceptedRecord) -> InterceptedRecord | None: ...

`intercept` returns the record (the same object changed in place, or a new one) or
None to drop it (KIP-905's "skip"). Raising `RecordRejected` says the record is
invalid: the whole batch is refused with INVALID_RECORD and a `record_errors` entry
per rejected record. Raising anything else is an interceptor failure: the partition
is answered with UNKNOWN_SERVER_ERROR and the batch is not forwarded. Raising
`ServiceUnavailable` says a service the interceptor needs (a schema registry, a KMS) did
not answer in time: the record cannot be judged now (REQUEST_TIMED_OUT, retriable, at
produce; the partition withheld at fetch) or, when the rule says so, passes unchecked. A
custom interceptor runs under a time budget per batch with retries (see `engine.py`).

An interceptor that only judges records and never changes them may also offer
`check_batch` (`BatchCheck`): the engine then hands it a batch's keys or values at once
instead of one record object each, which is what makes per-record checks cheap.

Records are plain values: `key`, `value` (bytes or None), `headers` (a list of
(name, value) pairs, in wire order; duplicates allowed as in Kafka), the `topic` as
the broker names it, the `partition`, the `timestamp` (ms) and, at consume time, the
`offset`. `principal` and `direction` say who produced or consumes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from interceptors.services import Services

RecordDirection = Literal["produce", "consume"]


@dataclass(slots=True)
class InterceptedRecord:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    timestamp: int = -1
    offset: int | None = None
    principal: str | None = None
    direction: RecordDirection = "produce"

    def header(self, name: str) -> bytes | None:
        """The last value of header `name` (Kafka's lastHeader), None when absent."""
        for key, value in reversed(self.headers):
            if key == name:
                return value
        return None


@runtime_checkable
class Interceptor(Protocol):
    def configure(self, config: Mapping[str, Any]) -> None: ...

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord | None: ...


class RecordRejected(Exception):
    """The record breaks a rule (e.g. its schema): refuse its batch with INVALID_RECORD."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ServiceUnavailable(Exception):
    """A service the interceptor needs did not answer in time or is unreachable.

    `fail_open` False (the default): the record cannot be judged now; its batch is
    refused with a retriable REQUEST_TIMED_OUT at produce and withheld at fetch. True: the
    rule's policy lets it pass unchecked; it is counted and audited as `unchecked`.
    """

    def __init__(self, reason: str, fail_open: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fail_open = fail_open


@runtime_checkable
class BatchCheck(Protocol):
    """A read-only check of a batch's keys or values (`target`), in record order (views
    into the batch's bytes: valid during the call only).

    Returns (position, effect, reason) for each record that does not simply pass:
    effect `rejected` (invalid) or `unchecked` (passes unjudged, a service being
    unavailable and the rule allowing it). Raises ServiceUnavailable (not fail-open)
    when the batch cannot be judged now. Judges exactly as `intercept` does.
    """

    target: Literal["key", "value"]

    def check_batch(self, topic: str, data: Sequence[bytes | memoryview | None]
                    ) -> list[tuple[int, str, str]]: ...


class InterceptorConfigError(Exception):
    """A record rule cannot be built (missing key, unreadable schema, bad import path).

    Raised when a rule set is compiled, so the gateway keeps its last good rule set.
    """


class SideEffects(Protocol):
    """Where side-effect actions (copy) send records: never blocks, may shed load."""

    def to_topic(self, topic: str, record: InterceptedRecord) -> bool:
        """Queue a copy for `topic`; False when the queue is full (the copy is lost)."""
        ...

    def to_http(self, url: str, record: InterceptedRecord, queue_size: int) -> bool:
        """Queue a POST of the record as JSON; False when the queue is full."""
        ...


class NoSideEffects:
    """Side effects that go nowhere (backtests and unit tests): counted, not sent."""

    def __init__(self) -> None:
        self.topic_copies: list[tuple[str, InterceptedRecord]] = []
        self.http_posts: list[tuple[str, InterceptedRecord]] = []

    def to_topic(self, topic: str, record: InterceptedRecord) -> bool:
        self.topic_copies.append((topic, record))
        return True

    def to_http(self, url: str, record: InterceptedRecord, queue_size: int) -> bool:
        self.http_posts.append((url, record))
        return True


@dataclass
class BuildContext:
    """What building a rule's interceptor may use.

    `base_dir` resolves relative file names in a rule (schemas, key files): the
    directory of the rule's file. `environ` is where `env:` secrets are read.
    `services` holds the clients of remote services (schema registries, KMSs) and
    their caches; copies of a context share it.
    """

    side_effects: SideEffects = field(default_factory=NoSideEffects)
    base_dir: Path = field(default_factory=Path.cwd)
    environ: Mapping[str, str] | None = None
    # Clients of the services rules call (registries, KMSs) and their caches: one per
    # process, so a new rule-set version keeps what the last one learnt.
    services: Services = field(default_factory=Services)

    def resolve(self, name: str) -> Path:
        path = Path(name).expanduser()
        return path if path.is_absolute() else self.base_dir / path


# Builds a rule action's interceptor: (the action's spec, context) -> interceptor.
Builder = Callable[[Any, BuildContext], Interceptor]
