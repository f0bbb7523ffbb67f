"""Progress a person can watch: a rich bar per model on a terminal, plain timestamped lines otherwise
(for logs), at most one line per model every ``interval_s`` seconds plus one when a model finishes."""
from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .run import Stats


class RunProgress:
    """``update(label, stats)`` after each request; use as a context manager around the run.
    ``totals`` maps each model label to its number of requests (tasks × epochs)."""

    def __init__(self, console: Console, totals: dict[str, int], interval_s: float = 10.0):
        self.console, self.totals, self.interval_s = console, totals, interval_s
        self.live = console.is_terminal
        self._bars: Progress | None = None
        self._ids: dict[str, int] = {}
        self._last: dict[str, float] = {}
        self._started = time.monotonic()

    def __enter__(self) -> RunProgress:
        if self.live:
            self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                  console=self.console, transient=False)
            self._bars.start()
            for label, total in self.totals.items():
                self._ids[label] = self._bars.add_task(escape(label), total=total, detail="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bars is not None:
            self._bars.stop()

    @staticmethod
    def _detail(s: Stats) -> str:
        return (f"sent {s.sent} cached {s.cache_hits} invalid {s.invalid} failed {s.failed} "
                f"retries {s.attempts - (s.ok + s.invalid + s.failed)} 429s {s.rate_limited}")

    def update(self, label: str, stats: Stats) -> None:
        total = self.totals.get(label, 0)
        if self._bars is not None:
            self._bars.update(self._ids[label], completed=stats.done, detail=self._detail(stats))
            return
        now = time.monotonic()
        if stats.done < total and now - self._last.get(label, self._started) < self.interval_s:
            return
        self._last[label] = now
        elapsed = now - self._started
        rate = stats.sent / elapsed if elapsed > 0 else 0.0
        self.console.print(f"{time.strftime('%H:%M:%S')} {label}: {stats.done}/{total} "
                           f"({rate:.1f} req/s) {self._detail(stats)}", highlight=False, markup=False)
