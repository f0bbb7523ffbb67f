"""An adaptive run's rounds (``dxi run --until``; docs/adaptive.md).

The questions are asked in rounds down the order (``runner.adaptive.order``): before round ``k``
every running model has been asked the first ``asked[e]`` tasks of each evaluation ``e``; round
``k`` asks the next ``scoring.sequential.round_sizes(asked, populations, aim=...)`` of each (every
evaluation at the same fraction: the next share of the schedule, or short of it where
``scoring.sequential.aim`` predicts that a running model settles), one ``send`` per round over the
running models (``runner.dispatch.send``: under each model's claim on the cache, synchronously or as
one batch per model with ``--batch``) over the round's new tasks only. After the round the asked
part is scored from the cache, by the pipeline ``dxi score`` uses (``scoring.answers``: failed and
missing answers stay in, for the bounds), each model restricted to the tasks it was asked, and
``scoring.sequential.standings`` says which models are settled: those stop receiving requests. The
run ends when every model is settled (a model asked the whole set is settled as ``exhausted``).

Nothing is decided from a round that did not finish: a Ctrl-C or SIGTERM (``runner.stops.RunStop``),
the cost bound or an error ends the rounds as it is (batch mode's ``--deadline`` ends them after the
round it cuts, which is scored: what its batches left counts as missing), with every decision taken
before it in the journal (``runner.outputs.adaptive``). The round the cost bound cuts is no round of
the run (``Rounds.cut``): the summary counts the rounds finished and its models were asked their
prefix, what the cut round sent staying in the cache for the rerun; a model whose provider stopped
(``runner.stops``) leaves the rounds unsettled. The rounds depend only on the order and the cache's
answers, so a rerun after a kill replays them from the cache (everything asked is a cache hit:
nothing is sent twice) and continues the same sequence.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import polars as pl

from dxi import scoring
from dxi.scoring.adaptive import asked_part
from dxi.scoring.sequential import aim, round_sizes, standings

from ..dispatch import merged
from ..outputs.adaptive import Journal, model_block, remember
from ..outputs.files import configs
from ..sending.scheduler import Stats
from .order import DEFAULT_SEED, Order, PrefixSuite, order_of

if TYPE_CHECKING:
    from dxi.cache import Cache
    from dxi.evals import Suite
    from dxi.scoring.records import Summary
    from dxi.scoring.sequential import Standing, Until

    from ..planning.plan import ModelRun, Plan
    from ..sending.cost import Budget
    from ..sending.limits import ProviderLimiter
    from ..sending.progress import RunProgress
    from ..sending.stops import RunStop

SendRound = Callable[[list["ModelRun"], "Suite"], Awaitable[dict[str, "Stats"]]]


@dataclass
class Rounds:
    """One adaptive run's state: ``plan`` (its ``until`` and ``seed``), then, as the rounds go,
    ``order`` (read or recorded before the first round), ``asked`` (model label -> evaluation ->
    tasks asked, its prefix of the order), ``standings`` (label -> its latest
    ``scoring.sequential.Standing``), ``settled_at`` (label -> the round, 1-based, after which it
    stopped), ``stopped`` (label -> why it left the rounds unsettled: its provider stopped),
    ``rounds`` (the rounds finished), ``cut`` (the round the cost bound or a stop cut short, None
    when none was: it is not among ``rounds`` and decides nothing; its models' ``asked`` is the
    finished rounds' prefix) and ``bars`` (what the progress bars count: ``RoundBars``)."""

    plan: Plan
    order: Order | None = None
    asked: dict[str, dict[str, int]] = field(default_factory=dict)
    standings: dict[str, Standing] = field(default_factory=dict)
    settled_at: dict[str, int] = field(default_factory=dict)
    stopped: dict[str, str] = field(default_factory=dict)
    rounds: int = 0
    cut: int | None = None
    bars: RoundBars = field(default_factory=lambda: RoundBars())

    @property
    def until(self) -> Until:
        assert self.plan.until is not None
        return self.plan.until

    @property
    def seed(self) -> int:
        return DEFAULT_SEED if self.plan.seed is None else self.plan.seed

    async def run(
        self,
        models: Sequence[ModelRun],
        cache: Cache,
        send_round: SendRound,
        *,
        stop: RunStop,
        budget: Budget,
        limiters: Mapping[str, ProviderLimiter],
        deadline: float | None = None,
        say: Callable[[str], None] | None = None,
        progress: RunProgress | None = None,
    ) -> dict[str, Stats]:
        """Ask ``models`` in rounds (see the module docstring) through ``send_round(models, suite)``
        (the round's suite: ``PrefixSuite``); each model's Stats merged over the rounds.
        ``deadline`` (batch mode's ``--deadline``, Unix seconds): no round starts after it; ``say``
        prints one line after each round (``round_line``: who stopped, who runs on); ``progress``
        (the run's bars) is given each round's requests as it starts (``bars``: ``RoundBars``).
        Raises what ``send_round`` raises, ``OSError`` when the order cannot be recorded in the
        cache folder."""
        self.order = order = await asyncio.to_thread(
            order_of, self.plan.suite, self.seed, self.plan.cache_dir
        )
        journal = Journal.of(order.path, self.until)
        populations = order.populations()
        parts: dict[str, list[Stats]] = {m.label: [] for m in models}
        running = list(models)
        asked = dict.fromkeys(populations, 0)
        for m in models:
            self.asked[m.label] = dict(asked)
        while running:
            aimed = aim(self.standings[m.label] for m in running if m.label in self.standings)
            more = round_sizes(asked, populations, aim=aimed)
            target = {
                n: min(populations[n], asked[n] + max(0, more.get(n, 0))) for n in populations
            }
            # nothing left to ask: standings below has settled them as exhausted
            if target == asked:
                break
            new = sum(target[n] - asked[n] for n in populations)  # tasks; × epochs: requests
            self.bars.next_round({m.label: new * m.epochs for m in running}, progress)
            stats = await send_round(
                running, PrefixSuite.of(self.plan.suite, order, target, start=asked)
            )
            for label, s in stats.items():
                parts[label].append(s)
            if stop.requested or budget.stopped:
                # an unfinished round decides nothing and is no round of the run: its models stay
                # asked the finished rounds' prefix (what it sent is in the cache: the rerun, which
                # replays the rounds, finds it there)
                self.cut = self.rounds + 1
                if say is not None and budget.stopped and not stop.requested:
                    say(self.cut_line(stats, new * sum(m.epochs for m in running)))
                break
            for m in running:
                self.asked[m.label] = dict(target)
            asked = target
            self.rounds += 1
            for m in running:
                limiter = limiters.get(m.limits_key)
                if limiter is not None and (
                    limiter.halted is not None or m.label in limiter.stopped_models
                ):
                    self.stopped[m.label] = (
                        "its provider stopped (runner.stops): the next run continues it"
                    )
            running = [m for m in running if m.label not in self.stopped]
            standings = await asyncio.to_thread(self.assess, cache)
            self.standings |= standings
            newly = [m.label for m in running if standings[m.label].settled]
            for label in newly:
                self.settled_at[label] = self.rounds
            journal.append(
                self.rounds, {label: self.standings[label] for label in newly}, self.asked
            )
            running = [m for m in running if m.label not in self.settled_at]
            if say is not None:
                say(self.round_line(newly, len(running)))
            if deadline is not None and time.time() >= deadline:
                # past the deadline no round starts (what its batches left is missing: bounds)
                break
        return {
            label: (merged(ps) if len(ps) != 1 else ps[0]) for label, ps in parts.items() if ps
        } | {label: _empty(m) for m in models if not parts[(label := m.label)]}

    def cut_line(self, stats: Mapping[str, Stats], requests: int) -> str:
        """The line when the cost bound cuts round ``cut`` short: "round 4 cut by the cost bound
        (16 of its 16 requests not sent): it decides nothing; the run's figures are over rounds 1-3
        (32 of 200 tasks asked); what it sent is in the cache, and a rerun with a higher --max-cost
        continues the sequence". ``requests``: the round's, over its running models; ``stats``
        (the round's ``send``) says how many were sent or found in the cache; the tasks asked are
        a running model's, as in ``round_line``."""
        assert self.order is not None and self.cut is not None
        total = sum(self.order.populations().values())
        asked = max((sum(a.values()) for a in self.asked.values()), default=0)
        unsent = requests - sum(s.sent + s.cache_hits for s in stats.values())
        done = (
            "no round finished"
            if self.rounds == 0
            else f"the run's figures are over round{'s 1-' if self.rounds > 1 else ' '}"
            f"{self.rounds} ({asked:,} of {total:,} tasks asked)"
        )
        return (
            f"round {self.cut} cut by the cost bound ({unsent:,} of its {requests:,} requests not "
            f"sent): "
            f"it decides nothing; {done}; what it sent is in the cache, and a rerun with a higher "
            "--max-cost continues the sequence"
        )

    def round_line(self, newly: Sequence[str], running: int) -> str:
        """The line after a round: "round 3 (16% of the whole set asked: 16 of 100 tasks): m00
        stopped by precision=5 (index 0.0 [0.0, 4.6]); 9 running". The share and the count are of
        the tasks a running model has actually been asked, over every evaluation (each evaluation's
        share of the schedule, or the aimed share, rounded up to whole tasks: on a small set above
        the schedule's share, after an aimed round below it)."""
        assert self.order is not None
        populations = self.order.populations()
        asked = max((sum(a.values()) for a in self.asked.values()), default=0)
        total = sum(populations.values())
        share = 100 * asked / max(total, 1)
        parts = []
        for label in newly:
            s = self.standings[label]
            index = s.index
            figure = (
                "—"
                if index.point is None
                else f"{index.point:.1f} [{index.low:.1f}, {index.high:.1f}]"
            )
            how = "asked the whole set" if s.rule == "exhausted" else f"stopped by {s.rule}"
            parts.append(f"{label} {how} (index {figure})")
        return (
            f"round {self.rounds} ({share:.0f}% of the whole set asked: {asked:,} of {total:,} "
            "tasks): "
            f"{'; '.join(parts) or 'none stopped'}; {running} running"
        )

    def assess(self, cache: Cache) -> dict[str, Standing]:
        """Score what each model was asked (``answers_asked``) and return ``standings`` of every
        model."""
        assert self.order is not None
        return standings(
            self.answers_asked(cache), self.order.populations(), self.until, order=self.order.evals
        )

    def answers_asked(self, cache: Cache) -> pl.DataFrame:
        """The per-answer frame (``scoring.answers``: one row per model, question and epoch, failed
        and missing answers included) of every model of the plan over the tasks it was asked."""
        assert self.order is not None
        widest = {n: max(a.get(n, 0) for a in self.asked.values()) for n in self.order.evals}
        gold, categories = PrefixSuite.of(self.plan.suite, self.order, widest).gold_frames()
        models = self.plan.models_frame()
        answers = cache.read(
            lambda rows: scoring.answers(rows, models, gold, categories, self.plan.epochs)
        )
        return asked_part(answers, self.parts(), always=True)[0]

    def parts(self) -> dict[str, dict[str, tuple[str, ...]]]:
        """Label -> evaluation -> the task ids it was asked (its prefix of the order): what its
        figures are scored over (``scoring.adaptive.asked_part``); empty before the order was
        read."""
        if self.order is None:
            return {}
        return {
            label: {name: self.order.prefix(name, n) for name, n in counts.items()}
            for label, counts in self.asked.items()
        }

    def block(self) -> dict:
        """summary.json's top-level ``adaptive`` block: ``until`` (as given), ``seed``, ``rounds``
        asked, ``order`` (the file in the cache folder recording the sequence) and ``populations``
        (evaluation -> tasks of the whole set)."""
        assert self.order is not None
        return {
            "until": str(self.until),
            "seed": self.seed,
            "rounds": self.rounds,
            "order": str(self.order.path),
            "populations": self.order.populations(),
        }

    def model_blocks(self) -> dict[str, dict]:
        """Label -> summary.json's ``models[i].adaptive``: ``asked`` (evaluation -> tasks asked),
        ``settled``, ``rule`` (what stopped it: "precision=5", "separated=1", "exhausted"; None
        while it was still running), ``round`` (the round after which it stopped, or None),
        ``reason``, ``index`` (the whole-set estimate ``{"point", "low", "high"}``, 0-100, with its
        anytime-valid 95% interval at stopping) and ``metrics`` ("<evaluation>.<metric>" -> the
        same)."""
        return {
            label: model_block(
                asked,
                self.standings.get(label),
                self.settled_at.get(label),
                self.stopped.get(label),
            )
            for label, asked in self.asked.items()
        }

    def remember(self, models: pl.DataFrame, summary: Summary) -> None:
        """Record the outcome in the cache folder (``runner.outputs.adaptive.remember``) for the
        commands that rescore it; ``models``: the plan's ``models_frame``; ``summary``: the run's,
        whose models scored over the whole set have their adaptive blocks marked ``exact``
        (``scoring.adaptive.mark_exact``): the record marks them too."""
        blocks = self.model_blocks()
        for m in summary.models:
            if isinstance(m.adaptive, dict) and m.adaptive.get("exact") and m.model in blocks:
                blocks[m.model]["exact"] = True
        remember(self.plan.cache_dir, self.block(), blocks, configs(models))

    def entries(self) -> dict[str, dict] | None:
        """Label -> {"adaptive": its block}, as ``runner.outputs.files.score`` sets them on the
        model entries (None before the order was read: the run stopped before its first round)."""
        if self.order is None:
            return None
        return {label: {"adaptive": block} for label, block in self.model_blocks().items()}


class RoundBars:
    """What an adaptive run's progress bars count (``runner.sending.progress.RunProgress``): each
    model's bar counts what the run has asked of it so far, not the whole set it may never be
    asked. Its total grows by each round's requests as the round starts (``next_round``); its
    counts add up the rounds (each round's ``send`` counts from zero: ``total`` adds the earlier
    rounds' Stats). A model that stopped keeps its last total, reached: its bar ends full, and its
    line says which round it finished ("round 7 done"), never that the run is done."""

    def __init__(self) -> None:
        self.planned: dict[str, int] = {}
        self.earlier: dict[str, Stats] = {}  # the finished rounds' Stats, merged
        self.current: dict[str, Stats] = {}  # the round's, as the last update gave them
        self.rounds = 0

    def next_round(self, requests: dict[str, int], progress: RunProgress | None) -> None:
        """A round starts: ``requests`` (label -> its requests) added to the totals ``progress``
        shows (``RunProgress.round_totals``)."""
        for label, s in self.current.items():
            before = self.earlier.get(label)
            self.earlier[label] = s if before is None else merged([before, s])
        self.current = {}
        for label, n in requests.items():
            self.planned[label] = self.planned.get(label, 0) + n
        self.rounds += 1
        if progress is not None:
            progress.round_totals(dict(self.planned), dict.fromkeys(requests, self.rounds))

    def total(self, label: str, stats: Stats) -> Stats:
        """``stats`` (the round's, of ``label``) with the earlier rounds' added."""
        if not self.planned:
            return stats
        self.current[label] = stats
        before = self.earlier.get(label)
        return stats if before is None else merged([before, stats])


def _empty(model: ModelRun) -> Stats:
    return Stats(cost_usd=None if model.price is None else 0.0)
