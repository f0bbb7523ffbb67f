"""The batches a cache's ledger holds (``cache.ledger``), as ``dxi batches`` lists, collects and
cancels them (docs/batch.md); the command prints what these return.

* ``held(cache_dir, models)``: the keys of each model's requests that its open batches hold, and
  whether the provider accepted each batch (what ``dxi estimate`` counts apart from the new
  requests, or calls new as ``batch not confirmed``).
* ``waiting(cache, models, suite)``: how many requests (and answers) not in the cache accepted
  open batches hold, per model (``dxi score``'s note); ``of_cache(cache_dir, found, epochs)``: the
  models found in the cache (no model given) that have such batches, rebuilt to encode their
  requests with; ``accepted_by_label(cache_dir)``: the open batches per model label (a model
  ``of_cache`` cannot rebuild).
* ``listed(cache_dir, every)``: the entries, oldest first, each with where it stands (``rows``).
* ``collect(plan, wait, poll_s, say)``: the open batches of the plan's models polled (once, or until
  they end) and the results of those that ended stored; nothing new is submitted.
* ``cancel(cache_dir, model, entry, every, say)``: the provider asked to cancel the chosen open
  batches; what they produced before is collected by the next run (or ``collect``).
* ``resume(cache_dir, model, entry, every)``: the stops of models' batch mode the ledger keeps
  (``Ledger.stops``) lifted.

``say`` gets a line for each batch state change and each problem met (a model that cannot be
reached, a cancel refused); None: nothing is said.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from dxi import adapters
from dxi.adapters import AdapterError
from dxi.cache import Cache
from dxi.cache.ledger import Entry, Ledger
from dxi.lazy import LazyModule

from .batch.options import BatchOptions, BatchStats, with_retries
from .errors import UsageError
from .session import start_adapters

# Imported on first use (``dxi.lazy``): the batch APIs and the dispatch load aiohttp, uvloop its
# loop; ``dxi batches list`` needs none of them
uvloop = LazyModule("uvloop")
_batches = LazyModule("dxi.adapters.batches")
_dispatch = LazyModule("dxi.runner.dispatch")
_plan = LazyModule("dxi.runner.planning.plan")

if TYPE_CHECKING:
    import polars as pl

    from dxi.adapters.batches import BatchAPI
    from dxi.evals import Suite

    from .planning.plan import ModelRun, Plan


def has_batches(cache_dir: Path) -> bool:
    """Whether the cache at ``cache_dir`` has a ledger (a batch run used it)."""
    return (Path(cache_dir) / "batches").is_dir()


def held(cache_dir: Path, models: Sequence[ModelRun]) -> dict[str, dict[str, bool]]:
    """Label -> the keys of the model's requests that its open batches hold (those the ledger's open
    entries claim: ``Ledger.claimed``, as ``dxi run`` keeps them from being sent, by
    ``runner.dispatch.identity``) -> whether the provider accepted the batch (the entry has its
    batch id). The next run collects an accepted batch's results and sends those requests nowhere
    (a batch that ends expired or cancelled gives its unanswered ones back: sent then); an entry
    without a batch id (a run killed between its intent and the provider's reply) may never have
    reached the provider: the next run asks it, and sends them when nothing is found. {} when the
    cache has no ledger; a model with none held is left out."""
    if not has_batches(cache_dir):
        return {}
    ledger = Ledger(cache_dir)
    out = {}
    for m in models:
        claimed = ledger.claimed(_dispatch.identity(m))
        entries = ledger.entries()  # (those claimed read: a re-read adds only what came since)
        if claimed:
            out[m.label] = {
                k: getattr(entries.get(e), "batch_id", None) is not None for k, e in claimed.items()
            }
    return out


def waiting(cache: Cache, models: Sequence[ModelRun], suite: Suite) -> dict[str, dict]:
    """Label -> what of the model's requests over ``suite`` that the cache does not hold, batches
    the provider accepted hold (``held``, as ``dxi estimate`` counts them ``in_open_batches``):
    {``requests``, ``answers``} (their questions), for ``dxi score``'s note: ``dxi batches collect``
    or the next ``dxi run`` collects them, neither asks for them again. {} when the cache has no
    ledger; a model with none is left out."""
    out = {}
    for m in models:
        accepted = {k for k, ok in held(cache.root, [m]).get(m.label, {}).items() if ok}
        if not accepted:
            continue
        requests = answers = 0
        stream = m.requests(suite)
        while part := list(islice(stream, 256)):
            for (task, _, request), hit in zip(
                part, cache.has_many([r.key for *_, r in part]), strict=True
            ):
                if not hit and request.key in accepted:
                    requests += 1
                    answers += len(task.questions)
        if requests:
            out[m.label] = {"requests": requests, "answers": answers}
    return out


def of_cache(cache_dir: Path, found: pl.DataFrame, epochs: int = 1) -> list[ModelRun]:
    """The models ``found`` in the cache (``scoring.models_in_cache`` rows, labelled: no run file
    nor ``--model`` names them) that open batches the provider accepted are of, rebuilt as the run
    that submitted them built them: the adapter, model and sampling parameters of their rows, the
    server of the batch's ledger entry, ``epochs`` each; so that ``waiting`` encodes their requests
    and tells which missing answers those batches hold. A model is one of an entry when its
    configuration digest is the entry's (``runner.dispatch.identity``: adapter, model, endpoint,
    parameters, prompt version). One that cannot be rebuilt (an adapter or parameter this dxi does
    not know) is left out: ``accepted_by_label`` counts its batches. [] without a ledger."""
    if not has_batches(cache_dir):
        return []
    servers: dict[str, set[str]] = {}  # adapter -> the servers of its accepted open batches
    wanted = set()
    for e in listed(cache_dir):
        if not e.closed and e.batch_id is not None:
            servers.setdefault(e.kind, set()).add(e.base_url or "")
            wanted.add(e.identity)
    out = []
    for label, kind, model, params in found.select("label", "provider", "model", "params").rows():
        for base_url in sorted(servers.get(kind, ())):
            try:
                spec = adapters.ModelSpec(
                    kind, model, base_url or None, orjson.loads(params or "{}"), name=label
                )
                run = _plan.ModelRun(adapters.get(spec), epochs)
            except (ValueError, orjson.JSONDecodeError):  # (an adapter this dxi does not know)
                continue
            if _dispatch.identity(run) in wanted:
                out.append(run)
                break
    return out


def accepted_by_label(cache_dir: Path) -> dict[str, int]:
    """Model label -> how many open batches of it the provider accepted (the ledger's open entries
    with a batch id): what ``dxi score`` of every model in the cache says of a model ``of_cache``
    cannot rebuild, where it has no model to tell which of their requests it scores
    (``waiting``)."""
    if not has_batches(cache_dir):
        return {}
    out: dict[str, int] = {}
    for e in listed(cache_dir):
        if not e.closed and e.batch_id is not None:
            out[e.label] = out.get(e.label, 0) + 1
    return out


def listed(cache_dir: Path, every: bool = False) -> list[Entry]:
    """The ledger's entries, oldest first: the open ones and those whose collection stopped their
    model's batch mode (``Entry.stop``), or with ``every`` also those collected or abandoned."""
    entries = sorted(Ledger(cache_dir).entries().values(), key=lambda e: e.created)
    return entries if every else [e for e in entries if not e.closed or e.stop]


