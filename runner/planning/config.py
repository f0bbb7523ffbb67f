"""The run file (TOML): providers, models, evaluations, data and cache locations, cost bound.

``load(path) -> RunFile`` parses and validates; every error names the file, the key
(``models[2].price``) and the line. The structure (see ``examples/run.toml`` for a commented
example)::

    data_dir = "../shared/data"      # relative paths are relative to the run file
    cache_dir = ".dxi-cache"
    out = "out"
    max_cost = 20.0                  # USD; optional
    until = "precision=5"            # optional: an adaptive run (docs/adaptive.md); or "separated"
    allow_failed = 5                 # optional: failed or missing answers accepted per model and evaluation
                                     # (or a fraction of its answers: 0.01, "1%"); see --allow-failed
    cache_remote = "s3://team-bucket/dxi"   # optional: a shared remote cache (docs/distributed.md)
    coordinator = "redis://10.0.0.5:6379/0" # optional: limits and cost shared through Redis
    epochs = 1                       # default for every model

    [evals]                          # optional
    select = ["when2call", "wildguardtest"]
    limit = 100                      # the first 100 tasks of each; or sample = 100 (seed = 1): a stratified sample
    wildguard_subset = "agreed"
    exclude = ["when2call=ambiguous_uuids.txt"]
    files = { hle_multichoice = "hle/hle_test.parquet" }

    [providers.openai]               # shared limits for every model on this provider
    kind = "openai"                  # the adapter
    base_url = "https://api.openai.com/v1"
    api_key_env = "OPENAI_API_KEY"   # or api_key_command = "gcloud auth print-access-token": a token, renewed
    rpm = 500                        # requests per minute
    tpm = 200000                     # tokens per minute
    max_in_flight = 32
    batch = true                     # send through the provider's batch API at the batch price (docs/batch.md)
    batch_max_requests = 10000       # optional: at most this many requests per batch
    batch_enqueued_tokens = 2000000  # optional: the provider's enqueued-token limit per model

    [[models]]
    name = "gpt-6.1-terra (low)"     # the name in reports; default "<adapter>:<model>"
    provider = "openai"              # a [providers.*] table, or an adapter name used with its defaults
    model = "gpt-6.1-terra"
    effort = "low"                   # none|minimal|low|medium|high|xhigh|max: the provider's own field (the key)
    params = { max_completion_tokens = 16000 }       # sampling parameters: part of the cache key
    price = { input = 0.25, output = 2.0 }           # USD per million input / output tokens (cached_input,
                                                     # cache_write, cache_write_1h = ...: prompt-cache prices)
    epochs = 1
    options = {}                     # adapter settings outside the cache key (llamacpp: ctx_size, ...)
    batch = false                    # this model alone: not through the batch API (default: its provider's)

A price's ``batch_input`` / ``batch_output`` are the batch API's prices (default: half of ``input``
/ ``output``, as OpenAI, Anthropic and Google bill batches).
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from dxi import adapters
from dxi.evals import EVALS
from dxi.evals.wildguardtest import SUBSETS

from . import numbers
from .numbers import Number


class ConfigError(ValueError):
    """A run file problem: the message names the file, the key and the line."""


class _Struct(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class Provider(_Struct):
    """One provider: ``kind`` is the adapter; limits are shared by every model on it."""

    kind: str
    base_url: str | None = None
    api_key_env: str | None = None
    api_key_command: str | list[str] | None = (
        None  # prints a key or token, run again before it expires (adapters.credentials)
    )
    rpm: float | None = None
    tpm: int | None = None
    max_in_flight: int | None = None
    max_attempts: int | None = None
    attempt_timeout_s: float | None = None
    max_stated_wait_s: float | None = (
        None  # the longest stated wait honoured; longer stops the provider
    )
    max_reply_bytes: int | None = None  # the largest reply read; larger is stored invalid
    max_reply_time_s: float | None = None  # the longest one reply may take in all (seconds)
    stream: str | None = None  # auto | always | never (adapters.streaming)
    batch: bool | None = None  # send through the batch API (runner.batch.driver)
    batch_max_requests: int | None = None  # at most this many requests per batch
    batch_enqueued_tokens: int | None = None  # input tokens in open batches at once, per model


class Price(_Struct):
    """USD per million tokens; ``cached_input``: the input tokens read from the provider's prompt
    cache; ``cache_write`` / ``cache_write_1h``: those written to it (Anthropic: its 5-minute /
    1-hour cache). None: the provider's own rule (``Adapter.CACHE_PRICES``: Anthropic's 0.1x, 1.25x
    and 2x the input price), else priced as input (``scoring.cost``)."""

    input: float
    output: float
    cached_input: float | None = None
    cache_write: float | None = None
    cache_write_1h: float | None = None
    batch_input: float | None = None  # the batch API's prices (default: half of input / output)
    batch_output: float | None = None


class Model(_Struct):
    """One model to evaluate on a provider (a ``[providers.*]`` name or an adapter name)."""

    provider: str
    model: str | None = None
    name: str | None = None
    effort: str | None = None  # one of adapters.EFFORTS, mapped onto the provider's own field
    params: dict[str, Any] = {}
    price: Price | None = None
    epochs: int | None = None
    options: dict[str, Any] = {}
    batch: bool | None = None  # None: its provider's ``batch``


class Evals(_Struct):
    select: list[str] | None = None
    limit: int | None = None
    sample: int | None = (
        None  # a stratified sample of N tasks per evaluation (runner.planning.sample)
    )
    seed: int | None = None
    wildguard_subset: str = "agreed"
    exclude: list[str] = []
    files: dict[str, str] = {}


class RunFile(_Struct):
    """A validated run file; paths are resolved against the run file's folder."""

    models: list[Model]
    data_dir: str | None = None
    cache_dir: str = ".dxi-cache"
    out: str = "out"
    max_cost: float | None = None
    allow_failed: int | float | str | None = (
        None  # ``allow_failed``: answers, or a fraction (scoring.provisional)
    )
    epochs: int = 1
    cache_remote: str | None = (
        None  # s3://bucket/prefix, gs://..., file:///dir (docs/distributed.md)
    )
    coordinator: str | None = None  # redis://HOST:PORT/DB
    until: str | None = None  # an adaptive run's rule (``scoring.sequential.Until.parse``)
    evals: Evals = Evals()
    providers: dict[str, Provider] = {}
    path: str = ""

    def provider_of(self, model: Model) -> tuple[str, Provider]:
        """``(provider name, provider)`` of a model; an adapter name alone means that adapter's
        defaults."""
        if model.provider in self.providers:
            return model.provider, self.providers[model.provider]
        return model.provider, Provider(kind=model.provider)

    def resolve(self, value: str | None) -> Path | None:
        """A path from the file, relative to the run file's folder (``runs/../out`` shown as
        ``out``)."""
        return None if value is None else Path(os.path.normpath(Path(self.path).parent / value))


