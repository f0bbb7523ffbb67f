"""How an adaptive run's summary is read (``dxi run --until``; docs/adaptive.md): the one note every
presentation shows (the terminal, ``report.html``, ``dxi view``) and the rows of its table, from
summary.json's ``adaptive`` blocks (``Summary.adaptive``, ``ModelEntry.adaptive``; written by
``runner.adaptive``), and the cut of an answers frame to the part each model was asked
(``asked_part``). Pure: reads a ``Summary`` or a frame only.

In an adaptive run each model was asked a seeded random part of each evaluation, so its figures are
estimates of the whole set: the index and metrics over the part it was asked (a random sample; the
questions not asked are not answers at all, neither missing nor failed: each evaluation block's
``n`` is the tasks asked, of the ``populations`` of the run's block), and beside them, the
whole-set estimate with its anytime-valid 95% interval at stopping (``scoring.sequential``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from .records import UNSET, ModelEntry, Summary

if TYPE_CHECKING:
    from .scored import Scored

# before a figure of a model an adaptive run asked part of the set: an estimate of the whole set
MARK = "≈"
# the interval cell of a model whose figures are over the whole set (``mark_exact``)
EXACT = "exact: whole set scored"
# what the ≈ figures' intervals, ranks and comparisons are (``note``; ``headline``;
# ``scoring.stopped_pairs``)
VALID_AFTER_STOPPING = (
    "Their 95% intervals are the anytime-valid ones, which hold although the run chose when to "
    "stop, and their rank intervals and tied groups cover them; a pair with such a model claims "
    "a difference only where both the anytime-valid interval of its index difference leaves 0 out "
    "(the order on the whole set, valid after stopping) and its ordinary p-value over the "
    "questions asked separates it (the claim beyond the set every other pair makes), and no "
    "difference of a metric. "
)
HEADERS = ("model", "asked", "whole-set index", "anytime 95% interval", "stopped by", "round")


def is_adaptive(summary: Summary) -> bool:
    """Whether ``summary`` is an adaptive run's (it has the top-level ``adaptive`` block)."""
    return summary.adaptive is not UNSET and summary.adaptive is not None


def rerun_command(until: str | None, seed: int) -> str:
    """The command that continues an adaptive run, as `dxi run ... --until precision=2` (with
    ``--seed S`` for a seed other than 0; ``--until ...`` when the rule is not known)."""
    return f"`dxi run ... --until {until or '...'}{f' --seed {seed}' if seed else ''}`"


# how an evaluation block's hint names an adaptive run that did not finish
# (``runner.outputs.adaptive.Unfinished.hint``: "... (`dxi run ... --until precision=2`) continues
# it")
UNFINISHED = "rerunning the adaptive run that did not finish"


def continued_by(reason: object) -> str | None:
    """The command continuing the adaptive run that did not finish that an evaluation block's
    ``reason`` names (its hint, ``UNFINISHED``), or None."""
    if not isinstance(reason, str) or f"{UNFINISHED} (" not in reason:
        return None
    return reason.split(f"{UNFINISHED} (", 1)[1].split(") continues it", 1)[0]


def unsettled(summary: Summary) -> str | None:
    """The line ``dxi score`` and ``dxi report`` print when an adaptive run ended with models its
    rule had not settled (the cost bound, a provider stop): "2 models were not settled when the
    adaptive run ended (--until precision=5; a, b): rerunning the same `dxi run ... --until
    precision=5` command continues them (with a higher --max-cost, if the cost bound stopped it);
    until then their figures are estimates over what they were asked". None when every model it
    ran was settled, or ``summary`` is no adaptive run's."""
    if not is_adaptive(summary):
        return None
    left = [
        m.model
        for m in summary.models
        if m.adaptive is not UNSET and m.adaptive and not m.adaptive.get("settled", True)
    ]
    if not left:
        return None
    groups: dict[tuple[str | None, int], list[str]] = {}  # (until, seed) -> its models left
    for label in left:
        run = run_of(summary, label)
        groups.setdefault((run.get("until"), run.get("seed") or 0), []).append(label)
    one = len(left) == 1
    if len(groups) == 1:
        ((until, seed),) = groups
        what = (
            f"(--until {until}; {_some(left)}): rerunning the same {rerun_command(until, seed)} "
            f"command continues {'it' if one else 'them'}"
        )
    else:  # models of several adaptive runs (``runner.outputs.adaptive.attach``): each its own
        what = (
            "("
            + "; ".join(
                f"--until {until}: {_some(models)}" for (until, _), models in groups.items()
            )
            + "): rerunning the same command continues each ("
            + "; ".join(
                f"{rerun_command(until, seed)} for {_some(models)}"
                for (until, seed), models in groups.items()
            )
            + ")"
        )
    return (
        f"{len(left)} model{' was' if one else 's were'} not settled when the adaptive "
        f"run{'s' if len(groups) > 1 else ''} ended {what} (with a higher --max-cost, if the cost "
        f"bound stopped {'it' if len(groups) == 1 else 'one'}); until then "
        f"{'its' if one else 'their'} figures are estimates over what "
        f"{'it was' if one else 'they were'} asked"
    )


