"""Summaries built by hand (``scoring.records``): a complete, accepted ``Summary`` and its model
entries with only the fields a test sets, for tests of what reads a summary (the report's banner,
the measures, an adaptive run's note)."""

from __future__ import annotations

from typing import Any

from dxi.scoring.records import ModelEntry, Summary


def entry(label: str, index: float | None = None, **fields: Any) -> ModelEntry:
    """A model entry of ``label`` with Decision Index ``index`` (0-100, None: not computed), one
    epoch, complete, no evaluation block and no request count unless ``fields`` gives them (any
    other ``ModelEntry`` field too)."""
    return ModelEntry(
        **{
            "model": label,
            "epochs": 1,
            "decision_index": index,
            "complete": True,
            "evals": {},
            "requests": {},
        }
        | fields
    )


def summary(models: list[ModelEntry], data: dict | None = None) -> Summary:
    """A complete, accepted summary (prompt version "p", one epoch) of ``models`` over ``data``
    (evaluation -> data block; default none)."""
    return Summary(
        prompt_version="p",
        epochs=1,
        complete=True,
        allow_failed=None,
        accepted=True,
        data=data or {},
        models=models,
    )