def resume(
    cache_dir: Path, *, model: str | None = None, entry: str | None = None, every: bool = False
) -> list[Entry]:
    """Lift the stops the ledger keeps on models' batch mode (``Ledger.stops``): those of the model
    ``model`` (as ``cancel`` takes it), of the entry or batch id ``entry``, or ``every`` one; a
    ``resume`` event each. Returns the entries resumed. Raises UsageError when the cache has no
    ledger, or no stop matches ``model`` or ``entry`` (with ``every`` and none: [])."""
    if not has_batches(cache_dir):
        raise UsageError(f"{cache_dir} holds no batches (no {Path(cache_dir) / 'batches'} folder)")
    ledger = Ledger(cache_dir)
    chosen = _chosen(ledger.stops(), model, entry, every, "stopped batch mode")
    for e in chosen:
        ledger.record(e.id, "resume")
    return chosen


def rows(entries: list[Entry]) -> list[dict]:
    """Entries as ``dxi batches list --json`` prints them: ``Entry.as_dict`` and ``running_s``
    (seconds since a submitted batch that has not ended was submitted; None otherwise)."""
    out = []
    for e in entries:
        running = (
            None if e.ended or e.batch_id is None else time.time() - (e.submitted_at or e.created)
        )
        out.append(e.as_dict() | {"running_s": None if running is None else round(running, 1)})
    return out