def _some(models: Sequence[str]) -> str:
    """At most three of ``models`` named, then "and N more"."""
    return ", ".join(models[:3]) + (f" and {len(models) - 3} more" if len(models) > 3 else "")


def run_of(summary: Summary, label: str) -> dict:
    """The top ``adaptive`` block of the run that asked ``label``: its entry of ``runs`` when the
    summary holds the models of several runs (``runner.outputs.adaptive.attach``), else the top
    block itself."""
    for run in summary.adaptive.get("runs", ()):
        if label in run.get("models", ()):
            return run
    return summary.adaptive


def estimated(summary: Summary, entry: ModelEntry) -> bool:
    """Whether ``entry``'s figures are estimates of the whole set: it has an ``adaptive`` block and
    was asked fewer tasks of some evaluation than the set holds (the run's ``populations``). A
    model asked everything has exact figures."""
    block = entry.adaptive if entry.adaptive is not UNSET else None
    if not block or not is_adaptive(summary) or block.get("exact"):
        return False
    populations = summary.adaptive.get("populations", {})
    return any(n < populations.get(name, 0) for name, n in block.get("asked", {}).items())


def mark_exact(summary: Summary, cut: set[tuple[str, str]]) -> Summary:
    """``summary`` with each adaptive model's block marked ``"exact": true`` when its figures are
    over the whole set although the rule stopped asking before the end: no evaluation it was asked
    part of was cut (``cut``: the (label, evaluation) pairs ``asked_part`` cut), because the cache
    held the rest (an earlier run without ``--until``). Such a model is not an estimate
    (``estimated``): no ≈ mark, and its row shows the exact index (``rows``). The mark is removed
    from a block where it no longer holds (a block read back from the cache folder's record).
    Returns ``summary`` (its entries' blocks changed in place)."""
    if not is_adaptive(summary):
        return summary
    populations = summary.adaptive.get("populations", {})
    for m in summary.models:
        block = m.adaptive if m.adaptive is not UNSET else None
        if not block:
            continue
        short = [name for name, n in block.get("asked", {}).items() if n < populations.get(name, 0)]
        if short and not any((m.model, name) in cut for name in short):
            block["exact"] = True
        else:
            block.pop("exact", None)
    return summary


