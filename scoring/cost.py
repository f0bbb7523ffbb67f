"""Token usage and its cost in USD, per model, evaluation and run (summary.json ``usage`` blocks).

Prices are USD per million tokens: a model's ``price`` is the tuple ``(input, output[, cached_input[,
cache_write[, cache_write_1h]]])`` (``runner.plan`` builds it from a run file's ``price = {input, output,
...}`` and the provider's own rules, ``Adapter.CACHE_PRICES``); a part that is absent or None is priced
as input. The input tokens of a reply (``input_tokens``, every input token billed) include those read from
the provider's prompt cache (``cached_input_tokens``, priced at ``cached_input``) and those written to it
(``cache_write_tokens`` at ``cache_write``: Anthropic's 5-minute cache, OpenAI's cache writes;
``cache_write_1h_tokens`` at ``cache_write_1h``: Anthropic's 1-hour cache). The usage is what the cache
rows of the scored answers report (``scoring.score.usage``), so ``dxi run`` and ``dxi score`` give the same
figures. A model without a price has its tokens reported and ``cost_usd`` null with a ``cost_reason``; so
has the run's total then.
"""
from __future__ import annotations

from collections.abc import Mapping

import polars as pl

NO_PRICE = "no price for this model: give one in the run file (price = {input = USD, output = USD} per million tokens)"
PRICE_PARTS = ("input", "output", "cached_input", "cache_write", "cache_write_1h")
"""The names of a price tuple's parts, in order (summary.json's ``price`` block uses them)."""
CACHE_WRITES = ("cache_write_tokens", "cache_write_1h_tokens")
"""The usage columns of cache writes: in a usage block only when a reply reported some (none is 0)."""


def cost_usd(input_tokens: float, output_tokens: float, price_input: float, price_output: float,
             price_cached: float | None = None, price_write: float | None = None, price_write_1h: float | None = None,
             *, cached_tokens: float = 0, written_tokens: float = 0, written_1h_tokens: float = 0) -> float:
    """USD for the tokens at prices in USD per million tokens (a price tuple unpacked: see above). Of the
    ``input_tokens``, ``cached_tokens`` were read from the provider's prompt cache (priced at ``price_cached``),
    ``written_tokens`` and ``written_1h_tokens`` written to it (at ``price_write`` / ``price_write_1h``);
    a price that is None is the input price."""
    def extra(tokens: float, price: float | None) -> float:  # the difference from the input price
        return 0.0 if price is None or not tokens else tokens * (price - price_input)

    return (input_tokens * price_input + output_tokens * price_output + extra(cached_tokens, price_cached)
            + extra(written_tokens, price_write) + extra(written_1h_tokens, price_write_1h)) / 1e6


USAGE_COLUMNS = ("input_tokens", "output_tokens", "cached_input_tokens", *CACHE_WRITES)
"""A cache row's (or a reply's) token counts that price it."""


def request_cost(usage: Mapping, price: tuple[float | None, ...]) -> float:
    """USD for one request's tokens: ``usage`` maps the ``USAGE_COLUMNS`` (a cache row, or a reply's
    attributes as a dict; None or absent counts 0) and ``price`` is a price tuple (USD per million tokens).
    The one rule by which a run's cost bound settles, and the view prices, each request."""
    def n(column: str) -> float:
        return usage.get(column) or 0

    return cost_usd(n("input_tokens"), n("output_tokens"), *price, cached_tokens=n("cached_input_tokens"),
                    written_tokens=n("cache_write_tokens"), written_1h_tokens=n("cache_write_1h_tokens"))


def max_input_price(price: tuple[float | None, ...]) -> float:
    """The most one input token can cost under ``price`` (a price tuple): its input price, or a cache
    write's when higher (a provider may write any input token to its cache). What a cost bound reserves."""
    return max(p for p in (price[0], *price[3:5]) if p is not None)


def _round(usd: float | None) -> float | None:
    return None if usd is None else round(usd, 6)


def _block(row: Mapping, price: tuple[float | None, ...] | None) -> dict:
    cached = int(row.get("cached_input_tokens") or 0)
    written, written_1h = (int(row.get(c) or 0) for c in CACHE_WRITES)
    block = {"requests": int(row["requests"]), "replies": int(row["replies"]), "with_usage": int(row["with_usage"]),
             "input_tokens": int(row["input_tokens"]), "output_tokens": int(row["output_tokens"]),
             "cached_input_tokens": cached}
    block |= {c: n for c, n in zip(CACHE_WRITES, (written, written_1h), strict=True) if n}
    block["cost_usd"] = None if price is None else _round(cost_usd(
        row["input_tokens"], row["output_tokens"], *price, cached_tokens=cached, written_tokens=written,
        written_1h_tokens=written_1h))
    if block["replies"] > block["with_usage"]:
        block["note"] = (f"{block['replies'] - block['with_usage']} replies reported no usage: their tokens "
                         "(and cost) are not counted")
    return block


def usage_blocks(table: pl.DataFrame, labels: list[str], prices: Mapping[str, tuple[float, ...] | None]
                 ) -> tuple[dict[str, dict], dict]:
    """``(per model, run)``: each model's ``usage`` block — requests, replies, with_usage, input_tokens,
    output_tokens, ``price`` ({input, output} USD per million tokens, or null), ``cost_usd`` (null with
    ``cost_reason`` without a price) and the same per evaluation under ``evals`` — and the run's total
    (null cost, with the reason, when any model has no price). ``table`` is ``scoring.score.usage``."""
    zero = {"requests": 0, "replies": 0, "with_usage": 0, "input_tokens": 0, "output_tokens": 0, "cached_input_tokens": 0,
            **dict.fromkeys(CACHE_WRITES, 0)}
    per_model, total, unpriced = {}, dict(zero), []
    for label in labels:
        rows = table.filter(pl.col("label") == label)
        price = prices.get(label)
        sums = {k: int(rows[k].sum()) if rows.height and k in rows.columns else 0 for k in zero}
        block = _block(sums, price)
        block["price"] = None if price is None else {k: v for k, v in zip(PRICE_PARTS, price, strict=False) if v is not None}
        if price is None:
            block["cost_reason"] = NO_PRICE
            unpriced.append(label)
        block["evals"] = {r["eval"]: _block(r, price) for r in rows.iter_rows(named=True)}
        per_model[label] = block
        for k in zero:
            total[k] += sums[k]
    run = _block(total, None)
    run["cost_usd"] = None if unpriced else _round(sum(b["cost_usd"] for b in per_model.values()))
    if unpriced:
        run["cost_reason"] = f"no price for {', '.join(unpriced)}"
    return per_model, run
