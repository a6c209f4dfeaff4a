"""The whole gateway on one machine: control plane, ext_proc service and Envoy.

The control plane runs on a background event loop in this process; the ext_proc
service (the hot path, which wants a core of its own) and Envoy are child
processes. `Gateway` is what `keg up`, the tests and the benchmarks all use.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control_plane.service import ControlPlane, ControlPlaneSettings, free_port
from control_plane.topology import SaslPlain
from keg.embedded.envoy import EmbeddedEnvoy
from keg.lifecycle import Service

log = logging.getLogger(__name__)


@dataclass
class GatewaySettings:
    bootstrap_servers: str
    listen_host: str = "127.0.0.1"
    advertised_host: str | None = None
    listen_port_base: int = 19092
    envoy_concurrency: int = 1
    message_timeout_s: float = 2.0
    failure_mode_allow: bool = False
    max_frame_size: int = 100 * 1024 * 1024
    ext_proc_log_level: str = "INFO"
    rules_dir: Path | None = None
    audit_log: Path | None = None
    metrics_port: int | None = None
    sasl: SaslPlain | None = None  # the control plane's login to a SASL/PLAIN bootstrap
    work_dir: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)


def wait_for_port(host: str, port: int, timeout: float, alive: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if alive is not None:
                alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s") from None
            time.sleep(0.05)


class _Loop:
    """An asyncio loop on a daemon thread, for the control plane."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="keg-control-plane", daemon=True
        )
        self._thread.start()

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


class Gateway(Service):
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.ext_proc_port = 0
        self._ext_proc: subprocess.Popen[bytes] | None = None
        self._loop: _Loop | None = None
        self.control_plane: ControlPlane | None = None
        self.envoy: EmbeddedEnvoy | None = None

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        s = self.settings
        try:
            self.start_ext_proc()
            self._loop = _Loop()
            self.control_plane = ControlPlane(
                ControlPlaneSettings(
                    bootstrap_servers=s.bootstrap_servers,
                    ext_proc_host="127.0.0.1",
                    ext_proc_port=self.ext_proc_port,
                    listen_host=s.listen_host,
                    advertised_host=s.advertised_host,
                    listen_port_base=s.listen_port_base,
                    message_timeout_s=s.message_timeout_s,
                    failure_mode_allow=s.failure_mode_allow,
                    sasl=s.sasl,
                    rules_dir=s.rules_dir,
                )
            )
            self._loop.run(self.control_plane.start(), timeout=60)
            self.start_envoy()
        except BaseException:
            self.stop()
            raise

    def start_ext_proc(self) -> None:
        s = self.settings
        self.ext_proc_port = self.ext_proc_port or free_port()
        cmd = [
            sys.executable,
            "-m",
            "keg",
            "ext-proc",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.ext_proc_port),
            "--max-frame-size",
            str(s.max_frame_size),
            "--log-level",
            s.ext_proc_log_level,
        ]
        if s.rules_dir is not None:
            cmd += ["--rules", str(s.rules_dir)]
        if s.audit_log is not None:
            cmd += ["--audit-log", str(s.audit_log)]
        if s.metrics_port is not None:
            cmd += ["--metrics-port", str(s.metrics_port)]
        env = {**os.environ, **s.extra_env}
        self._ext_proc = subprocess.Popen(cmd, env=env)
        wait_for_port("127.0.0.1", self.ext_proc_port, 30, alive=self._check_ext_proc)

    def _check_ext_proc(self) -> None:
        if self._ext_proc is not None and self._ext_proc.poll() is not None:
            raise RuntimeError(f"ext_proc service exited with {self._ext_proc.returncode}")

    def stop_ext_proc(self) -> None:
        if self._ext_proc is not None and self._ext_proc.poll() is None:
            self._ext_proc.terminate()
            try:
                self._ext_proc.wait(10)
            except subprocess.TimeoutExpired:
                self._ext_proc.kill()
                self._ext_proc.wait()
        self._ext_proc = None

    def start_envoy(self) -> None:
        assert self.control_plane is not None and self.control_plane.plan is not None
        self.envoy = EmbeddedEnvoy(
            "127.0.0.1",
            self.control_plane.xds_port,
            concurrency=self.settings.envoy_concurrency,
            work_dir=self.settings.work_dir,
        )
        self.envoy.start()
        self.envoy.wait_for_listeners(len(self.control_plane.plan.routes))
        for route in self.control_plane.plan.routes:
            wait_for_port(self.settings.listen_host, route.listen_port, 30)

    def stop_envoy(self) -> None:
        if self.envoy is not None:
            self.envoy.stop()
            self.envoy = None

    def stop(self) -> None:
        self.stop_envoy()
        if self._loop is not None:
            if self.control_plane is not None:
                try:
                    self._loop.run(self.control_plane.stop(), timeout=10)
                except Exception:  # stopping must go on whatever failed
                    log.exception("control plane did not stop cleanly")
            self._loop.close()
            self._loop = None
        self.stop_ext_proc()

    # -- what clients use ----------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        assert self.control_plane is not None
        return self.control_plane.bootstrap_address()