def note(summary: Summary) -> str | None:
    """The sentence that marks an adaptive run's figures as estimates of the whole set (None: not
    one; when no model's figures are estimates, ``estimated``, the sentence that says they are exact
    instead), e.g. "Adaptive run (--until precision=5, order seed 0, 4 rounds): a model stopped
    before the end was asked a random part of each evaluation, so its figures (marked ≈) are
    estimates of the whole set (...)". Scored over fewer evaluations than the run asked (the top
    block's ``not_scored``, ``runner.outputs.adaptive.scored_only``), it names those and says that
    no whole-set index is shown. Models of several runs (the top block's ``runs``, ``dxi score`` of
    a cache where models were last run under different rules) have each run described with its
    models: "Adaptive runs (2, each model's latest: --until precision=10, order seed 0, 3 rounds: a;
    --until precision=8, order seed 3, 4 rounds: b): ..."."""
    if not is_adaptive(summary):
        return None
    block = summary.adaptive
    runs = block.get("runs") or [block]
    described = [
        f"--until {run.get('until')}, order seed {run.get('seed')}, "
        + (
            f"{run['rounds']} round{'' if run['rounds'] == 1 else 's'}"
            if run.get("rounds")
            else "no round finished"
        )
        for run in runs
    ]
    head = (
        f"Adaptive run ({described[0]}): "
        if len(runs) == 1
        else f"Adaptive runs ({len(runs)}, each model's latest: "
        + "; ".join(
            f"{d}: {_some(run.get('models', []))}" for d, run in zip(described, runs, strict=True)
        )
        + "): "
    )
    left = block.get("not_scored")
    # scored over fewer evaluations than the run asked (``dxi score --evals``): no index
    fewer = (
        f"Not scored here: {', '.join(left)}, so no whole-set index is shown (the run's is over "
        "every evaluation it asked: its summary.json has it); each model's questions asked of the "
        "evaluations scored, and what stopped it:"
        if left
        else None
    )
    if len(runs) == 1 and not block.get("rounds"):  # the cost bound or a stop cut round 1
        return head + (
            "no model was asked a question yet, so none has figures; rerunning the same "
            f"{rerun_command(block.get('until'), block.get('seed') or 0)} command starts the "
            "sequence (with a higher --max-cost, if the cost bound stopped it). Each model:"
        )
    if not any(estimated(summary, m) for m in summary.models):
        return head + (
            "no model's figures are estimates: each model was asked the whole set, or the cache "
            "held the questions the rule stopped before, so its figures are exact, computed over "
            "the whole set. " + (fewer or "Each model's whole-set index:")
        )
    return (
        head + "a model stopped before the end was asked a "
        f"random part of each evaluation, so its figures (marked {MARK}) are estimates of the whole "
        "set, computed over the questions it was asked (a run without --until asks the others). "
        + VALID_AFTER_STOPPING
        + (fewer or "Each model's whole-set index with its anytime-valid 95% interval:")
    )


def asked_parts(summary: Summary) -> str | None:
    """The part of the set each model was scored over, in words, for a sentence about what was
    scored (the report's sample note): "m00: 61 tasks per evaluation; m50: the whole set" (per
    evaluation when the counts differ: "61 of hle_multichoice, 40 of when2call"); None when no
    model's figures are estimates (``estimated``)."""
    if not any(estimated(summary, m) for m in summary.models):
        return None
    out = []
    for m in summary.models:
        block = m.adaptive if m.adaptive is not UNSET else None
        if not block:
            continue
        asked = block.get("asked", {})
        if not estimated(summary, m):
            out.append(f"{m.model}: the whole set")
        elif len(set(asked.values())) == 1:
            out.append(f"{m.model}: {next(iter(asked.values()))} tasks per evaluation")
        else:
            out.append(f"{m.model}: " + ", ".join(f"{n} of {name}" for name, n in asked.items()))
    return "; ".join(out)


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def rows(summary: Summary) -> list[tuple[str, ...]]:
    """One row per model (``HEADERS``): its label, the questions asked ("132 of 200 (66%)"), the
    whole-set index estimate and its interval "[low, high]" (0-100, 1 decimal; "—" where unknown;
    for a model marked exact, ``mark_exact``: its index over the whole set and ``EXACT``),
    the rule that stopped it ("running" when none did) and the round after which it stopped ("—").
    """
    populations = summary.adaptive.get("populations", {}) if is_adaptive(summary) else {}
    total = sum(populations.values())
    out = []
    for m in summary.models:
        block = m.adaptive if m.adaptive is not UNSET else None
        if not block:
            continue
        asked = sum(block.get("asked", {}).values())
        share = f" ({100 * asked / total:.0f}%)" if total else ""
        index = block.get("index") or {}
        if block.get("exact"):  # scored over the whole set (``mark_exact``): its own index
            index = {"point": m.decision_index}
        interval = (
            EXACT
            if block.get("exact")
            else "—"
            if index.get("low") is None
            else f"[{_number(index['low'])}, {_number(index['high'])}]"
        )
        out.append(
            (
                m.model,
                f"{asked:,} of {total:,}{share}",
                _number(index.get("point")),
                interval,
                block.get("rule") or "running",
                "—" if block.get("round") is None else str(block["round"]),
            )
        )
    return out


def sentences(summary: Summary) -> list[str]:
    """The note and one sentence per model (``rows`` in words), for the report's banner and ``dxi
    view``'s overview; empty for a summary that is not an adaptive run's."""
    text = note(summary)
    if text is None:
        return []
    out = [text]
    for model, asked, point, interval, rule, round_ in rows(summary):
        stop = (
            "still running when the run ended"
            if rule == "running"
            else ("asked the whole set" if rule == "exhausted" else f"stopped by {rule}")
            + ("" if round_ == "—" else f" after round {round_}")
        )
        shown = f"({interval})" if interval == EXACT else interval
        figure = (
            "not shown"  # scored over fewer evaluations than the run asked (``note``)
            if point == "—" and (summary.adaptive or {}).get("not_scored")
            else f"{point} {shown}"
        )
        out.append(f"{model}: asked {asked}; whole-set index {figure}; {stop}.")
    return out


