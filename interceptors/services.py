"""The clients of the services record rules call: schema registries and KMSs.

One `Services` per process (the ext_proc service makes one and hands it to every rule
set it builds, through BuildContext): rules naming the same registry or KMS with the same
settings share one client, so its caches (schemas by id, unwrapped data keys) and its
state (a registry found down) survive rule-set changes. Secrets are part of what makes
settings the same, by digest only.
"""

from __future__ import annotations

import hashlib
import ssl
import threading
from collections import OrderedDict
from typing import Any, Final

from filter_rules.record_actions import KmsSpec, SchemaRegistryRef
from interceptors.contract import BuildContext, InterceptorConfigError
from interceptors.keys import read_secret

MAX_CLIENTS: Final = 64  # of each kind; the least recently configured is closed first


class Services:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: OrderedDict[tuple[Any, ...], Any] = OrderedDict()

    def registry(self, spec: SchemaRegistryRef, ctx: BuildContext) -> Any:
        """The `interceptors.registry.RegistryClient` for these settings."""
        from interceptors.registry import (
            RegistryClient,
            basic_authorization,
            bearer_authorization,
        )

        authorization = None
        if spec.auth is not None and spec.auth.basic is not None:
            password = read_secret(spec.auth.basic.password, ctx, "registry password")
            authorization = basic_authorization(spec.auth.basic.username, password)
        elif spec.auth is not None and spec.auth.bearer is not None:
            authorization = bearer_authorization(
                read_secret(spec.auth.bearer, ctx, "registry bearer token"))
        ca_file = str(ctx.resolve(spec.ca_file)) if spec.ca_file else None
        digest = hashlib.sha256((authorization or "").encode()).hexdigest()
        key = ("registry", spec.url, digest, ca_file, spec.timeout_ms, spec.cache_ttl_s,
               spec.cache_size)

        def make() -> Any:
            return RegistryClient(spec.url, authorization=authorization,
                                  ssl_context=_ssl_context(ca_file),
                                  timeout_s=spec.timeout_ms / 1000,
                                  ttl_s=spec.cache_ttl_s, cache_size=spec.cache_size)

        return self._client(key, make)

    def kms(self, spec: KmsSpec, ctx: BuildContext) -> Any:
        """The `interceptors.kms.KmsClient` for these settings."""
        from interceptors.kms import KmsClient, client_key, make_backend

        def make() -> Any:
            return KmsClient(make_backend(spec, ctx), spec.timeout_ms / 1000, spec.cache_size,
                             spec.cache_ttl_s)

        return self._client(("kms", *client_key(spec, ctx)), make)

    def _client(self, key: tuple[Any, ...], make: Any) -> Any:
        with self._lock:
            client = self._clients.get(key)
            if client is not None:
                self._clients.move_to_end(key)
                return client
        client = make()  # outside the lock: may read files, build an SDK client
        with self._lock:
            existing = self._clients.get(key)
            if existing is not None:
                client.close()
                return existing
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


def _ssl_context(ca_file: str | None) -> ssl.SSLContext | None:
    if ca_file is None:
        return None
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise InterceptorConfigError(f"cannot use CA file {ca_file}: {exc}") from None
