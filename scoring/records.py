"""The typed records one stage hands the next: the summary (``scoring.summary.build`` makes it;
``runner.outputs.files`` writes it as summary.json, ``report.html``, ``runner.export`` and ``view``
read it).

``Summary`` holds one ``ModelEntry`` per model and, with comparisons, ``Comparison`` rows and a
``Ranking``. Each record's fields are declared in the order summary.json has always written its
keys, so ``to_json(summary)`` gives the same bytes as the dict it replaces
(``tests/test_records.py``). A key that summary.json holds only sometimes is a field defaulting to
``UNSET`` (``msgspec.UNSET``): absent from the file when unset, ``null`` when set to None. Every
field that is always written has no default (a default other than UNSET would be left out of the
file whenever it equals it: ``omit_defaults``).

An evaluation's block (``EvalBlock``) is a typed mapping (``TypedDict``): its keys are the
evaluation's metrics (``scoring.sums.METRICS``: two for AA-Omniscience-Decision, one for
HLE-MultiChoice...) each with its ``_sd`` and ``_ci``, written in an order that depends on which
were computed (a ``reason`` for missing answers comes before the intervals, one for an undefined F1
after them), which a record's fixed field order cannot keep. The other nested blocks (``data``,
``usage``, ``requests``, ``provenance``...) are documented where they are made and stay mappings.

(``scoring.scored.ScoredRun``, a scored run as scoring hands it on, is the summary beside the
tables.) ``decode(raw)`` reads a summary back (summary.json, or the view's ``meta.json``) into the
records.
"""

from __future__ import annotations

from typing import Any, TypedDict

import msgspec
import orjson
from msgspec import UNSET, UnsetType

__all__ = [
    "UNSET",
    "Comparison",
    "EvalBlock",
    "Interval",
    "ModelEntry",
    "Ranking",
    "Summary",
    "decode",
    "to_json",
    "unset",
]

Interval = list[float | None]  # [low, high], 0-100


class EvalBlock(TypedDict, total=False):
    """One evaluation's block of one model (``scoring.summary.eval_block``): a mapping, since which
    keys it has and their order depend on the evaluation and on what was computed (summary.json
    writes them in the order they were added). ``n`` tasks (WildGuardTest: rows; for a model an
    adaptive run stopped, the tasks it was asked: ``scoring.adaptive.asked_part``); each metric of
    the evaluation (``scoring.sums.METRICS``; 0-100 or None) with ``<metric>_sd`` (several epochs)
    and ``<metric>_ci`` (intervals) and ``<metric>_bounds`` (a provisional figure's [lowest,
    highest], ``scoring.bounds``); the answer counts ``invalid``, ``failed``, ``missing``,
    ``repaired``; ``complete`` and ``rerun``; ``set_aside`` (of the missing answers, those whose
    request the cache set aside as damaged: ``cache.aside``) and ``replied`` (a provisional
    block's tasks with a reply: the *n* its figures and intervals are over); ``reason`` (a null
    metric, or missing answers);
    ``calibration`` (``scoring.summary.calibration_block``), ``ties`` and ``rounded``
    (``scoring.ties``) and ``measures`` (``scoring.measures``)."""

    n: int
    accuracy: float | None
    accuracy_sd: float | None
    accuracy_ci: Interval | None
    accuracy_bounds: Interval
    non_hallucination_rate: float | None
    non_hallucination_rate_sd: float | None
    non_hallucination_rate_ci: Interval | None
    non_hallucination_rate_bounds: Interval
    f1_prompt_harm: float | None
    f1_prompt_harm_sd: float | None
    f1_prompt_harm_ci: Interval | None
    f1_prompt_harm_bounds: Interval
    f1_response_refusal: float | None
    f1_response_refusal_sd: float | None
    f1_response_refusal_ci: Interval | None
    f1_response_refusal_bounds: Interval
    f1_response_harm: float | None
    f1_response_harm_sd: float | None
    f1_response_harm_ci: Interval | None
    f1_response_harm_bounds: Interval
    mean_f1: float | None
    mean_f1_sd: float | None
    mean_f1_ci: Interval | None
    mean_f1_bounds: Interval
    invalid: int
    failed: int
    missing: int
    repaired: int
    complete: bool
    rerun: int
    set_aside: int
    replied: int
    reason: str
    calibration: dict[str, Any] | None
    ties: int
    rounded: int
    measures: dict[str, Any]


