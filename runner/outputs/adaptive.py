"""What an adaptive run decided, recorded three times: as it goes, in a journal in the cache folder
(one JSON line per round: the models that stopped after it, their questions asked and intervals;
appended with one write(2) and fsynced, so that a Ctrl-C, a provider stop or a kill -9 later leaves
every decision taken), at the end in summary.json (``model_block``: each model's ``adaptive`` block;
the run's own block is ``Rounds.block``), and beside it in the cache folder (``remember``:
``outcomes.jsonl``), from which the commands that score the cache alone (``dxi score``, ``report``,
``view``) mark the figures of the models an adaptive run left part-asked as estimates of the whole
set (``attach``).

The journal is ``<cache>/adaptive/decisions-<order digest>.jsonl``: the runs that ask the same
sequence share it, each line naming its ``until``. A rerun replays the rounds from the cache and
appends its own lines; the journal is a record for people and tools (``jq``), never read back to
decide anything.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

# under the cache folder: the orders (``runner.adaptive.order``) and the journal of decisions
ORDER_DIR = "adaptive"

if TYPE_CHECKING:
    from dxi.scoring.records import Summary
    from dxi.scoring.sequential import Estimate, Standing, Until


def estimate(e: Estimate | None) -> dict | None:
    """``{"point", "low", "high"}`` (0-100, 4 decimals; None where unknown) of a whole-set
    estimate."""
    if e is None:
        return None
    pairs = (("point", e.point), ("low", e.low), ("high", e.high))
    return {k: None if v is None else round(float(v), 4) for k, v in pairs}


def model_block(
    asked: Mapping[str, int], standing: Standing | None, settled_at: int | None, stopped: str | None
) -> dict:
    """One model's ``adaptive`` block of summary.json (fields: ``Rounds.model_blocks``)."""
    block: dict = {
        "asked": dict(asked),
        "settled": bool(standing is not None and standing.settled),
        "rule": None if standing is None else standing.rule,
        "round": settled_at,
    }
    if stopped is not None:
        block["reason"] = stopped
    elif standing is None:
        block["reason"] = "no round finished: nothing was decided"
    else:
        block["reason"] = standing.reason
    block["index"] = estimate(None if standing is None else standing.index)
    block["metrics"] = (
        {} if standing is None else {k: estimate(v) for k, v in sorted(standing.metrics.items())}
    )
    return block


@dataclass(frozen=True)
class Journal:
    """The journal of decisions (``path``) of one order, for one ``until`` (text)."""

    path: Path
    until: str

    @classmethod
    def of(cls, order_path: Path, until: Until) -> Journal:
        """The journal beside the order recorded at ``order_path`` (``Order.path``)."""
        name = order_path.name.replace("order-", "decisions-").replace(".json", ".jsonl")
        return cls(order_path.with_name(name), str(until))

    def append(
        self, round_: int, settled: Mapping[str, Standing], asked: Mapping[str, Mapping[str, int]]
    ) -> None:
        """One line for round ``round_`` (1-based): the models ``settled`` after it (label ->
        Standing) with what each was asked. A line is written even when none settled (the round is
        then on record)."""
        line = {
            "at": round(time.time(), 3),
            "until": self.until,
            "round": round_,
            "settled": {
                label: {
                    "asked": dict(asked[label]),
                    "rule": s.rule,
                    "reason": s.reason,
                    "index": estimate(s.index),
                }
                for label, s in settled.items()
            },
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, orjson.dumps(line) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)


# under <cache>/adaptive/: each adaptive run's end, for the commands that rescore
OUTCOMES = "outcomes.jsonl"


def remember(
    cache_dir: Path, block: dict, blocks: Mapping[str, dict], configs: Mapping[str, tuple]
) -> None:
    """Append an adaptive run's outcome to ``<cache>/adaptive/outcomes.jsonl``: its ``block``
    (``Rounds.block``) and each model's (``blocks``: label -> ``Rounds.model_blocks``'s), under the
    model's configuration (``configs``: label -> (provider, model, endpoint, params), as the cache
    tells models apart), so that ``dxi score``, ``report`` and ``view`` mark its figures as
    estimates (``attach``). A folder that cannot take the line costs only that (the run's
    summary.json has the blocks)."""
    models = [
        {"config": list(configs[label]), "label": label, "adaptive": b}
        for label, b in blocks.items()
        if label in configs
    ]
    line = orjson.dumps({"at": round(time.time(), 3), **block, "models": models}) + b"\n"
    try:
        (cache_dir / ORDER_DIR).mkdir(parents=True, exist_ok=True)
        fd = os.open(
            cache_dir / ORDER_DIR / OUTCOMES, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
        )
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:
        pass


def attach(summary: Summary, configs: Mapping[str, tuple], cache_dir: Path) -> Summary:
    """``summary`` (scored from the cache alone) with the ``adaptive`` blocks of the latest adaptive
    run recorded for each of its models (``configs``: label -> configuration), for the models still
    not asked every question (a model whose entry is complete has exact figures: a later run
    completed it). The top block is that of the latest such run. A journal that cannot be read, or a
    line that is not JSON, is passed over (nothing to mark)."""
    try:
        lines = (cache_dir / ORDER_DIR / OUTCOMES).read_bytes().splitlines()
    except OSError:
        return summary
    latest: dict[tuple, tuple[dict, dict]] = {}
    for raw in lines:
        try:
            doc = orjson.loads(raw)
            for m in doc["models"]:
                latest[tuple(m["config"])] = (doc, m["adaptive"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
    top = None
    for entry in summary.models:
        found = latest.get(tuple(configs.get(entry.model, ())))
        if found is None or entry.complete:
            continue
        doc, block = found
        entry.adaptive = block
        if top is None or doc["at"] > top["at"]:
            top = doc
    if top is not None:
        summary.adaptive = {k: v for k, v in top.items() if k not in ("at", "models")}
    return summary
