"""What a command will do, from a run file or from the command line: the models (adapters built, not
started), their epochs, limits and prices, the suite, the locations and the cost bound.

A plan is built from ``PlanInputs``, the typed settings of a run (one field per flag of ``dxi run``,
with its default): ``build(models=["embedded"], data_dir=..., limit=3)`` from a program or a test,
``from_args(args)`` from the command line (``inputs_of`` turns the parsed flags into ``PlanInputs``;
the rules below are applied once, by ``from_inputs``). It reads the run file (``run_file``: TOML,
``runner.planning.config``) when given, else the models (``--model``). With a run file, these flags
override it (paths given on the command line are relative to the current folder; the file's to the
file): ``--data-dir``, ``--cache-dir``, ``--out``, the per-evaluation files, ``--evals``,
``--limit``, ``--wildguard-subset``, ``--epochs`` (every model), ``--effort`` (every model with an
effort setting), ``--max-cost``, ``--allow-failed``, ``--until``, and the limits flags (``--rpm``,
``--tpm``, ``--max-in-flight``, ``--timeout``, ``--max-attempts``, ``--backoff``,
``--max-stated-wait``, ``--max-reply-bytes``: every provider); ``--sample`` / ``--seed`` and
``--all-tasks`` (instead of the file's ``limit`` or ``sample``); ``--price`` (over a model's
``price``); ``--exclude`` adds to the file's lists; ``--model``, ``--param`` and ``--option`` are
errors (models, their parameters and options belong in the file).

Raises ``UsageError`` (a usage error: exit code 2) with a message naming the file and key where it
can.

The module stays whole (about 510 lines with ``ModelRun``, over the runner's 400; the inputs' record
is ``runner.planning.inputs``): the run file's path (``_from_file``) and the flags' path
(``_from_flags``) must give the same ``Plan`` for the same settings, and each override rule above is
read beside its twin; the prices (``price_flags``, ``_priced``) and the suite (``_suite``) are the
two parts that could move out if it grows.

Why one module over 600 lines: it is the one place where a run file's settings and the flags meet
(``from_inputs``); each helper applies one rule of that merge, listed above, and ``ModelRun`` and
``Plan`` are the records it builds.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from dxi import adapters
from dxi.adapters import Adapter, ModelIdentity, Request
from dxi.evals import EVALS, PROMPT_VERSION, Exclusions, Suite, Task, discover

from ..errors import UsageError
from . import config, numbers
from .datadir import DATA_DIR_ENV, default_data_dir
from .inputs import LIMITS_FLAGS, PlanInputs, inputs_of
from .sample import SampledSuite
from .shard import Shard

if TYPE_CHECKING:
    import polars as pl

    from dxi.scoring.provisional import Tolerance
    from dxi.scoring.sequential import Until


@dataclass
class ModelRun:
    """One model of a run: its (started) ``adapter``, its number of ``epochs``, its ``provider``
    (the name of the run file's provider, a ``[providers.*]`` table or an adapter kind), whose
    limits it shares with the other models on that provider (None: the adapter's own,
    ``Adapter.limits_key``), and its ``price`` in USD per million (input, output) tokens (None: none
    given); ``priced``: a run file or ``--price`` gave it (False: the default, ``price_of``)."""

    adapter: Adapter
    epochs: int = 1
    provider: str | None = None
    price: tuple[float, float] | None = None
    priced: bool = False

    @property
    def label(self) -> str:
        return self.adapter.label

    @property
    def limits_key(self) -> str:
        """The key of the limits this model shares: its ``provider``, else
        ``Adapter.limits_key``."""
        return self.provider or self.adapter.limits_key

    @property
    def identity(self) -> ModelIdentity:
        """The model as the cache and the scoring tell it apart (``Adapter.identity``)."""
        return self.adapter.identity

    def requests(
        self, suite: Suite, shard: Shard | None = None
    ) -> Iterator[tuple[Task, int, Request]]:
        """The model's requests: every task of ``suite`` times each of its ``epochs`` (``sample`` 0
        to ``epochs - 1``), encoded by its adapter (``Adapter.encode``), only those whose cache key
        ``shard`` owns (None: all), as ``(task, sample, request)`` in the suite's order, a task's
        epochs together.

        A generator: the tasks are read and encoded as it is consumed, so memory stays one task's
        worth. The one definition of "a model's requests" that the scheduler
        (``runner.sending.scheduler``), batch mode (``runner.batch.driver``), the dry run
        (``runner.planning.estimate``), the session's survey (``runner.session``) and
        ``Shard.owned`` read; errors are the task stream's and the adapter's (``Suite.tasks``,
        ``Adapter.encode``)."""
        encode = self.adapter.encode
        for task in suite.tasks():
            for sample in range(self.epochs):
                request = encode(task, sample)
                if shard is None or shard.owns(request.key):
                    yield task, sample, request


@dataclass
class Plan:
    """``models``: adapters built but not started; ``epochs``: the run's default; ``max_cost``: USD
    or None; ``source``: the run file, or None for the command line."""

    models: list[ModelRun]
    suite: Suite
    data_dir: Path | None
    cache_dir: Path
    out: Path
    epochs: int
    max_cost: float | None
    source: Path | None
    cache_remote: str | None = None  # the inputs', else a run file's (``runner.distributed.setup``)
    coordinator: str | None = None
    batch: frozenset[str] = (
        frozenset()
    )  # the labels sent through their provider's batch API (``runner.batch.driver``)
    batch_overrides: dict = field(
        default_factory=dict
    )  # label -> the run file's (batch_input, batch_output)
    batch_limits: dict = field(
        default_factory=dict
    )  # label -> (requests per batch, enqueued tokens), None: the provider's
    allow_failed: dict | None = (
        None  # the tolerance of provisional figures (``config.allow_failed``)
    )
    until: Until | None = None  # an adaptive run's rule (``runner.adaptive``; None: every task)
    seed: int | None = None  # the adaptive order's seed (``runner.adaptive.order``; None: default)

    def tolerance(self) -> Tolerance | None:
        """``allow_failed`` as scoring takes it (imports the scoring: call it when scoring)."""
        return tolerance(self.allow_failed)

    def models_frame(self) -> pl.DataFrame:
        """The frame scoring selects cache rows by (``scoring.MODELS_SCHEMA`` plus each model's
        ``epochs`` and ``effort``: the level its requests carry, ``Adapter.effort``)."""
        import polars as pl  # for scoring, after the run: not before the first request

        from dxi import scoring

        rows = [(*m.identity.row(PROMPT_VERSION), m.epochs, m.identity.effort) for m in self.models]
        return pl.DataFrame(
            rows,
            schema={**scoring.MODELS_SCHEMA, "epochs": pl.Int64, "effort": pl.String},
            orient="row",
        )

    def prices(self) -> dict[str, tuple[float | None, ...] | None]:
        return {m.label: m.price for m in self.models}

    def batch_prices(self) -> dict[str, tuple[float | None, ...] | None]:
        """Each model's price at the batch rate (``scoring.cost.batch_price``: the run file's
        ``batch_input`` / ``batch_output``, else half the price); imports the scoring (Polars): call
        it after the first request."""
        from dxi.scoring.cost import batch_price

        return {
            m.label: batch_price(m.price, *self.batch_overrides.get(m.label, (None, None)))
            for m in self.models
        }

    def check_labels(self) -> None:
        """Raise UsageError when two models share a name, or an (adapter, model, endpoint,
        parameters) configuration: scoring tells models apart by those, so one's cache rows would be
        read as the other's."""
        seen: dict[object, str] = {}
        for m in self.models:
            for key in (m.label, m.identity.key):
                if key in seen:
                    raise UsageError(
                        f"{seen[key]} and {m.label} are the same model (same name, or same adapter, "
                        "model, endpoint and parameters): give each a distinct name and configuration"
                    )
                seen[key] = m.label

    def check_models(self) -> None:
        """UsageError (bad input: ``dxi run`` and ``dxi estimate`` exit 2) for a model whose name is
        none of its adapter's models (``Adapter.unknown_model``: a typo), naming the run file, the
        line and the ``[[models]]`` table that gives it (or the ``--model`` flag)."""
        for i, m in enumerate(self.models):
            if (problem := m.adapter.unknown_model()) is None:
                continue
            if self.source is None:
                raise UsageError(f"--model {m.label}: {problem}")
            raise UsageError(config.located(self.source, ("models", i, "model"), problem))

    def check_data(self) -> None:
        """Raise UsageError when an evaluation the run selects (every one unless ``--evals`` or the
        run file's ``[evals] select`` leaves it out) has no data: its figures and the Decision Index
        would be missing while the run reads as done. The message names each such evaluation, the
        file looked for and the folder (``Suite.no_data``), and the ``--evals`` that runs the
        others. ``dxi plan`` (which needs all four) reads the same ``Suite.no_data``."""
        refuse_missing(self.suite, self.source)

    def check_cost_bound(self) -> None:
        """Under a cost bound every model needs a price (a model on this machine is free by default)
        and, when its output tokens are priced, a cap on them (``max_tokens`` or the like), and no
        parameter the bound cannot hold (``Adapter.cost_bound_problem``: a cap below 1, an ``n`` or
        ``candidateCount`` that is not a positive integer); UsageError otherwise."""
        if self.max_cost is None:
            return
        first = next(iter(self.suite.tasks()), None)
        for m in self.models:
            if m.price is None:
                raise UsageError(
                    f"{m.label}: a cost bound needs a price for every model; give it with --price "
                    f"{shlex.quote(m.label)}=IN/OUT (USD per million input / output tokens) or in the run file "
                    "(price = {input = USD, output = USD})"
                )
            if (problem := m.adapter.cost_bound_problem()) is not None:
                raise UsageError(f"{m.label}: {problem}")
            if first is not None and m.price[1] and m.adapter.output_tokens_bound(first) is None:
                raise UsageError(
                    f"{m.label}: under a cost bound, cap the output tokens, leaving room for reasoning "
                    "(e.g. params = {max_completion_tokens = 16000}; Gemini: maxOutputTokens), or price "
                    "output at 0 if it is not billed"
                )


