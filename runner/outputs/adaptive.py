"""What an adaptive run decided, recorded three times: as it goes, in a journal in the cache folder
(one JSON line per round: the models that stopped after it, their questions asked and intervals;
appended with one write(2) and fsynced, so that a Ctrl-C, a provider stop or a kill -9 later leaves
every decision taken), at the end in summary.json (``model_block``: each model's ``adaptive`` block;
the run's own block is ``Rounds.block``), and beside it in the cache folder (``remember``:
``outcomes.jsonl``), from which the commands that score the cache alone (``dxi score``, ``report``,
``view``) score the models an adaptive run left part-asked over the part each was asked
(``recorded``) and mark their figures as estimates of the whole set (``attach``), as the run did. A
run that did not end (a Ctrl-C, a kill) left a journal and no outcome: ``unfinished`` finds it, and
``dxi score`` and ``report`` say that rerunning it continues it (``Unfinished``,
``hint_unfinished``).

The journal is ``<cache>/adaptive/decisions-<order digest>.jsonl``: the runs that ask the same
sequence share it, each line naming its ``until``. A rerun replays the rounds from the cache: a
replayed round that decides what the journal already records for that round and ``until`` (the
same models settled, asked the same, with the same rule and interval; the reason, words about those,
may read otherwise in another version) appends nothing, so a
kill and a rerun leave one line per round; one that decides otherwise (an answer that failed before
came back) appends its line. The journal is a record for people and tools (``jq``), read back only
for that comparison, never to decide anything.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

# under the cache folder: the orders (``runner.adaptive.order``) and the journal of decisions
ORDER_DIR = "adaptive"

if TYPE_CHECKING:
    from dxi.scoring.records import Summary
    from dxi.scoring.sequential import Estimate, Standing, Until


def estimate(e: Estimate | None) -> dict | None:
    """``{"point", "low", "high"}`` (0-100, 4 decimals; None where unknown) of a whole-set
    estimate."""
    if e is None:
        return None
    pairs = (("point", e.point), ("low", e.low), ("high", e.high))
    return {k: None if v is None else round(float(v), 4) for k, v in pairs}


def model_block(
    asked: Mapping[str, int], standing: Standing | None, settled_at: int | None, stopped: str | None
) -> dict:
    """One model's ``adaptive`` block of summary.json (fields: ``Rounds.model_blocks``)."""
    block: dict = {
        "asked": dict(asked),
        "settled": bool(standing is not None and standing.settled),
        "rule": None if standing is None else standing.rule,
        "round": settled_at,
    }
    if stopped is not None:
        block["reason"] = stopped
    elif standing is None:
        block["reason"] = "no round finished: nothing was decided"
    else:
        block["reason"] = standing.reason
    block["index"] = estimate(None if standing is None else standing.index)
    block["metrics"] = (
        {} if standing is None else {k: estimate(v) for k, v in sorted(standing.metrics.items())}
    )
    return block


@dataclass(frozen=True)
class Journal:
    """The journal of decisions (``path``) of one order, for one ``until`` (text)."""

    path: Path
    until: str
    # the decisions already on record (``_decision``), read when the journal is opened
    recorded: set[bytes] = field(default_factory=set, compare=False)

    @classmethod
    def of(cls, order_path: Path, until: Until) -> Journal:
        """The journal beside the order recorded at ``order_path`` (``Order.path``), with the
        decisions its lines already record (a line that cannot be read, as a torn last line, is
        passed over)."""
        name = order_path.name.replace("order-", "decisions-").replace(".json", ".jsonl")
        journal = cls(order_path.with_name(name), str(until))
        try:
            lines = journal.path.read_bytes().splitlines()
        except FileNotFoundError:
            lines = []
        for raw in lines:
            try:
                journal.recorded.add(_decision(orjson.loads(raw)))
            except (orjson.JSONDecodeError, TypeError, KeyError):
                continue
        return journal

    def append(
        self, round_: int, settled: Mapping[str, Standing], asked: Mapping[str, Mapping[str, int]]
    ) -> None:
        """One line for round ``round_`` (1-based): the models ``settled`` after it (label ->
        Standing) with what each was asked. A line is written even when none settled (the round is
        then on record), but not when the journal already records the same decision (a rerun
        replaying the round from the cache: see the module docstring)."""
        line = {
            "until": self.until,
            "round": round_,
            "settled": {
                label: {
                    "asked": dict(asked[label]),
                    "rule": s.rule,
                    "reason": s.reason,
                    "index": estimate(s.index),
                }
                for label, s in settled.items()
            },
        }
        decision = _decision(line)
        if decision in self.recorded:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, orjson.dumps({"at": round(time.time(), 3)} | line) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        self.recorded.add(decision)


