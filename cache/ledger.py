"""The batch ledger: every provider batch ``dxi run --batch`` submits, recorded in the cache folder
before anything else happens (docs/batch.md; the intent-first rule of GUIDE §11).

Layout, under ``batches/`` in the cache folder::

    ledger.jsonl        one event per line, appended (under an exclusive flock) and fsync'd before the
                        step it records is taken, or at once after the step it records came back
    <entry>.keys        the custom ids (= cache keys) of an entry's requests, one a line; written to a
                        temporary name, fsync'd and renamed into place before the entry's intent event
    <entry>.lock        flocked by the process that polls and collects the entry (``collector``)

An **entry** is one batch of ours. Its events, in order (``Entry`` folds them):

* ``intent``: the entry's id (``dxi-...``, the tag a provider that allows one carries: OpenAI
  ``metadata``, a Gemini ``displayName``), the model, how many requests and bytes, what its worst
  case was reserved at, the run's ``price`` (when it had one: what ``dxi batches collect`` prices
  its results at when no run-history line has it), and (Anthropic, which tags nothing) ``ref``: the
  newest batch the provider listed just before;
* ``uploaded``: the input file's id (OpenAI, Gemini: the Files API);
* ``submitted``: the provider's batch id, written the instant the provider's reply is read;
* ``state``: the provider's state when it changed (and its request counts);
* ``ended``: the batch ended (completed, expired, cancelled, failed; ``lost``: the provider answers
  404), and where its results are;
* ``collected``: its results were read and their rows appended to the cache; ``returned`` lists the
  keys given back (expired, cancelled, transient errors: sent again), ``unmatched`` counts results
  whose task the run did not know (the entry stays open until a run that knows them collects it);
* ``abandoned``: the entry never became a batch (reconciled: nothing found with its tag), or was
  given up;
* ``cancel``: a cancellation was asked for (``dxi batches cancel``, a deadline);
* ``cleaned``: the batch's files at the provider (its input file, its result files) were deleted
  once it was collected, or their deletion was tried and failed (``failed``): never tried again
  either way;
* ``resume``: the user lifted the stop a collection put on the model's batch mode (``dxi batches
  resume``): a ``collected`` event with ``stop`` (a batch the provider said succeeded whose results
  carry none of its requests' ids) keeps every later run from submitting that model's requests in a
  batch until then.

A key is **claimed** by an entry while the entry is open (not collected whole, not abandoned) and
the key was not returned: nothing else sends it, synchronously or in another batch, in this process
or another.

Durability: every event is one ``write(2)`` of a whole line under the flock, then ``fsync``; a line
cut by a kill mid-write is completed with a newline by the next writer and skipped by readers with a
warning (the step it recorded is found again by reconciling with the provider). Readers never write;
``entries()`` re-reads only what was appended since it last read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from .lines import ShortWrite, append_line
from .store import CacheWriteError, _try_lock

log = logging.getLogger("dxi.cache")

LEDGER_DIR = "batches"
OPEN, CLOSED = "open", "closed"
EVENTS = (
    "intent",
    "uploaded",
    "submitted",
    "state",
    "ended",
    "collected",
    "abandoned",
    "cancel",
    "resume",
    "cleaned",
)


class LedgerError(CacheWriteError):
    """The ledger (or a batch's input file) cannot be written (a read-only or full disk): nothing is
    submitted without its record. A ``CacheWriteError``: ``dxi run`` stops as when a row cannot be
    written (exit code 4, "make room"); ``errno`` is the system's error number when there is one."""


@dataclass(slots=True)
class Entry:
    """One batch of ours, as the ledger's events say (see the module docstring). Times are Unix
    seconds.

    ``identity``: the model configuration's digest (``runner.dispatch.identity``); ``label``: the
    model's name in reports; ``kind`` / ``base_url``: the adapter and server; ``requests`` /
    ``bytes``: the batch's size; ``reserved_usd``: its worst-case cost reserved under ``--max-cost``
    (None: no bound); ``price``: the price the run that submitted it gave the model (the price tuple
    of ``scoring.cost``, as a list; None: none, or a ledger older than it); ``ref``: where the
    provider's batch listing stood before the create (``BatchAPI.reference``: a provider without a
    tag; None elsewhere); ``file_id``: the uploaded input file; ``batch_id``: the provider's;
    ``guessed``: the batch was adopted by its size and creation time (a provider without a tag), so
    it may be another client's; ``state``: the provider's last state; ``outcome``: how it ended
    (None while running); ``output``: where its results are (provider-specific); ``returned``: the
    keys given back when it was collected; ``unmatched``: results not stored for want of their task;
    ``cancel_at``: when a cancellation was asked for; ``stop``: why its collection stopped the
    model's batch mode, for every run until
    ``dxi batches     resume`` (None: it did not, or resumed); ``cleaned``: its files at the
    provider were deleted (or that was tried)."""

    id: str
    identity: str = ""
    label: str = ""
    kind: str = ""
    base_url: str = ""
    requests: int = 0
    bytes: int = 0
    created: float = 0.0
    host: str = ""
    pid: int = 0
    reserved_usd: float | None = None
    price: list | None = None
    ref: dict | None = None
    file_id: str | None = None
    batch_id: str | None = None
    guessed: bool = False
    submitted_at: float | None = None
    state: str = "intent"
    counts: dict = field(default_factory=dict)
    outcome: str | None = None
    ended_at: float | None = None
    output: dict = field(default_factory=dict)
    collected_at: float | None = None
    stored: int = 0
    returned: frozenset[str] = frozenset()
    unmatched: int = 0
    abandoned: str | None = None
    cancel_at: float | None = None
    cost_usd: float | None = None
    stop: str | None = None
    cleaned: bool = False

    @property
    def closed(self) -> bool:
        """Collected whole, or abandoned: it claims nothing any more."""
        return self.abandoned is not None or (self.collected_at is not None and self.unmatched == 0)

    @property
    def ended(self) -> bool:
        return self.outcome is not None

    @property
    def phase(self) -> str:
        """Where the entry stands, in words: intent, uploaded, submitted, running, ended, collected,
        abandoned."""
        if self.abandoned is not None:
            return "abandoned"
        if self.collected_at is not None and self.stop:
            return "collected: stopped its model's batch mode"
        if self.collected_at is not None:
            return "collected" if self.unmatched == 0 else "collected in part"
        if self.outcome is not None:
            return f"ended ({self.outcome})"
        if self.batch_id is not None:
            return self.state if self.state not in ("intent", "uploaded") else "submitted"
        return "uploaded" if self.file_id else "intent"

    def apply(self, event: dict) -> None:
        """Fold one event of this entry into it."""
        kind, at = event.get("event"), event.get("at")
        if kind == "intent":
            for name in (
                "identity",
                "label",
                "kind",
                "base_url",
                "requests",
                "bytes",
                "host",
                "pid",
                "reserved_usd",
                "price",
                "ref",
            ):
                if name in event:
                    setattr(self, name, event[name])
            self.created = at or 0.0
        elif kind == "uploaded":
            self.file_id = event.get("file_id")
            self.state = "uploaded" if self.batch_id is None else self.state
        elif kind == "submitted":
            self.batch_id, self.submitted_at = event.get("batch_id"), at
            self.guessed = bool(event.get("guessed"))
            self.state = event.get("state") or "submitted"
        elif kind == "state":
            self.state, self.counts = (
                event.get("state") or self.state,
                event.get("counts") or self.counts,
            )
        elif kind == "ended":
            self.outcome, self.ended_at = event.get("outcome"), at
            self.state = event.get("state") or self.state
            self.counts = event.get("counts") or self.counts
            self.output = event.get("output") or {}
        elif kind == "collected":
            self.collected_at = at
            self.stored += int(event.get("stored") or 0)
            self.returned = self.returned | frozenset(event.get("returned") or ())
            self.unmatched = int(event.get("unmatched") or 0)
            if event.get("cost_usd") is not None:
                self.cost_usd = (self.cost_usd or 0.0) + float(event["cost_usd"])
            if event.get("stop"):
                self.stop = str(event["stop"])
        elif kind == "resume":
            self.stop = None
        elif kind == "cleaned":
            self.cleaned = True
        elif kind == "abandoned":
            self.abandoned = event.get("reason") or "abandoned"
        elif kind == "cancel":
            self.cancel_at = at

    def as_dict(self) -> dict:
        """The entry for ``dxi batches list --json`` (the keys left out; ``returned`` as a
        count; ``price``: the model's price its intent recorded, None without one)."""
        out = {
            k: getattr(self, k)
            for k in (
                "id",
                "label",
                "kind",
                "base_url",
                "batch_id",
                "requests",
                "bytes",
                "created",
                "submitted_at",
                "state",
                "counts",
                "outcome",
                "ended_at",
                "collected_at",
                "stored",
                "unmatched",
                "abandoned",
                "cancel_at",
                "reserved_usd",
                "cost_usd",
                "price",
                "host",
                "pid",
                "stop",
            )
        }
        return out | {"phase": self.phase, "returned": len(self.returned)}


def new_id() -> str:
    """A fresh entry id: ``dxi-<UTC time>-<12 hex>``, 32 characters of ``[A-Za-z0-9-]`` (a valid
    Gemini ``displayName`` and OpenAI metadata value)."""
    return f"dxi-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:12]}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Ledger:
    """The ledger of the cache folder ``root`` (``batches/`` created on the first write; a cache
    without it has no batches). ``fsync`` False skips the fsyncs (benchmarks of the rest; never for
    real runs)."""

    def __init__(self, root: Path | str, *, fsync: bool = True):
        self.root = Path(root)
        self.folder = self.root / LEDGER_DIR
        self.path = self.folder / "ledger.jsonl"
        self.fsync = fsync
        self._entries: dict[str, Entry] = {}
        self._offset = 0
        self._inode: int | None = None
        self.warnings: list[str] = []

    # ---- writing ------------------------------------------------------------------------------
    def append(self, event: dict) -> None:
        """Append one event durably (see the module docstring); raises LedgerError when it cannot
        be."""
        line = orjson.dumps({"at": time.time(), **event}, option=orjson.OPT_APPEND_NEWLINE)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            append_line(
                self.path, line, fsync=self.fsync
            )  # a line cut by a kill is ended first (cache.lines)
        except ShortWrite as exc:
            raise LedgerError(
                f"cannot write the batch ledger {self.path}: only {exc.written} of {exc.wanted} bytes "
                "were written (is the disk full?)"
            ) from None
        except OSError as exc:
            raise LedgerError(
                f"cannot write the batch ledger {self.path}: {exc.strerror or exc}", exc.errno
            ) from None

    def intent(self, entry_id: str, keys: Iterable[str], **fields: object) -> None:
        """Record a batch about to be made: its keys file first (written whole, fsync'd, renamed
        into place), then its ``intent`` event (``fields``: ``identity``, ``label``, ``kind``,
        ``base_url``, ``requests``, ``bytes``, ``reserved_usd``, ``price``). Nothing is sent to the
        provider before this returns."""
        target = self.folder / f"{entry_id}.keys"
        tmp = self.folder / f".{entry_id}.keys.{os.getpid()}.tmp"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(b"".join(k.encode() + b"\n" for k in keys))
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, target)
            if self.fsync:
                _fsync_dir(self.folder)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise LedgerError(
                f"cannot write the batch ledger's keys file {target}: {exc.strerror or exc}",
                exc.errno,
            ) from None
        self.append(
            {
                "event": "intent",
                "entry": entry_id,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                **fields,
            }
        )

    def record(self, entry_id: str, event: str, **fields: object) -> None:
        """Append the event ``event`` (one of ``EVENTS``) of entry ``entry_id``."""
        assert event in EVENTS, event
        self.append({"event": event, "entry": entry_id, **fields})

    # ---- reading ------------------------------------------------------------------------------
    def entries(self) -> dict[str, Entry]:
        """Every entry (id -> Entry), with the events appended since the last call folded in."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if (
                    st.st_ino != self._inode or st.st_size < self._offset
                ):  # a new ledger: read it whole
                    self._entries, self._offset, self._inode = {}, 0, st.st_ino
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return self._entries
        end = data.rfind(b"\n") + 1  # a last line still being written is read next time
        at = 0
        while at < end:
            stop = data.index(b"\n", at)
            line, where = data[at:stop], self._offset + at
            at = stop + 1
            if not line.strip():
                continue
            try:
                event = orjson.loads(line)
                entry_id = event["entry"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                message = (
                    f"batch ledger {self.path}: a damaged line at byte {where} (cut by a kill mid-write) "
                    "skipped; the step it recorded is found again with the provider"
                )
                self.warnings.append(message)
                log.warning(message)
                continue
            entry = self._entries.get(entry_id)
            if entry is None:
                entry = self._entries[entry_id] = Entry(entry_id)
            entry.apply(event)
        self._offset += end
        return self._entries

    def keys(self, entry_id: str) -> list[str]:
        """The keys of an entry (its keys file; [] when it is gone: an intent cut before its
        event)."""
        try:
            return (self.folder / f"{entry_id}.keys").read_bytes().decode().split()
        except FileNotFoundError:
            return []

    def open_entries(self, identity: str | None = None) -> list[Entry]:
        """The entries not closed (of the model ``identity``, or of every model), oldest first."""
        return sorted(
            (
                e
                for e in self.entries().values()
                if not e.closed and (identity is None or e.identity == identity)
            ),
            key=lambda e: e.created,
        )

    def stops(self, identity: str | None = None) -> list[Entry]:
        """The entries whose collection stopped the batch mode of model ``identity`` (of every
        model: None) and that were not resumed since (``Entry.stop``), oldest first."""
        chosen = (
            e
            for e in self.entries().values()
            if e.stop and (identity is None or e.identity == identity)
        )
        return sorted(chosen, key=lambda e: e.created)

    def claimed(self, identity: str) -> dict[str, str]:
        """The keys the open entries of model ``identity`` claim: key -> entry id (keys returned
        excluded)."""
        out: dict[str, str] = {}
        for e in self.open_entries(identity):
            for k in self.keys(e.id):
                if k not in e.returned:
                    out[k] = e.id
        return out

    def sweep_inputs(self, keep: set[str] = frozenset()) -> int:
        """Delete the input files (``<entry>.input.jsonl``) left by processes that died before
        submitting them: those of entries not in ``keep`` (the open ones: their bodies are read when
        they are collected) whose collector lock is free (a live builder holds its entry's lock).
        Returns how many."""
        gone = 0
        for path in self.folder.glob("*.input.jsonl"):
            if path.name.removesuffix(".input.jsonl") in keep:
                continue
            with self.collector(path.name.removesuffix(".input.jsonl")) as free:
                if free:
                    path.unlink(missing_ok=True)
                    (self.folder / path.name.replace(".input.jsonl", ".lock")).unlink(
                        missing_ok=True
                    )
                    gone += 1
        return gone

    def forget_keys(self, entry_id: str) -> None:
        """Remove a closed entry's keys, input and lock files (its events stay)."""
        for suffix in ("keys", "input.jsonl", "lock"):
            with contextlib.suppress(OSError):
                (self.folder / f"{entry_id}.{suffix}").unlink()

    @contextlib.contextmanager
    def collector(self, entry_id: str) -> Iterator[bool]:
        """Whether this process may poll and collect ``entry_id`` now: True while it holds the
        entry's lock (no other live process polls or collects it), False when another does. Released
        on leaving the block (or by the kernel, when the process dies)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with _try_lock(self.folder / f"{entry_id}.lock", create=True) as held:
            yield held
