"""The runs' record in the output folder: ``OUT/run-history.jsonl``, one JSON line per ``dxi run``
that wrote there, and per ``dxi batches collect`` that collected something there (``COLLECT``),
appended when the command ends and never rewritten (``dxi score``, ``report``, ``export`` and
``view`` only read it). summary.json is the scored figures, rewritten from the cache
by each ``dxi score`` and ``report``: what a run sent, spent and where it stopped (its ``requests``
blocks, ``cost_bound``, ``stopped_providers``) is kept here. A line::

    {"started": "2026-12-04T21:44:19Z", "ended": "2026-12-04T21:51:02Z", "exit_code": 3,
     "outcome": "cost_bound", "selection": {"run_file": "runs/tonight.toml", "models": ["gpt"],
     "evals": ["hle_multichoice", ...], "limit": 120, "max_cost_usd": 25.0},
     "cost_bound": {"max_cost_usd": 25.0, "spent_usd": 24.98, "stopped": true, ...},
     "stopped_providers": [], "requests": {"gpt": {"sent": 310, "cache_hits": 0, ...}}}

``selection``: the run file (or null), the models' names and their ``configs`` (the cache's
provider, model, endpoint and params), the ``cache_dir`` (absolute), the evaluations, the tasks
(``limit``, or ``sample`` {tasks, seed}, as summary.json's data block writes them; neither: every
task), the WildGuardTest subset (``wildguard_subset``, where the run reads WildGuardTest), the
bound, ``prices`` (model name -> the price the run used, a ``scoring.cost`` tuple, or null:
``prices`` below), and ``until`` (an adaptive run) and ``shard`` where given. ``cost_bound`` (null
without a bound), ``stopped_providers`` and ``requests`` (model name -> its block) are
summary.json's as the run wrote them (``runner.session``). A run stopped by Ctrl-C or SIGTERM, once
the requests in flight are stored, has the counts too, as its summary.json of what arrived does
(``runner.counts``: each model's rest counted ``not_sent``; ``cost_bound`` without what remains);
one whose stop was cut short (a second signal, the grace period over) has what was counted by then:
the requests it left on the wire counted sent and ``abandoned``, charged their reservations (the
bound held them), and a model whose rest was not counted whole says which counts are ``incomplete``.
One stopped while scoring has its counts (the sending was over), and so does one stopped by a cache
that could not be written (the replies paid for but not stored counted ``unstored``); one stopped
while planning has ``cost_bound`` and ``requests`` null. A run killed with SIGKILL (or one that
crashed) writes no line. The line is one ``write(2)`` to the file opened ``O_APPEND``
(``cache.lines``); a folder that cannot take it costs a warning, not the run.

A line ``dxi batches collect`` writes has the same keys, and ``command`` (``COLLECT``; a run's line
has none) and ``collected`` (the ledger entries it collected): its ``requests`` blocks count what
it stored and what that cost (each model's ``batches.from_earlier_entries``: the entries whose
answers it stored, which the submitting run's line lists under ``batches.open`` when it stopped
with them open), ``cost_bound`` null. So every answer a batch produced is costed in the line of the
command that stored it, and the sum of ``requests.*.cost_usd`` over the lines is what was spent.
It is no run: ``runs`` leaves it out (the last run's selection, the notes of ``dxi score``).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import orjson

from dxi.cache.lines import append_line
from dxi.cache.runs import MODEL_FIELDS

from ..errors import (
    EXIT_CACHE_WRITE,
    EXIT_COST_BOUND,
    EXIT_FAILED_REQUESTS,
    EXIT_INTERRUPTED,
    EXIT_PROVIDER_STOPPED,
    EXIT_TERMINATED,
    EXIT_UPLOAD,
)

RUNS_FILE = "run-history.jsonl"
COLLECT = "batches collect"  # the ``command`` of a line ``dxi batches collect`` wrote

# exit code -> the line's ``outcome``, and what the notes of ``dxi score`` say of the last run
OUTCOMES = {
    0: ("done", "finished"),
    EXIT_FAILED_REQUESTS: ("provisional", "ended provisional (failed or missing answers)"),
    EXIT_COST_BOUND: ("cost_bound", "stopped at the cost bound"),
    EXIT_CACHE_WRITE: ("cache_write_failed", "stopped: the cache could not be written"),
    EXIT_UPLOAD: ("upload_failed", "finished, but shards were not uploaded"),
    EXIT_PROVIDER_STOPPED: ("provider_stopped", "had a provider stopped"),
    EXIT_INTERRUPTED: ("interrupted", "was interrupted"),
    EXIT_TERMINATED: ("terminated", "was stopped by SIGTERM"),
}

log = logging.getLogger("dxi.runs")


def now() -> str:
    """The time now, UTC, as the lines write it (ISO 8601 to the second, ``Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def line_of(
    selection: dict, started: str, exit_code: int, result=None, command: str | None = None
) -> dict:
    """The line of a run that selected ``selection`` (``runner.planning.selection.selection_of``),
    started at ``started`` (``now()``) and ends now with ``exit_code``; ``result`` is
    ``runner.session.run``'s ``RunResult``, or the ``runner.counts.Counts`` of a run a signal
    stopped (``runner.signals.Interrupted.counts``: cut short, what was counted by then): either
    has the ``cost_bound``, ``stopped`` (providers) and ``requests`` blocks; None: stopped before
    its counts were known. ``command``: the command that wrote it when it is not ``dxi run``
    (``COLLECT``), its line's first key."""
    return ({"command": command} if command is not None else {}) | {
        "started": started,
        "ended": now(),
        "exit_code": exit_code,
        "outcome": OUTCOMES.get(exit_code, (str(exit_code),))[0],
        "selection": selection,
        "cost_bound": None if result is None else result.cost_bound,
        "stopped_providers": [] if result is None else result.stopped,
        "requests": None if result is None else result.requests,
    }


def append(out: Path, line: dict) -> None:
    """Append ``line`` to ``out``'s run-history.jsonl; a warning, nothing raised, when it cannot
    be written."""
    path = Path(out) / RUNS_FILE
    try:
        append_line(path, orjson.dumps(line) + b"\n")
    except OSError as exc:
        log.warning(f"could not record this run in {path} ({exc}); its summary.json has its spend")


def read(out: Path) -> list[dict]:
    """The runs' lines in ``out``'s run-history.jsonl, oldest first (none: no file, or it cannot be
    read); a line that is not one (cut by a full disk) is skipped."""
    try:
        data = (Path(out) / RUNS_FILE).read_bytes()
    except OSError:
        return []
    lines = []
    for raw in data.split(b"\n"):
        try:
            doc = orjson.loads(raw) if raw.strip() else None
        except orjson.JSONDecodeError:
            continue  # a line cut by a full disk
        if isinstance(doc, dict) and "outcome" in doc:
            lines.append(doc)
    return lines


def is_run(line: dict) -> bool:
    """Whether ``line`` is a ``dxi run``'s (it names no other ``command``)."""
    return line.get("command") is None


def runs(out: Path) -> list[dict]:
    """The lines of ``out``'s run-history.jsonl that ``dxi run`` wrote, oldest first (``read``)."""
    return [line for line in read(out) if is_run(line)]


def about(selection: dict, cache_dir: Path, configs: dict[str, tuple[str, ...]]) -> bool:
    """Whether a run's line (its ``selection``) is about the cache in ``cache_dir`` and one of the
    models scored (``configs``: name -> configuration, the cache's ``MODEL_FIELDS``): the same
    cache folder where the line records it (``cache_dir``; an older dxi's lines have none), and a
    model in common, by configuration where the line records them (``configs``), else by name. A
    line about another cache or other models says nothing of what this scoring should take."""
    if same_cache(selection, cache_dir) is False:
        return False
    theirs = selection.get("configs")
    if isinstance(theirs, list):
        ran = {tuple(c.get(f) for f in MODEL_FIELDS) for c in theirs if isinstance(c, dict)}
        return any(config in ran for config in configs.values())
    names = selection.get("models")
    return isinstance(names, list) and any(name in names for name in configs)


def same_cache(selection: dict, cache_dir: Path) -> bool | None:
    """Whether a line (its ``selection``) is about the cache in ``cache_dir``: its ``cache_dir``
    is that folder (True) or another (False); None where the line records none (an older dxi)."""
    cache = selection.get("cache_dir")
    if not isinstance(cache, str):
        return None
    return Path(cache).resolve() == Path(cache_dir).resolve()


def note(out: Path) -> str | None:
    """The line ``dxi score`` and ``report`` print when ``out`` holds runs' lines: where they are,
    how many (and how many ``dxi batches collect`` wrote), and how the last run ended; None when
    it holds none."""
    path = Path(out) / RUNS_FILE
    lines = read(out)
    ran = [line for line in lines if is_run(line)]
    if not lines:
        return None
    collects = f"{len(lines) - len(ran)} dxi batches collect" if len(lines) > len(ran) else ""
    if not ran:
        return f"what each run sent and spent: {path} ({collects})"
    last = ran[-1].get("exit_code")
    how = OUTCOMES[last][1] if last in OUTCOMES else f"exited {last}"
    count = f"{len(ran)} run{'s' if len(ran) != 1 else ''}"
    if collects:
        return f"what each run sent and spent: {path} ({count} and {collects}; the last run {how})"
    return f"what each run sent and spent: {path} ({count}; the last {how})"


def prices(out: Path, cache_dir: Path) -> dict[str, tuple[tuple[float | None, ...], str | None]]:
    """Model name -> (the price, the ``started`` of the run that used it), from the newest line of
    ``out``'s run-history.jsonl about the cache in ``cache_dir`` (``same_cache``) that priced that
    model (its ``selection.prices``): what ``dxi score`` and ``dxi batches collect`` price a model
    with when it is given none. A line about another cache is passed over (a model of the same
    name there may be another configuration, priced otherwise); a line that records no cache (an
    older dxi) prices only a model no line about this cache priced. A line without prices (an older
    dxi still) or a model it has no price for is passed over."""
    found: dict[str, tuple[tuple[float | None, ...], str | None]] = {}
    older: dict[str, tuple[tuple[float | None, ...], str | None]] = {}
    for line in reversed(read(out)):
        selection = line.get("selection")
        if not isinstance(selection, dict) or (same := same_cache(selection, cache_dir)) is False:
            continue
        given = selection.get("prices")
        into = found if same else older
        for name, price in given.items() if isinstance(given, dict) else ():
            if name not in into and is_price(price):
                into[name] = (tuple(price), line.get("started"))
    return older | found


def is_price(value) -> bool:
    """A price tuple as a line writes it: a list of at least two numbers >= 0, then numbers or
    nulls."""
    numbers = (int, float)
    return (
        isinstance(value, list)
        and len(value) >= 2
        and all(isinstance(v, numbers) and not isinstance(v, bool) and v >= 0 for v in value[:2])
        and all(v is None or (isinstance(v, numbers) and v >= 0) for v in value[2:])
    )


def batch_spend(block: dict) -> list[str]:
    """What a model's ``requests`` block (``block``) says of the money of batches run across runs,
    for the lines under the usage table's ``this run`` column (``runner.outputs.terminal``): the
    part of its ``cost_usd`` that answered earlier runs' batches (under their bounds, if any), and
    the batches this run left open (their reservations held under its bound, not in its
    ``cost_usd``)."""
    batches, lines = block.get("batches") or {}, []
    if earlier := batches.get("from_earlier_runs_usd"):
        lines.append(
            f"${earlier:.4f} of it answered batches earlier runs submitted (theirs, under their "
            "bounds where they had one: not this run's own spend; under a bound, "
            "cost_bound.earlier_batches_usd)"
        )
    if held := batches.get("open"):
        usd = held["reserved_usd"]
        most = "" if usd is None else f", at most ${usd:.4f} (their reservations)"
        if "input_usd" in held:  # the reservations held their input alone: no bound
            most = f", ${held['input_usd']:.4f} reserved for their input ({held['cost_reason']})"
        lines.append(
            f"{held['requests']:,} request(s) in batches still open at the provider{most}, not in "
            "this run's cost: the run that collects them records what they cost"
        )
    return lines
