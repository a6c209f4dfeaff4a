"""The contract every filter of the data path follows.

Three kinds, any object may be several: a `ResponseFilter` changes answers, a
`RequestObserver` reads requests, a `RequestFilter` decides what becomes of a
request (forward, forward changed, answer from the gateway, patch the answer).

A filter names the API keys it handles and, per (api key, version), whether it
wants the response at all; the session decides that when the *request* passes
(responses carry no api key) and only then holds and decodes the response.
`filter_response` gets the decoded body, may change it in place, and returns True
when it did: an unchanged response is forwarded as its original bytes.

Request filters run in order, each on the body the previous ones left; their
verdicts `combine` like middleware: the first filter's patch sees the broker's (or a
later filter's) answer last, so a filter that renames topics on the way in renames
them back on the way out, whoever answers.

Filters run one frame at a time, in stream order; they must not block and must not
keep references to bodies after returning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import kafka_wire
from ext_proc.connection import ConnectionInfo


@runtime_checkable
class ResponseFilter(Protocol):
    api_keys: frozenset[int]

    def wants(self, api_key: int, api_version: int) -> bool: ...

    def filter_response(
        self, api_key: int, api_version: int, body: dict[str, Any], conn: ConnectionInfo
    ) -> bool: ...


@runtime_checkable
class RequestObserver(Protocol):
    """A filter that also sees the requests it asks for, decoded, and never changes them.

    A wanted request is held until complete, decoded, shown to the observer and
    forwarded as its original bytes; one that does not decode is forwarded unobserved.
    """

    def wants_request(self, api_key: int, api_version: int) -> bool: ...

    def observe_request(
        self, header: kafka_wire.RequestHeader, body: dict[str, Any], conn: ConnectionInfo
    ) -> None: ...


# Changes a decoded broker answer in place; returns True when it changed it.
ResponsePatch = Callable[[dict[str, Any]], bool]


@dataclass
class RequestVerdict:
    """What a `RequestFilter` decided. Fields left at their defaults mean "as it was".

    - `answer`: the response body the gateway sends the client itself; the request
      never reaches the broker. Its place in the response order is kept.
    - `changed`: the (in place) changed request body is forwarded instead.
    - `patch`: applied to the broker's answer before the client sees it (e.g. error
      entries for the topics a partial denial removed from the request).
    - `expects_response`: False for a request Kafka never answers (acks=0 Produce).
    - `delay_s`: how long to hold the request before it goes on (throttling).
    """

    answer: dict[str, Any] | None = None
    changed: bool = False
    patch: ResponsePatch | None = None
    expects_response: bool = True
    delay_s: float = 0.0  # hold the request this long first (rate limits)


@runtime_checkable
class RequestFilter(Protocol):
    def wants_request(self, api_key: int, api_version: int) -> bool: ...

    def filter_request(
        self, header: kafka_wire.RequestHeader, body: dict[str, Any], conn: ConnectionInfo
    ) -> RequestVerdict | None: ...


def combine(earlier: RequestVerdict, later: RequestVerdict) -> RequestVerdict:
    """One verdict for two filters that ran in this order on the same request.

    Changes accumulate; the later filter's patch runs first on the answer, then the
    earlier's (onion order). A later answer is patched by the earlier filters too
    (they changed the request it answers); an answer ends the chain.
    """
    inner, outer = later.patch, earlier.patch
    patch: ResponsePatch | None
    if inner is None or outer is None:
        patch = inner or outer
    else:
        def patch(response: dict[str, Any]) -> bool:
            changed = inner(response)
            return outer(response) or changed

    answer = later.answer
    if answer is not None and outer is not None:
        outer(answer)
    return RequestVerdict(
        answer=answer,
        changed=earlier.changed or later.changed,
        patch=None if answer is not None else patch,
        expects_response=earlier.expects_response and later.expects_response,
        delay_s=max(earlier.delay_s, later.delay_s),
    )


def decide(filters: Iterable[RequestFilter], header: kafka_wire.RequestHeader,
           body: dict[str, Any], conn: ConnectionInfo) -> RequestVerdict | None:
    """One request through request filters in order, as the data path runs them: each
    filter that wants it sees the body the earlier ones left, verdicts `combine`, and an
    answer ends the chain. None when no filter had a verdict."""
    verdict: RequestVerdict | None = None
    for f in filters:
        if not f.wants_request(header.api_key, header.api_version):
            continue
        decided = f.filter_request(header, body, conn)
        if decided is None:
            continue
        verdict = decided if verdict is None else combine(verdict, decided)
        if decided.answer is not None:
            break
    return verdict
