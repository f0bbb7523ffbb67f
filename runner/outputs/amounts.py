"""How a dollar amount the user gave is written back (``--max-cost``, a run file's ``max_cost``, a
share of it): ``usd``, in fixed-point, never with an exponent."""

from __future__ import annotations

import math

DIGITS = 6
"""The significant digits ``usd`` keeps (as ``:g``)."""


def usd(value: float) -> str:
    """``value`` as "$5", "$2.5", "$1.66667" or "$0.0000001": ``DIGITS`` significant digits, in
    fixed-point, trailing zeros left out (``:g`` wrote "$1e-07", beside a spend of "$0.000000")."""
    if value == 0 or not math.isfinite(value):
        return f"${value:g}"
    decimals = max(0, DIGITS - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:.{decimals}f}"
    return f"${text.rstrip('0').rstrip('.') if '.' in text else text}"
