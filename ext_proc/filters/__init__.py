"""Per-API response filters: the contract every filter of the data path follows.

A filter names the API keys it handles and, per (api key, version), whether it
wants the response at all; the session decides that when the *request* passes
(responses carry no api key) and only then holds and decodes the response.
`filter_response` gets the decoded body, may change it in place, and returns True
when it did: an unchanged response is forwarded as its original bytes.

Filters run on the connection's event loop, one frame at a time, in stream order;
they must not block and must not keep references to bodies after returning.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import kafka_wire
from ext_proc.connection import ConnectionInfo


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