def _decision(line: dict) -> bytes:
    """What a journal line decides, comparable across runs: its ``until``, ``round`` and
    ``settled`` (each model's asked, rule and index; not its ``reason``, the words for them, which
    another version of dxi may phrase otherwise), as canonical JSON (sorted keys; the time ``at``
    left out). Raises KeyError for a line without them."""
    settled = {
        label: {k: v for k, v in entry.items() if k != "reason"}
        for label, entry in line["settled"].items()
    }
    return orjson.dumps(
        {"until": line["until"], "round": line["round"], "settled": settled},
        option=orjson.OPT_SORT_KEYS,
    )


# under <cache>/adaptive/: each adaptive run's end, for the commands that rescore
OUTCOMES = "outcomes.jsonl"


def remember(
    cache_dir: Path, block: dict, blocks: Mapping[str, dict], configs: Mapping[str, tuple]
) -> None:
    """Append an adaptive run's outcome to ``<cache>/adaptive/outcomes.jsonl``: its ``block``
    (``Rounds.block``) and each model's (``blocks``: label -> ``Rounds.model_blocks``'s), under the
    model's configuration (``configs``: label -> (provider, model, endpoint, params), as the cache
    tells models apart), so that ``dxi score``, ``report`` and ``view`` mark its figures as
    estimates (``attach``). A folder that cannot take the line costs only that (the run's
    summary.json has the blocks)."""
    models = [
        {"config": list(configs[label]), "label": label, "adaptive": b}
        for label, b in blocks.items()
        if label in configs
    ]
    line = orjson.dumps({"at": round(time.time(), 3), **block, "models": models}) + b"\n"
    try:
        (cache_dir / ORDER_DIR).mkdir(parents=True, exist_ok=True)
        fd = os.open(
            cache_dir / ORDER_DIR / OUTCOMES, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
        )
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:
        pass


@dataclass(frozen=True)
class Recorded:
    """The adaptive runs recorded in a cache folder for the models scored (``recorded``): ``top``
    (label -> the summary's top ``adaptive`` block of the latest run that asked it), ``blocks``
    (label -> its ``adaptive`` block) and ``parts`` (label -> evaluation -> the task ids it was
    asked: its prefix of the recorded order, ``scoring.adaptive.asked_part``)."""

    top: dict[str, dict]
    blocks: dict[str, dict]
    parts: dict[str, dict[str, tuple[str, ...]]]


