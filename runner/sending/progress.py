"""Progress a person can watch at 3 a.m.: per model, done/total, rate, time left, spend, retries,
429s and invalid answers. On a terminal a rich bar per model; otherwise (logs) plain timestamped
lines, at most one per model every ``interval_s`` seconds (``INTERVAL_S``, 10) from the start (also
before the first reply and while none arrives: a model's requests count ``in flight`` from the
moment a worker takes them up, so a provider that is down, or replies that take minutes, show as a
count that stands still) plus one when a model ends: it finishes ("done"), or the cost bound or a
stop of its provider (or of it) leaves the rest of its requests not sent ("stopped", with those
counted ``not sent`` and ``refused``), e.g.::

    03:08:19 gpt-6.1-terra: 0/2193 0% 0.0 req/s ETA - $0.0000 retries 0 429s 0 invalid 0 failed 0 cached 0 in flight 32
    03:12:09 gpt-6.1-terra: 1200/2193 55% 3.9 req/s ETA 4m15s $0.4210 retries 3 429s 1 invalid 2 failed 0 cached 400 in flight 32
    03:12:41 gpt-6.1-terra: 1310/2193 60% 3.9 req/s stopped $0.4597 retries 3 429s 1 invalid 2 failed 0 cached 400 not sent 883

A model in batch mode adds its batches: submitted, running (with the time each has been running) and
done; in place of the rate and the time left (answers come a batch at a time, hours apart: neither
means anything), it shows its batches open and the answers collected so far. The rate counts
requests sent (not cache hits) over the time since the run started (so the first line cannot read
thousands of requests a second); the time left is the requests still to do at that rate. A model
that costs nothing (a local model, or priced at 0) shows no spend; with a cost bound, the spend of
the whole run is shown against it; a spend that holds reservations kept for replies of unknown cost
(``Stats.cost_at_reservation_usd``) reads "at most $X". ``start_line`` is the line printed before
the run: what is about to run.

Once the run is stopping (the first Ctrl-C or SIGTERM, ``runner.sending.stops.RunStop``), a line
says so and counts the requests still in flight down (on a terminal under the bars; in logs one line
at once, then at most one a second while the count falls, and one when none is left), e.g.::

    03:12:10 stopping (SIGTERM): nothing new is sent; 12 request(s) in flight finish and are stored (at most 25 s; again to stop at once)
"""

from __future__ import annotations

import asyncio
import time

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.progress import BarColumn, MofNCompleteColumn, Progress, Task, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from dxi.shown import shown

from ..outputs import amounts
from .cost import Budget
from .scheduler import Stats

INTERVAL_S = 10.0  # a log's progress: a line per model this often (a test makes it shorter)


def ended(s: Stats, total: int | None) -> bool:
    """Whether a model with ``total`` requests (None: not counted yet) has none left: each one done
    (answered, failed or found in the cache), not sent or refused (``Stats``)."""
    return total is not None and s.done + s.not_sent + s.refused >= total


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def batches(s: Stats) -> str:
    """A model's batches in its progress line (``runner.batch.driver.BatchStats``): submitted,
    running (each one's time running so far) and collected, and the requests given back; "" for a
    model sent synchronously."""
    running = getattr(s, "running", None)
    if running is None:
        return ""
    ages = ", ".join(_duration(time.time() - t) for t in sorted(running.values())[:4]) + (
        ", ..." if len(running) > 4 else ""
    )
    return (
        f" batches {s.submitted} submitted {len(running)} running"
        + (f" ({ages})" if running else "")
        + f" {s.collected} done"
        + (f" given back {s.given_back}" if s.given_back else "")
        + (f" in another process's batches {s.claimed}" if s.claimed else "")
    )


MIN_BAR, MAX_BAR = (
    10,
    40,
)  # the bar's width in columns: dropped rather than drawn narrower than MIN_BAR


