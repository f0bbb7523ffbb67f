"""How a dollar amount the user gave is written back (``--max-cost``, a run file's ``max_cost``, a
share of it): ``usd``, in fixed-point down to a millionth of a cent, with an exponent below that;
and a price tuple (``scoring.cost``) as a note writes it: ``price``."""

from __future__ import annotations

import math

DIGITS = 6
"""The significant digits ``usd`` keeps (as ``:g``)."""


SMALLEST_FIXED = 1e-8
"""The smallest amount ``usd`` writes in fixed-point; a smaller one (``--max-cost 1e-300``) has an
exponent, not 300 zeros."""


def usd(value: float) -> str:
    """``value`` as "$5", "$2.5", "$1.66667" or "$0.0000001": ``DIGITS`` significant digits, in
    fixed-point, trailing zeros left out (``:g`` wrote "$1e-07", beside a spend of "$0.000000");
    below ``SMALLEST_FIXED`` as "$1e-300", "$2.5e-12" (fixed-point wrote 300 zeros)."""
    if value == 0 or not math.isfinite(value):
        return f"${value:g}"
    if abs(value) < SMALLEST_FIXED:
        mantissa, _, exponent = f"{value:.{DIGITS - 1}e}".partition("e")
        return f"${mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    decimals = max(0, DIGITS - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:.{decimals}f}"
    return f"${text.rstrip('0').rstrip('.') if '.' in text else text}"


PRICE_PARTS = ("input", "output", "cached input", "cache write", "1-hour cache write")
"""The parts of a price tuple (``scoring.cost``), in its order."""


def price(parts: tuple[float | None, ...] | list[float | None]) -> str:
    """A price tuple as "100/0/10 USD per million input/output/cached input tokens": every part it
    gives (a part it leaves out, None, is priced as input and not named)."""
    given = [(v, name) for v, name in zip(parts, PRICE_PARTS, strict=False) if v is not None]
    return (
        f"{'/'.join(f'{v:g}' for v, _ in given)} USD per million "
        f"{'/'.join(name for _, name in given)} tokens"
    )