def key_values(items: Mapping | list[str] | list[list[str]], flag: str) -> dict:
    """``KEY=VALUE`` items (or lists of them: a flag given several times) -> dict; VALUE is parsed
    as JSON (0, 0.7, true, {"type": ...}), else kept as text. A mapping is taken as it is."""
    if isinstance(items, Mapping):
        return dict(items)
    out = {}
    for item in (i for group in items for i in ([group] if isinstance(group, str) else group)):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = orjson.loads(value)
        except orjson.JSONDecodeError:
            out[key.strip()] = value
    return out


def selected_evals(text: str) -> tuple[str, ...]:
    selected = tuple(e.strip() for e in text.split(",") if e.strip())
    unknown = [e for e in selected if e not in EVALS]
    if unknown:
        raise UsageError(f"unknown evaluation(s) {', '.join(unknown)}; known: {', '.join(EVALS)}")
    return selected


def _exclusions(items: list[tuple[str | None, Path]]) -> Exclusions:
    exclusions = Exclusions()
    for name, file in items:
        try:
            exclusions.add_file(file, name)
        except FileNotFoundError:
            raise UsageError(f"exclusion list not found: {file}") from None
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        ids = sorted(exclusions.ids)
        stray = [i for i in ids if i.split("/", 1)[0] not in EVALS]
        if stray:
            raise UsageError(
                f"exclusion list {file}: {', '.join(repr(i) for i in stray[:3])} names no evaluation "
                f"(task ids start with {', '.join(f'{e}/' for e in EVALS)})"
            )
    return exclusions