def collect(
    plan: Plan,
    *,
    wait: bool = False,
    poll_s: float | None = None,
    say: Callable[[str], None] | None = None,
    stats: dict[str, BatchStats] | None = None,
) -> dict[str, BatchStats]:
    """Poll the open batches of ``plan``'s models (once each, or until every one has ended with
    ``wait``; the first wait between status reads ``poll_s`` seconds, ``BatchOptions``' by default,
    growing by half each time up to 300 s) and store the results of those that ended; nothing new is
    submitted. A model that cannot be reached is said and left (its batches stay open). Returns each
    collected model's BatchStats by label (``given_back``: requests the next run sends; ``running``:
    its batches still open), in ``stats`` when given, filled as the models are collected (what was
    counted when a stop or a full disk cut it); {} when the cache has no ledger. Raises UsageError
    when ``poll_s`` is not positive."""
    poll_s = BatchOptions().poll_s if poll_s is None else poll_s
    if poll_s <= 0:
        raise UsageError("--poll must be positive (seconds)")
    if not has_batches(plan.cache_dir):
        return {}
    say = say or (lambda text: None)
    options = BatchOptions(
        poll_s=poll_s, max_poll_s=max(poll_s, 300.0), collect_only=True, wait=wait
    )
    with Cache(plan.cache_dir) as cache:
        ledger = Ledger(plan.cache_dir)

        async def go() -> dict[str, BatchStats]:
            models, unreachable = await start_adapters(plan.models)
            for m, stop in unreachable:  # its batches stay open: collected once it can be reached
                say(f"{m.label}: not collected ({stop})")
            try:
                return await _dispatch.collect(
                    models, plan.suite, cache, ledger, options, plan.batch_overrides, say, stats
                )
            finally:
                for m in models:
                    await m.adapter.close()

        return uvloop.run(go())


@dataclass(frozen=True)
class Cancelled:
    """What ``cancel`` did: ``cancelled`` batches whose cancel the provider accepted (each ends at
    the provider's pace: its results so far are kept), of ``submitted`` chosen ones that were
    running (the others chosen had no batch id yet, or had ended)."""

    cancelled: int
    submitted: int

    @property
    def complete(self) -> bool:
        return self.cancelled == self.submitted


def cancel(
    cache_dir: Path,
    *,
    model: str | None = None,
    entry: str | None = None,
    every: bool = False,
    say: Callable[[str], None] | None = None,
) -> Cancelled:
    """Ask the provider to cancel the open batches chosen: every one of the model ``model`` (its
    name in reports, or the model string ``dxi run --model`` took: ``openai:gpt-x@http://host/v1``),
    the entry (``dxi-...``) or provider batch id ``entry``, or ``every`` one. Each provider is
    reached as the run that submitted the batch reached it (its model, server and key variable, from
    the entry's intent). Raises UsageError when the cache has no ledger, or no open batch matches
    ``model`` or ``entry`` (with ``every`` and none open: nothing to do, ``Cancelled(0, 0)``)."""
    if not has_batches(cache_dir):
        raise UsageError(f"{cache_dir} holds no batches (no {Path(cache_dir) / 'batches'} folder)")
    say = say or (lambda text: None)
    ledger = Ledger(cache_dir)
    chosen = _chosen(listed(cache_dir), model, entry, every, "open batch")
    if not chosen:
        return Cancelled(0, 0)

    async def go() -> int:
        apis = await _apis(ledger, chosen, say)
        try:
            return await cancel_entries(ledger, chosen, lambda e: apis.get(e.id), say)
        finally:
            for api in {id(a): a for a in apis.values() if a is not None}.values():
                await api.adapter.close()

    done = uvloop.run(go())
    return Cancelled(done, len([e for e in chosen if e.batch_id and not e.ended]))


