"""The runs record: ``runs.jsonl`` in the cache folder, what each ``dxi run`` on this cache
selected.

One JSON object a line, appended by ``dxi run`` once its models are started (before its first
request), read by the commands that score the cache (``runner.planning.selection``: with no
selection given, they score what the runs selected). A line::

    {"at": 1796151260.5, "prompt_version": "dxi-prompt-1",
     "models": [{"provider": "embedded", "model": "sparrow-nano-general-v1.1", "endpoint": "...", "params": "{}"}],
     "evals": ["aa_omniscience_decision", "hle_multichoice", "when2call", "wildguardtest"],
     "limit": null, "sample": 20, "seed": 0, "wildguard_subset": "agreed"}

``at`` is Unix seconds; ``models`` are the configurations as the cache rows name them (the columns
``provider``, ``model``, ``endpoint``, ``params``); ``evals`` the evaluations the run read;
``limit`` the first N tasks of each, or ``sample``/``seed`` a stratified sample
(``runner.planning.sample``), both null for every task. A run whose record equals one already there
(``at`` aside) adds no line, so the file grows with the distinct selections, not with the runs. Each
line is one ``write(2)`` to a file opened ``O_APPEND`` (Linux serialises the writes to one file), so
two runs appending at once never interleave their lines; a line cut by a kill (or a full disk) is
ended with a newline by the next writer, so it never swallows the next run's record
(``cache.lines``, as the batch ledger does). Exclusion lists and data files are not recorded.

Where the output folder has no OUT/run-history.jsonl, a record stands in for its last line when it
is the one selection recorded of the models scored (``runner.planning.selection.last_run``): of
several, the latest run cannot be told, since a repeated selection adds no line.

The file is only read and appended: a line that is not a record (a torn write, an edit) is skipped
with a warning naming it. A read-only cache (``dxi view``) is only read. With a remote cache tier,
only the runs on this machine's cache folder are recorded here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import orjson

from .lines import append_line

RUNS_FILE = "runs.jsonl"
MODEL_FIELDS = ("provider", "model", "endpoint", "params")

log = logging.getLogger("dxi.cache")


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One line of ``runs.jsonl`` (see the module docstring). ``models``: (provider, model,
    endpoint, params) per model; ``evals``: evaluation names; ``limit``, ``sample``: tasks per
    evaluation or None; ``seed``: the sample's seed; ``at``: Unix seconds."""

    prompt_version: str
    models: tuple[tuple[str, str, str, str], ...]
    evals: tuple[str, ...]
    limit: int | None = None
    sample: int | None = None
    seed: int = 0
    wildguard_subset: str = "agreed"
    at: float = 0.0

    def as_json(self) -> dict:
        return {
            "at": self.at,
            "prompt_version": self.prompt_version,
            "models": [dict(zip(MODEL_FIELDS, m, strict=True)) for m in self.models],
            "evals": list(self.evals),
            "limit": self.limit,
            "sample": self.sample,
            "seed": self.seed,
            "wildguard_subset": self.wildguard_subset,
        }

    @classmethod
    def from_json(cls, doc: object) -> RunRecord:
        """The record of one decoded line; ValueError (naming the field) when it is not one."""
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")

        def get(name: str, kind: type | tuple[type, ...], optional: bool = False) -> object:
            value = doc.get(name)
            if (value is None and optional) or (
                isinstance(value, kind) and not isinstance(value, bool)
            ):
                return value
            raise ValueError(f"field {name!r} is missing or not {getattr(kind, '__name__', kind)}")

        models = []
        for i, m in enumerate(get("models", list)):
            if not isinstance(m, dict) or not all(isinstance(m.get(f), str) for f in MODEL_FIELDS):
                raise ValueError(
                    f"models[{i}] is not a model configuration ({', '.join(MODEL_FIELDS)})"
                )
            models.append(tuple(m[f] for f in MODEL_FIELDS))
        evals = get("evals", list)
        if not all(isinstance(e, str) for e in evals):
            raise ValueError("field 'evals' holds a name that is not text")
        return cls(
            get("prompt_version", str),
            tuple(models),
            tuple(evals),
            get("limit", int, True),
            get("sample", int, True),
            get("seed", int, True) or 0,
            get("wildguard_subset", str, True) or "agreed",
            float(get("at", (int, float), True) or 0.0),
        )

    def same_selection(self, other: RunRecord) -> bool:
        """Equal but for ``at``: appending ``other`` beside this one would add nothing."""
        return self.as_json() | {"at": 0} == other.as_json() | {"at": 0}


def read(root: Path) -> tuple[list[RunRecord], list[str]]:
    """The records of the cache folder ``root`` in the order written, and a warning for each line
    skipped (naming the file and line). No file: no records."""
    path = Path(root) / RUNS_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], []
    records, warnings = [], []
    for n, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            records.append(RunRecord.from_json(orjson.loads(line)))
        except (orjson.JSONDecodeError, ValueError) as exc:
            warnings.append(f"{path} line {n} is not a run record ({exc}); skipped it.")
    return records, warnings


def append(root: Path, record: RunRecord) -> bool:
    """Add ``record`` to ``root``'s runs.jsonl unless a record of the same selection is there (True
    when a line was written), as one whole line after any line a killed writer left cut
    (``cache.lines``). OSError when the file cannot be written (the caller decides whether that
    matters)."""
    records, _ = read(root)
    if any(r.same_selection(record) for r in records):
        return False
    append_line(
        Path(root) / RUNS_FILE, orjson.dumps(record.as_json()) + b"\n"
    )  # a cut line is ended first
    return True
