"""Batch mode's submitting (``runner.batch.driver``'s module docstring: **Submitting**,
**Reconciling**): the batch being built (``_Builder``), a request added under the cost bound and the
provider's limits, the ledger's intent-first order (intent, upload, create, submitted), and at start
the entries of earlier runs reconciled with the provider (found, adopted or abandoned)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from dxi.adapters import AdapterError, Fatal, ProviderStop, RateLimited, Request, Retryable
from dxi.adapters.batches import WIDE_S, BatchLost, BatchStatus
from dxi.cache.ledger import Entry, LedgerError, new_id
from dxi.evals import Task

from ..planning.tokens import BYTES_PER_TOKEN
from .options import failpoint, with_retries


@dataclass
class _Builder:
    """The batch being built: its entry id, input file, keys, bytes, estimated input tokens and the
    reservation of each request (key -> USD)."""

    entry: str
    path: Path
    fd: object
    keys: list[str] = field(default_factory=list)
    bytes: int = 0
    tokens: float = 0.0
    reserved: dict[str, float] = field(default_factory=dict)
    submitted: bool = False  # ``_submit`` was called: a batch is submitted once, never twice
    creating: bool = False  # its create went out (``ModelBatches.count_stopped`` counts it sent)


class Submitting:
    """The submitting half of ``ModelBatches`` (a mixin: the state it reads is the one
    ``ModelBatches.__init__`` sets and documents; kept apart so each module reads in one
    sitting)."""

    async def _reconcile(self) -> None:
        """Entries of this model left open by earlier runs: those cut before their batch id was
        recorded looked for at the provider (adopted, or abandoned); the others polled from now
        on."""
        known = {e.batch_id for e in self.ledger.entries().values() if e.batch_id}
        stops = self.ledger.stops(self.identity) if not self.options.collect_only else []
        if stops:  # a collection of an earlier run stopped this model's batch mode
            first = stops[0]
            self.stopped = Fatal(
                f"{self.label}: batch mode stays stopped for this model: batch {first.batch_id} "
                f"(entry {first.id}) succeeded but none of its results carried one of its "
                "requests' ids; its requests are not submitted in a batch (run without --batch "
                f"to send them one call at a time, or {self._resume_hint()} once the cause is "
                "fixed)"
            )
            self.stats.stopped = str(self.stopped)
            self.events(str(self.stopped))  # (it names the model already)
        if self.ledger.folder.is_dir():
            self.ledger.sweep_inputs({e.id for e in self.ledger.open_entries()})
        for entry in list(self.ledger.entries().values()):  # a run killed before cleaning
            mine = entry.identity == self.identity
            if mine and entry.closed and not entry.abandoned and not entry.cleaned:
                await self._clean(entry)
        for entry in self.ledger.open_entries(self.identity):
            if not self._lock(entry.id):
                self.watched.add(entry.id)  # another live process polls it
                continue
            adopted = [entry.id]
            if entry.batch_id is None:
                adopted = await self._find(entry, known)
                entry = self.ledger.entries()[entry.id]
                if entry.closed:
                    self._unlock(entry.id)
                    continue
            for entry_id in adopted:
                one = self.ledger.entries()[entry_id]
                self.mine[entry_id] = 0.0
                self.stats.running[entry_id] = one.submitted_at or one.created
                self.entry_tokens[entry_id] = one.bytes / BYTES_PER_TOKEN

    async def _find(self, entry: Entry, known: set[str]) -> list[str]:
        """An entry whose create may have reached the provider without its reply being recorded:
        every batch that may be it is adopted (the entry takes the first; each other one gets an
        entry of its own, with the same keys): results are matched by custom id, so a batch that was
        not ours stores nothing, and a request is given back only once no open entry claims it
        (``_collect``). Returns the entry ids adopted (to poll); [] when none was found (the entry
        is abandoned, its input file deleted at the provider) or the provider could not be asked
        (left open for the next run)."""
        try:
            found = await with_retries(
                lambda: self.api.find(entry.id, entry.created, entry.requests, known, entry.ref),
                self.adapter,
                "find",
            )
        except AdapterError as exc:
            self._say(
                f"could not look for batch {entry.id} at the provider ({exc}); left open for the next run"
            )
            return []
        guessed = not self.api.taggable
        how = "by its tag" if not guessed else "by its size and creation (the provider has no tag)"
        if found:
            adopted = []
            for i, status in enumerate(found):
                entry_id = entry.id
                if i:  # another candidate: an entry of its own, claiming the same keys
                    entry_id = new_id()
                    self._lock(entry_id)
                    a = self.adapter
                    self.ledger.intent(
                        entry_id,
                        self.ledger.keys(entry.id),
                        identity=self.identity,
                        label=self.label,
                        kind=a.kind,
                        base_url=getattr(a, "base_url", ""),
                        model=a.spec.model,
                        api_key_env=getattr(a, "key_env", None),
                        requests=entry.requests,
                        bytes=entry.bytes,
                        reserved_usd=None,
                        candidate_of=entry.id,
                    )
                self.ledger.record(
                    entry_id,
                    "submitted",
                    batch_id=status.batch_id,
                    state=status.state,
                    adopted=True,
                    guessed=guessed,
                )
                known.add(status.batch_id)
                adopted.append(entry_id)
            if len(found) == 1:
                self._say(
                    f"found batch {found[0].batch_id} of {entry.id} again {how}; its results will "
                    "be collected"
                )
            else:
                self._say(
                    f"{len(found)} batches may be entry {entry.id}, found {how} "
                    f"({', '.join(s.batch_id for s in found)}): each is adopted and collected; the "
                    "results carrying its requests' ids are kept, the others' left out, and a request "
                    "none of them answers is sent again"
                )
            return adopted
        api = self.api
        if api.listed_all:
            what = (
                "carries the entry's tag"
                if api.taggable
                else f"has its {entry.requests:,} requests (of those created after the newest "
                "batch it listed before the create, by its own clock)"
            )
            reason = (
                f"not found at the provider (none of the {api.listed:,} batches it lists "
                f"{what}): it was never created; its requests are submitted in a new batch"
            )
        elif api.taggable or entry.ref is not None:
            reason = (
                f"not found among the {api.listed:,} batches of the provider's listing read "
                "(it lists more: not proof that it was never created); its requests are "
                "submitted in a new batch"
            )
        else:
            since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(entry.created - WIDE_S))
            reason = (
                f"no batch of {entry.requests:,} requests created since {since} "
                "(this machine's clock, a day before the intent: the entry was recorded "
                "without the provider's listing to go by) that no other entry knows is "
                "listed by the provider, which tags nothing: taken as not created, its "
                "requests are submitted in a new batch (were this machine's clock more "
                "than a day ahead of the provider's, such a batch would exist, unknown to "
                "dxi: see the provider's console)"
            )
        self.ledger.record(entry.id, "abandoned", reason=reason)
        self._unlock(entry.id)
        self.ledger.forget_keys(entry.id)
        self._say(f"entry {entry.id} {reason}")
        await self._delete_input(entry)
        return []

    async def _clean(self, entry: Entry) -> None:
        """Delete at the provider the files of a batch that ran and was collected (its input file,
        its result files: ``BatchAPI.files_of``), best effort: the ``cleaned`` event records what
        was deleted, or why not, and the deletion is never tried again (``_reconcile`` tries it
        once for an entry closed by a run killed before it)."""
        if entry.cleaned or entry.batch_id is None:
            return
        files = self.api.files_of(entry.file_id, entry.output)
        if not files:
            return
        try:
            deleted = await with_retries(
                lambda: self.api.delete_files(files), self.adapter, "delete"
            )
        except AdapterError as exc:
            self.ledger.record(entry.id, "cleaned", files=files, failed=str(exc))
            self._say(
                f"could not delete the files of batch {entry.batch_id} at the provider "
                f"({exc}); left there (not tried again)"
            )
            return
        self.ledger.record(entry.id, "cleaned", files=files, deleted=deleted)

    async def _delete_input(self, entry: Entry) -> None:
        """Delete at the provider the input file of an entry that never became a batch (uploaded
        just before a kill, or before a create that failed): by the file id the ledger recorded,
        else by the name dxi gave it (``BatchAPI.delete_input``: only a file named after this
        ledger's entry)."""
        try:
            deleted = await with_retries(
                lambda: self.api.delete_input(entry.id, entry.file_id), self.adapter, "delete"
            )
        except AdapterError as exc:
            self._say(
                f"could not delete the input file of entry {entry.id} at the provider ({exc})"
            )
            return
        if deleted:
            self._say(
                f"deleted the input file of entry {entry.id} at the provider (it never became a "
                "batch)"
            )

    async def _add(
        self, builder: _Builder | None, task: Task, sample: int, request: Request
    ) -> _Builder | None:
        """Put one request in the batch being built (submitting it first when full); reserve its
        worst case first (CostBoundReached when the bound leaves no room)."""
        line = self.api.line(request) + b"\n"
        tokens = len(request.body) / BYTES_PER_TOKEN
        if builder is not None and (
            len(builder.keys) >= self.max_requests
            or builder.bytes + len(line) > self.max_bytes
            or self._over_tokens(builder.tokens + tokens)
        ):
            await self._submit(builder)
            builder = None
        while self.options.enqueued_tokens and self.entry_tokens and self._over_tokens(tokens):
            self.wake.set()
            await self._settled()  # the enqueued-token limit: wait for an open batch to end
        if (
            not self.budget.fits(self.charge.bound(self.adapter, task, request))
            and builder is not None
            and builder.keys
        ):
            await self._submit(
                builder
            )  # what is built goes first: its results may free room under the bound
            builder = None
        reserved = await self.charge.reserve(self.adapter, task, request)
        try:
            if builder is None:
                builder = self._new_builder()
            builder.fd.write(line)
        except (
            OSError
        ) as exc:  # a full or read-only disk: stopped as a cache write is (exit code 4)
            self.budget.settle(reserved, 0.0)
            where = builder.path if builder is not None else self.ledger.folder
            raise LedgerError(
                f"cannot write the batch input file in {where}: {exc.strerror or exc}", exc.errno
            ) from None
        builder.keys.append(request.key)
        builder.bytes += len(line)
        builder.tokens += tokens
        builder.reserved[request.key] = reserved
        self.waiting[request.key] = (task, sample)
        return builder

    def _over_tokens(self, tokens: float) -> bool:
        limit = self.options.enqueued_tokens
        return bool(limit) and sum(self.entry_tokens.values()) + tokens > limit

    async def _settled(self) -> None:
        """Wait until an open entry of this run closes."""
        before = self.stats.collected
        while self.stats.collected == before and self.entry_tokens:
            await asyncio.sleep(min(1.0, self.options.poll_s))

    def _new_builder(self) -> _Builder:
        """A new batch: its entry id, its collector lock (held from now: ``Ledger.sweep_inputs``
        leaves its input file alone) and its input file."""
        entry_id = new_id()
        self.ledger.folder.mkdir(parents=True, exist_ok=True)
        self._lock(entry_id)
        path = self.ledger.folder / f"{entry_id}.input.jsonl"
        return _Builder(entry_id, path, open(path, "wb"))  # noqa: SIM115 (closed by _submit)

    async def _submit(self, builder: _Builder) -> None:
        """Record the intent, upload, create, record the batch id (see the module docstring), once
        per builder: a caller whose ``_add`` submitted it before its reservation failed holds it
        still. After a stop of the model (the provider refused a batch whole) or past the deadline,
        nothing is submitted: its requests are left unsent."""
        if builder.submitted:
            return
        builder.submitted = True
        try:
            builder.fd.close()
        except OSError as exc:
            raise LedgerError(
                f"cannot write the batch input file {builder.path}: {exc.strerror or exc}",
                exc.errno,
            ) from None
        entry_id, n = builder.entry, len(builder.keys)
        if (
            not n or self._past_deadline() or self.stopped is not None
        ):  # past the deadline, or stopped, nothing more is submitted: left for the fallback
            builder.path.unlink(missing_ok=True)
            self._unlock(entry_id)
            for key in builder.keys:
                self.budget.settle(builder.reserved.get(key, 0.0), 0.0)
                self.left.append(self.waiting.pop(key))
            return
        spec = self.adapter.spec
        reserved = sum(builder.reserved.values())
        self.submitting = builder  # until it is a batch, or abandoned: a stop counts it from here
        ref = await self._reference()
        self.ledger.intent(
            entry_id,
            builder.keys,
            identity=self.identity,
            label=self.label,
            kind=self.adapter.kind,
            base_url=getattr(self.adapter, "base_url", ""),
            model=spec.model,
            api_key_env=getattr(self.adapter, "key_env", None),
            requests=n,
            bytes=builder.bytes,
            reserved_usd=(round(reserved, 6) if self.budget.max_usd is not None else None),
            **({"ref": ref} if ref is not None else {}),
            # the run's price: what dxi batches collect prices the results at when no run-history
            # line has it (a run killed before it wrote one)
            **({"price": list(self.model.price)} if self.model.price is not None else {}),
        )
        self.reserved.update(builder.reserved)
        for key in builder.keys:
            self.attempts[key] = self.attempts.get(key, 0) + 1
        failpoint("intent")
        try:
            file_id = await with_retries(
                lambda: self.api.upload(entry_id, builder.path, n, builder.bytes),
                self.adapter,
                "upload",
            )
            failpoint("upload_reply")
            if file_id is not None:
                self.ledger.record(entry_id, "uploaded", file_id=file_id)
            failpoint("uploaded")
            builder.creating = True  # the create goes out: the batch may exist from now on
            status = await self._create(entry_id, builder, file_id, n, ref)
        except AdapterError as exc:
            self.submitting = None
            self.ledger.record(
                entry_id, "abandoned", reason=f"the batch could not be submitted: {exc}"
            )
            self._unlock(entry_id)
            self.ledger.forget_keys(entry_id)
            self._refused(exc, builder.keys)
            entry = self.ledger.entries().get(entry_id)
            if entry is not None and entry.file_id is not None:  # uploaded, never a batch
                await self._delete_input(entry)
            return
        failpoint("created")
        # (a record that cannot be written leaves it cut: counted sent, ``ModelBatches._count_cut``)
        self.ledger.record(entry_id, "submitted", batch_id=status.batch_id, state=status.state)
        self.submitting = None
        failpoint("submitted")
        self.stats.submitted += 1
        # each request counted sent once, however many batches it was in (given back, resubmitted);
        # a retry each time it is in a batch again, once the batch is submitted (one the API refused
        # sent nothing again)
        new = set(builder.keys) - self.counted
        self.counted |= new
        self.stats.sent += len(new)
        self.stats.retries += sum(self.attempts[key] > 1 for key in builder.keys)
        if self.stats.started is None:
            self.stats.started = time.monotonic()
        self.stats.running[entry_id] = time.time()
        self.entry_tokens[entry_id] = builder.tokens
        self.mine[entry_id] = time.monotonic() + self.options.poll_s
        self.fresh.add(entry_id)
        self._say(f"batch {status.batch_id} submitted ({n:,} requests, entry {entry_id})")
        self.wake.set()
        self.on_progress()

    async def _reference(self) -> dict | None:
        """Where the provider's batch listing stands before a create (``BatchAPI.reference``), to
        find the batch by if the create's reply is lost; None when the provider tags batches or
        the listing cannot be read (then a lost create is looked for by this machine's clock,
        said as such)."""
        try:
            return await with_retries(self.api.reference, self.adapter, "reference")
        except BatchLost:  # no batch API here: the create says so
            return None
        except AdapterError as exc:
            self._say(
                f"could not read the provider's batch listing before a create ({exc}); "
                "were its reply lost, its batch would be looked for by this machine's clock"
            )
            return None

    async def _create(
        self, entry_id: str, builder: _Builder, file_id: str | None, n: int, ref: dict | None = None
    ) -> BatchStatus:
        """Create the batch; after a create whose reply was lost, look for it (by tag; Anthropic: by
        time and size) before trying again, so that one entry never becomes two batches."""
        created_after = time.time() - 5
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self.api.create(entry_id, builder.path, file_id, n, builder.bytes)
            except Retryable as exc:
                if attempt >= max(1, self.adapter.limits.max_attempts) or not exc.should_retry:
                    raise
                if not isinstance(
                    exc, RateLimited
                ):  # the create may have been made: look before creating again
                    known = {e.batch_id for e in self.ledger.entries().values() if e.batch_id}
                    found = await with_retries(
                        lambda known=known: self.api.find(entry_id, created_after, n, known, ref),
                        self.adapter,
                        "find",
                    )
                    if len(found) == 1:
                        return found[0]
                wait = (
                    exc.retry_after
                    if isinstance(exc, RateLimited) and exc.retry_after is not None
                    else min(
                        self.adapter.limits.max_wait_s,
                        self.adapter.limits.backoff_s * 2 ** (attempt - 1),
                    )
                )
                await asyncio.sleep(wait)

    def _refused(self, error: AdapterError, keys: list[str]) -> None:
        """The batch API refused a batch (a 4xx, a stop, retries spent): its requests are left
        unsent, and after a stop (a refused key, an exhausted quota, no batch API at this URL)
        nothing more is submitted."""
        self._say(f"a batch could not be submitted: {error}")
        if self.stats.errors is not None and len(self.stats.errors) < 20:
            self.stats.errors.append(f"batch submission: {error}")
        if isinstance(error, (ProviderStop, Fatal)):
            self.stopped = error
            self.stats.stopped = str(error)
        for key in keys:
            self.budget.settle(self.reserved.pop(key, 0.0), 0.0)
            item = self.waiting.pop(key, None)
            if item is not None:  # (counted as not sent once, with the rest left: runner.dispatch)
                self.left.append(item)