class _Bars(Progress):
    """Rich's live progress, one model a row, laid out for the terminal's width so that no counter
    is ever cut: ``label [bar] done/total counters elapsed`` on one line, the bar as wide as what is
    left allows (``MAX_BAR`` at most); where that leaves less than ``MIN_BAR``, no bar; where even
    the line without the bar does not fit, the counters go on their own lines below the label,
    indented, wrapped at spaces. Labels are plain text (no markup, no emoji codes: a label such as
    "openai:m" holds ":m:")."""

    def __init__(self, console: Console):
        super().__init__(console=console, transient=False)
        self._counts, self._elapsed = MofNCompleteColumn(), TimeElapsedColumn()

    def make_tasks_table(self, tasks: list[Task]) -> Table:
        table = Table.grid()
        table.add_column()
        rows = [t for t in tasks if not t.fields.get("note")]
        label = max(
            (Text(shown(t.description)).cell_len for t in rows), default=0
        )  # the rows' labels and counts align
        counts = max((self._counts.render(t).cell_len for t in rows), default=0)
        for task in tasks:
            if task.fields.get("note"):  # a line of text under the bars (the run stopping)
                table.add_row(Text(shown(task.description), style="yellow"))
            else:
                table.add_row(self.row(task, self.console.width, label, counts))
        return table

    def row(
        self, task: Task, width: int, label_width: int = 0, counts_width: int = 0
    ) -> RenderableType:
        """One model's row at ``width`` columns (see the class docstring), its label and counts
        padded to ``label_width`` and ``counts_width`` when it is one line."""
        label, counts, elapsed = (
            Text(shown(task.description)),  # a server may name the model (dxi.shown)
            self._counts.render(task),
            self._elapsed.render(task),
        )
        label.pad_right(max(0, label_width - label.cell_len))
        counts.pad_left(max(0, counts_width - counts.cell_len))
        detail = Text(str(task.fields.get("detail", "")))
        parts = [label, counts, detail, elapsed]
        line = sum(p.cell_len for p in parts) + len(parts) - 1
        if line + 1 + MIN_BAR <= width:
            parts.insert(1, BarColumn(bar_width=min(MAX_BAR, width - line - 1)).render(task))
        if line + 1 + MIN_BAR <= width or line <= width:
            grid = Table.grid(padding=(0, 1))
            for _ in parts:
                grid.add_column(no_wrap=True)
            grid.add_row(*parts)
            return grid
        label.rstrip()
        counts = Text(counts.plain.lstrip())
        return Group(Text.assemble(label, " ", counts, " ", elapsed), Padding(detail, (0, 0, 0, 2)))


