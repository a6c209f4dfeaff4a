"""The clients of the services record rules call: schema registries and KMSs.

One `Services` per rule engine (BuildContext carries it; the ext_proc service keeps its
context across rule-set versions): rules naming the same registry or KMS with the same
settings share one client, so its caches (schemas by id, unwrapped data keys) and its
state (a registry found down) survive rule-set changes. The clients themselves are made
by `interceptors.registry.registry_client` and `interceptors.kms.kms_client`, keyed by
their settings (secrets by digest only).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Final, Protocol, TypeVar, cast

MAX_CLIENTS: Final = 64  # the least recently configured is closed first


class Closable(Protocol):
    def close(self) -> None: ...


ClientT = TypeVar("ClientT", bound=Closable)


class Services:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: OrderedDict[tuple[Hashable, ...], Closable] = OrderedDict()

    def client(self, key: tuple[Hashable, ...], make: Callable[[], ClientT]) -> ClientT:
        """The client for `key` (settings), made by `make` the first time."""
        with self._lock:
            known = self._clients.get(key)
            if known is not None:
                self._clients.move_to_end(key)
                return cast(ClientT, known)
        client = make()  # outside the lock: may read files, build an SDK client
        with self._lock:
            existing = self._clients.get(key)
            if existing is not None:
                client.close()
                return cast(ClientT, existing)
            self._clients[key] = client
            while len(self._clients) > MAX_CLIENTS:
                _old_key, old = self._clients.popitem(last=False)
                old.close()
        return client

    def close(self) -> None:
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
        for client in clients:
            client.close()
