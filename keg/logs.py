"""Structured logs: one JSON object per line (or plain text for a terminal), and a bound
on how fast one kind of line may repeat (clients choose how often some lines happen)."""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        return json.dumps(event, separators=(",", ":"))


# Control characters (CR and LF, ESC of terminal sequences, ...) in a line's message.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class TextFormatter(logging.Formatter):
    """One line per event: control characters in the message are escaped (`\\n`,
    `\\x1b`). Messages carry what clients and API callers chose (a change's reason, a
    client id, a topic): a reason with a newline forged a whole log line of its own, and
    an ESC sequence coloured the operator's terminal. A traceback keeps its lines."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = _CONTROL.sub(_escaped, record.message)
        return super().formatMessage(record)


def _escaped(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


@dataclass
class _Bucket:
    tokens: float
    at: float
    suppressed: int = 0


class RepeatLimit(logging.Filter):
    """At most `burst` lines of one kind at once, then one per `every_s` seconds; a kind is
    a logger, a level and a message template (`"refused %s-%d: %s"`, not the text it
    became), so a client that sends a refused frame thousands of times a second writes a
    line now and then, not thousands, while every other kind of line still gets through.
    The next line of a kind that passes says how many of its kind were left out.

    Kinds are bounded (`max_kinds`, the oldest forgotten first): templates are the
    code's, not the clients', but a message built without a template is its own kind."""

    def __init__(self, burst: int = 10, every_s: float = 5.0, max_kinds: int = 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst, self.every_s, self.max_kinds, self.clock = burst, every_s, max_kinds, clock
        self._buckets: dict[tuple[str, int, str], _Bucket] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        with self._lock:
            bucket = self._buckets.pop(kind, None)  # re-inserted: the newest kind last
            if bucket is None:
                bucket = _Bucket(tokens=float(self.burst), at=now)
                if len(self._buckets) >= self.max_kinds:
                    del self._buckets[next(iter(self._buckets))]
            self._buckets[kind] = bucket
            bucket.tokens = min(float(self.burst),
                                bucket.tokens + (now - bucket.at) / self.every_s)
            bucket.at = now
            if bucket.tokens < 1:
                bucket.suppressed += 1
                return False
            bucket.tokens -= 1
            suppressed, bucket.suppressed = bucket.suppressed, 0
        if suppressed:  # no % in the words added: the template's arguments stay its own
            record.msg = f"{record.msg} [{suppressed} more like this left out]"
        return True


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RepeatLimit())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
