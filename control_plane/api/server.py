"""Serving the API inside a running asyncio loop (the control-plane process's)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI

from control_plane.tls import ServerTls

log = logging.getLogger(__name__)


class _EmbeddedServer(uvicorn.Server):
    """The process owns its signals (it also runs xDS): uvicorn must not take them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ApiServer:
    """A uvicorn server started on the current loop: `await start()`, `await stop()`.

    `port` is the bound port once started (pass 0 for a free one).
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 8080,
                 tls: ServerTls | None = None) -> None:
        ssl_options: dict[str, Any] = {}
        if tls is not None:
            tls.check()  # TlsConfigError naming the file, before anything binds
            ssl_options = {"ssl_certfile": str(tls.cert_file), "ssl_keyfile": str(tls.key_file)}
            if tls.client_ca_file is not None:
                ssl_options.update(ssl_ca_certs=str(tls.client_ca_file),
                                   ssl_cert_reqs=ssl.CERT_REQUIRED)
        config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False,
                                lifespan="off", server_header=False, **ssl_options)
        self.scheme = "https" if tls is not None else "http"
        self._server = _EmbeddedServer(config)
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        self.host = host
        self.port = port

    async def start(self, timeout: float = 10.0) -> None:
        """Raises OSError when the address cannot be bound."""
        # Bound here, not by uvicorn: its bind failure is sys.exit(), which would
        # escape this task and stop the whole process's loop.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._socket = socket.create_server((self.host, self.port), family=family)
        self._socket.setblocking(False)
        self.port = int(self._socket.getsockname()[1])
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        deadline = asyncio.get_running_loop().time() + timeout
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it stopped (e.g. the port is taken)
                raise RuntimeError(f"the API server on {self.host}:{self.port} did not start")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"the API server did not start within {timeout}s")
            await asyncio.sleep(0.01)
        log.info("REST API listening on %s://%s:%d", self.scheme, self.host, self.port)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None


async def serve_api(app: FastAPI, host: str = "127.0.0.1", port: int = 8080,
                    tls: ServerTls | None = None) -> ApiServer:
    """Start the API on the running loop and return its server (call `stop()`)."""
    server = ApiServer(app, host, port, tls)
    await server.start()
    return server
