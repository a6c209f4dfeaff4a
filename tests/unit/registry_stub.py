"""A schema registry's HTTP API as a stub server (Confluent's GET paths), for unit tests
of what asks one; integration tests use a real registry (Apicurio)."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any


class Registry:
    """GET path -> (status, JSON); records the requests and their headers."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, Any]] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.stall = threading.Event()  # set: answer nothing until released
        self.release = threading.Event()
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                registry.requests.append((self.path, dict(self.headers)))
                if registry.stall.is_set():
                    registry.release.wait(10)
                status, body = registry.routes.get(
                    self.path, (404, {"error_code": 40403, "message": "not found"}))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, schema_id: int, schema: Any, schema_type: str | None, subjects: list[str],
            references: list[dict[str, Any]] | None = None) -> None:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        answer: dict[str, Any] = {"schema": text, "references": references or []}
        if schema_type:
            answer["schemaType"] = schema_type
        self.routes[f"/schemas/ids/{schema_id}"] = (200, answer)
        self.routes[f"/schemas/ids/{schema_id}/versions"] = (
            200, [{"subject": s, "version": 1} for s in subjects])

    def add_subject_version(self, subject: str, version: int, schema: str, kind: str) -> None:
        self.routes[f"/subjects/{subject}/versions/{version}"] = (
            200, {"subject": subject, "version": version, "schema": schema, "schemaType": kind,
                  "references": []})

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