def asked_part(
    answers: pl.DataFrame, asked: Mapping[str, Mapping[str, Sequence[str]]], *, always: bool = False
) -> tuple[pl.DataFrame, set[tuple[str, str]]]:
    """``answers`` (``scoring.answers``'s frame, or any frame with ``label``, ``eval``, ``task_id``
    and ``status``) with each adaptive model cut to the part it was asked: ``asked`` maps a label
    -> evaluation -> the task ids it was asked (a prefix of the run's order). The rows of that label
    and evaluation outside the part (the questions never asked: ``missing`` answers) are dropped, so
    its figures are over the asked part, a random sample of the evaluation; a failed or missing
    answer *inside* the part stays (bounds, as for any run). Labels and evaluations not in ``asked``
    are left whole.

    Without ``always``, a (label, evaluation) whose every question outside the part has an answer
    in the cache (any status but ``missing``) is left whole too: a later run completed it (a run
    without ``--until``), and its figures are the ordinary ones. Returns the frame (rows in their
    order) and the (label, evaluation) pairs cut (those asked everything included: nothing to
    cut, their figures exact)."""
    wanted = {(label, name) for label, part in asked.items() for name in part}
    if not wanted or answers.is_empty():
        return answers, set()
    sep = "\x00"
    key = pl.concat_str(
        [pl.col(c).cast(pl.String) for c in ("label", "eval", "task_id")], separator=sep
    )
    pair = pl.concat_str([pl.col(c).cast(pl.String) for c in ("label", "eval")], separator=sep)
    inside = pl.Series(
        [
            sep.join((label, name, task_id))
            for label, part in asked.items()
            for name, ids in part.items()
            for task_id in ids
        ],
        dtype=pl.String,
    )
    flags = answers.select(
        pair.alias("pair"),
        key.is_in(inside.implode()).alias("inside"),
        (pl.col("status").cast(pl.String) != "missing").alias("got"),
    )
    candidates = pl.Series([sep.join(p) for p in sorted(wanted)], dtype=pl.String)
    flags = flags.with_columns(pl.col("pair").is_in(candidates.implode()).alias("covered"))
    if not always:  # completed: every question outside the part answered (a later run)
        outside = flags.filter(pl.col("covered") & ~pl.col("inside"))
        done = outside.group_by("pair").agg(pl.col("got").all()).filter(pl.col("got"))["pair"]
        flags = flags.with_columns(pl.col("covered") & ~pl.col("pair").is_in(done.implode()))
    cut = set(flags.filter(pl.col("covered"))["pair"].unique().to_list())
    keep = ~(flags["covered"] & ~flags["inside"])
    return answers.filter(keep), {tuple(p.split(sep, 1)) for p in cut}  # type: ignore[misc]


def _interval(figure: Mapping | None) -> list[float | None] | None:
    """``[low, high]`` of an ``adaptive`` block's ``{"point", "low", "high"}`` (None: unknown)."""
    if not figure or figure.get("low") is None or figure.get("high") is None:
        return None
    return [figure["low"], figure["high"]]


def _exact(value: float | None) -> dict | None:
    return None if value is None else {"point": value, "low": value, "high": value}


