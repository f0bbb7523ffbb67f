"""``dxi estimate``: a dry run that sends nothing. Per model: the requests not yet cached (and how
many are), why each is new, and their expected tokens and cost, plus the most they can cost (the
cost bound's reservations, ``runner.sending.cost``).

Requests are encoded exactly as ``dxi run`` would encode them and looked up in the cache by key, so
the count of new requests is exact. Why a request is new is told by comparing it with the cache's
rows, in this order: ``batch not confirmed`` (below), ``failed before`` (its last attempt failed
transiently: sent again), ``another model answered`` (its cached reply names another model than the
System One model asked for: set aside, ``dxi.served.served_by_other``), ``retry requested``
(``--retry-invalid`` / ``--retry-failed``), ``set aside as damaged`` (its row was in a shard the
cache found damaged and set aside in ``quarantine/``: ``Cache.set_aside``), ``new model`` (no row of
this adapter and model), ``new parameters`` (none with these sampling parameters),
``new prompt version``, ``new epoch`` (the task is cached under another epoch only),
``changed task`` (the task id is cached with other content), ``other endpoint`` (the same task and
epoch is cached under another URL or request bytes), ``NOT_IN_CACHE`` (this model, with these
parameters, has answers of the evaluation in the cache but not this task: a run stopped before it,
Ctrl-C or the cost bound, or ran a smaller ``--limit`` / ``--sample``; or a run sent it and was
killed, or crashed, before it stored the reply: the cache cannot tell), ``new evaluation`` (the
rest: the model has no answer of the evaluation yet).

A request not cached that an open batch holds (submitted by an earlier ``dxi run --batch`` that was
killed or interrupted: ``held``, the keys ``runner.open_batches.held`` reads from the cache's batch
ledger) is not new when the provider accepted that batch: the next run collects its result from it
and sends it nowhere, and it is paid when the batch ends, whatever this run's bound. It is counted
apart (``in_open_batches``), not priced in the expected cost nor in ``bound_usd``, and has no
reason. One whose batch was recorded but not the provider's reply to its create (a kill in between,
before or after the create) may or may not be at the provider (the next run asks it: found,
collected; not found, sent): it stays new, priced, so ``at most`` stays a bound, its reason
``batch not confirmed`` (before all others).

Expected tokens (``runner.planning.tokens.TokenEstimate``): input = request bytes / 4 × the
tokens-per-byte ratio that the cache's replies of the same model and evaluation reported, else those
of the adapter's other models on that evaluation, else 1; output = their mean reported output, else
``runner.planning.tokens.prior_output``. Only replies that counted their tokens teach a ratio
(``scoring.cost.COUNTED``): one that reports 0 input tokens comes from a server that counts none
(``sparrow-decider serve``), not from a free request, so it teaches nothing, for its model or
another; with nothing else cached the estimate is bytes / 4, and ``basis`` says why, of the model's
own replies (``NOT_COUNTED``) or of the others' (``OTHERS_NOT_COUNTED``). A model that thinks (an
effort level, or a Claude model that thinks by default: ``runner.planning.tokens.thinking_effort``)
spends most of its output thinking, and how much depends on its level: its output is the mean that
its own replies at these parameters (effort included) reported, else the level's prior
(``runner.planning.tokens.THINKING_PRIOR``, capped by the request's output cap); never other models'
or other levels' usage. ``basis`` says which.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

import polars as pl

from dxi.adapters import ProviderStop
from dxi.cache import Cache
from dxi.cache.index import SET_ASIDE
from dxi.evals import PROMPT_VERSION, Suite
from dxi.scoring import cost_usd
from dxi.scoring.cost import COUNTED, max_input_price

from .plan import ModelRun, Plan
from .shard import Shard
from .tokens import TokenEstimate, input_bound, prior_output, thinking_effort, thinking_prior


async def unreachable(models: Sequence[ModelRun]) -> dict[str, ProviderStop]:
    """The models whose server cannot be reached now, or serves another model than the one named (a
    System One server's ``GET /health``: cause ``SERVED``), label -> the stop ``dxi run`` would meet
    (``Adapter.check_reachable``: a connection opened and closed each, all at once, nothing sent):
    ``dxi run`` would stop their providers and run the others."""

    async def why(model: ModelRun) -> ProviderStop | None:
        try:
            await model.adapter.check_reachable()
        except ProviderStop as stop:
            return stop
        return None

    found = await asyncio.gather(*(why(m) for m in models))
    return {m.adapter.label: w for m, w in zip(models, found, strict=True) if w is not None}


# this model has answers of the evaluation in the cache, not this task's: the cache cannot tell a
# request never sent from one a run sent and was stopped (a kill -9, a crash) before it stored the
# reply (perhaps billed): said as both (it said "not sent yet", untrue of the second)
NOT_IN_CACHE = "not in the cache (never sent, or sent by a run stopped before storing its reply)"
REASONS = (
    "batch not confirmed",
    "failed before",
    "another model answered",
    "retry requested",
    "set aside as damaged",
    "new model",
    "new parameters",
    "new prompt version",
    "new epoch",
    "changed task",
    "other endpoint",
    NOT_IN_CACHE,
    "new evaluation",
)
BATCH = 256
# a request not cached, its tokens scaled from the usage this model's cached replies of its
# evaluation recorded (input: their tokens per request byte; output: their mean): an estimate, not
# the recorded usage of a cached reply (what `dxi plan` calls "recorded by its cached replies")
OWN_USAGE = "estimated from this model's cached usage"
NO_USAGE = "bytes / 4 (no usage in the cache yet)"
# the model's own cached replies of the evaluation (and the adapter's others') all reported 0
# tokens: nothing learned from them
NOT_COUNTED = "bytes / 4 (this model's cached replies reported 0 tokens: a server that counts none)"
# the model has no reply of the evaluation that reported usage, and the adapter's other models'
# replies there all reported 0 tokens: the reason is theirs, said as theirs
OTHERS_NOT_COUNTED = (
    "bytes / 4 (no usage of this model in the cache yet; other {kind} models' cached replies "
    "reported 0 tokens: a server that counts none)"
)


@dataclass
class Estimate:
    """One model's dry run. Token counts are expected values (floats); ``cost_usd`` is their cost
    (None without a price, see ``cost_reason``); ``bound_usd`` is the most the new requests can cost
    (None when nothing caps the output tokens); ``basis`` says where the token figures come from.
    ``in_open_batches``: requests not cached that open batches hold (not new, not priced)."""

    model: str
    requests: int = 0
    cached: int = 0
    new: int = 0
    in_open_batches: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    input_tokens: float = 0.0
    output_tokens: float = 0.0
    cost_usd: float | None = None
    bound_usd: float | None = None
    cost_reason: str | None = None
    basis: dict[str, int] = field(default_factory=dict)
    evals: dict[str, dict] = field(default_factory=dict)
    eval_basis: dict[str, dict[str, int]] = field(default_factory=dict)  # basis per evaluation
    # ``estimate(cached_too=True)``: ``evals`` and ``eval_basis`` of the requests the cache holds,
    # estimated as if new (``dxi plan``'s tokens of an evaluation whose cached replies counted none)
    cached_evals: dict[str, dict] = field(default_factory=dict)
    cached_eval_basis: dict[str, dict[str, int]] = field(default_factory=dict)
    # ``dxi plan``: per evaluation, task id -> its requests not new (cached, or held by an open
    # batch the provider accepted), and the new requests' expected (input, output) tokens unrounded
    not_new: dict[str, dict[str, int]] = field(default_factory=dict)
    new_tokens: dict[str, tuple[float, float]] = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {
            k: getattr(self, k)
            for k in ("model", "requests", "cached", "new", "in_open_batches", "reasons")
        }
        out |= {
            "input_tokens": round(self.input_tokens),
            "output_tokens": round(self.output_tokens),
            "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 6),
            "bound_usd": None if self.bound_usd is None else round(self.bound_usd, 6),
        }
        if self.cost_reason:
            out["cost_reason"] = self.cost_reason
        return out | {"basis": self.basis, "evals": self.evals}


def learned_rates(cache: Cache) -> dict[tuple[str, ...], TokenEstimate | None]:
    """TokenEstimates taught by the usage in the cache: per (adapter, model, params, eval), per
    (adapter, model, eval) and per (adapter, eval), from every reply (ok or invalid) that counted
    its tokens (``scoring.cost.COUNTED``). None: the key's replies reported usage, all of it 0
    (nothing learned; ``NOT_COUNTED``)."""
    usage = cache.read(
        lambda rows: (
            rows.filter(
                pl.col("status").is_in(["ok", "invalid"]) & pl.col("input_tokens").is_not_null()
            )
            .group_by("provider", "model", "params", "eval")
            .agg(
                pl.col("request_body").str.len_bytes().filter(COUNTED).sum().alias("bytes"),
                pl.col("input_tokens").filter(COUNTED).sum(),
                pl.col("output_tokens").filter(COUNTED).fill_null(0).sum(),
                COUNTED.sum().alias("n"),
            )
            .collect()
        )
    )
    rates: dict[tuple[str, ...], TokenEstimate | None] = {}

    def learn(frame: pl.DataFrame, keys: tuple[str, ...]) -> None:
        for r in frame.iter_rows(named=True):
            rates[tuple(r[k] for k in keys)] = (
                TokenEstimate.learned(r["bytes"], r["input_tokens"], r["output_tokens"], r["n"])
                if r["n"]
                else None
            )

    sums = pl.col("bytes", "input_tokens", "output_tokens", "n").sum()
    learn(usage, ("provider", "model", "params", "eval"))  # its effort is among its params
    usage = usage.group_by("provider", "model", "eval").agg(sums)
    learn(usage, ("provider", "model", "eval"))
    learn(usage.group_by("provider", "eval").agg(sums), ("provider", "eval"))
    return rates


def _history(cache: Cache) -> pl.DataFrame:
    return cache.read(
        lambda rows: (
            rows.select(
                pl.col("provider").alias("kind"),
                "model",
                "params",
                "prompt_version",
                "eval",
                "task_id",
                "task_digest",
                "sample",
            )
            .unique()
            .collect()
        )
    )


def _classify(new: pl.DataFrame, history: pl.DataFrame) -> pl.Series:
    """Why each new request is new (see the module docstring)."""
    levels = [
        ("m1", ["kind", "model"]),
        ("m2", ["kind", "model", "params"]),
        ("m3", ["kind", "model", "params", "prompt_version"]),
        ("m4", ["kind", "model", "params", "prompt_version", "task_id", "task_digest", "sample"]),
        ("m5", ["kind", "model", "params", "prompt_version", "task_id", "task_digest"]),
        ("m6", ["kind", "model", "params", "prompt_version", "task_id"]),
        ("m7", ["kind", "model", "params", "prompt_version", "eval"]),
    ]
    frame = new.with_row_index("i")
    for flag, keys in levels:
        seen = history.select(keys).unique().with_columns(pl.lit(True).alias(flag))
        frame = frame.join(seen, on=keys, how="left", maintain_order="left")
    reason = (
        pl.when(pl.col("unconfirmed"))
        .then(pl.lit("batch not confirmed"))
        .when(pl.col("status") == "transient")
        .then(pl.lit("failed before"))
        .when(pl.col("status") == SET_ASIDE)
        .then(pl.lit("another model answered"))
        .when(pl.col("status").is_in(["invalid", "fatal"]))
        .then(pl.lit("retry requested"))
        .when(pl.col("damaged"))
        .then(pl.lit("set aside as damaged"))
        .when(pl.col("m1").is_null())
        .then(pl.lit("new model"))
        .when(pl.col("m2").is_null())
        .then(pl.lit("new parameters"))
        .when(pl.col("m3").is_null())
        .then(pl.lit("new prompt version"))
        .when(pl.col("m4").is_not_null())
        .then(pl.lit("other endpoint"))
        .when(pl.col("m5").is_not_null())
        .then(pl.lit("new epoch"))
        .when(pl.col("m6").is_not_null())
        .then(pl.lit("changed task"))
        .when(pl.col("m7").is_not_null())
        .then(pl.lit(NOT_IN_CACHE))
        .otherwise(pl.lit("new evaluation"))
    )
    return frame.sort("i").select(reason.alias("reason")).to_series()


def _estimate_one(
    model: ModelRun,
    suite: Suite,
    cache: Cache,
    rates: dict,
    history: pl.DataFrame,
    shard: Shard | None = None,
    cached_too: bool = False,
    damaged: frozenset[str] = frozenset(),
    held: Mapping[str, bool] | None = None,
) -> Estimate:
    a = model.adapter
    est = Estimate(a.label)
    held = held or {}
    rows = []
    effort = thinking_effort(a.kind, a.model, a.params, a.effort)
    thinking = thinking_prior(a.kind, effort)
    stream = ((task, request) for task, _, request in model.requests(suite, shard))
    while batch := list(islice(stream, BATCH)):
        est.requests += len(batch)
        for (task, request), hit in zip(
            batch, cache.has_many([r.key for _, r in batch]), strict=True
        ):
            if hit or held.get(request.key):
                tasks = est.not_new.setdefault(task.eval, {})
                tasks[task.id] = tasks.get(task.id, 0) + 1
            if hit:
                est.cached += 1
                if not cached_too:
                    continue
            elif held.get(request.key):  # in a batch the provider accepted: collected, not sent
                est.in_open_batches += 1
                continue
            size = len(request.body)
            rate, basis = rates.get((a.kind, a.model, task.eval)), OWN_USAGE
            if rate is None:
                rate = rates.get((a.kind, task.eval))
                basis = f"estimated from other {a.kind} models' cached usage"
            if rate is None:
                rate, basis = TokenEstimate(), NO_USAGE  # replies of 0 tokens: whose they are
                if (a.kind, a.model, task.eval) in rates:  # its own, all of 0 tokens
                    basis = NOT_COUNTED
                elif (a.kind, task.eval) in rates:  # none of its own; the others', all 0
                    basis = OTHERS_NOT_COUNTED.format(kind=a.kind)
            out_bound = a.output_tokens_bound(task)
            output = rate.output
            # a thinking model's output: its own usage at these parameters, else the prior
            if thinking is not None:
                mine = rates.get((a.kind, a.model, a.params_key, task.eval))
                output = mine.output if mine is not None else None
                if output is None:
                    basis += (
                        f"; output: the thinking prior at effort {effort} ({thinking:,} tokens, "
                        "runner.planning.tokens)"
                    )
                elif basis != OWN_USAGE:
                    basis += "; output: this model's cached usage at these parameters"
            if output is None:
                output = prior_output(out_bound, len(task.questions), thinking)
            rows.append(
                (
                    task.eval,
                    task.id,
                    task.digest,
                    request.sample,
                    cache.status(request.key),
                    request.key in damaged,
                    not hit and request.key in held,  # its batch not confirmed
                    rate.input(size),
                    output,
                    input_bound(size, a.HIDDEN_INPUT_TOKENS),
                    out_bound,
                    basis,
                    hit,
                )
            )
    cached = [r[:-1] for r in rows if r[-1]]  # (cached_too) estimated apart
    rows = [r[:-1] for r in rows if not r[-1]]
    if cached:
        est.cached_evals, est.cached_eval_basis = _per_eval(_frame(cached), model.price)
    est.new = len(rows)
    if not rows:
        est.cost_usd = 0.0 if model.price is not None else None
        est.bound_usd = est.cost_usd
        return est
    frame = _frame(rows)
    frame = frame.with_columns(
        pl.lit(a.kind).alias("kind"),
        pl.lit(a.model).alias("model"),
        pl.lit(a.params_key).alias("params"),
        pl.lit(PROMPT_VERSION).alias("prompt_version"),
    )
    frame = frame.with_columns(_classify(frame, history))
    est.reasons = {r: n for r, n in frame["reason"].value_counts(sort=True).iter_rows()}
    est.basis = {b: n for b, n in frame["basis"].value_counts(sort=True).iter_rows()}
    est.input_tokens, est.output_tokens = float(frame["input"].sum()), float(frame["output"].sum())
    if model.price is None:
        est.cost_reason = (
            "no price for this model: give it with --price MODEL=IN/OUT (USD per million input / "
            "output tokens) or in a run file (price = { input = USD, output = USD })"
        )
    else:
        est.cost_usd = cost_usd(est.input_tokens, est.output_tokens, *model.price)
        if model.price[1] == 0 or frame["output_bound"].null_count() == 0:
            est.bound_usd = cost_usd(
                int(frame["input_bound"].sum()),
                int(frame["output_bound"].fill_null(0).sum()),
                max_input_price(model.price),
                model.price[1],
            )  # as the cost bound reserves
    est.evals, est.eval_basis = _per_eval(frame, model.price)
    est.new_tokens = {
        e: (float(i), float(o))
        for e, i, o in frame.group_by("eval")
        .agg(pl.col("input").sum(), pl.col("output").sum())
        .iter_rows()
    }
    return est


def _frame(rows: list[tuple]) -> pl.DataFrame:
    """``_estimate_one``'s rows, one a request estimated, as a frame."""
    return pl.DataFrame(
        rows,
        orient="row",
        schema={
            "eval": pl.String,
            "task_id": pl.String,
            "task_digest": pl.String,
            "sample": pl.Int32,
            "status": pl.String,
            "damaged": pl.Boolean,
            "unconfirmed": pl.Boolean,
            "input": pl.Float64,
            "output": pl.Float64,
            "input_bound": pl.Int64,
            "output_bound": pl.Int64,
            "basis": pl.String,
        },
    )


def _per_eval(
    frame: pl.DataFrame, price: tuple[float, ...] | None
) -> tuple[dict[str, dict], dict[str, dict[str, int]]]:
    """An estimate's ``evals`` and ``eval_basis`` from its rows (``_frame``)."""
    evals: dict[str, dict] = {}
    eval_basis: dict[str, dict[str, int]] = {}
    per_eval = frame.group_by("eval").agg(
        pl.len().alias("new"), pl.col("input").sum(), pl.col("output").sum()
    )
    for e, b, n in frame.group_by("eval", "basis").len().iter_rows():
        eval_basis.setdefault(e, {})[b] = n
    for r in per_eval.sort("eval").iter_rows(named=True):
        evals[r["eval"]] = {
            "new": r["new"],
            "input_tokens": round(r["input"]),
            "output_tokens": round(r["output"]),
            "cost_usd": None
            if price is None
            else round(cost_usd(r["input"], r["output"], *price), 6),
        }
    return evals, eval_basis


def estimate(
    models: list[ModelRun],
    suite: Suite,
    cache: Cache,
    shard: Shard | None = None,
    cached_too: bool = False,
    held: Mapping[str, Mapping[str, bool]] | None = None,
) -> list[Estimate]:
    """The dry run of ``models`` (adapters built; a System One model must know its name) over
    ``suite`` (only the requests ``shard`` owns, when given: ``runner.planning.shard``).
    ``cached_too``: the requests the cache holds are estimated too, as if new, apart
    (``cached_evals`` and ``cached_eval_basis``; the rest of each estimate is the same:
    ``dxi plan``'s tokens of an evaluation whose cached replies counted none). ``held``: label ->
    the keys of the model's requests that open batches hold -> whether the provider accepted the
    batch (``runner.open_batches.held``): counted ``in_open_batches`` when not cached (not new), or
    new as ``batch not confirmed``."""
    rates, history = learned_rates(cache), _history(cache)
    damaged = cache.set_aside().keys  # after the reads above, which set damaged shards aside
    held_ = held or {}
    return [
        _estimate_one(
            m, suite, cache, rates, history, shard, cached_too, damaged, held_.get(m.label)
        )
        for m in models
    ]


def batch_priced(plan: Plan) -> list[ModelRun]:
    """The plan's models, those in batch mode (``--batch``, or ``batch = true`` in the run file:
    ``Plan.batch``) whose provider has a batch API priced at the batch rate (``Plan.batch_prices``,
    the price ``dxi run`` charges them: the run file's ``batch_input`` / ``batch_output``, else half
    the price): what ``dxi estimate`` prices, and what a run stopped at the cost bound expects the
    next run to cost."""
    import dataclasses

    from dxi.adapters.batches import supports

    if not plan.batch:
        return list(plan.models)
    prices = plan.batch_prices()
    return [
        dataclasses.replace(m, price=prices[m.label])
        if m.label in plan.batch and supports(m.adapter.kind)
        else m
        for m in plan.models
    ]


def totals(estimates: list[Estimate]) -> dict:
    """The run's totals: new requests (and those open batches hold), expected tokens and cost (None
    if a model has no price), bound."""
    costs = [e.cost_usd for e in estimates]
    bounds = [e.bound_usd for e in estimates]
    return {
        "requests": sum(e.requests for e in estimates),
        "cached": sum(e.cached for e in estimates),
        "new": sum(e.new for e in estimates),
        "in_open_batches": sum(e.in_open_batches for e in estimates),
        "input_tokens": round(sum(e.input_tokens for e in estimates)),
        "output_tokens": round(sum(e.output_tokens for e in estimates)),
        "cost_usd": None if None in costs else round(sum(costs), 6),
        "bound_usd": None if None in bounds else round(sum(bounds), 6),
    }
