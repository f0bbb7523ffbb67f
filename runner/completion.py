"""Shell completion's answers for the values of ``--model``, ``--price`` and ``--evals``
(argcomplete completers).

``dxi completion bash|zsh|fish`` prints argcomplete's script; completing a word runs ``dxi`` itself,
which asks these functions (``runner.commands.options`` attaches them to the options). Each returns
every candidate; argcomplete keeps those that start with what is typed.

* ``models``: each adapter's prefix (``openai:``, ``systemone:``, ...; ``embedded`` and the embedded
  models sparrow-decider has), the models of the run file on the command line
  (``ADAPTER:MODEL[@BASE_URL]``) and the models seen in the cache (``--cache-dir`` on the command
  line, else the run file's, else ``.dxi-cache``): those its runs recorded (``cache.runs``) and
  those its shards hold (their ``provider`` and ``model`` columns, read with PyArrow: nothing else
  is read, and a shard that cannot be read is passed over).
* ``prices``: the same models followed by ``=`` (``--price MODEL=IN/OUT``).
* ``evals``: the evaluation names, completing the last of a comma-separated list.

A completer never raises: a run file that does not parse or a cache that cannot be read gives fewer
candidates, not an error in the user's shell.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from dxi.adapters import KINDS
from dxi.evals import EVALS

CACHE_DIR = Path(".dxi-cache")


def models(
    prefix: str = "", parsed_args: argparse.Namespace | None = None, **_: object
) -> list[str]:
    """The ``--model`` candidates (see the module docstring), each once, in this order: adapters,
    embedded models, the run file's, the cache's."""
    out = [f"{kind}:" for kind in KINDS] + ["embedded"]
    with contextlib.suppress(Exception):  # sparrow-decider's own list of models (it ships with dxi)
        from sparrow_decider import available_models

        out += [f"embedded:{name}" for name in available_models()]
    run_file = getattr(parsed_args, "run_file", None)
    cache_dir = getattr(parsed_args, "cache_dir", None)
    if run_file is not None:
        file_models, file_cache = _run_file(Path(run_file))
        out += file_models
        cache_dir = cache_dir or file_cache
    out += cached_models(Path(cache_dir) if cache_dir else CACHE_DIR)
    return list(dict.fromkeys(out))


def prices(
    prefix: str = "", parsed_args: argparse.Namespace | None = None, **_: object
) -> list[str]:
    """The ``--price`` candidates: each model of ``models`` (not a bare adapter prefix) then
    ``=``."""
    return [f"{m}=" for m in models(prefix, parsed_args) if not m.endswith(":")]


def evals(prefix: str = "", **_: object) -> list[str]:
    """The ``--evals`` candidates: ``prefix``'s complete names, then each evaluation not listed
    yet."""
    done, _, _last = prefix.rpartition(",")
    listed = [e for e in done.split(",") if e]
    head = ",".join(listed) + ("," if listed else "")
    return [head + name for name in EVALS if name not in listed]


def cached_models(cache_dir: Path) -> list[str]:
    """``ADAPTER:MODEL`` of every model the cache folder's runs recorded or its shards hold,
    sorted."""
    from dxi.cache import runs

    found: set[tuple[str, str]] = set()
    with contextlib.suppress(Exception):
        records, _ = runs.read(cache_dir)
        found |= {(provider, model) for r in records for provider, model, _, _ in r.models}
    shards = sorted(cache_dir.glob("shards/*.parquet")) + sorted(
        cache_dir.glob("remote/**/*.parquet")
    )
    if shards:
        with contextlib.suppress(ImportError):
            import pyarrow.parquet as pq

            for shard in shards:
                with contextlib.suppress(Exception):
                    table = pq.read_table(shard, columns=["provider", "model"])
                    found |= set(
                        zip(
                            table.column("provider").to_pylist(),
                            table.column("model").to_pylist(),
                            strict=True,
                        )
                    )
    return sorted(f"{p}:{m}" for p, m in found if p in KINDS and m)


def _run_file(path: Path) -> tuple[list[str], Path | None]:
    """The model strings of the run file ``path`` and its cache folder; nothing when it does not
    parse."""
    from .planning import config

    try:
        run = config.load(path)
    except Exception:
        return [], None
    out = []
    for m in run.models:
        with contextlib.suppress(Exception):
            _, provider = run.provider_of(m)
            out.append(
                f"{provider.kind}:{m.model or ''}"
                + (f"@{provider.base_url}" if provider.base_url else "")
            )
    return out, run.resolve(run.cache_dir)
