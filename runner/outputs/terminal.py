"""The terminal's tables: a run's or a scoring's summary (the Decision Index, rank, metrics, the
comparisons of adjacent ranks), usage and spend, latency and cost measures, and ``dxi estimate``'s
dry run, each fitted to the terminal's width (narrower variants, model keys and a legend when the
names do not fit). Printed by ``dxi run``, ``dxi score``, ``dxi report`` and ``dxi estimate``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from dxi.evals import EVALS
from dxi.scoring import adaptive, provisional
from dxi.scoring.measures import NO_CONFIDENCE
from dxi.scoring.missing import selection_flags
from dxi.scoring.records import UNSET, ModelEntry, Summary, unset
from dxi.scoring.replies import model_notes
from dxi.shown import shown

from . import amounts
from .history import batch_spend
from .legend import adjacent, index_legend


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _usd(value: float | None) -> str:
    return "—" if value is None else f"${value:.4f}"


# Terminal tables fit the terminal: each is built with long headers, then compact (short, two-line
# headers, no column rules), and the first whose natural width fits is printed. Model names are
# shown in full when the index table fits with them, else as keys M1, M2, ... with a legend under
# the index table (the same keys in every table of the summary).
Column = tuple[str, str, str]  # (long header, short header, justify)
Rows = list[tuple[list[str], str | None]]  # (cells, style)


def _table(title: str, headers: list[str], justify: list[str], rows: Rows, compact: bool) -> Table:
    table = Table(
        title=title,
        title_style="bold",
        box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD,
        collapse_padding=compact,
        pad_edge=not compact,
        show_edge=not compact,
    )
    for header, j in zip(headers, justify, strict=True):
        table.add_column(header, justify=j)
    for cells, style in rows:
        table.add_row(*cells, style=style)
    return table


def _variants(title: str, columns: list[Column], rows: Rows) -> list[Table]:
    justify = [c[2] for c in columns]
    return [
        _table(title, [c[0] for c in columns], justify, rows, False),
        _table(title, [c[1] for c in columns], justify, rows, True),
    ]


def _fitted(console: Console, tables: list[Table | Group]) -> Table | Group:
    """The first of ``tables`` that fits the terminal, else the last (Rich then wraps its cells)."""
    return next((t for t in tables if _fits(console, t)), tables[-1])


def model_keys(names: list[str], console: Console, fits: Callable[[list[str]], bool]) -> list[str]:
    """The labels the tables show: the names themselves when ``fits(names)``, else M1, M2, ..."""
    return names if fits(names) else [f"M{i}" for i in range(1, len(names) + 1)]


def _legend(console: Console, names: list[str], keys: list[str]) -> None:
    if keys != names:
        for key, name in zip(keys, names, strict=True):
            console.print(f"  {key} = {name}", highlight=False, markup=False)


def print_usage(summary: Summary, console: Console, keys: list[str] | None = None) -> None:
    """Tokens and cost per model (of the answers scored, from the cache) and for the run; a model
    that costs nothing (price 0) shows "free"; this run's spend that includes reservations kept
    for replies of unknown cost (``cost_at_reservation_usd``) shows "at most", one that no
    reservation bounds "—" and its reason."""
    if summary.usage is UNSET:
        return
    keys = keys or summary.labels
    columns = [
        ("model", "model", "left"),
        ("requests", "requests", "right"),
        ("input tokens", "input\ntokens", "right"),
        ("output tokens", "output\ntokens", "right"),
        ("cost", "cost", "right"),
        ("this run", "this\nrun", "right"),
    ]
    rows = []
    for key, m in zip(keys, summary.models, strict=True):
        u = unset(m.usage) or {}
        spent = _usd((m.requests or {}).get("cost_usd"))
        if (m.requests or {}).get("cost_at_reservation_usd"):  # the cost unknown: its reservation
            spent = f"at most {spent}"
        free = u.get("price") == {"input": 0.0, "output": 0.0}
        rows.append(
            (
                [
                    escape(key),
                    str(u.get("requests", 0)),
                    f"{u.get('input_tokens', 0):,}",
                    f"{u.get('output_tokens', 0):,}",
                    "free" if free else _usd(u.get("cost_usd")),
                    "free" if free else spent,
                ],
                None,
            )
        )
    run = summary.usage
    all_free = all(
        (unset(m.usage) or {}).get("price") == {"input": 0.0, "output": 0.0} for m in summary.models
    )
    rows.append(
        (
            [
                "all",
                str(run["requests"]),
                f"{run['input_tokens']:,}",
                f"{run['output_tokens']:,}",
                "free" if all_free else _usd(run["cost_usd"]),
                "",
            ],
            "bold",
        )
    )
    console.print(
        _fitted(
            console,
            _variants("Usage (the scored answers' requests, from the cache)", columns, rows),
        )
    )
    if run.get("cost_reason"):
        console.print(escape(f"  cost: {run['cost_reason']}"))
    for key, m in zip(keys, summary.models, strict=True):  # this run's cost, where unknown
        if (m.requests or {}).get("cost_reason"):
            console.print(escape(f"  this run, {key}: {m.requests['cost_reason']}"))
        for line in batch_spend(m.requests or {}):  # batches across runs (runner.outputs.history)
            console.print(escape(f"  this run, {key}: {line}"), highlight=False)


def _seconds(value: float | None) -> str:
    """Seconds as the measures table prints them: three decimals below 1 s (a local model's
    milliseconds)."""
    return "—" if value is None else f"{value:.3f}" if value < 1 else f"{value:.2f}"


def print_measures(summary: Summary, console: Console, keys: list[str] | None = None) -> None:
    """One row per model, every evaluation pooled (``scoring.measures``): latency p50 and p95 per
    call (seconds; batch answers left out), the cost of 1,000 decisions, AURC and accuracy at
    confidence ≥ 0.9 with the share it covers. Per evaluation: summary.json, the report and ``dxi
    view``."""
    if not any(unset(m.measures) for m in summary.models):
        return
    keys = keys or summary.labels
    columns = [
        ("model", "model", "left"),
        ("p50 s", "p50\ns", "right"),
        ("p95 s", "p95\ns", "right"),
        ("$ / 1k decisions", "$ per 1k\ndecisions", "right"),
        ("AURC", "AURC", "right"),
        ("acc @ conf ≥ 0.9 (coverage)", "acc@0.9\n(cov.)", "right"),
    ]
    rows: Rows = []
    for key, m in zip(keys, summary.models, strict=True):
        x = unset(m.measures) or {}
        lat, rc = x.get("latency") or {}, x.get("risk_coverage")
        cost = x.get("cost_per_1000_decisions_usd")
        at = next((a for a in rc["at"] if a["tau"] == 0.9), None) if rc else None
        conf = (
            ("no conf." if x.get("risk_coverage_reason") == NO_CONFIDENCE else "—")
            if rc is None
            else f"{_fmt(at['accuracy'])} ({100 * at['coverage']:.0f}%)"
            if at
            else "—"
        )
        rows.append(
            (
                [
                    escape(key),
                    _seconds(lat.get("p50_s")),
                    _seconds(lat.get("p95_s")),
                    "—" if cost is None else f"${cost:.4f}",
                    "—" if rc is None else f"{rc['aurc']:.3f}",
                    conf,
                ],
                None,
            )
        )
    title = "Measures (every evaluation pooled; per evaluation in summary.json and the report)"
    console.print(_fitted(console, _variants(title, columns, rows)))
    pooled = [unset(m.measures) or {} for m in summary.models]
    batch = sum(x.get("latency", {}).get("batch_excluded", 0) for x in pooled)
    if batch:
        console.print(
            f"  latency: {batch} answer call(s) from provider batches are left out (a "
            "batch's time is not a per-call latency)"
        )
    if any(x.get("risk_coverage_reason") == NO_CONFIDENCE for x in pooled):
        console.print(
            "  no conf.: the model's answers carry no probability (structured outputs): "
            "no risk-coverage figures"
        )


def print_estimate(doc: dict, console: Console) -> None:
    """The dry run (``runner.planning.estimate``) as a table, then why requests are new, the totals
    and the cost bound, if any."""
    names = [m["model"] for m in doc["models"]]
    columns = [
        ("model", "model", "left"),
        ("requests", "requests", "right"),
        ("cached", "cached", "right"),
        ("new", "new", "right"),
        ("input tokens", "input\ntokens", "right"),
        ("output tokens", "output\ntokens", "right"),
        ("cost", "cost", "right"),
        ("at most", "at\nmost", "right"),
    ]

    def cells(label: str, m: dict) -> list[str]:
        counts = [str(m[c]) for c in ("requests", "cached", "new")]
        tokens = [f"{m[c]:,}" for c in ("input_tokens", "output_tokens")]
        return [label, *counts, *tokens, _usd(m["cost_usd"]), _usd(m["bound_usd"])]

    def rows(keys: list[str]) -> Rows:
        out = [(cells(escape(k), m), None) for k, m in zip(keys, doc["models"], strict=True)]
        return out + [(cells("all", doc["total"]), "bold")]

    title = "Estimate: what `dxi run` would send (nothing was sent)"
    keys = model_keys(
        names,
        console,
        lambda ks: any(_fits(console, t) for t in _variants(title, columns, rows(ks))),
    )
    t = doc["total"]
    console.print(_fitted(console, _variants(title, columns, rows(keys))))
    _legend(console, names, keys)
    for m in doc["models"]:
        if m["new"]:
            why = ", ".join(f"{r} ({n})" for r, n in m["reasons"].items())
            console.print(escape(f"  {m['model']}: new because: {why}"), highlight=False)
        notes = [  # requests of batches: one the provider may not have, those it holds
            "batch not confirmed: a run was killed before it recorded the provider's reply to its "
            "create, so the batch may exist; the next run asks the provider, collects that batch if "
            "it was made and sends only what it did not get (cost and at most may overstate)"
        ] * bool(m["reasons"].get("batch not confirmed"))
        if m.get("in_open_batches"):
            notes.append(
                f"in open batches {m['in_open_batches']} (collected by the next run; paid when "
                "their batch ends; not new, not in cost or at most)"
            )
        for note in notes:
            console.print(escape(f"  {m['model']}: {note}"), highlight=False)
        if m.get("cost_reason"):
            console.print(escape(f"  {m['model']}: {m['cost_reason']}"))
        if m["new"]:
            console.print(
                escape(
                    f"  {m['model']}: tokens: "
                    + ", ".join(f"{b} ({n})" for b, n in m["basis"].items())
                )
            )
    console.print(
        "Tokens and cost are expected values (estimated from the request bytes and the usage the cache "
        'has seen); "at most" is what the cost bound reserves for them: the most they can cost.'
    )
    if any("thinking prior" in b for m in doc["models"] for b in m.get("basis", {})):
        console.print(
            "A thinking model's output, until its usage at these parameters is cached, is "
            "the prior of its effort level: the project's own assumption (docs: Estimates), "
            "not a provider's figure."
        )
    for problem in doc.get("problems", {}).values():
        console.print(f"[yellow]dxi run will refuse to start[/]: {escape(problem)}")
    for key, lead in (
        ("unreachable", "cannot be reached now"),
        ("serves_another_model", "serves another model"),
    ):
        for label, why in doc.get(key, {}).items():
            console.print(
                f"[yellow]{lead}[/]: {escape(why)}. dxi run would stop the provider of "
                f"{escape(label)} (exit code 6) and run the others."
            )
    if doc.get("batch"):
        batch = doc["batch"]
        console.print(
            escape(
                f"--batch: {', '.join(batch['models']) or 'no model'} priced at the batch rate"
                + (
                    f"; {', '.join(batch['synchronous'])} have no batch API (their own price)"
                    if batch["synchronous"]
                    else ""
                )
            ),
            highlight=False,
        )
    bound = doc.get("max_cost_usd")
    if bound is not None:
        if t["bound_usd"] is not None and t["bound_usd"] <= bound:
            console.print(
                f"max_cost {amounts.usd(bound)}: the new requests cannot pass it; the run will complete."
            )
        else:
            console.print(
                f"[yellow]max_cost {amounts.usd(bound)}[/]: the run may stop at the bound before it completes "
                f"(expected cost {_usd(t['cost_usd'])}, at most {_usd(t['bound_usd'])}); rerun with a higher "
                "bound to continue."
            )


def _fits(console: Console, table: Table | Group) -> bool:
    """Whether ``table`` at its natural width (nothing wrapped) fits the terminal."""
    return (
        Measurement.get(console, console.options.update_width(10_000), table).maximum
        <= console.width
    )


INDEX_COLUMNS: list[Column] = [
    ("model", "model", "left"),
    ("index", "index", "right"),
    ("95% CI", "95% CI", "right"),
    ("rank [95% CI]", "rank", "right"),
    ("Omni acc", "Omni\nacc", "right"),
    ("Omni non-halluc", "Omni\nnon-hall.", "right"),
    ("HLE acc", "HLE\nacc", "right"),
    ("When2Call acc", "When2Call\nacc", "right"),
    ("WildGuard F1", "WildGuard\nF1", "right"),
    ("invalid", "inv.", "right"),
    ("repaired", "rep.", "right"),
    ("failed", "fail.", "right"),
    ("missing", "miss.", "right"),
]


def _index_tables(summary: Summary, keys: list[str]) -> list[Table | Group]:
    """The index table's variants, widest first: the third shows invalid/repaired/failed(/missing)
    in one column; the narrowest moves the rank column into a small table of its own under it. The
    missing answers' column only where a model has some (a complete run's table is as it was)."""
    rows = _index_rows(summary, keys)
    n = len(INDEX_COLUMNS) - all(cells[-1] == "0" for cells, _ in rows)  # no missing: no column
    columns, rows = INDEX_COLUMNS[:n], [(cells[:n], style) for cells, style in rows]
    merged = [(cells[:9] + ["/".join(cells[9:])], style) for cells, style in rows]
    justify = [c[2] for c in columns]
    headers = [c[1] for c in columns[:9]] + ["inv/rep\n/fail" + "\n/miss" * (n > 12)]
    without = [0, 1, 2, *range(4, 10)]  # every column but the rank
    split = Group(
        _table(
            "Decision Index",
            [headers[i] for i in without],
            [justify[i] for i in without],
            [([cells[i] for i in without], style) for cells, style in merged],
            True,
        ),
        _table(
            "Rank",
            ["model", "rank [95% CI]"],
            ["left", "right"],
            [([cells[0], cells[3]], style) for cells, style in merged],
            True,
        ),
    )
    return _variants("Decision Index", columns, rows) + [
        _table("Decision Index", headers, justify[:10], merged, True),
        split,
    ]


def _rank(m: ModelEntry) -> str:
    """A model's rank by the index with its 95% interval over the resamples: "2 [1–3]" (— without
    one); "2* [1–3]" (``provisional.MARK``) when its index is provisional, as the index is marked:
    a rank by its lowest bound (its interval covers every rank the index's bounds allow)."""
    if unset(m.rank) is None:
        return "—"
    low, high = m.rank_ci
    return f"{m.rank}{'' if m.complete else provisional.MARK} [{low}–{high}]"


def _marked(value: float | None, incomplete: bool, estimate: bool = False) -> str:
    """A figure as the tables print it, marked when it is provisional (``provisional.MARK`` after
    it) and when it is an adaptive run's estimate of the whole set (``adaptive.MARK`` before it: the
    model was asked part of the set); a null one is never marked."""
    if value is None:
        return _fmt(value)
    return (
        (adaptive.MARK if estimate else "") + _fmt(value) + (provisional.MARK if incomplete else "")
    )


def _index_rows(summary: Summary, keys: list[str]) -> Rows:
    rows = []
    for key, m in zip(keys, summary.models, strict=True):
        e = m.evals
        invalid = sum(b.get("invalid", 0) for b in e.values())
        failed = sum(b.get("failed", 0) for b in e.values())
        missing = sum(b.get("missing", 0) for b in e.values())  # not answered: not failed either
        repaired = sum(b.get("repaired", 0) for b in e.values())
        ci, sd = unset(m.decision_index_ci), unset(m.decision_index_sd)
        estimate = adaptive.estimated(summary, m)
        index = _marked(m.decision_index, not m.complete, estimate) + (
            f" ±{sd:.1f} sd" if sd is not None else ""
        )

        def cell(name: str, metric: str, e: dict = e, estimate: bool = estimate) -> str:
            return _marked(e[name].get(metric), e[name].get("complete") is False, estimate)

        rows.append(
            (
                [
                    escape(key),
                    index,
                    f"[{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "—",
                    _rank(m),
                    cell("aa_omniscience_decision", "accuracy"),
                    cell("aa_omniscience_decision", "non_hallucination_rate"),
                    cell("hle_multichoice", "accuracy"),
                    cell("when2call", "accuracy"),
                    cell("wildguardtest", "mean_f1"),
                    str(invalid),
                    str(repaired),
                    str(failed),
                    str(missing),
                ],
                None,
            )
        )
    return rows


def print_adaptive(summary: Summary, console: Console, keys: list[str] | None = None) -> None:
    """An adaptive run's note and table (``scoring.adaptive``): each model's questions asked,
    whole-set index estimate with its anytime-valid interval, and the rule and round that stopped
    it; nothing for another run."""
    text = adaptive.note(summary)
    if text is None:
        return
    console.print(f"[yellow]{escape(text)}[/]")
    key_of = dict(zip(summary.labels, keys or summary.labels, strict=True))
    rows: Rows = [([key_of.get(r[0], r[0]), *r[1:]], None) for r in adaptive.rows(summary)]
    columns = [(h, h, "left" if i in (0, 4) else "right") for i, h in enumerate(adaptive.HEADERS)]
    title = (
        "Adaptive run: estimates of the whole set"
        if any(adaptive.estimated(summary, m) for m in summary.models)
        else "Adaptive run: exact figures over the whole set"
    )
    console.print(_fitted(console, _variants(title, columns, rows)))


def print_summary(
    summary: Summary, console: Console, out: Path | None = None, ranked: bool = False, shard=None
) -> None:
    """The index table (fitted to the terminal: long or short headers, full model names or keys with
    a legend), then what data was used and anything the reader must know (once per model: another
    model served it, replies cut off at the token limit, a clamp of P(yes):
    ``scoring.replies.model_notes``). The index's 95% interval has a column of its own; with several
    epochs the index shows ± its standard deviation over epochs (sd). Every table has the models in
    the report's order (``Summary.order``; ``ranked``: no order was given, by Decision Index). A
    ``shard`` ("1/3") is told of its own part, not of the other shards' missing answers."""
    summary = summary.ordered(ranked)
    names = summary.labels
    keys = model_keys(
        names, console, lambda ks: any(_fits(console, t) for t in _index_tables(summary, ks))
    )
    console.print(_fitted(console, _index_tables(summary, keys)))
    _legend(console, names, keys)
    console.print(index_legend(summary), highlight=False, markup=False)
    groups = summary.ranking.groups if summary.ranking else []
    if sum(map(len, groups)) > 1:
        key_of = dict(zip(names, keys, strict=True))
        named = " > ".join("{" + ", ".join(key_of[m] for m in g) + "}" for g in groups)
        console.print(
            "Ranked by Decision Index in statistically tied groups (max-T step-down over "
            "every pair, adjusted p < 0.05"
            + (
                "; an adaptive run's estimates parted only where their anytime-valid paired "
                "intervals and their own intervals part too"
                if any(adaptive.estimated(summary, m) for m in summary.models)
                else ""
            )
            + f"): {named}"
            + adjacent(summary, [m for g in groups for m in g], key_of),
            markup=False,
        )
    print_adaptive(summary, console, keys)
    console.print("Data used:")
    for name, d in summary.data.items():
        title = EVALS[name].title
        if "missing" in d:
            console.print(f"  {title}: [yellow]none[/] ({escape(d['missing'])})")
            continue
        f = d["files"][0]
        extra = f", subset {d['subset']}" if "subset" in d else ""
        extra += f", limit {d['limit']}" if "limit" in d else ""
        extra += (
            f", sample {d['sample']['tasks']} (seed {d['sample']['seed']})" if "sample" in d else ""
        )
        extra += f", the union of {selection_flags(d)}" if "union" in d else ""
        excluded = d.get("excluded") or {}
        if excluded:
            extra += f", {excluded['matched']} of {excluded['listed']} excluded ids matched"
        console.print(
            f"  {title}: {d['tasks']} tasks from {escape(f['path'])} "
            f"({f['rows']} rows, sha256 {f['sha256'][:12]}…{extra})"
        )
        if d.get("stand_in"):
            console.print(f"    [yellow]stand-in:[/] {d['note']}")
        elif d.get("note"):
            console.print(f"    [yellow]note:[/] {d['note']}")
        if excluded and excluded["matched"] < excluded["listed"]:
            console.print(
                f"    [yellow]{excluded['listed'] - excluded['matched']} excluded id(s) matched no task[/]"
                + (
                    " read (with --limit only the first tasks are read)"
                    if "limit" in d
                    else ": check the ids in the exclusion list"
                )
            )
    for line in (
        provisional.notes(summary) if shard is None else provisional.shard_notes(summary, shard)
    ):
        console.print(f"  [yellow]{escape(line)}[/]")
    for m in summary.models:
        if m.decision_index_reason:
            console.print(
                f"  [yellow]{escape(m.model)}: index {escape(m.decision_index_reason)}[/]"
            )
        for name, block in m.evals.items():
            if block.get("reason") and "no data" not in block["reason"] and shard is None:
                console.print(
                    f"  [yellow]{escape(m.model)} {EVALS[name].title}: {escape(block['reason'])}[/]"
                )
        ties = sum(b.get("ties", 0) for b in m.evals.values())
        if ties:
            console.print(
                f"  {escape(m.model)}: {ties} pick(s) decided by a tie of the highest probabilities "
                "(scored: the returned choice when tied, else the first tied option in option order)"
            )
        rounded = sum(b.get("rounded", 0) for b in m.evals.values())
        if rounded:
            console.print(
                f"  {escape(m.model)}: {rounded} answer(s) with probabilities rounded to "
                "fewer than 4 decimals, accepted as their sum is within N × ½ × 10^-k of 1 "
                "(a `rounded` warning)"
            )
        for note in model_notes(m):
            console.print(f"  [yellow]{escape(m.model)}: {escape(note)}[/]")
        if m.invalid_reasons:
            n = sum(b.get("invalid", 0) for b in m.evals.values())
            console.print(
                f"  [yellow]{escape(m.model)}: {n} invalid answer(s)[/] (scored as wrong; all in "
                "answers.parquet). Most frequent reasons:"
            )
            for r in m.invalid_reasons:
                text = r["error"] if len(r["error"]) <= 200 else r["error"][:200] + "…"
                text = shown(text)  # the model's words, from the cache
                console.print(f"    {r['count']} × {text}", highlight=False, markup=False)
    print_usage(summary, console, keys)
    print_measures(summary, console, keys)
    written = f"; written to {out}/summary.json and {out}/answers.parquet" if out else ""
    made = unset(summary.provenance) or {}
    git = made.get("git")
    by = (
        f"; dxi {made['dxi_version']}"
        + (f" at {git['commit'][:12]}{' (modified)' if git['dirty'] else ''}" if git else "")
        if made
        else ""
    )
    console.print(escape(f"Prompt version {summary.prompt_version}{by}{written}"))
