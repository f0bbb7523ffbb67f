"""Scoring: vectorised Polars and NumPy over the cache plus gold labels. Never imports runner/ or
adapters/, so rescoring from the cache alone works by construction.

``answers`` (``pipeline``: the cache's rows) -> one row per (model, question, epoch); ``score`` ->
every table (metrics with intervals, the index, calibration, breakdowns; ``Scored``; ``Scorer``: the
same, one evaluation at a time); ``build_summary`` -> summary.json; ``decision_index.WEIGHTS`` ->
the Decision Index formula; ``Bootstrap`` -> how intervals are computed.
"""

from .bootstrap import Bootstrap
from .cost import cost_usd, usage_blocks
from .decision_index import WEIGHTS, decision_index
from .pipeline import (
    MODELS_SCHEMA,
    answers,
    export,
    metrics,
    missing_found,
    models_in_cache,
    request_counts,
    requests_found,
    usage,
)
from .scored import Scored, Scorer, score
from .summary import build as build_summary

__all__ = [
    "MODELS_SCHEMA",
    "WEIGHTS",
    "Bootstrap",
    "Scored",
    "Scorer",
    "answers",
    "build_summary",
    "cost_usd",
    "decision_index",
    "export",
    "metrics",
    "missing_found",
    "models_in_cache",
    "request_counts",
    "requests_found",
    "score",
    "usage",
    "usage_blocks",
]