def _exclude_item(item: str, base: Path | None = None) -> tuple[str | None, Path]:
    name, sep, file = item.partition("=")
    if (
        sep
        and name not in EVALS
        and "/" not in name
        and not (base / item if base else Path(item)).exists()
    ):
        raise UsageError(
            f"--exclude {item}: {name!r} is not an evaluation; write EVAL=FILE with EVAL one of "
            f"{', '.join(EVALS)}"
        )
    name, file = (name, file) if sep and name in EVALS else (None, item)
    return name, (base / file if base is not None else Path(file))


def refuse_missing(suite: Suite, source: Path | None = None, scoring: bool = False) -> None:
    """``Plan.check_data``'s refusal (UsageError) when an evaluation ``suite`` selects has no data
    (``Suite.no_data``), naming each, the file looked for and the folder, and the ``--evals`` that
    runs the others (``source``: the run file, for its ``[evals] select``; ``scoring``: said of a
    rescoring, ``runner.rescore``). ``_suite`` raises it too when no evaluation selected has data
    but the folder holds another one (``--evals hle_multichoice`` without the HLE file)."""
    missing = suite.no_data()
    if not missing:
        return
    others = [n for n in suite.selected() if n not in missing]
    rest = (
        f"; to {'score' if scoring else 'run'} the others alone: --evals {','.join(others)}"
        + ("" if source is None else f" (or [evals] select in {source})")
        if others
        else ""
    )
    raise UsageError(
        f"no data for {', '.join(missing)}, which the {'scoring' if scoring else 'run'} selects: "
        + "; ".join(missing.values() if len(missing) == 1 else map(": ".join, missing.items()))
        + (". Nothing was scored or written" if scoring else ". Nothing was sent")
        + (
            " (the Decision Index needs all four evaluations)"
            if suite.evals is None or set(EVALS) <= set(suite.evals)  # the index's own selection
            else ""
        )
        + ". Put the file "
        "there or name it (--data-dir DIR; --omniscience, --hle, --when2call or "
        f"--wildguardtest FILE; `dxi data check` lists what is found){rest}"
    )


