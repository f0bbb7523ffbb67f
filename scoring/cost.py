"""Token usage and its cost in USD, per model, evaluation and run (summary.json ``usage`` blocks).

Prices are USD per million tokens: a model's ``price`` is the tuple ``(input, output[,
cached_input[, cache_write[, cache_write_1h]]])`` (``runner.planning.plan`` builds it from a run
file's ``price = {input, output, ...}`` and the provider's own rules, ``Adapter.CACHE_PRICES``); a
part that is absent or None is priced as input. The input tokens of a reply (``input_tokens``, every
input token billed) include those read from the provider's prompt cache (``cached_input_tokens``,
priced at ``cached_input``) and those written to it (``cache_write_tokens`` at ``cache_write``:
Anthropic's 5-minute cache, OpenAI's cache writes; ``cache_write_1h_tokens`` at ``cache_write_1h``:
Anthropic's 1-hour cache). The usage is what the cache rows of the scored answers report
(``scoring.pipeline.usage``), so ``dxi run`` and ``dxi score`` give the same figures. A model
without a price has its tokens reported and ``cost_usd`` null with a ``cost_reason``; so has the
run's total then. So has a priced model whose replies reported 0 tokens (``COUNTED``: a server that
counts none, such as ``sparrow-decider serve``) or no usage at all: their cost is unknown, not 0
(``ZERO_TOKENS``, ``NO_USAGE``), in each evaluation where they are, the model's and the run's total;
a free model (price 0) costs 0.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

NO_PRICE = "no price for this model: give one in the run file (price = {input = USD, output = USD} per million tokens)"
PRICE_PARTS = ("input", "output", "cached_input", "cache_write", "cache_write_1h")
"""The names of a price tuple's parts, in order (summary.json's ``price`` block uses them)."""
CACHE_WRITES = ("cache_write_tokens", "cache_write_1h_tokens")
"""The usage columns of cache writes: in a usage block only when a reply reported some (none is
0)."""
ZERO_TOKENS = "{n} replies reported 0 tokens (a server that counts none): their cost is unknown"
"""The ``cost_reason`` of a priced model's (or evaluation's) cost when ``n`` of its replies
reported usage but not ``COUNTED``."""
NO_USAGE = "{n} {replies} reported no usage: {their} cost is unknown"
"""The ``cost_reason`` of a priced model's (or evaluation's) cost when ``n`` of its replies
reported no usage at all (``_unknown_replies``)."""
COUNTED = pl.col("input_tokens") > 0
"""A cache row whose reply counted its tokens: input tokens above 0. A request always has input, so
a reply that reports 0 (``sparrow-decider serve``, the embedded model: servers that count no tokens)
says nothing of what a request uses, as one that reports none (null); the token estimates
(``runner.planning.estimate``, ``dxi plan``) learn from counted replies only, as the TPM pacer
does (``TokenEstimate.observe``)."""


def cost_usd(
    input_tokens: float,
    output_tokens: float,
    price_input: float,
    price_output: float,
    price_cached: float | None = None,
    price_write: float | None = None,
    price_write_1h: float | None = None,
    *,
    cached_tokens: float = 0,
    written_tokens: float = 0,
    written_1h_tokens: float = 0,
) -> float:
    """USD for the tokens at prices in USD per million tokens (a price tuple unpacked: see above).
    Of the ``input_tokens``, ``cached_tokens`` were read from the provider's prompt cache (priced at
    ``price_cached``), ``written_tokens`` and ``written_1h_tokens`` written to it (at
    ``price_write`` / ``price_write_1h``); a price that is None is the input price."""

    def extra(tokens: float, price: float | None) -> float:  # the difference from the input price
        return 0.0 if price is None or not tokens else tokens * (price - price_input)

    usd = (
        input_tokens * price_input
        + output_tokens * price_output
        + extra(cached_tokens, price_cached)
        + extra(written_tokens, price_write)
        + extra(written_1h_tokens, price_write_1h)
    ) / 1e6
    if usd < 0:  # counts no reply can state (``inconsistent``), or a negative price
        raise ValueError(
            f"a negative cost ({usd:.6f} USD): {input_tokens:g} input tokens, of them "
            f"{cached_tokens:g} cached and {written_tokens + written_1h_tokens:g} cache writes, "
            f"{output_tokens:g} output tokens; counts no reply can state, which are kept out of "
            "every cost (scoring.cost.inconsistent)"
        )
    return usd


BATCH_SHARE = 0.5
"""The batch APIs' price as a share of the synchronous one: OpenAI's Batch API, Anthropic's Message
Batches and the Gemini Batch API each bill 50% of the model's price (their pricing pages),
prompt-cache parts included (Anthropic: the discounts stack)."""


def batch_price(
    price: tuple[float | None, ...] | None,
    batch_input: float | None = None,
    batch_output: float | None = None,
) -> tuple[float | None, ...] | None:
    """The price tuple of a model's batch requests: ``batch_input`` / ``batch_output`` (USD per
    million tokens, a run file's) where given, else ``BATCH_SHARE`` of ``price``'s; the prompt-cache
    parts scaled as the input price is. None without a price."""
    if price is None:
        return None
    share_in = (
        (batch_input / price[0] if price[0] else BATCH_SHARE)
        if batch_input is not None
        else BATCH_SHARE
    )
    parts = [
        batch_input if batch_input is not None else round(price[0] * BATCH_SHARE, 12),
        batch_output if batch_output is not None else round(price[1] * BATCH_SHARE, 12),
    ]
    parts += [None if p is None else round(p * share_in, 12) for p in price[2:]]
    return tuple(parts)


USAGE_COLUMNS = ("input_tokens", "output_tokens", "cached_input_tokens", *CACHE_WRITES)
"""A cache row's (or a reply's) token counts that price it."""
INPUT_PARTS = ("cached_input_tokens", *CACHE_WRITES)
"""The counts of a usage that are parts of its ``input_tokens`` (every provider's: the adapters
count Anthropic's cache reads and writes, which its ``input_tokens`` leaves out, into it)."""


def inconsistent(usage: Mapping) -> str | None:
    """Why the token counts ``usage`` (the ``USAGE_COLUMNS`` of a reply or a cache row; None or
    absent: not stated) cannot be any reply's usage, or None when they can: a count below 0; input
    tokens without output tokens, or any count without input tokens (a usage is whole or none: an
    output count missing, or one the adapter could not read, is not 0 output); or more input
    tokens read from or written to the provider's prompt cache than the input tokens that include
    them (OpenAI's ``cached_tokens`` and Gemini's ``cachedContentTokenCount`` are counted within
    the prompt tokens, by their SDKs' docs). Priced, such counts make a negative cost (10 input
    tokens of which 900 cached, at a cached price below the input price) or price unknown output
    at $0. A reply's usage that is inconsistent is not kept (``runner.sending.cost.credible``), and
    a cache row's (an earlier version's) is counted as no usage (``CONSISTENT``)."""
    # (on every reply: one pass over the counts for a usage that holds, the messages built only
    # for one that does not)
    cached = 0
    for name in USAGE_COLUMNS:
        count = usage.get(name)
        if count is None:
            continue
        if count < 0:
            return f"{name} {count} < 0"
        if name in INPUT_PARTS:
            cached += count
    inputs, outputs = usage.get("input_tokens"), usage.get("output_tokens")
    if inputs is None or outputs is None:
        stated = [n for n in USAGE_COLUMNS if usage.get(n) is not None]
        if stated and inputs is None:
            return f"{', '.join(f'{n} {usage[n]}' for n in stated)} without input_tokens"
        if stated:
            return f"input_tokens {inputs} without output_tokens"
        return None
    if cached > inputs:
        parts = [n for n in INPUT_PARTS if usage.get(n)]
        return f"{' + '.join(parts)} {cached} > input_tokens {inputs}, which include them"
    return None


CONSISTENT = pl.all_horizontal(
    *(pl.col(n).fill_null(0) >= 0 for n in USAGE_COLUMNS),
    pl.col("input_tokens").is_not_null() & pl.col("output_tokens").is_not_null()
    | pl.all_horizontal(*(pl.col(n).is_null() for n in USAGE_COLUMNS)),
    pl.col("input_tokens").fill_null(0)
    >= pl.sum_horizontal(*(pl.col(n).fill_null(0) for n in INPUT_PARTS)),
)
"""A cache row whose token counts are not ``inconsistent`` (the same rule, as an expression)."""


def request_cost(usage: Mapping, price: tuple[float | None, ...]) -> float:
    """USD for one request's tokens: ``usage`` maps the ``USAGE_COLUMNS`` (a cache row, or a reply's
    attributes as a dict; None or absent counts 0) and ``price`` is a price tuple (USD per million
    tokens). The one rule by which a run's cost bound settles, and the view prices, each request."""

    def n(column: str) -> float:
        return usage.get(column) or 0

    return cost_usd(
        n("input_tokens"),
        n("output_tokens"),
        *price,
        cached_tokens=n("cached_input_tokens"),
        written_tokens=n("cache_write_tokens"),
        written_1h_tokens=n("cache_write_1h_tokens"),
    )


def known_cost(usage: Mapping, price: tuple[float | None, ...] | None) -> float | None:
    """``request_cost`` of one cache row (``usage``), or None where it is unknown: without a price,
    without usage (``input_tokens`` None), when its reply reported 0 tokens (not ``COUNTED``) at
    a price that is not free (``usage_blocks``' rule, per request: ``dxi view``), or counts no reply
    can state (``inconsistent``: an earlier version's row)."""
    tokens = usage.get("input_tokens")
    if price is None or tokens is None or (tokens <= 0 and any(price)) or inconsistent(usage):
        return None
    return request_cost(usage, price)


def max_input_price(price: tuple[float | None, ...]) -> float:
    """The most one input token can cost under ``price`` (a price tuple): its input price, or a
    cache write's when higher (a provider may write any input token to its cache). What a cost bound
    reserves."""
    return max(p for p in (price[0], *price[3:5]) if p is not None)


def _round(usd: float | None) -> float | None:
    return None if usd is None else round(usd, 6)


def _cost(row: Mapping, price: tuple[float | None, ...] | None) -> float | None:
    """USD of a usage row's tokens at ``price`` (None without one)."""
    if price is None:
        return None
    return cost_usd(
        row["input_tokens"],
        row["output_tokens"],
        *price,
        cached_tokens=int(row.get("cached_input_tokens") or 0),
        written_tokens=int(row.get("cache_write_tokens") or 0),
        written_1h_tokens=int(row.get("cache_write_1h_tokens") or 0),
    )


def _block(row: Mapping, cost: float | None) -> dict:
    """A usage block of token sums ``row`` that cost ``cost`` USD (None: no price)."""
    cached = int(row.get("cached_input_tokens") or 0)
    written, written_1h = (int(row.get(c) or 0) for c in CACHE_WRITES)
    block = {
        "requests": int(row["requests"]),
        "replies": int(row["replies"]),
        "with_usage": int(row["with_usage"]),
        "input_tokens": int(row["input_tokens"]),
        "output_tokens": int(row["output_tokens"]),
        "cached_input_tokens": cached,
    }
    block |= {c: n for c, n in zip(CACHE_WRITES, (written, written_1h), strict=True) if n}
    block["cost_usd"] = _round(cost)
    if block["replies"] > block["with_usage"]:
        n = block["replies"] - block["with_usage"]
        block["note"] = (
            f"{n} {'reply' if n == 1 else 'replies'} reported no usage: "
            f"{'its' if n == 1 else 'their'} tokens (and cost) are not counted"
        )
    return block


def _unknown_replies(sums: Mapping, price: tuple | None) -> tuple[int, int]:
    """``(zero, none)``: how many replies of token sums ``sums`` reported 0 tokens (not
    ``COUNTED``) and how many reported no usage at all, at a ``price`` that is not free: their cost
    is unknown, not 0 (``known_cost``'s rule, per reply). (0, 0) without a price or at price 0."""
    if price is None or not any(price):
        return 0, 0
    return sums["with_usage"] - sums["counted"], max(0, sums["replies"] - sums["with_usage"])


def _unknown(block: dict, sums: Mapping, price: tuple | None) -> dict:
    """``block`` (a usage block of token sums ``sums``) with ``cost_usd`` null and a
    ``cost_reason`` (``ZERO_TOKENS``, ``NO_USAGE``) when some of its replies' cost is unknown
    (``_unknown_replies``), not 0."""
    zero, none = _unknown_replies(sums, price)
    reasons = [ZERO_TOKENS.format(n=zero)] * bool(zero) + [
        NO_USAGE.format(
            n=none,
            replies="reply" if none == 1 else "replies",
            their="its" if none == 1 else "their",
        )
    ] * bool(none)
    if reasons:
        block["cost_usd"] = None
        block["cost_reason"] = "; ".join(reasons)
    return block


def usage_blocks(
    table: pl.DataFrame,
    labels: list[str],
    prices: Mapping[str, tuple[float, ...] | None],
    batch_prices: Mapping[str, tuple[float | None, ...] | None] | None = None,
) -> tuple[dict[str, dict], dict]:
    """``(per model, run)``: each model's ``usage`` block — requests, replies, with_usage,
    input_tokens, output_tokens, ``price`` ({input, output} USD per million tokens, or null),
    ``cost_usd`` (null with ``cost_reason`` without a price, or for a priced model whose replies
    reported 0 tokens or no usage: ``ZERO_TOKENS``, ``NO_USAGE``; a ``note`` where replies reported
    no usage) and the same per
    evaluation under ``evals`` — and the run's total (null cost, with the reasons naming the models,
    when any model's cost is unknown).
    ``table`` is ``scoring.pipeline.usage``. The requests a provider batch answered (its ``batch``
    rows) cost ``batch_prices[label]`` (default ``batch_price(price)``: half) and are counted in a
    ``batch`` block (requests, price); a model without them has none, so a synchronous run's summary
    is as before."""
    zero = {
        "requests": 0,
        "replies": 0,
        "with_usage": 0,
        "counted": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cached_input_tokens": 0,
        **dict.fromkeys(CACHE_WRITES, 0),
    }
    per_model, total, unpriced, uncounted, unreported = {}, dict(zero), [], [], []

    def summed(rows: list[dict]) -> dict:
        return {k: sum(int(r.get(k) or 0) for r in rows) for k in zero}

    def costed(
        rows: list[dict], price: tuple | None, in_batch: tuple | None
    ) -> tuple[dict, float | None]:
        """The sums of ``rows`` and their cost: the synchronous rows' tokens at ``price``, the batch
        rows' at ``in_batch`` (each priced on its sums, so a synchronous model's cost is computed as
        it always was)."""
        plain, batched = (
            [r for r in rows if not r.get("batch")],
            [r for r in rows if r.get("batch")],
        )
        if price is None:
            return summed(rows), None
        cost = _cost(summed(plain), price)
        if batched:
            cost += _cost(summed(batched), in_batch)
        return summed(rows), cost

    for label in labels:
        rows = list(table.filter(pl.col("label") == label).iter_rows(named=True))
        price = prices.get(label)
        in_batch = (batch_prices or {}).get(label, batch_price(price))
        sums, cost = costed(rows, price, in_batch)
        block = _block(sums, cost)
        block["price"] = (
            None
            if price is None
            else {k: v for k, v in zip(PRICE_PARTS, price, strict=False) if v is not None}
        )
        if price is None:
            block["cost_reason"] = NO_PRICE
            unpriced.append(label)
        elif _unknown(block, sums, price)["cost_usd"] is None:
            zeros, nones = _unknown_replies(sums, price)
            uncounted += [label] * bool(zeros)
            unreported += [label] * bool(nones)
        block["evals"] = {
            name: _unknown(_block(sums_, cost_), sums_, price)
            for name in sorted({r["eval"] for r in rows})
            for sums_, cost_ in [costed([r for r in rows if r["eval"] == name], price, in_batch)]
        }
        batched = [r for r in rows if r.get("batch")]
        if batched:
            block["batch"] = {
                "requests": sum(int(r["requests"]) for r in batched),
                "cost_usd": None
                if price is None or any(_unknown_replies(summed(batched), price))
                else _round(_cost(summed(batched), in_batch)),
                "price": None
                if in_batch is None
                else {k: v for k, v in zip(PRICE_PARTS, in_batch, strict=False) if v is not None},
            }
        per_model[label] = block
        for k in zero:
            total[k] += sums[k]
    run = _block(total, None)
    unknown = unpriced + uncounted + unreported
    run["cost_usd"] = None if unknown else _round(sum(b["cost_usd"] for b in per_model.values()))
    if unknown:
        run["cost_reason"] = "; ".join(
            [f"no price for {', '.join(unpriced)}"] * bool(unpriced)
            + [f"replies of {', '.join(uncounted)} reported 0 tokens (a server that counts none)"]
            * bool(uncounted)
            + [f"replies of {', '.join(unreported)} reported no usage"] * bool(unreported)
        )
    return per_model, run