def recorded(
    configs: Mapping[str, tuple], cache_dir: Path, tasks: Mapping[str, set[str]]
) -> Recorded:
    """The latest adaptive run recorded in ``<cache>/adaptive/outcomes.jsonl`` for each model of
    ``configs`` (label -> configuration, ``files.configs``) whose order (the file the line names,
    read from the same folder) holds exactly the tasks scored of each evaluation scored (``tasks``:
    evaluation -> task ids; fewer evaluations are fine, other tasks of one are another selection,
    and the record does not apply). A folder without the file,
    a line that is not JSON or an order that cannot be read is passed over (nothing recorded)."""
    out = Recorded({}, {}, {})
    try:
        lines = (cache_dir / ORDER_DIR / OUTCOMES).read_bytes().splitlines()
    except OSError:
        return out
    latest: dict[tuple, tuple[dict, dict]] = {}
    for raw in lines:
        try:
            doc = orjson.loads(raw)
            for m in doc["models"]:
                latest[tuple(m["config"])] = (doc, m["adaptive"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
    orders: dict[str, dict[str, list[str]] | None] = {}
    for label, config in configs.items():
        found = latest.get(tuple(config))
        if found is None:
            continue
        doc, block = found
        name = Path(str(doc.get("order", ""))).name
        if name not in orders:
            try:
                evals = orjson.loads((cache_dir / ORDER_DIR / name).read_bytes())["evals"]
                same = all(n in evals and set(evals[n]) == tasks[n] for n in tasks)
                orders[name] = evals if same else None
            except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
                orders[name] = None
        evals = orders[name]
        if evals is None:
            continue
        top = {k: v for k, v in doc.items() if k != "models"}
        out.top[label], out.blocks[label] = scored_only(top, block, set(tasks))
        out.parts[label] = {
            n: tuple(evals[n][: int(k)])
            for n, k in out.blocks[label].get("asked", {}).items()
            if n in evals
        }
    return out


def scored_only(top: dict, block: dict, scored: set[str]) -> tuple[dict, dict]:
    """A recorded run's ``top`` block and one model's ``block`` as they apply to the evaluations
    ``scored`` (``dxi score --evals`` scoring fewer than the run asked): the run's evaluations not
    scored are listed in the top block's ``not_scored`` (sorted) and left out of its
    ``populations`` and of the model's ``asked`` and ``metrics``, and the model's ``index`` is null:
    the whole-set index the run estimated is over evaluations not scored here, as the index is not
    computed over fewer (``scoring.adaptive.note`` says so). Unchanged when every evaluation of the
    run is scored; copies otherwise."""
    populations = top.get("populations", {})
    left = sorted(n for n in populations if n not in scored)
    if not left:
        return top, block
    top = top | {
        "populations": {n: k for n, k in populations.items() if n in scored},
        "not_scored": left,
    }
    block = block | {
        "asked": {n: k for n, k in block.get("asked", {}).items() if n in scored},
        "index": None,
        "metrics": {
            k: v for k, v in block.get("metrics", {}).items() if k.split(".", 1)[0] in scored
        },
    }
    return top, block


def attach(summary: Summary, record: Recorded, cut: set[tuple[str, str]]) -> Summary:
    """``summary`` (scored from the cache alone) with the ``adaptive`` blocks of ``record``
    (``recorded``) for the models scored over the part they were asked (``cut``: the (label,
    evaluation) pairs ``scoring.adaptive.asked_part`` cut), as the run itself wrote them. Nothing is
    attached when no model is left with a part of an evaluation (a later run completed them, or
    every model of the run was asked everything): its figures are then exact. A model whose recorded
    block is marked ``exact`` (the run scored it over the whole set, the cache holding the rest) is
    attached too, as the run showed it. The top block is that of the latest such run; when the
    models attached come from more than one run (each model's latest, ``recorded``), it also lists
    them in ``runs``, oldest first: each run's ``until``, ``seed``, ``rounds``, ``order`` and
    ``models`` (their labels), so that no model is described by another's run
    (``scoring.adaptive.note``)."""
    labels = {label for label, _ in cut if label in record.blocks}
    partial = any(
        record.blocks[label].get("asked", {}).get(name, 0)
        < record.top[label].get("populations", {}).get(name, 0)
        for label, name in cut
        if label in labels
    )
    # a model the run itself scored over the whole set (the cache held it: marked exact,
    # ``scoring.adaptive.mark_exact``) shows that run's block, as the run did
    exact = {label for label, block in record.blocks.items() if block.get("exact")}
    labels |= exact
    partial = partial or bool(exact)
    if not partial:
        return summary
    runs: dict[float, tuple[dict, list[str]]] = {}  # a run's time -> its top block, its models
    for entry in summary.models:
        if entry.model not in labels:
            continue
        entry.adaptive = record.blocks[entry.model]
        doc = record.top[entry.model]
        runs.setdefault(doc["at"], (doc, []))[1].append(entry.model)
    if not runs:
        return summary
    ordered = [runs[at] for at in sorted(runs)]
    summary.adaptive = {k: v for k, v in ordered[-1][0].items() if k != "at"}
    if len(ordered) > 1:
        summary.adaptive["runs"] = [
            {k: doc.get(k) for k in ("until", "seed", "rounds", "order")} | {"models": models}
            for doc, models in ordered
        ]
    return summary


@dataclass(frozen=True)
class Unfinished:
    """An adaptive run over a cache folder that did not finish (``unfinished``): its ``until`` (as
    its journal names it; None when no round of it finished), the order's ``seed`` and the
    ``rounds`` its journal records."""

    until: str | None
    seed: int
    rounds: int

    def command(self) -> str:
        """The command that continues it, as `dxi run ... --until precision=2` (with ``--seed S``
        for a seed other than 0; ``--until ...`` when the rule is not known)."""
        from dxi.scoring.adaptive import rerun_command

        return rerun_command(self.until, self.seed)

    def line(self) -> str:
        """The one line ``dxi score`` and ``dxi report`` print: "An adaptive run over this cache
        did not finish (--until precision=2: its journal has 3 rounds): rerunning the same `dxi
        run ... --until precision=2` command continues it; until then the figures here are over
        every task, the questions it has not asked counted missing (provisional)"."""
        what = f"--until {self.until}: " if self.until else ""
        journal = (
            "no round finished"
            if not self.rounds
            else f"its journal has {self.rounds} round{'' if self.rounds == 1 else 's'}"
        )
        return (
            f"An adaptive run over this cache did not finish ({what}{journal}): rerunning the same "
            f"{self.command()} command continues it; until then the figures here are over every "
            "task, the questions it has not asked counted missing (provisional)"
        )

    def hint(self) -> str:
        """What an evaluation block's missing answers hint says instead of the plain run alone:
        "rerunning the adaptive run that did not finish (`dxi run ... --until precision=2`)
        continues it, or `dxi run` with --all-tasks sends every missing answer"."""
        from dxi.scoring.adaptive import UNFINISHED

        return f"{UNFINISHED} ({self.command()}) continues it"


def unfinished(cache_dir: Path, tasks: Mapping[str, set[str]]) -> Unfinished | None:
    """The adaptive run over ``cache_dir`` that did not finish, for the tasks scored (``tasks``:
    evaluation -> task ids), or None. A run appends its outcome (``remember``) only when it ends,
    so an order of these tasks (every evaluation both it and ``tasks`` hold has the same tasks)
    whose journal has a line later than the latest outcome naming the order, or that no outcome
    names at all, is a run stopped before its end (a Ctrl-C, SIGTERM, kill -9, or an error): its
    ``until`` is the latest journal line's, ``rounds`` the most recent such lines' highest round.
    The latest such order counts; files that cannot be read are passed over."""
    folder = cache_dir / ORDER_DIR
    ended: dict[str, float] = {}  # order file name -> the latest outcome naming it
    try:
        outcomes = (folder / OUTCOMES).read_bytes().splitlines()
    except OSError:
        outcomes = []
    for raw in outcomes:
        try:
            doc = orjson.loads(raw)
            name = Path(str(doc["order"])).name
            ended[name] = max(ended.get(name, 0.0), float(doc["at"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    found: tuple[float, Unfinished] | None = None
    for path in sorted(folder.glob("order-*.json")):
        try:
            doc = orjson.loads(path.read_bytes())
            evals, seed = doc["evals"], int(doc["seed"])
            common = [n for n in tasks if n in evals]
            if not common or any(set(evals[n]) != tasks[n] for n in common):
                continue
            started = path.stat().st_mtime
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
        end = ended.get(path.name)
        lines = []
        journal = path.with_name(path.name.replace("order-", "decisions-") + "l")
        try:
            raws = journal.read_bytes().splitlines()
        except OSError:
            raws = []
        for raw in raws:
            try:
                line = orjson.loads(raw)
                lines.append((float(line["at"]), str(line["until"]), int(line["round"])))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
        later = [line for line in lines if end is None or line[0] > end]
        if end is not None and not later:
            continue  # it ended after its last decision
        if later:
            until = later[-1][1]
            rounds = max(r for _, u, r in later if u == until)
            at = later[-1][0]
        else:  # no outcome and no round: stopped before its first round ended
            until, rounds, at = None, 0, started
        if found is None or at > found[0]:
            found = (at, Unfinished(until, seed, rounds))
    return None if found is None else found[1]


# the end of an evaluation block's hint for missing answers (``scoring.summary``'s)
_SENDS = " sends what is missing"


def hint_unfinished(summary: Summary, left: Unfinished) -> Summary:
    """``summary`` (scored from the cache alone) with the hint of each missing answers' reason of
    the models the record leaves whole (no ``adaptive`` block attached: ``attach``) saying that
    rerunning the adaptive run that did not finish (``left``) continues it, before the plain run
    that sends everything ("...; rerunning the adaptive run that did not finish (`dxi run ...
    --until precision=2`) continues it, or `dxi run` with --all-tasks sends every missing
    answer"). Returns ``summary`` (its blocks changed in place)."""
    from dxi.scoring.records import UNSET

    for m in summary.models:
        if m.adaptive is not UNSET and m.adaptive:
            continue
        for block in m.evals.values():
            reason = block.get("reason")
            if not block.get("missing") or not isinstance(reason, str):
                continue
            head, sep, tail = reason.rpartition("; `dxi run` with ")
            flags, sends, after = tail.partition(
                _SENDS
            )  # after: a note on the metrics that follows
            if sep and sends and (not after or after.startswith(";")):
                block["reason"] = (
                    f"{head}; {left.hint()}, or `dxi run` with {flags} sends every missing answer"
                    f"{after}"
                )
    return summary
