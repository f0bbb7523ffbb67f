"""A realistic summary for the byte-identity test of summary.json (``tests/test_records.py``): four
models over a synthetic cache (``benchmarks.synthetic``: invalid and failed answers), one of them
asked for two epochs of which the cache holds one (missing answers: provisional figures, reasons
before and after the intervals), one under a provider that clamps P(yes) whose answers the cache
does not hold (no index), paired comparisons (McNemar's for the two one-epoch models) and ranks,
prices (usage blocks), a tolerance, an effort, a model with batch counts, a cost bound and a stopped
provider, with a fixed provenance.

It uses only what summary.json was built from before the summary became a record
(``runner.outputs.files.summarize``), so the same function run on the older code gave
``tests/fixtures/summary_realistic.json``: from a checkout, with the older tree first on PYTHONPATH
(``benchmarks.same_outputs._baseline(rev, folder)``), ``python -m tests.helpers.realistic_summary
OUT.json``."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import polars as pl
import pytest

from dxi import scoring
from dxi.cache import Cache
from dxi.evals import PROMPT_VERSION
from dxi.runner.outputs import files as outputs
from dxi.scoring.provisional import Tolerance
from tests.helpers.synthetic import SyntheticSuite, suite, write_cache

SIZES = {"aa_omniscience_decision": 12, "hle_multichoice": 10, "when2call": 8, "wildguardtest": 6}
PROVENANCE = {
    "dxi_version": "0.0.0",
    "git": {"commit": "0" * 40, "dirty": False},
    "python": "3.12.0",
    "platform": "Linux-x86_64",
}


def _requests(label: str, i: int) -> dict:
    counts = {
        "sent": 40 + i,
        "cache_hits": 3,
        "failed": 2,
        "invalid": 1,
        "attempts": 44 + i,
        "retry_wait_s": 1.25,
        "rate_limited": 1,
        "repaired": 0,
        "input_tokens": 1000 * (i + 1),
        "output_tokens": 50,
        "cost_usd": 0.001234,
        "not_sent": 0,
        "refused": 0,
    }
    if i == 1:  # a model sent in provider batches (``runner.counts.requests_block``)
        counts["batches"] = {"submitted": 2, "collected": 1, "running": 1, "given_back": 3}
    return counts


def realistic(root: Path):
    """The summary ``runner.outputs.files.summarize`` returns for the scenario of the module
    docstring, its cache written under ``root``."""
    write_cache(root, suite(SIZES), 4, invalid_rate=0.1, failed_rate=0.08)
    with Cache(root, read_only=True) as cache:
        models = cache.read(lambda rows: scoring.models_in_cache(rows, PROMPT_VERSION))
        labels = models["label"].to_list()
        models = models.with_columns(
            pl.Series("epochs", [None, None, 2, None], dtype=pl.Int64),
            pl.Series("effort", ["high", None, None, "low"], dtype=pl.String),
            pl.Series("provider", ["synthetic", "synthetic", "synthetic", "gemini-decisions"]),
        )
        extra = {
            "cost_bound": {
                "max_cost_usd": 5.0,
                "spent_usd": 0.003702,
                "stopped": False,
                "remaining_requests": 0,
                "remaining_cost_usd": None,
            },
            "stopped_providers": [
                {
                    "provider": "synthetic",
                    "scope": "model",
                    "models": [labels[2]],
                    "cause": "quota",
                    "message": "quota exhausted",
                    "http_status": 429,
                    "stopped_at": "2026-01-01T00:00:00Z",
                    "resets_at": None,
                    "refused": 1,
                    "not_sent": 4,
                }
            ],
        }
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(outputs, "provenance", lambda: dict(PROVENANCE))
            summary, _ = outputs.summarize(
                cache,
                SyntheticSuite(SIZES),
                models,
                {label: _requests(label, i) for i, label in enumerate(labels)},
                1,
                prices={labels[0]: (1.0, 2.0), labels[1]: (0.0, 0.0)},
                extra=extra,
                tolerance=Tolerance(answers=1),
            )
    return summary


if __name__ == "__main__":  # the bytes (see the module docstring; written as summary.json is)
    from dxi.scoring import records

    with tempfile.TemporaryDirectory() as folder:
        made = realistic(Path(folder))
    Path(sys.argv[1]).write_bytes(
        records.to_json(made)
        if isinstance(made, records.Summary)
        else __import__("orjson").dumps(made, option=__import__("orjson").OPT_INDENT_2) + b"\n"
    )