def headline(summary: Summary, scored: Scored) -> tuple[Summary, Scored]:
    """``summary`` and ``scored`` with the headline intervals of each model an adaptive run stopped
    before the end (``estimated``) made the ones valid after stopping: its ``decision_index_ci``
    and each metric's ``<metric>_ci`` (and the tables' ``_low``/``_high``) become the anytime-valid
    intervals of its ``adaptive`` block (null where the block has none: no fixed-sample interval
    is valid after the run chose when to stop), the fixed-sample ones over the asked part kept in
    the block's ``fixed_sample_ci`` ("index" and "<evaluation>.<metric>" -> [low, high]); every
    model's rank interval (``rank_ci``, ``rank_set``) is widened to cover the ranks those
    intervals allow (``_ranks``). A model marked ``exact`` (``mark_exact``) has its block's
    ``index`` and ``metrics`` made its whole-set figures, each interval of zero width, the
    estimates at stopping kept in ``estimate_at_stopping``. Unchanged for a summary that is no
    adaptive run's. The summary's entries are changed in place."""
    if not is_adaptive(summary):
        return summary, scored
    index_iv: dict[str, list | None] = {}  # label -> its headline index interval
    metric_iv: dict[tuple[str, str, str], list | None] = {}  # (label, eval, metric) -> interval
    for m in summary.models:
        block = m.adaptive if m.adaptive is not UNSET else None
        if not block:
            continue
        if block.get("exact"):
            block.setdefault(
                "estimate_at_stopping",
                {"index": block.get("index"), "metrics": block.get("metrics", {})},
            )
            if block.get("index") is not None:
                block["index"] = _exact(m.decision_index)
            block["metrics"] = {
                key: _exact(m.evals.get(key.split(".", 1)[0], {}).get(key.split(".", 1)[1]))
                for key in block.get("metrics", {})
            }
            continue
        if not estimated(summary, m):
            continue
        fixed: dict[str, list | None] = {"index": _unset(m.decision_index_ci)}
        if m.decision_index is not None and m.decision_index_ci is not UNSET:
            index_iv[m.model] = m.decision_index_ci = _interval(block.get("index"))
        figures = block.get("metrics", {})
        for name, ev in m.evals.items():
            for key in [k for k in ev if k.endswith("_ci") and ev[k] is not None]:
                metric = key[: -len("_ci")]
                if metric not in _INDEX_METRICS:
                    continue
                fixed[f"{name}.{metric}"] = ev[key]
                metric_iv[m.model, name, metric] = ev[key] = _interval(
                    figures.get(f"{name}.{metric}")
                )
        block["fixed_sample_ci"] = fixed
    if not index_iv and not metric_iv:
        return summary, scored
    return summary, _tables(_ranks(summary, scored), index_iv, metric_iv)


# the metrics an adaptive run's block estimates (``scoring.sequential``): the index's terms
_INDEX_METRICS = (
    "accuracy",
    "non_hallucination_rate",
    "f1_prompt_harm",
    "f1_response_refusal",
    "f1_response_harm",
    "mean_f1",
)


def _unset(value):
    return None if value is UNSET else value


def _ranks(summary: Summary, scored: Scored) -> Scored:
    """Every ranked model's ``rank_ci`` and ``rank_set`` (and the index table's ``rank_low``,
    ``rank_high``, ``rank_set_low``, ``rank_set_high``) widened to cover the ranks its headline
    index interval allows beside the others' (``headline``): at best 1 + the models whose interval
    lies wholly above its own, at worst the models less those whose interval lies wholly below.
    Never narrowed."""
    ranked = [
        m
        for m in summary.models
        if m.rank is not UNSET and m.decision_index is not None and _unset(m.decision_index_ci)
    ]
    spans: dict[str, tuple[int, int]] = {}
    for m in ranked:
        low, high = m.decision_index_ci
        if low is None or high is None:
            continue
        above = sum(
            1
            for o in ranked
            if o is not m and o.decision_index_ci[0] is not None and o.decision_index_ci[0] > high
        )
        below = sum(
            1
            for o in ranked
            if o is not m and o.decision_index_ci[1] is not None and o.decision_index_ci[1] < low
        )
        best, worst = 1 + above, len(ranked) - below
        for name in ("rank_ci", "rank_set"):
            span = _unset(getattr(m, name))
            if span and span[0] is not None and span[1] is not None:
                setattr(m, name, [min(span[0], best), max(span[1], worst)])
        spans[m.model] = (best, worst)
    groups = _groups(summary, scored)
    if groups and "tied_group" in scored.index.columns:
        scored = replace(
            scored,
            index=scored.index.with_columns(
                pl.col("label")
                .replace_strict(groups, default=pl.col("tied_group"), return_dtype=pl.Int64)
                .alias("tied_group")
            ),
        )
    if not spans or "rank_low" not in scored.index.columns:
        return scored
    best = pl.col("label").replace_strict(
        {k: v[0] for k, v in spans.items()}, default=None, return_dtype=pl.Int64
    )
    worst = pl.col("label").replace_strict(
        {k: v[1] for k, v in spans.items()}, default=None, return_dtype=pl.Int64
    )
    widen = [
        pl.min_horizontal(pl.col(c), best).alias(c)
        for c in ("rank_low", "rank_set_low")
        if c in scored.index.columns
    ] + [
        pl.max_horizontal(pl.col(c), worst).alias(c)
        for c in ("rank_high", "rank_set_high")
        if c in scored.index.columns
    ]
    return replace(scored, index=scored.index.with_columns(widen))