def _suite(
    data_dir: Path | None,
    files: dict[str, Path],
    exclude: list[tuple[str | None, Path]],
    limit: int | None,
    subset: str,
    selected: tuple[str, ...] | None,
    sample: int | None = None,
    seed: int | None = None,
    all_tasks: bool = False,
    until: bool = False,
) -> Suite:
    if limit is not None and limit < 1:
        raise UsageError("--limit must be at least 1")
    if sample is not None and sample < 1:
        raise UsageError("--sample must be at least 1")
    if sample is not None and limit is not None:
        raise UsageError(
            "--sample and --limit do not combine: --limit N takes the first N tasks of each evaluation, "
            "--sample N a stratified sample of N; give one"
        )
    if seed is not None and sample is None and not until:
        raise UsageError(
            "--seed is the seed of --sample (or of --until's order): give --sample N or --until too"
        )
    if all_tasks and (sample is not None or limit is not None):
        raise UsageError(
            f"--all-tasks and --{'sample' if sample is not None else 'limit'} do not combine: --all-tasks "
            "takes every task of each evaluation; give one"
        )
    try:
        data = discover(data_dir, files, selected)
        exclusions = _exclusions(exclude)
        suite = (
            Suite(data, exclusions, limit, subset, selected)
            if sample is None
            else SampledSuite(
                data, exclusions, None, subset, selected, sample=sample, seed=seed or 0
            )
        )
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    # every selected file whole, before anything is sent or scored (evals.DatasetError)
    suite.validate()
    if not suite.selected() and any(d.file for d in discover(data_dir).values()):
        refuse_missing(suite)  # the folder holds others: the selected ones it lacks, named
    if not suite.selected():
        where = (
            f"no --data-dir given, ${DATA_DIR_ENV} is not set and neither ./data nor ../shared/data exists"
            if not data_dir
            else "no evaluation data found in "
            + (
                f"{data_dir} (that is, {data_dir.resolve()})"
                if str(data_dir.resolve()) != str(data_dir)
                else str(data_dir)
            )
        )
        raise UsageError(
            f"{where}.\n"
            "Point --data-dir at a folder holding the evaluation files, e.g. ../shared/data with "
            "omniscience-standin/*.jsonl, hle/hle_mcqa.json, when2call/*.jsonl and wildguardtest/*.parquet, "
            "or name files with --omniscience, --hle, --when2call, --wildguardtest."
        )
    return suite


def limits_overrides(inputs: PlanInputs) -> dict:
    """The limits given (``--max-in-flight``, ``--rpm``, ...) as ``adapters.Limits`` fields;
    UsageError for a name that is not one."""
    unknown = sorted(set(inputs.limits) - set(LIMITS_FLAGS.values()))
    if unknown:
        raise UsageError(
            f"limits {', '.join(unknown)}: not a limit (known: {', '.join(LIMITS_FLAGS.values())})"
        )
    given = {k: v for k, v in inputs.limits.items() if v is not None}
    if given.get("stream", "auto") not in ("auto", "always", "never"):
        raise UsageError(f"--stream {given['stream']!r}: expected auto, always or never")
    if given.get("max_reply_time_s", 1) <= 0:
        raise UsageError("--max-reply-time must be positive (seconds)")
    return given


