"""The Decision Index formula (SPEC §2; seed methodology, "Decision Index evaluation suite"):

    0.125·accuracy(AA-Omniscience-Decision) + 0.125·non-hallucination rate(AA-Omniscience-Decision)
    + 0.25·accuracy(HLE-MultiChoice) + 0.25·accuracy(When2Call) + 0.25·mean F1(WildGuardTest)

All terms are 0-100, so the index is 0-100. It is null (with the reason) whenever any term is null:
never a partial index presented as whole.
"""
from __future__ import annotations

# (evaluation, metric) -> weight
WEIGHTS: dict[tuple[str, str], float] = {
    ("aa_omniscience_decision", "accuracy"): 0.125,
    ("aa_omniscience_decision", "non_hallucination_rate"): 0.125,
    ("hle_multichoice", "accuracy"): 0.25,
    ("when2call", "accuracy"): 0.25,
    ("wildguardtest", "mean_f1"): 0.25,
}


def decision_index(evals: dict[str, dict]) -> tuple[float | None, str | None]:
    """``(index, None)`` from a summary's ``evals`` block, or ``(None, reason)`` when a term is missing."""
    total, missing = 0.0, []
    for (name, metric), weight in WEIGHTS.items():
        value = evals.get(name, {}).get(metric)
        if value is None:
            missing.append(f"{name}.{metric}")
        else:
            total += weight * value
    if missing:
        return None, f"not computed: {', '.join(missing)} unavailable (see each evaluation's reason)"
    return total, None
