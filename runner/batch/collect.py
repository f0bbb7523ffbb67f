"""Batch mode's collecting (``runner.batch.driver``'s module docstring: **Collecting**): an ended
batch's result lines decoded into the cache's rows as a synchronous reply's, appended a piece at a
time; the requests without a result given back to the next batch, or stored as a transient failure
once they ran out of attempts; the heap trimmed after each collection (``_trim``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dxi.adapters import (
    AdapterError,
    Answer,
    ErrorIn200,
    Fatal,
    ProviderStop,
    RateLimited,
    Reply,
    Request,
    Retryable,
)
from dxi.adapters.batches import COMPLETED as COMPLETED_BATCH
from dxi.adapters.batches import FAILED as FAILED_BATCH
from dxi.adapters.batches import BatchLost, BatchStatus, ResultLine
from dxi.adapters.errors import REQUEST
from dxi.cache.ledger import Entry
from dxi.evals import Task

from ..sending.cost import CostBoundReached, Settled, credible
from ..sending.retry import Outcome
from ..sending.rows import make_row
from .options import BATCH, failpoint

if TYPE_CHECKING:
    from .submit import _Builder


class Collecting:
    """The collecting half of ``ModelBatches`` (a mixin: the state it reads is the one
    ``ModelBatches.__init__`` sets and documents; kept apart so each module reads in one
    sitting)."""

    def _bodies(self, entry_id: str) -> dict[str, bytes]:
        """The request bodies of an entry, from its input file (kept until it is collected): each
        result's request is rebuilt from them rather than encoded again. {} when the file is gone (a
        run that died before: the requests are encoded again)."""
        split = self.api.split
        try:
            with open(self.ledger.folder / f"{entry_id}.input.jsonl", "rb") as f:
                return dict(
                    split(raw[:-1] if raw[-1:] == b"\n" else raw) for raw in f if not raw.isspace()
                )
        except (OSError, ValueError):
            return {}

    def _request(self, key: str, task: Task, sample: int, body: bytes | None) -> Request:
        """The request of ``key``: from its body as sent (``_bodies``), else encoded again."""
        if body is not None:
            a = self.adapter
            request = Request(a.kind, a.model, a.endpoint, body, sample, self.params_key)
            if request.key == key:
                return request
        return self.adapter.encode(task, sample)

    async def _collect(self, entry: Entry, status: BatchStatus | None) -> None:
        """Store an ended batch's results as they are read; give back what has none (module
        docstring).

        A result whose id is none of the batch's requests' (or that has none) and one repeating an
        id read already (the first is kept) are counted (``BatchStats.unknown_results``,
        ``duplicate_results``) and said. A batch the provider says succeeded none of whose results
        carries one of its requests' ids stops the model's batch mode (its requests are not
        submitted again: they would be lost the same way), unless it was adopted by size
        (``Entry.guessed``: then it was another client's). Results the provider no longer has (404:
        past its retention) give the batch's requests back, once. Those, and the requests a
        completed batch leaves without a result (no line, or an unreadable one), keep their
        reservations as spent (``_kept``)."""
        keys = set(self.ledger.keys(entry.id))
        bodies = self._bodies(entry.id)
        seen: set[str] = set()
        given: list[str] = []
        stored = unmatched = unknown = duplicate = cached = 0
        actual = 0.0
        gone: BatchLost | None = None
        if status is not None:
            try:
                async for results in self.api.results(status):  # a piece of the results at a time
                    rows: list[tuple[str, Task, dict, float]] = []
                    for result in results:
                        key = result.key
                        if key not in keys:
                            unknown += 1
                            continue
                        if key in seen:
                            duplicate += 1
                            continue
                        seen.add(key)
                        item = self.waiting.get(key)
                        if self.cache.has(key):  # (stored by a run killed before its record)
                            self.waiting.pop(key, None)
                            cached += 1
                            continue
                        if item is None:
                            unmatched += 1
                            continue
                        row, cost = self._row(entry, key, item, result, bodies.get(key))
                        if row is None:
                            given.append(key)
                            actual += self._charged(cost)  # (a reply that arrived unreadable)
                        else:
                            rows.append((key, item[0], row, cost))
                    if rows:  # stored before the next piece is read
                        self._store(rows)
                        stored += len(rows)
                        if entry.id not in self.fresh:
                            self.stats.from_earlier += len(rows)
                            self.stats.earlier_entries.add(entry.id)
                        actual += sum(cost.usd for *_, cost in rows)
            except BatchLost as exc:  # past the provider's retention: its requests are given back
                gone = exc
            except AdapterError as exc:
                self._say(
                    f"could not read all results of batch {entry.batch_id} ({exc}); trying again later"
                )
                self._schedule(entry.id)
                return
        foreign = (
            entry.guessed and not seen
        )  # adopted by size, none of ours: another client's batch
        if unknown and not foreign:
            self.stats.unknown_results += unknown
            self._say(
                f"batch {entry.batch_id}: {unknown:,} result(s) whose id is none of its requests' "
                "(or that carry none) left out"
            )
        if duplicate:
            self.stats.duplicate_results += duplicate
            self._say(
                f"batch {entry.batch_id}: {duplicate:,} result(s) repeating an id read already left "
                "out (the first result of each id is kept)"
            )
        mismatch = (
            status is not None
            and status.outcome == COMPLETED_BATCH
            and gone is None
            and keys
            and not seen
            and not entry.guessed
        )
        if mismatch:  # submitting them again would lose them the same way, and pay again
            self.stopped = Fatal(
                f"{self.label}: batch {entry.batch_id} succeeded but none of its {unknown:,} "
                f"result(s) carries one of its {len(keys):,} requests' ids: nothing could be "
                "stored; batch mode stopped for this model, in this run and the next ones (its "
                "requests are not submitted in a batch again: run without --batch to send them one "
                f"call at a time; once the cause is fixed, {self._resume_hint()} lets batch mode "
                "submit them again)"
            )
            self.stats.stopped = str(self.stopped)
            self.events(str(self.stopped))  # (it names the model already)
        elif gone is not None:
            self._say(
                f"the results of batch {entry.batch_id} are gone at the provider ({gone}: "
                f"{self.api.RETENTION}): its {len(keys - seen):,} request(s) not stored are given "
                "back and sent again"
            )
        others: set[str] | None = (
            None  # keys other open entries claim (candidates of one lost create)
        )
        for key in keys - seen:
            if key in self.waiting and not self.cache.has(key):
                if others is None:
                    others = {
                        k
                        for e in self.ledger.open_entries(self.identity)
                        if e.id != entry.id
                        for k in self.ledger.keys(e.id)
                        if k not in e.returned
                    }
                if key in others:  # another candidate may still answer it: given back once none can
                    continue
                given.append(key)
                self.stats.attempts += 1
        returned = sorted(set(given))
        if status is not None and status.outcome == FAILED_BATCH and entry.id in self.fresh:
            # its input refused whole: this run's requests in it were refused, not sent (their
            # next run sends them), as a synchronous request that met a provider's stop
            refused = self.refused.union(returned)
            self.stats.sent -= len(refused) - len(self.refused)
            self.stats.refused += len(refused) - len(self.refused)
            # nor sent again: a resubmitted one's retry (counted at submission) is taken back
            self.stats.retries -= sum(self.attempts.get(k, 0) > 1 for k in refused - self.refused)
            self.refused = refused
        extra = {"results_gone": str(gone)} if gone is not None else {}
        missing = [k for k in returned if k not in seen]  # no result read
        ended = status is not None and status.outcome == COMPLETED_BATCH and not foreign
        if gone is not None:  # the provider ran (and billed) them: kept as spent (``_kept``)
            actual += self._kept(missing, extra)
        elif ended and missing:  # a completed batch's results cover each of its requests: one
            # without a line (read or unreadable) ran, and may have been billed
            omitted = max(0, len(missing) - unknown)  # beyond the unreadable lines
            if omitted:
                extra["omitted"] = omitted
                self._say(
                    f"batch {entry.batch_id}: {omitted:,} request(s) without a result line in a "
                    "completed batch: each is charged its reservation (at most that was spent)"
                )
            actual += self._kept(missing, extra)
        elif unknown and not foreign and missing:  # a line unreadable, or its id not one of ours:
            # it may be the reply of a request without a result, which the provider ran and billed
            dearest = sorted(missing, key=lambda k: self.reserved.get(k, 0.0), reverse=True)
            actual += self._kept(dearest[:unknown], extra)
        if mismatch:  # the stop outlives this run: every run reads it (``_reconcile``)
            extra["mismatch"] = True
            extra["stop"] = str(self.stopped)
        self.ledger.record(
            entry.id,
            "collected",
            stored=stored,
            returned=returned,
            unmatched=unmatched,
            cost_usd=round(actual, 9) if self.charge.price is not None else None,
            unknown=unknown,
            duplicate=duplicate,
            **extra,
        )
        self._unlock(entry.id)
        if self.ledger.entries()[entry.id].closed:
            self.ledger.forget_keys(entry.id)
            await self._clean(self.ledger.entries()[entry.id])
        self.mine.pop(entry.id, None)
        self.stats.running.pop(entry.id, None)
        self.entry_tokens.pop(entry.id, None)
        self.stats.collected += 1
        self.stats.collected_entries.add(entry.id)
        if foreign:
            self._say(
                f"batch {entry.batch_id} (adopted by its size and time) was not this run's: none of "
                "its results carries one of the entry's ids; nothing stored from it"
            )
        for key in returned:
            if (
                mismatch
            ):  # stopped: left for the next run (or a synchronous one), never submitted here
                continue
            self._give_back(key)
        _trim()
        said = [f"{stored:,} stored"]
        if cached:  # read again, not stored again: "0 stored" alone would read as lost
            said.append(f"{cached:,} already in the cache (not stored again)")
        if returned:
            said.append(f"{len(returned):,} given back")
        self._say(f"batch {entry.batch_id} collected: {', '.join(said)}")
        self.wake.set()
        self.on_progress()

    def _kept(self, keys: list[str], extra: dict) -> float:
        """The batch ran its requests ``keys`` (the provider billed them) but their results could
        not be read: gone at the provider (404), left out of a completed batch's results (no line
        for them: ``extra``'s ``omitted``), or in result lines that cannot be read (not JSON, no id,
        an id none of its requests has: in a batch that did not complete, ``keys`` are then as many
        of the requests without a result, the dearest). As for a synchronous reply that never
        arrived or is not the wire format (``Charge.settle``), the reservation of each one this run
        submitted is kept as spent (in the model's cost and its ``cost_at_reservation_usd``: at most
        that was spent; where it bounds nothing, ``Charge.is_bound``, in ``cost_unbounded``; in the
        ledger's ``cost_usd``); those of an earlier run's batch (no reservation here) are counted in
        ``extra`` as of unknown cost. Returns what was kept; each one is given back all the same
        (``_give_back``: sent again, or stored as a transient failure, which the next run sends)."""
        kept, unknown = 0.0, 0
        for key in keys:
            reserved = self.reserved.pop(key, None)
            if reserved is None:
                unknown += 1
                continue
            item = self.waiting.get(key)
            bounded = item is None or self.charge.is_bound(self.adapter, item[0])
            kept += self._charged(self.charge.settle(reserved, None, None, bounded))
        extra["kept_usd"] = round(kept, 9)
        if unknown:
            extra["cost_unknown"] = unknown
        return kept

    def _charged(self, cost: Settled) -> float:
        """Count what an attempt was charged (``Charge.settle``'s ``Settled``) in the model's
        ``cost_usd`` (and ``cost_at_reservation_usd``, and ``cost_unbounded`` where that bounds
        nothing); returns it (USD)."""
        st = self.stats
        if st.cost_usd is not None:
            st.cost_usd += cost.usd
            if cost.at_reservation:
                st.cost_at_reservation_usd += cost.usd
                st.cost_unbounded += not cost.bounded
        return cost.usd

    def _row(
        self,
        entry: Entry,
        key: str,
        item: tuple[Task, int],
        result: ResultLine,
        sent: bytes | None = None,
    ) -> tuple[dict | None, Settled]:
        """Decode one result as the synchronous path would (``sent``: the request's body as it was
        sent, when known); returns (its cache row, what it was charged: ``Charge.settle``'s
        ``Settled``), or (None, what it was charged) when it is given back: its reservation for a
        reply that is not the wire format (billed, as a synchronous one), else nothing."""
        task, sample = item
        body, error = result.body, result.error
        outcome = Outcome(attempts=1)
        st = self.stats
        st.attempts += 1
        reserved = self.reserved.pop(key, None)
        if body is not None and error is None:
            outcome.body = body
            try:
                if len(body) > self.adapter.limits.max_reply_bytes:
                    outcome.body = body[:2000]
                    outcome.reply = Reply(
                        tuple(
                            Answer.invalid(
                                q.id,
                                f"reply larger than {self.adapter.limits.max_reply_bytes} bytes",
                            )
                            for q in task.questions
                        )
                    )
                else:
                    reply = self.adapter.decode_parsed(task, body, result.doc)
                    request = self._request(key, task, sample, sent)
                    outcome.reply = credible(reply, self.adapter, task, request)
            except AdapterError as exc:
                error = exc
        if (
            isinstance(error, ProviderStop) and error.cause == REQUEST
        ):  # the batch ran the others of this form:
            error = Fatal(
                str(error), error.status
            )  # this one's own refusal (as runner.sending.retry)
        elif isinstance(
            error, ProviderStop
        ):  # a quota or key stop inside a batch: no new batch is submitted
            self.stopped = self.stopped or error
            st.stopped = st.stopped or str(error)
        if outcome.reply is None and not isinstance(
            error, Fatal
        ):  # transient, rate limited, stop, not run: given back
            cost = Settled(0.0)
            if reserved is not None and body is not None:
                # a reply that is not the wire format: billed, charged as a synchronous one is
                # (its reservation: ``Charge.settle``); an error inside a 200, the usage it states
                # when credible, as ``runner.sending.retry`` charges it
                billed = None
                if isinstance(error, ErrorIn200) and error.usage is not None:
                    request = self._request(key, task, sample, sent)
                    billed = credible(error.usage, self.adapter, task, request)
                cost = self.charge.settle(
                    reserved, billed, error, self.charge.is_bound(self.adapter, task)
                )
            elif reserved is not None:  # an error status, or not run: nothing billed
                self.budget.settle(reserved, 0.0)
            if isinstance(error, RateLimited):
                st.rate_limited += 1
            return None, cost
        outcome.error = None if outcome.reply is not None else error
        cost = Settled(0.0)
        if reserved is not None:
            cost = self.charge.settle(
                reserved, outcome.reply, outcome.error, self.charge.is_bound(self.adapter, task)
            )
        elif (
            outcome.reply is not None and self.charge.price is not None
        ):  # an earlier run's batch: not reserved here
            from dxi.scoring.cost import USAGE_COLUMNS, request_cost

            cost = Settled(
                request_cost(
                    {c: getattr(outcome.reply, c) for c in USAGE_COLUMNS}, self.charge.price
                )
            )
            self.stats.from_earlier_usd += cost.usd  # the earlier run's spend, not under this bound
        return make_row(
            task,
            self._request(key, task, sample, sent),
            outcome,
            transport=BATCH,
            batch_id=entry.batch_id,
        ), cost

    def _store(self, rows: list[tuple[str, Task, dict, Settled]]) -> None:
        """Append the rows of a piece of results, ``(key, task, row, cost)`` each (``cost``: what it
        was charged, ``Settled``), in one write
        (``Cache.append_many``), then count them."""
        before = self.appended
        self.cache.append_many([row for _, _, row, _ in rows])
        self.appended += len(rows)
        if (
            self.failpoint is not None
        ):  # ``append:N``: killed after the append that stored the N-th row
            for n in range(before + 1, self.appended + 1):
                failpoint(f"append:{n}")
        for key, task, row, cost in rows:
            self.waiting.pop(key, None)
            self._charged(cost)
            self.stats.add(row, task.id)
        self.on_progress()

    def _give_back(self, key: str) -> None:
        """A request without a usable result: into the next batch, or (its attempts spent) stored as
        a transient failure; with a deadline passed or submission stopped, left for the synchronous
        fallback."""
        item = self.waiting.get(key)
        if item is None:
            return
        self.stats.given_back += 1
        if self.reserved.get(key) is not None:
            self.budget.settle(self.reserved.pop(key), 0.0)
        if self.attempts.get(key, 0) >= max(1, self.adapter.limits.max_attempts):
            self._give_up(
                key,
                f"no result after {self.attempts[key]} batch(es) (expired, cancelled or a "
                "transient error each time)",
            )
            return
        if self._past_deadline() or self.stopped is not None or self.options.collect_only:
            return  # left in ``waiting``: ``run`` hands it to the fallback (or the next run)
        self.requeue.append(key)

    def _give_up(self, key: str, why: str) -> None:
        """Store a request this run submitted and got no answer for as a transient failure (``why``;
        the next run sends it again), as a synchronous request whose retry is not sent."""
        task, sample = self.waiting.pop(key)
        outcome = Outcome(attempts=self.attempts[key], error=_GivenUp(f"{self.label}: {why}"))
        self.cache.append(
            make_row(task, self.adapter.encode(task, sample), outcome, transport=BATCH)
        )
        self.stats.failed += 1

    async def _submit_requeued(self) -> None:
        """The requests given back, in new batches (each reserved again under the bound; a task of
        its own beside the polling, ``ModelBatches.resubmitting``). Once the bound leaves no room,
        each one left is stored as a transient failure when this run submitted it (it was sent:
        counted once, as a synchronous request whose retry could not be sent), else counted not
        sent (an earlier run's batch gave it back)."""
        keys, self.requeue = self.requeue, []
        builder: _Builder | None = None
        try:
            for i, key in enumerate(keys):
                item = self.waiting.get(key)
                if item is None or self.cache.has(key):
                    self.waiting.pop(key, None)
                    continue
                task, sample = item
                try:
                    request = self.adapter.encode(task, sample)
                    builder = await self._add(builder, task, sample, request)
                except CostBoundReached:
                    self._bounded(keys[i:])
                    break
            if builder is not None:  # (one ``_add`` submitted already is not submitted again)
                await self._submit(builder)
        finally:
            self.wake.set()  # the polling loop: done, or more to submit

    def _bounded(self, keys: list[str]) -> None:
        """Given-back requests the cost bound leaves no room for (``_submit_requeued``)."""
        for key in keys:
            if key not in self.waiting or self.cache.has(key):
                continue
            if self.attempts.get(key):
                self._give_up(
                    key,
                    "the cost bound was reached before it could be submitted again (after "
                    f"{self.attempts[key]} batch(es))",
                )
            else:
                self.waiting.pop(key)
                self.stats.not_sent += 1


def _trim() -> None:
    """Give the heap's free pages back to the system after a collection (glibc ``malloc_trim``):
    reading a result file frees thousands of reply-sized blocks, which glibc otherwise keeps, so
    that batches collected one after another would grow the process by what each one read. A no-op
    elsewhere."""
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes

            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 (glibc only)
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC = None


class _GivenUp(Retryable):
    """A request given back by every batch it was in: stored as a transient failure (sent again next
    run)."""