class RunProgress:
    """``update(label, stats)`` after each request; use as a context manager around the run.
    ``totals`` maps each model label to its number of requests (tasks × its epochs); a label missing
    from it has no total yet (``set_totals`` gives it once the tasks are counted: ``dxi run`` counts
    them while the first requests are on the wire); ``budget`` (optional) is the run's cost budget,
    shown against its bound; ``free``: the labels of models that cost nothing; ``started``: the
    run's start in ``time.monotonic()`` seconds (default: now)."""

    def __init__(
        self,
        console: Console,
        totals: dict[str, int],
        interval_s: float | None = None,
        budget: Budget | None = None,
        free: frozenset[str] = frozenset(),
        started: float | None = None,
    ):
        self.console, self.totals, self.interval_s, self.budget = (
            console,
            totals,
            INTERVAL_S if interval_s is None else interval_s,
            budget,
        )
        self.free = free  # labels of the models that cost nothing: no spend shown
        self.live = console.is_terminal
        self._bars: Progress | None = None
        self._ids: dict[str, int] = {}
        self._last: dict[str, float] = {}
        self._stats: dict[
            str, Stats
        ] = {}  # each model's latest Stats (updated in place by the run)
        self._finished: set[str] = set()
        self._ticker: asyncio.TimerHandle | None = None
        self._started = (
            time.monotonic() if started is None else started
        )  # the run's start (monotonic seconds)
        # an adaptive run's: label -> the last round it is asked in (``runner.session._RoundBars``):
        # its total is what the rounds so far ask, so reaching it finishes that round, not the run
        self.rounds: dict[str, int] = {}
        self._note: int | None = None  # the bars' line saying the run is stopping
        self._stopping_shown: tuple[float, int] | None = (
            None  # (when, count) of the last stopping line in logs
        )

    def __enter__(self) -> RunProgress:
        if self.live:
            self._bars = _Bars(self.console)
            self._bars.start()
            for label, total in self.totals.items():
                self._ids[label] = self._bars.add_task(label, total=total, detail="")
        self._schedule()
        return self

    def _schedule(self) -> None:
        """Show every model again after a while without replies (inside an event loop only)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._ticker = loop.call_later(1.0 if self.live else self.interval_s, self._tick)

    def _tick(self) -> None:
        now = time.monotonic()
        for label, stats in self._stats.items():
            self._show(label, stats, now)
        self._schedule()

    def set_totals(self, totals: dict[str, int]) -> None:
        """Give (or correct) the models' totals; a model not shown yet gets its bar. An adaptive
        run's come round by round (``round_totals``): the whole set's, given once the tasks are
        counted, are then not what its bars count, and are passed over."""
        if not self.rounds:
            self._totals(totals)

    def round_totals(self, totals: dict[str, int], rounds: dict[str, int]) -> None:
        """An adaptive run's round starts (``runner.adaptive.rounds.RoundBars``): ``totals`` (label
        -> what the rounds so far ask of it) and ``rounds`` (label -> this round, for the models it
        asks). A total that grows reopens the model: its line is printed again when it reaches the
        new total."""
        self.rounds |= rounds
        self._totals(totals)

    def _totals(self, totals: dict[str, int]) -> None:
        for label, total in totals.items():
            if total > self.totals.get(label, total):
                self._finished.discard(label)
        self.totals = dict(totals)
        if self._bars is not None:
            for label, total in self.totals.items():
                if label in self._ids:
                    self._bars.update(self._ids[label], total=total)
                else:
                    self._ids[label] = self._bars.add_task(label, total=total, detail="")
            return
        now = time.monotonic()
        for label, stats in self._stats.items():  # ended before its total was known: its last line
            if ended(stats, self.totals.get(label)):
                self._show(label, stats, now)

    def __exit__(self, *exc: object) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if self._bars is not None:
            self._bars.stop()

    def line(self, label: str, s: Stats, now: float | None = None) -> str:
        """One model's progress: done/total, share, rate, time left ("done"; "stopped" when the rest
        was not sent), spend, retries (``Stats.retries``: requests sent again after a failed
        attempt), 429s, invalid, failed, cached, and the requests in flight (``Stats.in_flight``),
        not sent and refused when there are."""
        now = time.monotonic() if now is None else now
        total = self.totals.get(label)
        share = f"{100 * s.done / total:.0f}%" if total else "-"
        elapsed = now - self._started
        # requests sent, and those answered by an earlier run's batches that this one collected
        rate = (s.sent + getattr(s, "from_earlier", 0)) / elapsed if elapsed > 0 else 0.0
        left = None if total is None else total - s.done
        eta = (
            "ETA -"
            if left is None
            else ("done" if label not in self.rounds else f"round {self.rounds[label]} done")
            if left <= 0
            else "stopped"
            if ended(s, total)
            else (f"ETA {_duration(left / rate)}" if rate > 0 else "ETA -")
        )
        if label in self.free:
            spend = ""
        else:
            # charged at reservation (the cost unknown): what it spent is at most that; a
            # reservation of uncapped output bounds nothing (Stats.cost_unbounded)
            most = "at most " if s.cost_at_reservation_usd else ""
            spend = (
                "no price "
                if s.cost_usd is None
                else "cost unknown "
                if s.cost_unbounded
                else f"{most}${s.cost_usd:.4f} "
            )
            if self.budget is not None and self.budget.max_usd is not None:
                run_most = any(o.cost_at_reservation_usd for o in (s, *self._stats.values()))
                earlier = getattr(s, "from_earlier_usd", 0.0)  # paid by the run that submitted
                also = f"; ${earlier:.4f} earlier runs' batches" if earlier else ""
                spend = (
                    spend[:-1]
                    + f" (run {'at most ' if run_most else ''}${self.budget.spent:.4f} of "
                    + f"{amounts.usd(self.budget.max_usd)}{also}) "
                )
        if getattr(
            s, "in_batch", False
        ):  # answers come a batch at a time: a rate and a time left would mislead
            # answers (valid or not) from the batches; a failed request is not one (``failed N``)
            pace = f"{len(s.running)} batch(es) open {s.ok + s.invalid} answer(s) collected"
        else:
            pace = f"{rate:.1f} req/s {eta}"
        return (
            f"{s.done}/{'?' if total is None else total} {share} {pace} {spend}retries {s.retries} "
            f"429s {s.rate_limited} "
            f"invalid replies {s.invalid} failed {s.failed} cached {s.cache_hits}"
            + (f" in flight {s.in_flight}" if s.in_flight else "")
            + (f" not sent {s.not_sent}" if s.not_sent else "")
            + (f" refused {s.refused}" if s.refused else "")
            + batches(s)
        )

    def stopping(self, signal_name: str, in_flight: int, grace_s: float) -> None:
        """The run is stopping on ``signal_name`` ("Ctrl-C", "SIGTERM") with ``in_flight`` requests
        still out (see the module docstring); called at the signal and as each of them finishes."""
        if in_flight:
            text = (
                f"stopping ({signal_name}): nothing new is sent; {in_flight} request(s) in flight finish and are "
                f"stored (at most {grace_s:g} s; again to stop at once)"
            )
        else:
            text = f"stopping ({signal_name}): every request that was in flight is stored"
        if self._bars is not None:
            if self._note is None:
                self._note = self._bars.add_task(text, total=None, note=True)
            else:
                self._bars.update(self._note, description=text)
            return
        now = time.monotonic()
        last = self._stopping_shown
        if last is not None and (last[1] == in_flight or (in_flight and now - last[0] < 1.0)):
            return
        self._stopping_shown = (now, in_flight)
        self.console.print(f"{time.strftime('%H:%M:%S')} {text}", highlight=False, markup=False)

    def update(self, label: str, stats: Stats) -> None:
        self._stats[label] = stats
        self._show(label, stats, time.monotonic())

    def _show(self, label: str, stats: Stats, now: float) -> None:
        if self._bars is not None:
            if label not in self._ids:  # no total yet: a bar without one
                self._ids[label] = self._bars.add_task(label, total=None, detail="")
            detail = self.line(label, stats, now).split(" ", 1)[
                1
            ]  # the bar shows done/total itself
            self._bars.update(self._ids[label], completed=stats.done, detail=detail)
            return
        total = self.totals.get(label)
        # its last line, once: none left (``ended``), and no batch of it still open (the line after
        # its collection)
        if ended(stats, total) and not getattr(stats, "running", None):
            if label in self._finished:
                return
            self._finished.add(label)
        elif now - self._last.get(label, self._started) < self.interval_s:
            return
        self._last[label] = now
        self.console.print(
            f"{time.strftime('%H:%M:%S')} {label}: {self.line(label, stats, now)}",
            highlight=False,
            markup=False,
        )


def start_line(
    models: dict[str, int],
    tasks: dict[str, int],
    epochs: dict[str, int],
    idle: set[str],
    cache_dir: object,
    out: object,
    budget: Budget | None = None,
    until: object = None,
) -> str:
    """What is about to run, e.g. ``Running 2 models on 2,193 tasks (AA-Omniscience-Decision 500,
    ...), 6,579 requests; cache .dxi-cache, results to out``. ``models``: label -> requests;
    ``tasks``: evaluation title -> tasks; ``epochs``: label -> epochs (shown when not 1); ``idle``:
    labels with every request cached; ``until``: an adaptive run's rule (``--until``, as ``str``
    gives it; None: not one), whose requests are at most these ("at most 6,579 requests (--until
    precision=5: each model stops when settled)")."""
    names = []
    for label in models:
        notes = ([f"{epochs[label]} epochs"] if epochs.get(label, 1) != 1 else []) + (
            ["all cached"] if label in idle else []
        )
        names.append(label + (f" ({', '.join(notes)})" if notes else ""))
    n_tasks = sum(tasks.values())
    bound = (
        f", cost bound {amounts.usd(budget.max_usd)}"
        if budget is not None and budget.max_usd is not None
        else ""
    )
    return (
        f"Running {len(models)} model{'s' if len(models) != 1 else ''} ({'; '.join(names)}) on {n_tasks:,} tasks ("
        + ", ".join(f"{t} {n:,}" for t, n in tasks.items())
        + f"): {'at most ' if until else ''}{sum(models.values()):,} requests"
        + (f" (--until {until}: each model stops when settled)" if until else "")
        + f"{bound}; "
        f"cache {cache_dir}, results to {out}"
    )


class Said:
    """The timestamped lines a run says as it goes ("03:12:09 round 2 ..."; a wait for another
    process, a batch's state change, an adaptive round's outcome), printed to ``console`` (None:
    nowhere) after the start line: a line said before ``release()`` (the start line is out, or will
    not be) is held until then, so a fast first round's line never precedes the line that says what
    is about to run."""

    def __init__(self, console: Console | None) -> None:
        self.console, self.held, self.released = console, [], False

    def __call__(self, text: str) -> None:
        if self.console is not None:
            self.held.append(f"{time.strftime('%H:%M:%S')} {text}")
            if self.released:
                self.release()

    def release(self) -> None:
        """Print the lines held, and from now on each as it is said."""
        self.released = True
        while self.held and self.console is not None:
            self.console.print(self.held.pop(0), highlight=False, markup=False)
