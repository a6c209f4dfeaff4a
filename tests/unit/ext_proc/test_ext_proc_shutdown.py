"""Stopping the ext_proc service (SIGTERM cancels serve_forever) flushes what it holds."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from ext_proc import ExtProcServer, ProcessorSettings


def test_cancelling_serve_forever_stops_the_server_and_closes_the_data_path() -> None:
    server = ExtProcServer(ProcessorSettings(port=0))
    closed: list[bool] = []
    original = server.data_path.close

    def close() -> None:
        closed.append(True)
        original()

    server.data_path.close = close  # type: ignore[method-assign]

    async def run() -> int:
        task = asyncio.create_task(server.serve_forever())
        while not server.port:
            await asyncio.sleep(0.01)
        port = server.port
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return port

    port = asyncio.run(run())
    assert closed == [True]
    with socket.socket() as s:  # the port is released: the gRPC server really stopped
        assert s.connect_ex(("127.0.0.1", port)) != 0