def _groups(summary: Summary, scored: Scored) -> dict[str, int]:
    """The tied groups (``tied_group``, ``Summary.ranking``) of the claims in force: the grouping of
    ``scoring.compare`` (``tied_groups``) fed each index pair's final ``significant`` (after
    ``scoring.stopped_pairs.claim``: the anytime-valid paired interval AND the fixed-sample test for
    a pair with a model whose figures are estimates, the test for two exact ones), parted only where
    the higher model's headline interval also lies wholly above the other's (so the groups never
    part what the rank sets tie). Returns label -> its new group (the entries and the ranking
    changed in place; empty when no group changed)."""
    from .compare import INDEX, tied_groups
    from .summary import ranking

    index = scored.index
    if "rank" not in index.columns or scored.comparisons.is_empty():
        return {}
    index = index.filter(pl.col("rank").is_not_null() & pl.col("decision_index").is_not_null())
    labels = index["label"].to_list()
    point = index["decision_index"].to_numpy()
    place = {label: k for k, label in enumerate(labels)}
    entries = {m.model: m for m in summary.models}
    a, b = [], []
    for r in scored.comparisons.filter(
        (pl.col("metric") == INDEX) & pl.col("eval").is_null() & pl.col("significant")
    ).iter_rows(named=True):
        if r["a"] not in place or r["b"] not in place:
            continue
        i, j = place[r["a"]], place[r["b"]]
        hi, lo = (i, j) if point[i] >= point[j] else (j, i)
        above, below = entries.get(labels[hi]), entries.get(labels[lo])
        if above is None or below is None:
            continue
        if not _overlap(_unset(above.decision_index_ci), _unset(below.decision_index_ci)):
            a.append(i)
            b.append(j)
    # in rank order (``compare.ranks``: a provisional index placed by its lowest bound)
    placed = -index["rank"].to_numpy().astype(np.float64)
    group = tied_groups(placed, np.array(a, np.int64), np.array(b, np.int64))
    new = {label: int(g) for label, g in zip(labels, group, strict=True)}
    if all(entries[label].tied_group == g for label, g in new.items() if label in entries):
        return {}
    for label, g in new.items():
        if label in entries:
            entries[label].tied_group = g
    summary.ranking = ranking(summary.models)
    summary.ranking.method += (
        "; an adaptive run's: rank_ci and rank_set widened to cover the ranks the anytime-valid "
        "index intervals allow, and groups parted only by the claims in force (a pair with a "
        "model whose figures are estimates: its anytime-valid paired interval and its fixed-sample "
        "test) where those intervals part too (scoring.adaptive.headline)"
    )
    return new


def _overlap(above: list | None, below: list | None) -> bool:
    """Whether the interval ``above`` does not lie wholly above ``below`` (unknown: overlapping
    is not claimed, the comparisons' groups stand)."""
    if not above or not below or above[0] is None or below[1] is None:
        return False
    return above[0] <= below[1]


def _tables(
    scored: Scored,
    index_iv: Mapping[str, list | None],
    metric_iv: Mapping[tuple[str, str, str], list | None],
) -> Scored:
    """``scored`` with the index and metrics tables' ``_low``/``_high`` of the figures
    ``headline`` changed set to their headline intervals."""
    index = scored.index
    if index_iv and "decision_index_low" in index.columns:
        for side, col in enumerate(("decision_index_low", "decision_index_high")):
            values = {k: (None if v is None else v[side]) for k, v in index_iv.items()}
            index = index.with_columns(
                pl.when(pl.col("label").is_in(list(values)))
                .then(pl.col("label").replace_strict(values, default=None, return_dtype=pl.Float64))
                .otherwise(pl.col(col))
                .alias(col)
            )
    metrics = scored.metrics
    for (label, name, metric), iv in metric_iv.items():
        where = (pl.col("label") == label) & (pl.col("eval") == name)
        for side, col in enumerate((f"{metric}_low", f"{metric}_high")):
            if col in metrics.columns:
                metrics = metrics.with_columns(
                    pl.when(where)
                    .then(pl.lit(None if iv is None else iv[side], dtype=pl.Float64))
                    .otherwise(pl.col(col))
                    .alias(col)
                )
    return replace(scored, index=index, metrics=metrics)
