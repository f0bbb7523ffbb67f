"""Token usage and its cost in USD, per model, evaluation and run (summary.json ``usage`` blocks).

Prices are USD per million tokens, input and output (a run file's ``price = {input, output}``), and
optionally cached input (``cached_input``: the input tokens read from the provider's prompt cache,
``cached_input_tokens``; without it they are priced as input). The
usage is what the cache rows of the scored answers report (``scoring.score.usage``), so ``dxi run`` and
``dxi score`` give the same figures. A model without a price has its tokens reported and ``cost_usd``
null with a ``cost_reason``; so has the run's total then.
"""
from __future__ import annotations

from collections.abc import Mapping

import polars as pl

NO_PRICE = "no price for this model: give one in the run file (price = {input = USD, output = USD} per million tokens)"


def cost_usd(input_tokens: float, output_tokens: float, price_input: float, price_output: float,
             price_cached: float | None = None, cached_tokens: float = 0) -> float:
    """USD for the tokens at prices in USD per million input / output tokens. ``cached_tokens`` of the
    input tokens (read from the provider's prompt cache) are priced at ``price_cached`` when given, else
    as input (a run file's ``price = {input, output, cached_input}``)."""
    cached = 0.0 if price_cached is None else cached_tokens * (price_input - price_cached)
    return (input_tokens * price_input + output_tokens * price_output - cached) / 1e6


def _round(usd: float | None) -> float | None:
    return None if usd is None else round(usd, 6)


def _block(row: Mapping, price: tuple[float, ...] | None) -> dict:
    cached = int(row.get("cached_input_tokens") or 0)
    block = {"requests": int(row["requests"]), "replies": int(row["replies"]), "with_usage": int(row["with_usage"]),
             "input_tokens": int(row["input_tokens"]), "output_tokens": int(row["output_tokens"]),
             "cached_input_tokens": cached,
             "cost_usd": None if price is None else _round(cost_usd(row["input_tokens"], row["output_tokens"], *price,
                                                                    cached_tokens=cached))}
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
    zero = {"requests": 0, "replies": 0, "with_usage": 0, "input_tokens": 0, "output_tokens": 0, "cached_input_tokens": 0}
    per_model, total, unpriced = {}, dict(zero), []
    for label in labels:
        rows = table.filter(pl.col("label") == label)
        price = prices.get(label)
        sums = {k: int(rows[k].sum()) if rows.height else 0 for k in zero}
        block = _block(sums, price)
        block["price"] = None if price is None else ({"input": price[0], "output": price[1]}
                                                     | ({"cached_input": price[2]} if len(price) > 2 else {}))
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