def price_of(
    adapter: adapters.Adapter | type[adapters.Adapter], price: config.Price | None
) -> tuple[float | None, ...] | None:
    """The price tuple of ``scoring.cost``, (input, output[, cached_input[, cache_write[,
    cache_write_1h]]]) USD per million tokens: the run file's, its prompt-cache parts where it gives
    none from the provider's own rule (``Adapter.CACHE_PRICES``, multiples of the input price),
    trailing unknown parts left out (priced as input). A model on this machine is free by default;
    any other has no price without a run file's."""
    if price is None:
        return (0.0, 0.0) if adapter.free else None
    parts = [price.input, price.output]
    for name in ("cached_input", "cache_write", "cache_write_1h"):
        given, rule = getattr(price, name), adapter.CACHE_PRICES.get(name)
        # 12 decimals: 0.1 x 3.0 is 0.3, not 0.30000000000000004 (a price block shows it as it is)
        parts.append(
            given if given is not None else None if rule is None else round(rule * price.input, 12)
        )
    while parts[-1] is None:
        parts.pop()
    return tuple(parts)


def price_flags(items: list[str]) -> dict[str, config.Price]:
    """``--price MODEL=IN/OUT[/CACHED]`` items (USD per million input, output and, optionally,
    cached input tokens: the provider's price list) -> MODEL -> ``config.Price``. UsageError naming
    the item for one that is malformed, negative, above ``numbers.PRICE``'s $1,000,000 (1e308 made
    every cost infinite: "about $inf expected") or given twice."""
    out: dict[str, config.Price] = {}
    for item in items:
        model, sep, text = item.rpartition("=")
        parts = text.split("/")
        example = "e.g. --price openai:gpt-6-luna=0.1/0.5/0.01"
        if not sep or not model.strip() or len(parts) not in (2, 3):
            raise UsageError(
                f"--price {item!r}: expected MODEL=IN/OUT or MODEL=IN/OUT/CACHED, USD per million input, "
                f"output and cached input tokens ({example})"
            )
        try:
            if "_" in text:  # Python's float reads "1_0" as 10
                raise ValueError(text)
            values = [float(part) for part in parts]
        except ValueError:
            raise UsageError(
                f"--price {item!r}: {text!r} holds something that is not a number ({example})"
            ) from None
        if not all(numbers.PRICE.accepts(v) for v in values):  # the run file's range too
            raise UsageError(f"--price {item!r}: each price must be {numbers.PRICE.expected()}")
        if model.strip() in out:
            raise UsageError(f"--price {model.strip()}: given twice")
        out[model.strip()] = config.Price(
            values[0], values[1], values[2] if len(values) == 3 else None
        )
    return out


def names(model: ModelRun, text: str | None = None) -> set[str]:
    """The names by which a flag may name ``model`` (``--price MODEL=...``, ``dxi plan --separate A
    B``): its label (a run file's ``name``), ``ADAPTER:MODEL``, and ``text``, the model string
    ``--model`` gave it as (``embedded`` for ``embedded:sparrow-nano-general-v1.1``)."""
    return {model.label, f"{model.adapter.kind}:{model.adapter.model}"} | (
        {text} if text else set()
    )


def model_named(
    models: list[ModelRun], name: str, flag: str, texts: dict[int, str] | None = None
) -> ModelRun:
    """The one model of ``models`` that ``name`` names (``names``; ``texts``: position in
    ``models`` -> the ``--model`` text it was given as). UsageError naming ``flag``, ``name`` and
    the models' labels when it names none of them, or several."""
    texts = texts or {}
    found = [m for i, m in enumerate(models) if name in names(m, texts.get(i))]
    if len(found) == 1:
        return found[0]
    if found:
        listed = ", ".join(m.label for m in found)
        raise UsageError(
            f"{flag} {name}: names {len(found)} models of this run ({listed}); give its label"
        )
    listed = ", ".join(m.label for m in models)
    raise UsageError(f"{flag} {name}: no model of this run is named so (its models: {listed})")


