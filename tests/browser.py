"""Headless Chromium for tests: Debian's `chromium`, no driver, no browser download.

Two ways, the lightest that does the job:

- `dump_dom(url)`: `chromium --headless --dump-dom` runs the page's scripts and prints
  the DOM (the API docs pages need nothing more);
- `Browser`: Chromium with `--remote-debugging-port`, driven over the DevTools protocol
  (a JSON message per command on a WebSocket, the `websockets` package's sync client):
  navigate, evaluate JavaScript, wait for a condition, take a screenshot. The console
  tests click, type and read through `evaluate`.

Every run gets a fresh profile (`--user-data-dir`) and has background networking,
component updates and first-run pages off: the machine has no internet, and nothing
but the page under test may be loaded.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from keg.children import stop_process

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--no-default-browser-check",
         "--disable-extensions", "--window-size=1280,900")

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no headless Chromium: apt-get install chromium (make system-deps)")


def dump_dom(url: str, budget_ms: int = 15000, timeout: float = 120) -> str:
    """The DOM of `url` after its scripts ran (for up to `budget_ms` of virtual time)."""
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory(prefix="keg-chromium-") as profile:
        done = subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}",
             f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
            capture_output=True, text=True, timeout=timeout, check=True)
    return done.stdout


class BrowserError(RuntimeError):
    """A DevTools command failed, or a page condition never became true."""


class Browser:
    """One headless Chromium and one page, over the DevTools protocol."""

    def __init__(self, profile: Path | None = None) -> None:
        if CHROMIUM is None:
            raise BrowserError("no chromium on PATH")
        self._tmp = None if profile else tempfile.TemporaryDirectory(
            prefix="keg-chromium-", ignore_cleanup_errors=True)
        self.profile = profile or Path(self._tmp.name)  # type: ignore[union-attr]
        # Its own process group: Chromium's helpers (renderer, GPU, crash handler) go
        # with it, so none is still writing into the profile when it is removed.
        self._process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        self._ids = itertools.count(1)
        self._stack = contextlib.ExitStack()  # the DevTools WebSocket
        self._events: list[dict[str, Any]] = []
        try:
            self._socket = self._connect_page(self._debugging_port())
            self.command("Page.enable")
            self.command("Runtime.enable")
        except BaseException:
            self.close()
            raise

    def _debugging_port(self, timeout: float = 60) -> int:
        """Chromium writes the port it bound into the profile (DevToolsActivePort)."""
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BrowserError(f"chromium exited with {self._process.returncode}")
            if marker.exists():
                first = marker.read_text().split("\n", 1)[0].strip()
                if first.isdigit():
                    return int(first)
            time.sleep(0.05)
        raise BrowserError("chromium did not open its DevTools port")

    def _connect_page(self, port: int) -> Any:
        import urllib.request

        from websockets.sync.client import connect

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            targets = json.loads(r.read())
        (page,) = [t for t in targets if t["type"] == "page"][:1]
        return self._stack.enter_context(connect(
            page["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024, open_timeout=10))

    def command(self, method: str, timeout: float = 30, **params: Any) -> dict[str, Any]:
        ident = next(self._ids)
        self._socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"{method}: no answer within {timeout}s")
            message = json.loads(self._socket.recv(timeout=left))
            if message.get("id") == ident:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            if "method" in message:
                self._events.append(message)

    def goto(self, url: str, timeout: float = 30) -> None:
        """Navigate and wait until the document has loaded."""
        self.command("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'",
                      timeout=timeout)

    def evaluate(self, expression: str, timeout: float = 30) -> Any:
        """The value of a JavaScript expression (awaited when it is a promise)."""
        result = self.command("Runtime.evaluate", timeout=timeout, expression=expression,
                              returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise BrowserError(f"{expression[:80]}: {text}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> Any:
        """Until the expression is truthy; its value. BrowserError with the page's text
        when it never becomes true."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                text = self.evaluate("document.body ? document.body.innerText : ''")
                raise BrowserError(f"never true within {timeout}s: {expression}\n"
                                   f"page text:\n{str(text)[:2000]}")
            time.sleep(0.1)

    def screenshot(self, path: Path) -> Path:
        """A PNG of the page as shown (the whole page height)."""
        data = self.command("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def console_errors(self) -> list[str]:
        """Exceptions the page threw so far (Runtime.exceptionThrown events)."""
        return [str(e["params"]["exceptionDetails"].get("exception", {}).get("description"))
                for e in self._events if e.get("method") == "Runtime.exceptionThrown"]

    def close(self) -> None:
        self._stack.close()
        stop_process(self._process)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)  # helpers left behind
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
