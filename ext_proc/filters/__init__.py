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

from typing import Any, Protocol

from ext_proc.connection import ConnectionInfo


class ResponseFilter(Protocol):
    api_keys: frozenset[int]

    def wants(self, api_key: int, api_version: int) -> bool: ...

    def filter_response(
        self, api_key: int, api_version: int, body: dict[str, Any], conn: ConnectionInfo
    ) -> bool: ...