def _priced(
    models: list[ModelRun], prices: dict[str, config.Price], texts: dict[int, str] | None = None
) -> None:
    """Give each model the ``--price`` whose MODEL names it (``names``; ``texts``: position -> the
    ``--model`` text). UsageError for a MODEL that names no model of the run, or a model named by
    two (one MODEL may price several: the same model under two settings)."""
    texts = texts or {}
    for i, m in enumerate(models):
        given = [k for k in prices if k in names(m, texts.get(i))]
        if len(given) > 1:
            raise UsageError(
                f"--price {' and --price '.join(given)} name the same model ({m.label}): give one"
            )
        if given:
            m.price, m.priced = price_of(m.adapter, prices[given[0]]), True
    named = {n for i, m in enumerate(models) for n in names(m, texts.get(i))}
    unknown = [k for k in prices if k not in named]
    if unknown:
        raise UsageError(
            f"--price {unknown[0]}: no model of this run is named so (its models: "
            f"{', '.join(m.label for m in models)})"
        )


def build(**inputs) -> Plan:
    """The plan of ``PlanInputs(**inputs)`` (``runner.planning.inputs``: the keywords are its
    fields, e.g. ``build(models=["embedded"], data_dir=Path("data"), cache_dir=tmp / "cache",
    limit=3)``), as ``from_inputs`` builds it; TypeError for a keyword that is no field, UsageError
    as ``from_inputs``."""
    return from_inputs(PlanInputs(**inputs))


def from_args(args: argparse.Namespace) -> Plan:
    """The plan of ``dxi run`` / ``estimate`` / ``score`` / ``report``'s parsed flags:
    ``from_inputs(inputs_of(args))``."""
    return from_inputs(inputs_of(args))


def from_inputs(inputs: PlanInputs) -> Plan:
    """The plan of ``inputs`` (see the module docstring): the run file's models with the settings
    given over it, else ``inputs.models``. UsageError (the flag or the file's key named) for a bad
    value."""
    epochs = inputs.epochs
    if epochs is not None and epochs < 1:
        raise UsageError("--epochs must be at least 1")
    max_cost = inputs.max_cost
    if max_cost is not None and max_cost < 0:
        raise UsageError("--max-cost must be >= 0 (USD)")
    if inputs.run_file is not None:
        return _from_file(inputs, epochs, max_cost)
    models = _from_flags(inputs, epochs or 1)
    suite = suite_of(inputs)
    size = inputs.batch_size
    return Plan(
        models,
        suite,
        inputs.data_dir if inputs.data_dir is not None else default_data_dir(),
        inputs.cache_dir or Path(".dxi-cache"),
        inputs.out or Path("out"),
        epochs or 1,
        max_cost,
        None,
        batch=frozenset(m.label for m in models) if inputs.batch else frozenset(),
        batch_limits={m.label: (size, None) for m in models},
        allow_failed=inputs.allow_failed,
        cache_remote=inputs.cache_remote,
        until=until_of(inputs.until, "--until"),
        seed=inputs.seed,
    )


def _allow_failed(inputs: PlanInputs, run: config.RunFile) -> dict | None:
    """``--allow-failed`` (already parsed by ``config.allow_failed``), else the run file's."""
    given = inputs.allow_failed
    return (
        given
        if given is not None
        else (None if run.allow_failed is None else config.allow_failed(run.allow_failed))
    )


def until_of(text: str | None, where: str) -> Until | None:
    """``--until``'s (or a run file's ``until``) text as ``scoring.sequential.Until`` (None: not
    given); UsageError naming ``where`` and the accepted forms for a bad one. Imports the scoring
    (Polars): an adaptive run scores between its rounds anyway."""
    if text is None:
        return None
    from dxi.scoring.sequential import Until

    try:
        return Until.parse(text)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}") from None


def tolerance(allow_failed: dict | None) -> Tolerance | None:
    """``config.allow_failed``'s value as ``scoring.provisional.Tolerance`` (None: none given)."""
    from dxi.scoring.provisional import Tolerance

    return None if allow_failed is None else Tolerance(**allow_failed)


