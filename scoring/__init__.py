"""Scoring: vectorised Polars over the cache plus gold labels. Never imports runner/ or adapters/, so
rescoring from the cache alone works by construction.

``answers`` -> one row per (model, question, epoch); ``metrics`` -> per model and evaluation;
``summary.build`` -> summary.json; ``index.WEIGHTS`` -> the Decision Index formula.
"""
from .index import WEIGHTS, decision_index
from .score import MODELS_SCHEMA, answers, metrics, models_in_cache, request_counts
from .summary import build as build_summary

__all__ = ["MODELS_SCHEMA", "WEIGHTS", "answers", "build_summary", "decision_index", "metrics", "models_in_cache",
           "request_counts"]
