"""LocalCluster's readiness probe: what the Master's web UI answers while it starts."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.cluster import LocalCluster


def _serving(body: bytes, content_type: str) -> ThreadingHTTPServer:
    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    yield LocalCluster(workers=1)


@pytest.mark.parametrize("body", [
    # What CI met: Jetty answered /json/ with the Master's HTML page while the UI
    # attached its handlers; the probe raised JSONDecodeError and the fixture failed.
    b'<!DOCTYPE html><html data-bs-theme="light"><head></head></html>',
    b"[]",
    b"",
])
def test_an_answer_that_is_not_the_masters_json_counts_no_worker(
        cluster: LocalCluster, body: bytes) -> None:
    server = _serving(body, "text/html")
    try:
        cluster.ui_port = server.server_address[1]
        assert cluster.alive_workers() == 0
    finally:
        server.shutdown()


def test_the_masters_json_gives_its_alive_workers(cluster: LocalCluster) -> None:
    server = _serving(b'{"url": "spark://127.0.0.1:7077", "aliveworkers": 2}',
                      "application/json")
    try:
        cluster.ui_port = server.server_address[1]
        assert cluster.alive_workers() == 2
    finally:
        server.shutdown()