def suite_of(inputs: PlanInputs) -> Suite:
    """The suite ``inputs`` name without a run file: ``data_dir``, ``files``, ``evals``, ``limit``
    or ``sample`` / ``seed`` or ``all_tasks``, ``exclude``, ``wildguard_subset``; UsageError as
    ``_suite``."""
    selected = selected_evals(inputs.evals) if inputs.evals else None
    data_dir = inputs.data_dir if inputs.data_dir is not None else default_data_dir()
    return _suite(
        data_dir,
        dict(inputs.files),
        [_exclude_item(e) for e in inputs.exclude],
        inputs.limit,
        inputs.wildguard_subset or "agreed",
        selected,
        inputs.sample,
        inputs.seed,
        inputs.all_tasks,
        until=inputs.until is not None,
    )


def with_effort(frame: pl.DataFrame) -> pl.DataFrame:
    """A ``scoring.MODELS_SCHEMA`` frame of models found in the cache with each one's ``effort``
    (the level its cached requests' parameters carry in the provider's own field,
    ``Adapter.effort_of``; null where none)."""
    import polars as pl

    efforts = [
        adapters.adapter_class(kind).effort_of(orjson.loads(params or "{}"))
        if kind in adapters.KINDS
        else None
        for kind, params in frame.select("provider", "params").iter_rows()
    ]
    return frame.with_columns(pl.Series("effort", efforts, dtype=pl.String))


def _effort(inputs: PlanInputs) -> str | None:
    effort = inputs.effort
    if effort is not None and effort not in adapters.EFFORTS:
        raise UsageError(f"--effort {effort!r}: one of {', '.join(adapters.EFFORTS)}")
    return effort


def _from_flags(inputs: PlanInputs, epochs: int) -> list[ModelRun]:
    """The ``--model`` flags' models, with ``--param`` and ``--effort`` given to those that take
    sampling parameters and each ``--option`` to those that know it; UsageError for a bad model
    string or a flag no model uses."""
    params = key_values(inputs.params, "--param")
    options = key_values(inputs.options, "--option")
    effort = _effort(inputs)
    overrides = limits_overrides(inputs)
    models, used = [], set()
    for text in inputs.models:
        try:
            spec = adapters.parse_model(text)
            cls = adapters.adapter_class(spec.kind)
            spec.params = dict(params) if cls.takes_params else {}
            spec.effort = effort if cls.takes_params else None
            spec.options = {k: v for k, v in options.items() if k in cls.OPTIONS}
            a = adapters.get(spec)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        used |= set(spec.options)
        a.limits = replace(a.limits, **overrides)
        models.append(ModelRun(a, epochs, None, price_of(a, None)))
    _priced(models, price_flags(inputs.prices), dict(enumerate(inputs.models)))
    if params and not any(type(m.adapter).takes_params for m in models):
        raise UsageError(
            "--param: no model of this run takes sampling parameters (decision models have none)"
        )
    if effort and not any(type(m.adapter).takes_params for m in models):
        raise UsageError(
            "--effort: no model of this run has an effort setting (decision models have none)"
        )
    unused = sorted(set(options) - used)
    if unused:
        raise UsageError(f"--option {', '.join(unused)}: no model of this run knows this option")
    return models


