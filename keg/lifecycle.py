"""The context-manager face every runnable part of keg shares: `with X(...) as x:`."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self


class Service:
    """Subclasses define `start()` and `stop()`; `stop()` must be safe to call twice."""

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