class ModelEntry(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One model's entry of ``Summary.models`` (summary.json's ``models[i]``).

    ``model`` is its label; ``epochs`` its number of epochs; ``decision_index`` 0-100 or None with
    ``decision_index_reason``; ``complete`` (no failed or missing answer, ``scoring.provisional``)
    and, when not, ``within_tolerance``; with intervals ``decision_index_ci`` [low, high] (and
    ``decision_index_sd`` with several epochs); ``decision_index_bounds`` [lowest, highest] when it
    is provisional (``scoring.bounds``); with comparisons ``rank``, ``rank_ci`` [low, high]
    (marginal 95% interval), ``rank_set`` [low, high] (simultaneous: every model's rank in its set
    at once) and ``tied_group`` (``scoring.compare``); ``evals`` (evaluation name -> ``EvalBlock``);
    ``invalid_reasons`` ([{"error", "count"}], ``scoring.summary.invalid_reasons``); ``requests``
    (the request counts); ``usage`` (tokens and USD, ``scoring.cost``); ``served_models``,
    ``served_differs``, ``answered_by_other`` and ``cut_off`` (``scoring.replies.add_replies``);
    ``effort`` and ``p_yes_range`` (``runner.outputs.files.model_settings``); ``measures`` (latency,
    cost of 1,000 decisions, risk–coverage: ``scoring.measures``); ``adaptive`` (an adaptive run's:
    the questions asked per evaluation, the rule that stopped the model, the whole-set estimates
    with their anytime-valid intervals at stopping; written by the runner's adaptive rounds)."""

    model: str
    epochs: int
    decision_index: float | None
    decision_index_reason: str | UnsetType = UNSET
    complete: bool
    within_tolerance: bool | UnsetType = UNSET
    decision_index_ci: Interval | None | UnsetType = UNSET
    decision_index_sd: float | None | UnsetType = UNSET
    decision_index_bounds: Interval | UnsetType = UNSET
    rank: int | UnsetType = UNSET
    rank_ci: list[int | None] | UnsetType = UNSET
    rank_set: list[int] | UnsetType = UNSET
    tied_group: int | UnsetType = UNSET
    evals: dict[str, EvalBlock]
    invalid_reasons: list[dict[str, Any]] | UnsetType = UNSET
    requests: dict[str, Any]
    usage: dict[str, Any] | None | UnsetType = UNSET
    served_models: dict[str, int] | UnsetType = UNSET
    served_differs: dict[str, Any] | UnsetType = UNSET
    answered_by_other: dict[str, Any] | UnsetType = UNSET
    cut_off: dict[str, int] | UnsetType = UNSET
    effort: str | None | UnsetType = UNSET
    p_yes_range: list[float] | UnsetType = UNSET
    measures: dict[str, Any] | UnsetType = UNSET
    adaptive: dict[str, Any] | UnsetType = UNSET

    def placing(self) -> tuple:
        """This model's place in the order by Decision Index, as a sort key (first first): by its
        ``rank`` (``scoring.compare.ranks``, which places a provisional index by its lowest bound:
        a partial result never stands above what it could turn out to be), a complete index before
        a provisional one of the same rank, then by name; models without an index last. A summary
        without ranks (written without comparisons) is placed by the same rule, read from the
        index and its bounds."""
        index, rank = self.decision_index, unset(self.rank)
        bounds = unset(self.decision_index_bounds)
        value = bounds[0] if bounds and not self.complete else index
        return (
            index is None,
            rank is None,
            rank or 0,
            -(value or 0.0),
            not self.complete,
            self.model,
        )


class Comparison(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One entry of ``Summary.comparisons`` (``scoring.summary.comparisons``): models ``a`` and
    ``b``, ``eval`` (None for the index), ``metric``, ``difference`` (a − b, points), ``ci`` [low,
    high] or None, ``p_value`` (the pair's own test), ``p_adjusted`` (the simultaneous procedure's,
    summary.json's ``comparison_method``), ``significant`` (``p_adjusted`` < 1 − confidence and,
    where a figure is provisional, settled), for accuracy with one epoch ``discordant`` [a only
    right, b only right] and ``mcnemar_p``, ``complete`` (false: a figure compared is provisional)
    and, when not complete, ``settled`` (false: the failed and missing answers could overturn the
    difference, not claimed; ``scoring.bounds``). In an adaptive run's summary, ``claim`` (the rule
    ``significant`` follows) and, for a pair with a model whose figures are estimates, ``settled``
    and, for its index, ``anytime_ci`` and ``fixed_sample_significant`` (the fixed-sample test's
    own verdict, which ``significant`` ANDs with ``settled``; ``scoring.stopped_pairs``)."""

    a: str
    b: str
    eval: str | None
    metric: str
    difference: float | None
    ci: Interval | None
    p_value: float | None
    p_adjusted: float | None
    significant: bool
    discordant: list[int] | UnsetType = UNSET
    mcnemar_p: float | None | UnsetType = UNSET
    complete: bool
    settled: bool | UnsetType = UNSET
    claim: str | UnsetType = UNSET
    anytime_ci: Interval | None | UnsetType = UNSET
    fixed_sample_significant: bool | UnsetType = UNSET


class Ranking(msgspec.Struct, kw_only=True):
    """``Summary.ranking`` (``scoring.summary.ranking``): ``by`` (the figure ranked), ``groups``
    (the statistically tied groups of labels, in rank order) and ``method`` (how, in words)."""

    by: str
    groups: list[list[str]]
    method: str


class Summary(msgspec.Struct, kw_only=True, omit_defaults=True):
    """summary.json as a record (the key meanings: ``scoring.summary``'s docstring).

    Always present: ``prompt_version``, ``epochs`` (the run's default), ``complete``,
    ``allow_failed`` (``{"answers": N}``, ``{"fraction": x}`` or None), ``accepted``, ``data``
    (evaluation -> its data block) and ``models``. Sometimes: ``provenance``
    (``runner.outputs.provenance``; added when the outputs are written), ``intervals`` and
    ``calibration`` (with the scored tables), ``usage`` (the run's tokens and USD),
    ``comparison_method``, ``comparisons`` and ``ranking`` (with paired comparisons), ``cost_bound``
    (``dxi run --max-cost``), ``stopped_providers`` (``runner.sending.stops``), ``measures`` (how
    the models' measures are computed: ``scoring.measures.describe``) and ``adaptive`` (``dxi run
    --until``: its rule, the order's seed, the rounds asked; written by the runner's adaptive
    rounds; the models' figures are then estimates of the whole set from the part each was
    asked) and ``interrupted`` (a ``dxi run`` a Ctrl-C or SIGTERM stopped: the signal, the exit
    code and the requests not sent; its figures are of what arrived, the rest missing)."""

    prompt_version: str
    provenance: dict[str, Any] | UnsetType = UNSET
    epochs: int
    complete: bool
    allow_failed: dict[str, Any] | None
    accepted: bool
    data: dict[str, dict[str, Any]]
    intervals: dict[str, Any] | None | UnsetType = UNSET
    calibration: dict[str, Any] | UnsetType = UNSET
    usage: dict[str, Any] | UnsetType = UNSET
    models: list[ModelEntry]
    comparison_method: dict[str, Any] | UnsetType = UNSET
    comparisons: list[Comparison] | UnsetType = UNSET
    ranking: Ranking | UnsetType = UNSET
    cost_bound: dict[str, Any] | UnsetType = UNSET
    stopped_providers: list[dict[str, Any]] | UnsetType = UNSET
    measures: dict[str, Any] | UnsetType = UNSET
    adaptive: dict[str, Any] | UnsetType = UNSET
    interrupted: dict[str, Any] | UnsetType = UNSET

    def entry(self, label: str) -> ModelEntry:
        """The model entry of ``label``; KeyError when the summary has none."""
        for m in self.models:
            if m.model == label:
                return m
        raise KeyError(label)

    @property
    def labels(self) -> list[str]:
        """The models' labels, in the summary's order."""
        return [m.model for m in self.models]

    def order(self, ranked: bool = False) -> list[str]:
        """The one order of models in every table and chart (the terminal's, the report's and its
        tables'): the summary's (the run file's or the ``--model`` flags') unless ``ranked`` (no
        order was given), else by Decision Index, highest first, a provisional index placed by its
        lowest bound (``ModelEntry.placing``: by rank; models without an index last, then by
        name)."""
        if not ranked:
            return self.labels
        return [m.model for m in sorted(self.models, key=ModelEntry.placing)]

    def ordered(self, ranked: bool = False) -> Summary:
        """This summary with its models in ``order(ranked)`` (itself when that is its order)."""
        if not ranked:
            return self
        return msgspec.structs.replace(self, models=[self.entry(lb) for lb in self.order(True)])


def unset(value: Any, default: Any = None) -> Any:
    """``value``, or ``default`` when it is ``UNSET`` (a key summary.json leaves out)."""
    return default if value is UNSET else value


def to_builtins(record: Summary | ModelEntry | Comparison | Ranking) -> dict[str, Any]:
    """A record as the plain dict summary.json holds (keys in its order; unset fields left out)."""
    return msgspec.to_builtins(record)


def to_json(summary: Summary) -> bytes:
    """summary.json's bytes: ``summary`` as JSON indented by 2, with a final newline (orjson, as
    always: floats in their shortest round-trip form)."""
    return orjson.dumps(to_builtins(summary), option=orjson.OPT_INDENT_2) + b"\n"


LEGACY_ADJUSTMENT = (
    "Holm's step-down over each figure's pairs, from a summary written before the max-T step-down "
    "(read back: p_adjusted is its p_holm, significant p_holm < 1 − confidence)"
)


def decode(raw: bytes | dict[str, Any]) -> Summary:
    """A summary read back: summary.json's bytes, or the dict they decode to. Raises
    ``msgspec.ValidationError`` naming the field when it is not a summary. A summary written before
    the max-T step-down (its comparisons carry ``p_holm``, no ``p_adjusted`` nor ``significant``)
    is read as ``legacy`` maps it."""
    if isinstance(raw, dict):
        return msgspec.convert(legacy(raw), Summary)
    if b'"p_holm"' in raw:
        return msgspec.convert(legacy(msgspec.json.decode(raw)), Summary)
    return msgspec.json.decode(raw, type=Summary)


def legacy(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (summary.json as a dict) with an older summary's comparisons mapped to today's
    fields (the dict unchanged when no comparison has ``p_holm``): ``p_adjusted`` = its ``p_holm``
    (Holm's adjustment, valid for the family of a figure's pairs: a conservative stand-in for the
    step-down's), ``significant`` = ``p_holm`` < 1 − the summary's confidence (``intervals``, else
    0.95); and the mark: ``comparison_method`` (absent in such a summary) says so in its
    ``adjustment`` (``LEGACY_ADJUSTMENT``), with ``read_from`` "p_holm". Rank sets, ``settled``
    and the step-down's other fields were never computed: they stay absent."""
    pairs = doc.get("comparisons")
    if not isinstance(pairs, list) or not any(isinstance(c, dict) and "p_holm" in c for c in pairs):
        return doc
    intervals = doc.get("intervals") if isinstance(doc.get("intervals"), dict) else {}
    alpha = 1 - float(intervals.get("confidence", 0.95))
    mapped = []
    for c in pairs:
        if isinstance(c, dict) and "p_holm" in c:
            c = dict(c)
            holm = c.pop("p_holm")
            c.setdefault("p_adjusted", holm)
            c.setdefault("significant", holm is not None and holm < alpha)
        mapped.append(c)
    method = dict(doc.get("comparison_method") or {})
    method.setdefault("adjustment", LEGACY_ADJUSTMENT)
    method.setdefault("read_from", "p_holm")
    return {**doc, "comparisons": mapped, "comparison_method": method}
