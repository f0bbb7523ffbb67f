"""The settings a plan is built from, typed: ``PlanInputs``, one field per option of ``dxi run``
(and of ``score``, ``report``, ``export``, ``view``, which take a subset), each with the default the
command line has. A program or a test builds one with keywords, ``PlanInputs(models=["embedded"],
data_dir=Path("data"), limit=3)``, and hands it to ``runner.planning.plan.from_inputs`` (a ``Plan``:
``runner.planning.plan.build`` does both) or ``runner.rescore.select``; ``inputs_of`` turns the
command line's parsed flags into one, so both take the same path through the same rules
(``runner.planning.plan``). Nothing is checked here: the plan checks the values, with the flags'
names in its errors. Light at import (``dxi --help`` loads it): no Polars, no adapters.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from dxi.evals import EVALS

# The limits flags and the ``adapters.Limits`` fields they set (a given flag applies to every
# provider).
LIMITS_FLAGS = {
    "max_in_flight": "max_in_flight",
    "rpm": "rpm",
    "tpm": "tpm",
    "timeout": "attempt_timeout_s",
    "max_attempts": "max_attempts",
    "backoff": "backoff_s",
    "max_stated_wait": "max_stated_wait_s",
    "max_reply_bytes": "max_reply_bytes",
    "max_reply_time": "max_reply_time_s",
    "stream": "stream",
}

_PATHS = ("run_file", "data_dir", "cache_dir", "out")
_TEXTS = ("models", "exclude", "prices")


@dataclass(frozen=True)
class PlanInputs:
    """A run's settings as ``dxi run`` takes them; None (or empty) is the flag not given: the run
    file's value, else the default the plan applies.

    ``models``: model strings ``ADAPTER:MODEL[@BASE_URL]`` (``--model``; a single string is one
    model); ``run_file``: a TOML run file (``runner.planning.config``), instead of ``models``;
    ``data_dir``, ``cache_dir``, ``out``: folders (default:
    ``runner.planning.datadir.default_data_dir()``, ``.dxi-cache``, ``out``, or the run file's);
    ``files``: evaluation name -> its file, over the one found under ``data_dir``; ``evals``: the
    evaluations (names, or one comma-separated text; default: all four); ``limit``: the first N
    tasks of each; ``sample`` / ``seed``: a stratified sample of N tasks of each and its seed
    (``seed`` is also the seed of ``until``'s order); ``all_tasks``: every task (``dxi score``
    otherwise scores what the runs selected, ``runner.planning.selection``); ``exclude``: exclusion
    lists, ``[EVAL=]FILE`` each; ``wildguard_subset``: ``agreed`` (default) or ``all``; ``epochs``:
    requests per task (default 1, or the run file's); ``effort``: the reasoning effort of every
    language model (``adapters.EFFORTS``); ``params`` / ``options``: sampling parameters and adapter
    settings, a dict or ``KEY=VALUE`` texts (VALUE read as JSON); ``prices``:
    ``MODEL=IN/OUT[/CACHED]`` texts, USD per million tokens; ``max_cost``: the cost bound, USD;
    ``allow_failed``: the tolerance of failed answers, as ``runner.planning.config.allow_failed``
    returns it; ``limits``: ``adapters.Limits`` fields (``rpm``, ``attempt_timeout_s``, ...) over
    every provider's; ``batch``: every model through its provider's batch API; ``batch_size``:
    requests per batch; ``until``: an adaptive run's stopping rule, as ``--until`` takes it
    ("precision=5", "separated": ``scoring.sequential.Until.parse``; docs/adaptive.md);
    ``cache_remote``: a remote cache tier's URI (a run uploads to it, scoring reads it).

    Strings are accepted where paths are expected, lists where tuples are.
    """

    models: tuple[str, ...] = ()
    run_file: Path | None = None
    data_dir: Path | None = None
    cache_dir: Path | None = None
    out: Path | None = None
    files: Mapping[str, Path] = field(default_factory=dict)
    evals: tuple[str, ...] | str | None = None
    limit: int | None = None
    sample: int | None = None
    seed: int | None = None
    all_tasks: bool = False
    exclude: tuple[str, ...] = ()
    wildguard_subset: str | None = None
    epochs: int | None = None
    effort: str | None = None
    params: Mapping[str, object] | tuple[str, ...] = ()
    options: Mapping[str, object] | tuple[str, ...] = ()
    prices: tuple[str, ...] = ()
    max_cost: float | None = None
    allow_failed: dict | None = None
    limits: Mapping[str, float | int] = field(default_factory=dict)
    batch: bool = False
    batch_size: int | None = None
    cache_remote: str | None = None
    until: str | None = None

    def __post_init__(self):
        for name in _PATHS:
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, Path(value))
        for name in _TEXTS:
            value = getattr(self, name)
            object.__setattr__(
                self, name, (value,) if isinstance(value, str) else tuple(value or ())
            )
        for name in ("params", "options"):
            value = getattr(self, name)
            if not isinstance(value, Mapping):
                object.__setattr__(self, name, tuple(value or ()))
        object.__setattr__(self, "files", {k: Path(v) for k, v in (self.files or {}).items()})
        if self.evals is not None and not isinstance(self.evals, str):
            object.__setattr__(self, "evals", ",".join(self.evals))


def inputs_of(args: argparse.Namespace) -> PlanInputs:
    """The ``PlanInputs`` of a command's parsed flags (``runner.commands``: ``--model`` ->
    ``models``, ``--param`` -> ``params``, ``--price`` -> ``prices``, the limits flags ->
    ``limits``, the per-evaluation file flags -> ``files``); a flag the command does not have is not
    given."""
    given = {
        f.name: getattr(args, f.name)
        for f in fields(PlanInputs)
        if getattr(args, f.name, None) is not None
    }
    renamed = {
        "models": getattr(args, "model", None),
        "params": getattr(args, "param", None),
        "options": getattr(args, "option", None),
        "prices": getattr(args, "price", None),
    }
    limits = {
        name: getattr(args, flag)
        for flag, name in LIMITS_FLAGS.items()
        if getattr(args, flag, None) is not None
    }
    files = {
        name: getattr(args, f"file_{name}") for name in EVALS if getattr(args, f"file_{name}", None)
    }
    return PlanInputs(
        **(given | {k: v for k, v in renamed.items() if v} | {"limits": limits, "files": files})
    )