# ---- locating keys in the source, for messages --------------------------------------------------
_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_\-\"'. ]+?)\s*=")


def _key_lines(text: str) -> dict[tuple, int]:
    """Every key path in ``text`` -> its 1-based line (array tables get their index: ("models", 2,
    "price"))."""
    lines: dict[tuple, int] = {}
    table: tuple = ()
    counts: dict[tuple, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if m := _HEADER.match(line):
            parts = tuple(p.strip().strip("\"'") for p in m.group(2).split("."))
            if m.group(1) == "[[":
                counts[parts] = counts.get(parts, -1) + 1
                table = (*parts, counts[parts])
            else:
                table = parts
            lines.setdefault(table, n)
        elif m := _KEY.match(line):
            key = tuple(p.strip().strip("\"'") for p in m.group(1).split("."))
            lines.setdefault((*table, *key), n)
    return lines


def _where(path: Path, text: str, key: tuple) -> str:
    lines = _key_lines(text)
    for end in range(len(key), 0, -1):
        if key[:end] in lines:
            return f"{path}, line {lines[key[:end]]}"
    return str(path)


def located(path: Path, key: tuple, problem: str, text: str | None = None) -> str:
    """A run file problem as its errors say it: the file, the line of ``key`` (its nearest
    enclosing key with a line), the key dotted and ``problem``; ``text``: the file's (else read)."""
    text = Path(path).read_text(encoding="utf-8") if text is None else text
    return f"{_where(path, text, key)}: {_dotted(key) or 'top level'}: {problem}"


def _dotted(key: tuple) -> str:
    """``models[2].price`` for ("models", 2, "price"), with "(the 3rd [[models]] table)": indices
    count from 0."""
    out = ""
    for k in key:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    if len(key) > 1 and isinstance(key[1], int):
        n = key[1] + 1
        suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
        out += f" (the {n}{suffix} [[{key[0]}]] table)"
    return out


# msgspec's names of TOML's types, in the run file's own terms (``_in_words``)
_TYPES = {
    "int": "a whole number",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "array": "a list",
    "object": "a table",
}


def _at(value: Any, sub: tuple) -> Any:
    """The value at ``sub`` (keys and indices) inside ``value``; None when there is none."""
    for k in sub:
        try:
            value = value[k]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def _in_words(message: str, got: Any) -> str:
    """A type error of the run file (msgspec's "Expected `int | null`, got `str` - at ...") in the
    user's terms: ``expected a whole number, got the string "100"``; any other message as it is."""
    m = re.match(r"Expected `([^`]+)`, got `([^`]+)`", message)
    if m is None:
        return message.split(" - at ")[0]
    wanted = [_TYPES.get(t, f"`{t}`") for t in map(str.strip, m.group(1).split("|")) if t != "null"]
    if isinstance(got, bool):
        shown = "true" if got else "false"
    elif isinstance(got, str):
        shown = f"the string {json.dumps(got, ensure_ascii=False)}"
    elif isinstance(got, int | float):
        shown = f"the number {got!r}"
    else:  # a list, a table, a date: named
        shown = _TYPES.get(m.group(2), m.group(2))
    return f"expected {' or '.join(wanted)}, got {shown}"


def load(path: Path | str) -> RunFile:
    """Read and validate a run file. Raises ConfigError naming the file, key and line;
    FileNotFoundError."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None

    def fail(key: tuple, problem: str) -> ConfigError:
        return ConfigError(located(path, key, problem, text))

    def number(key: tuple, value: Any, kind: Number) -> None:
        """A number of the run file in ``kind``'s range (``runner.planning.numbers``: that of the
        flag that overrides it), else the error naming the key and line."""
        if value is not None and not kind.accepts(value):
            raise fail(key, f"must be {kind.expected()}, got {value!r}")

    def convert(value: Any, kind: type, key: tuple) -> Any:
        try:
            return msgspec.convert(value, kind)
        except msgspec.ValidationError as exc:
            message = str(exc)
            field = re.search(r"at `\$\.?([^`]*)`", message)
            sub = tuple(p for p in re.split(r"[.\[\]]+", field.group(1)) if p) if field else ()
            sub = tuple(int(p) if p.isdigit() else p for p in sub)
            unknown = re.search(r"unknown field `([^`]+)`", message)
            if unknown:
                raise fail((*key, *sub, unknown.group(1)), "unknown key (a typo?)") from None
            missing = re.match(r"Object missing required field `([^`]+)`", message)
            if missing:
                raise fail((*key, *sub, missing.group(1)), "missing (a required key)") from None
            raise fail((*key, *sub), _in_words(message, _at(value, sub))) from None

    providers = {}
    for name, value in (raw.pop("providers", None) or {}).items():
        providers[name] = convert(value, Provider, ("providers", name))
    models_raw = raw.pop("models", None)
    if not isinstance(models_raw, list) or not models_raw:
        raise fail(("models",), "at least one [[models]] table is required")
    models = [convert(m, Model, ("models", i)) for i, m in enumerate(models_raw)]
    evals = convert(raw.pop("evals", {}), Evals, ("evals",))
    top = convert({**raw, "models": [], "providers": {}}, RunFile, ())
    run = msgspec.structs.replace(
        top, models=models, providers=providers, evals=evals, path=str(path)
    )

    for name, p in providers.items():
        if p.kind not in adapters.KINDS:
            raise fail(
                ("providers", name, "kind"),
                f"unknown adapter {p.kind!r}; known: {', '.join(adapters.KINDS)}",
            )
        if p.api_key_command is not None and p.api_key_env is not None:
            raise fail(
                ("providers", name, "api_key_command"),
                "api_key_env and api_key_command do not combine: give one",
            )
        if p.stream is not None and p.stream not in ("auto", "always", "never"):
            raise fail(
                ("providers", name, "stream"), f"{p.stream!r} is not one of auto, always, never"
            )
        for field, kind in numbers.RUN_FILE_LIMITS.items():
            number(("providers", name, field), getattr(p, field), kind)
    labels = set()
    for i, m in enumerate(models):
        if m.provider not in providers and m.provider not in adapters.KINDS:
            raise fail(
                ("models", i, "provider"),
                f"{m.provider!r} is neither a [providers.*] table "
                f"({', '.join(providers) or 'none'}) nor an adapter ({', '.join(adapters.KINDS)})",
            )
        if m.price is not None and not all(
            numbers.PRICE.accepts(v or 0)
            for v in (
                m.price.input,
                m.price.output,
                m.price.cached_input,
                m.price.cache_write,
                m.price.cache_write_1h,
                m.price.batch_input,
                m.price.batch_output,
            )
        ):
            raise fail(("models", i, "price"), f"each price must be {numbers.PRICE.expected()}")
        number(("models", i, "epochs"), m.epochs, numbers.EPOCHS)
        if m.effort is not None and m.effort not in adapters.EFFORTS:
            raise fail(
                ("models", i, "effort"), f"{m.effort!r} is not one of {', '.join(adapters.EFFORTS)}"
            )
        label = m.name or (f"{run.provider_of(m)[1].kind}:{m.model}" if m.model else None)
        if label is not None and label in labels:
            raise fail(
                ("models", i, "name"), f"two models are called {label!r}: give each a distinct name"
            )
        labels.add(label)
    for e in evals.select or []:
        if e not in EVALS:
            raise fail(("evals", "select"), f"unknown evaluation {e!r}; known: {', '.join(EVALS)}")
    for e in evals.files:
        if e not in EVALS:
            raise fail(("evals", "files", e), f"unknown evaluation; known: {', '.join(EVALS)}")
    if evals.wildguard_subset not in SUBSETS:
        raise fail(("evals", "wildguard_subset"), f"expected one of {', '.join(SUBSETS)}")
    number(("evals", "limit"), evals.limit, numbers.TASKS)
    number(("evals", "sample"), evals.sample, numbers.TASKS)
    number(("evals", "seed"), evals.seed, numbers.SEED)
    if evals.sample is not None and evals.limit is not None:
        raise fail(("evals", "sample"), "sample and limit do not combine: give one")
    if evals.seed is not None and evals.sample is None and run.until is None:
        raise fail(
            ("evals", "seed"),
            "seed is the seed of sample (or of until's order): give sample or until too",
        )
    if run.until is not None:
        from dxi.scoring.sequential import Until  # (Polars: adaptive runs score between rounds)

        try:
            Until.parse(run.until)
        except ValueError as exc:
            raise fail(("until",), str(exc)) from None
    number(("epochs",), run.epochs, numbers.EPOCHS)
    number(("max_cost",), run.max_cost, numbers.MAX_COST)
    if run.allow_failed is not None:
        try:
            allow_failed(run.allow_failed)
        except ValueError as exc:
            raise fail(("allow_failed",), str(exc)) from None
    return run


def allow_failed(value: object) -> dict:
    """The tolerance of provisional figures (``--allow-failed``, a run file's ``allow_failed``;
    ``scoring.provisional.Tolerance(**result)``) from the user's value: an integer (5, "5") is a
    number of failed or missing answers accepted per model and evaluation, ``{"answers": 5}``; a
    decimal (0.01, "0.01") or a percentage ("1%") a fraction of that evaluation's answers,
    ``{"fraction": 0.01}``. ValueError, saying what is expected, for anything else (a negative
    number, a fraction above 1)."""
    expected = f"expected a number of answers (5) or a fraction of them (0.01, 1%), got {value!r}"
    if isinstance(value, bool):
        raise ValueError(expected)
    text = value if isinstance(value, str) else repr(value)
    text = text.strip()
    try:
        if isinstance(value, int) or text.isdigit():
            count = int(text)
            if count < 0:
                raise ValueError(expected)
            return {"answers": count}
        fraction = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(expected) from None
    if not 0 <= fraction <= 1:  # NaN too
        raise ValueError(expected)
    return {"fraction": fraction}