def _from_file(inputs: PlanInputs, epochs: int | None, max_cost: float | None) -> Plan:
    path: Path = inputs.run_file
    for flag, value in (
        ("--model", inputs.models),
        ("--param", inputs.params),
        ("--option", inputs.options),
    ):
        if value:
            raise UsageError(
                f"{flag} cannot be combined with a run file ({path}): give models, their params and "
                "options in the file"
            )
    try:
        run = config.load(path)
    except FileNotFoundError:
        raise UsageError(f"run file not found: {path}") from None
    except config.ConfigError as exc:
        raise UsageError(str(exc)) from None
    base = path.parent
    overrides = limits_overrides(inputs)
    flag_effort = _effort(inputs)
    models = []
    batch, overrides_of, batch_limits = set(), {}, {}
    for i, m in enumerate(run.models):
        name, provider = run.provider_of(m)
        where = f"{path}: models[{i}]"
        try:
            cls = adapters.adapter_class(provider.kind)
            if m.params and not cls.takes_params:
                raise ValueError(
                    f"{provider.kind} is a decision model: it takes no sampling parameters"
                )
            if m.effort and not cls.takes_params:
                raise ValueError(f"{provider.kind} is a decision model: it has no effort setting")
            options = dict(m.options)
            for key in ("api_key_env", "api_key_command"):
                if getattr(provider, key):
                    options[key] = getattr(provider, key)
            unknown = sorted(set(options) - cls.OPTIONS)
            if unknown:
                raise ValueError(
                    f"option(s) {', '.join(unknown)} unknown to the {provider.kind} adapter "
                    f"(known: {', '.join(sorted(cls.OPTIONS)) or 'none'})"
                )
            effort = (
                flag_effort if flag_effort and cls.EFFORT_FIELD else m.effort
            )  # --effort: every model that has one
            spec = adapters.ModelSpec(
                provider.kind, m.model, provider.base_url, dict(m.params), options, m.name, effort
            )
            a = adapters.get(spec)
        except ValueError as exc:
            raise UsageError(f"{where}: {exc}") from None
        table = {
            k: v
            for k, v in (
                ("rpm", provider.rpm),
                ("tpm", provider.tpm),
                ("max_in_flight", provider.max_in_flight),
                ("max_attempts", provider.max_attempts),
                ("attempt_timeout_s", provider.attempt_timeout_s),
                ("max_stated_wait_s", provider.max_stated_wait_s),
                ("max_reply_bytes", provider.max_reply_bytes),
                ("max_reply_time_s", provider.max_reply_time_s),
                ("stream", provider.stream),
            )
            if v is not None
        }
        a.limits = replace(a.limits, **(table | overrides))
        key = (
            f"table:{name}" if name in run.providers else None
        )  # models on one table share its limits
        models.append(
            ModelRun(
                a, epochs or m.epochs or run.epochs, key, price_of(a, m.price), m.price is not None
            )
        )
        label = models[-1].label
        if inputs.batch or (m.batch if m.batch is not None else provider.batch):
            batch.add(label)
        if m.price is not None and (
            m.price.batch_input is not None or m.price.batch_output is not None
        ):
            overrides_of[label] = (m.price.batch_input, m.price.batch_output)
        batch_limits[label] = (
            inputs.batch_size or provider.batch_max_requests,
            provider.batch_enqueued_tokens,
        )
    _priced(models, price_flags(inputs.prices))  # the command line's over the file's
    files = {e: base / f for e, f in run.evals.files.items()} | dict(inputs.files)
    exclude = [_exclude_item(e, base) for e in run.evals.exclude] + [
        _exclude_item(e) for e in inputs.exclude
    ]
    selected = (
        selected_evals(inputs.evals)
        if inputs.evals
        else (tuple(run.evals.select) if run.evals.select else None)
    )
    data_dir = (
        inputs.data_dir
        if inputs.data_dir is not None
        else (run.resolve(run.data_dir) if run.data_dir is not None else default_data_dir())
    )
    sample, seed, all_tasks = inputs.sample, inputs.seed, inputs.all_tasks
    limit = (
        inputs.limit
        if inputs.limit is not None
        else (run.evals.limit if sample is None and not all_tasks else None)
    )
    if (
        inputs.limit is None and sample is None and not all_tasks
    ):  # the file's sample, unless the command line chose
        sample, seed = run.evals.sample, run.evals.seed if seed is None else seed
    until_text = inputs.until if inputs.until is not None else run.until
    suite = _suite(
        data_dir,
        files,
        exclude,
        limit,
        inputs.wildguard_subset or run.evals.wildguard_subset,
        selected,
        sample,
        seed if sample is not None else None,
        all_tasks,
    )
    until = until_of(until_text, "--until" if inputs.until is not None else f"{path}: until")
    return Plan(
        models,
        suite,
        data_dir,
        inputs.cache_dir or run.resolve(run.cache_dir),
        inputs.out or run.resolve(run.out),
        epochs or run.epochs,
        max_cost if max_cost is not None else run.max_cost,
        path,
        inputs.cache_remote or run.cache_remote,
        run.coordinator,
        frozenset(batch),
        overrides_of,
        batch_limits,
        allow_failed=_allow_failed(inputs, run),
        until=until,
        seed=inputs.seed if inputs.seed is not None else run.evals.seed,
    )
