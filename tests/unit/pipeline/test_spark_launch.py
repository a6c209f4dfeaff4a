"""Spark's JVM is started without Python code between fork and exec.

PySpark's own launcher passes a `preexec_fn`; in a process where gRPC has threads
(every test process that ran a gateway, `keg up`'s own) the forked child then dies
now and then with SIGSEGV before it can exec the JVM, and the session never starts
(JAVA_GATEWAY_EXITED): it failed a CI run once. `gateway_popen` is what keg's
sessions launch the JVM with.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from pipeline.spark import gateway_popen

LAUNCHES = 300


@pytest.fixture
def busy_grpc() -> Iterator[None]:
    """gRPC calls going on in other threads, as in a process running a gateway."""
    def echo(request: bytes, _context: grpc.ServicerContext) -> bytes:
        return request

    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "keg.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = threading.Event()

    def call_in_a_loop() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo_call = channel.unary_unary("/keg.Echo/Echo")
            while not stop.is_set():
                echo_call(b"x")

    callers = [threading.Thread(target=call_in_a_loop, daemon=True) for _ in range(3)]
    for caller in callers:
        caller.start()
    yield
    stop.set()
    for caller in callers:
        caller.join(10)
    server.stop(None)


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_launches_survive_grpc_threads(busy_grpc: None) -> None:
    # Called as PySpark's launch_gateway calls Popen: with its preexec_fn.
    failed = []
    for _ in range(LAUNCHES):
        child = gateway_popen(["true"], stdin=subprocess.PIPE, preexec_fn=ignore_sigint)
        child.communicate()
        if child.returncode != 0:
            failed.append(child.returncode)
    assert failed == []


def test_the_child_has_a_process_group_of_its_own() -> None:
    # What the preexec_fn was for: the terminal's Ctrl-C must not reach the JVM.
    child = gateway_popen(["sleep", "5"], preexec_fn=ignore_sigint)
    try:
        assert os.getpgid(child.pid) == child.pid
    finally:
        child.kill()
        child.wait()
