"""Why answers are missing from a scoring, in words a user can act on (each evaluation block's
``reason`` in summary.json): the flags that select the tasks a data entry describes
(``selection_flags``), the answers the cache set aside as damaged (``Damaged``, ``cache.aside``),
replies another model gave (set aside), and runs that selected other tasks than those scored."""

from __future__ import annotations

from dataclasses import dataclass, field


def selection_flags(data: dict) -> str:
    """The command-line flags that select the tasks a data-block entry describes (its ``limit``,
    ``sample`` or ``union`` of such entries): ``--sample N`` (``--seed S`` when not 0),
    ``--limit N``, a union's joined by " + ", or ``--all-tasks`` for every task."""
    if data.get("union"):
        return " + ".join(selection_flags(p) for p in data["union"])
    sample = data.get("sample")
    if sample:
        return f"--sample {sample['tasks']}" + (
            f" --seed {sample['seed']}" if sample.get("seed") else ""
        )
    return "--all-tasks" if data.get("limit") is None else f"--limit {data['limit']}"


@dataclass(frozen=True)
class Damaged:
    """What the cache set aside as damaged (``cache.aside``), for the missing answers' reasons: per
    (label, evaluation) ``counts`` of the missing answers whose request it set aside, ``where``
    (what the cache did with them: "moved them to DIR/quarantine/"), and ``unread``: set-aside
    shards whose requests cannot be told (some of the other missing answers may be theirs)."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    where: str = ""
    unread: int = 0


def missing_reason(
    missing: int,
    data: dict,
    label: str | None,
    damaged: Damaged | None = None,
    name: str = "",
    other: int = 0,
    recorded: bool = False,
    tasks: int | None = None,
) -> str:
    """Why ``missing`` answers (of ``tasks`` tasks, said where the two differ: a WildGuardTest
    task's request holds up to three answers, a task of several epochs one per epoch; None: as
    many as answers) are not in the cache, and what to do: ``other`` of them are replies
    another model gave, set aside (``scoring.replies``' ``answered_by_other``); those whose request
    the cache set aside as damaged (``damaged``: not scored, and the next run requests them again);
    when the model's recorded runs (``data["runs"]``, ``runner.planning.selection``) selected other
    tasks than those scored, the flags that score what they ran. ``recorded``: the cache recorded
    the model's runs of this evaluation (``Suite.recorded``); with no ``data["runs"]`` of it they
    selected what is scored, so "it ran other tasks" is not among the causes."""
    if other:
        said = (
            f"{other} answer(s) set aside: another model answered them, not the model asked for "
            "(the model's answered_by_other); `dxi run` sends their requests again"
        )
        if other >= missing:
            return said
        rest = missing_reason(missing - other, data, label, damaged, name, 0, recorded, tasks)
        return f"{said}; {rest}"
    scored = selection_flags(data)
    damaged = damaged or Damaged()
    aside = damaged.counts.get((label, name), 0)
    of = "" if tasks is None or tasks == missing else f", of {tasks} task(s),"
    head = f"{missing} answer(s){of} not in the cache: "
    if aside:
        told = (
            f"set aside as damaged (the cache found their rows unreadable and {damaged.where}): "
            f"they are not scored, and `dxi run` with {scored} requests them again"
        )
        if aside == missing:
            return head + told
        head += f"{aside} {told}; the other {missing - aside}: "
    ran = (data.get("runs") or {}).get(label) if label is not None else None
    if (
        ran and ran != scored and scored not in ran.split(" + ")
    ):  # (one of its runs selected these: it is incomplete)
        see = (
            f"score with {ran}"
            if " + " not in ran
            # a union: what no flag selects, the default does
            else "score this model without --limit, --sample or --all-tasks (the tasks its runs selected)"
        )
        return (
            f"{head}this model's runs selected {ran} here, not {scored}; "
            f"{see} to see what they answered, or `dxi run` with {scored} to send what is missing"
        )
    other = "" if ran or recorded else ", or it ran other tasks (--limit, --sample)"
    unread = (
        f", or its rows were in one of {damaged.unread} damaged shard(s) whose requests cannot be "
        f"told: the cache {damaged.where}"
        if damaged.unread
        else ""
    )
    return (
        f"{head}the run is incomplete (interrupted{unread}, or it ran fewer epochs than "
        f"scored here{other}); `dxi run` with {scored} sends what is missing"
    )
