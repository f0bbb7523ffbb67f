"""What a stored request outcome is made of, shared by the adapters that make one and the cache that
reads it back (``cache.verify.line_problem``): the key of a request (its content address), and the
form of the values a reply's answers and usage may hold. Standard library only, so that any layer
may import it (``dxi.layers``).

* ``request_key``: the cache key, sha256 (hex) of the adapter kind, model, endpoint, epoch, prompt
  version, sampling parameters and the exact request bytes (``adapters.base.Request.key``). A cache
  row whose key is not ``request_key`` of its own columns is damaged.
* ``probability``: a probability as a reply may give it (a finite number in [0, 1], not a bool),
  else None: what the decision adapters accept (``adapters.decision``); ``probability_expr``, the
  same rule over a frame's column (scoring holds the answers it reads from the cache to it), imports
  Polars when called.
* ``as_count``: a token count as a usage block may give it (a non-negative int, not a bool), else
  None: what every adapter reads usage with (``adapters.http``).
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl


def request_key(
    kind: str, model: str, endpoint: str, sample: int, prompt_version: str, params: str, body: bytes
) -> str:
    """The cache key of a request: sha256 (hex) of its kind, model, endpoint, epoch, prompt version
    and sampling parameters, each separated by a NUL byte, then a NUL and the body bytes."""
    head = "\0".join((kind, model, endpoint, str(sample), prompt_version, params)).encode()
    return hashlib.sha256(head + b"\0" + body).hexdigest()


def probability(value: Any) -> float | None:
    """``value`` as a probability: a finite int or float in [0, 1] (a bool is not one), else
    None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def probability_expr(value: pl.Expr) -> pl.Expr:
    """``probability`` over the Float64 expression ``value``: True where it is null or a probability
    (finite, in [0, 1]), False where it is not (NaN, an infinity, outside [0, 1])."""
    return value.is_null() | (value.is_finite() & (value >= 0.0) & (value <= 1.0)).fill_null(False)


def as_count(value: Any) -> int | None:
    """A token count from a usage block: a non-negative integer, also written as an integral float
    (``100.0``: JSON has one number type, and a gateway may write it so), else None (a fraction, a
    string, a boolean, null, Infinity, NaN, a number below 0)."""
    if type(value) is int:  # the common case first (a bool is an int's subclass, not an int)
        return value if value >= 0 else None
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
