"""A rich progress bar fed by Spark's status tracker (tasks done / tasks known)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

POLL_SECONDS = 0.5


@contextlib.contextmanager
def spark_progress(spark: SparkSession, label: str, console: Console | None = None,
                   enabled: bool = True) -> Iterator[None]:
    """Show the tasks of every Spark stage that runs inside the block as one bar."""
    if not enabled:
        yield
        return
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    # markup off: the label is shown as written.
    progress = Progress(TextColumn("{task.description}", style="bold", markup=False),
                        BarColumn(),
                        MofNCompleteColumn(), TextColumn("tasks"), TimeElapsedColumn(),
                        console=console or Console(stderr=True), transient=False)
    task = progress.add_task(label, total=None)
    seen: dict[int, tuple[int, int]] = {}

    def poll() -> None:
        while not stop.wait(POLL_SECONDS):
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    seen[stage_id] = (info.numCompletedTasks, info.numTasks)
            done = sum(d for d, _ in seen.values())
            total = sum(t for _, t in seen.values())
            progress.update(task, completed=done, total=total or None)

    thread = threading.Thread(target=poll, name="keg-spark-progress", daemon=True)
    with progress:
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            total = sum(t for _, t in seen.values())
            progress.update(task, completed=total, total=total or 1)


__all__ = ["spark_progress"]