def _chosen(
    entries: list[Entry], model: str | None, entry: str | None, every: bool, what: str
) -> list[Entry]:
    """The ``entries`` ``cancel`` and ``resume`` act on: ``every`` one, or those of the model
    ``model`` (``_of_model``) or of the entry or provider batch id ``entry``. Raises UsageError
    naming ``what`` (e.g. "open batch") when none matches ``model`` or ``entry``; with ``every``
    none is no error."""
    chosen = [
        e
        for e in entries
        if every or (model and _of_model(e, model)) or (entry and entry in (e.id, e.batch_id))
    ]
    if not chosen and not every:
        raise UsageError(
            f"no {what} matches"
            + (f" the model {model!r}" if model else f" {entry!r}" if entry else "")
            + " (dxi batches list)"
        )
    return chosen


def _of_model(entry: Entry, model: str) -> bool:
    """Whether ``entry`` is a batch of ``model``: its label, or a model string naming its adapter
    and model (and, when it gives one, its server)."""
    if model == entry.label:
        return True
    try:
        spec = adapters.parse_model(model)
    except ValueError:
        return False
    same_server = spec.base_url is None or (entry.base_url or "").rstrip(
        "/"
    ) == spec.base_url.rstrip("/")
    return f"{spec.kind}:{spec.model}" == entry.label and same_server


async def _apis(
    ledger: Ledger, entries: list[Entry], say: Callable[[str], None]
) -> dict[str, BatchAPI | None]:
    """Entry id -> the started batch API its batch was submitted through (one per model, server and
    key variable), None when it cannot be started (its key not set, say)."""
    made: dict[tuple, BatchAPI | None] = {}
    out: dict[str, BatchAPI | None] = {}
    for e in entries:
        doc = _intent(ledger, e.id)
        key = (e.kind, e.base_url, doc.get("model"), doc.get("api_key_env"))
        if key not in made:
            spec = adapters.ModelSpec(
                e.kind,
                doc.get("model") or "model",
                e.base_url or None,
                {},
                {"api_key_env": doc["api_key_env"]} if doc.get("api_key_env") else {},
            )
            adapter = adapters.get(spec)
            try:
                await adapter.start()
            except adapters.Fatal as exc:
                say(f"{e.label}: {exc}")
                made[key] = None
            else:
                made[key] = _batches.batch_api(adapter)
        out[e.id] = made[key]
    return out


def _intent(ledger: Ledger, entry_id: str) -> dict:
    """The intent event of an entry (its model's name and key variable), read from the ledger."""
    with open(ledger.path, "rb") as f:
        for line in f:
            if entry_id.encode() in line and b'"intent"' in line:
                try:
                    doc = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if doc.get("entry") == entry_id and doc.get("event") == "intent":
                    return doc
    return {}


async def cancel_entries(
    ledger: Ledger,
    entries: list[Entry],
    api_for: Callable[[Entry], BatchAPI | None],
    say: Callable[[str], None],
) -> int:
    """Ask the provider to cancel each open, submitted entry (``api_for`` gives its started batch
    API, None when it cannot be had); records ``cancel``, or ``ended`` (lost) for a batch the
    provider no longer knows. Returns how many were cancelled."""
    done = 0
    for entry in entries:
        if entry.closed or entry.batch_id is None or entry.ended:
            continue
        api = api_for(entry)
        if api is None:
            say(f"{entry.label}: batch {entry.batch_id}: no API key or server to cancel it with")
            continue
        try:
            status = await with_retries(
                lambda a=api, e=entry: a.cancel(e.batch_id), api.adapter, "cancel"
            )
        except _batches.BatchLost:
            ledger.record(entry.id, "ended", outcome="lost", state="not found", output={})
            say(f"{entry.label}: batch {entry.batch_id} is gone at the provider")
            continue
        except AdapterError as exc:
            say(f"{entry.label}: batch {entry.batch_id}: could not cancel ({exc})")
            continue
        ledger.record(entry.id, "cancel", reason="dxi batches cancel")
        if (
            status.state and status.state != entry.state
        ):  # (cancelling, canceling, ...: where it stands now)
            ledger.record(entry.id, "state", state=status.state, counts=status.counts)
        say(f"{entry.label}: batch {entry.batch_id} {status.state} (cancel asked)")
        done += 1
    return done
