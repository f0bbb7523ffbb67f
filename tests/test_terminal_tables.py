"""The terminal tables fit the terminal: rendered at 80, 120 and 200 columns, no line is wider, no
header or model name is cut, and every model can be told from the others (its full name, or a key
and a legend)."""

from __future__ import annotations

import io
import re

import orjson
import pytest
from rich.console import Console

from dxi.runner import session
from dxi.runner.outputs.terminal import print_estimate, print_summary
from dxi.runner.planning import plan
from dxi.runner.planning.estimate import NOT_IN_CACHE
from dxi.scoring import records

NAMES = [
    "embedded:sparrow-nano-general-v1.1",
    "openai:gpt-5-mini (t=0)",
    "openai:gpt-5-mini (t=0.7)",
    "llamacpp-logprobs:qwen2.5-coder-0.5b",
]


@pytest.fixture(scope="module")
def summary(tmp_path_factory) -> dict:
    """A real summary of the fixture data, its model repeated under four names (two that differ at
    the end)."""
    from .conftest import FIXTURES, write_wildguard_parquet

    tmp = tmp_path_factory.mktemp("tables")
    data = tmp / "data"
    for src, dst in (
        ("omniscience.jsonl", "omniscience-standin/o.jsonl"),
        ("hle_split.json", "hle/hle_mcqa.json"),
        ("when2call.jsonl", "when2call/w.jsonl"),
    ):
        (data / dst).parent.mkdir(parents=True, exist_ok=True)
        (data / dst).write_bytes((FIXTURES / src).read_bytes())
    write_wildguard_parquet(data / "wildguardtest" / "wildguardtest.parquet")
    ran = session.run(
        plan.build(models=["embedded"], data_dir=data, cache_dir=tmp / "c", out=tmp / "o")
    )
    assert ran.exit_code == 0
    s = orjson.loads((tmp / "o" / "summary.json").read_bytes())
    s["models"] = [dict(s["models"][0], model=name) for name in NAMES]
    return s


def render(width: int, show, doc: dict) -> list[str]:
    buffer = io.StringIO()
    show(
        doc,
        Console(
            file=buffer,
            width=width,
            force_terminal=False,
            soft_wrap=False,
            emoji=False,
            highlight=False,
        ),
    )
    return buffer.getvalue().splitlines()


def summary_json(doc: dict, console: Console) -> None:
    """``print_summary`` of a summary as summary.json holds it (read back into its record)."""
    print_summary(records.decode(doc), console)


def table_lines(lines: list[str], title: str, ends: tuple[str, ...]) -> list[str]:
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    end = next(
        i
        for i in range(start + 1, len(lines))
        if lines[i].startswith(ends) or ": new because" in lines[i]
    )
    return lines[start:end]


def told_apart(lines: list[str], table: list[str]) -> None:
    """Every model is named in full in the table, or by a key whose legend line names it."""
    text = "\n".join(table)
    legend = {
        m.group(1): m.group(2) for line in lines if (m := re.fullmatch(r"  (M\d+) = (.+)", line))
    }
    if legend:
        assert sorted(legend.values()) == sorted(NAMES)
        for key in legend:
            assert re.search(rf"^\W*{key}\b", text, re.M), key
    else:
        for name in NAMES:
            assert sum(name in line for line in table) == 1, name


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_index_table_fits(summary: dict, width: int):
    lines = render(width, summary_json, summary)
    table = table_lines(lines, "Decision Index", ("  M1 =", "Data used"))
    assert max(len(line) for line in table) <= width
    assert not any("…" in line for line in table)  # nothing cut: headers and names whole
    told_apart(lines, table)
    header = " ".join(table[1:4])
    for word in ("index", "95% CI", "Omni", "HLE", "When2Call", "WildGuard"):
        assert word in header
    interval = re.compile(r"\[\d+\.\d, \d+\.\d\]")
    body = [line for line in table if interval.search(line)]
    assert len(body) == len(
        NAMES
    )  # each interval whole on its model's line, in a column of its own
    usage = table_lines(
        lines, "Usage (the scored answers' requests, from the cache)", ("Prompt version",)
    )
    assert max(len(line) for line in usage) <= width and not any("…" in line for line in usage)
    assert sum("free" in line for line in usage) == len(NAMES) + 1  # local models cost nothing


def test_full_names_at_200_keys_and_a_legend_at_80(summary: dict):
    wide = render(200, summary_json, summary)
    assert not any(line.startswith("  M1 =") for line in wide)
    narrow = render(80, summary_json, summary)
    assert [line for line in narrow if re.fullmatch(r"  M\d = .+", line)] == [
        f"  M{i} = {name}" for i, name in enumerate(NAMES, 1)
    ]


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_estimate_table_fits(width: int):
    model = {
        "requests": 2193,
        "cached": 400,
        "new": 1793,
        "reasons": {NOT_IN_CACHE: 1793},
        "input_tokens": 1234567,
        "output_tokens": 23456,
        "cost_usd": 1.2345,
        "bound_usd": 4.5678,
        "basis": {"bytes / 4": 1793},
        "evals": {},
    }
    doc = {
        "models": [dict(model, model=name) for name in NAMES],
        "max_cost_usd": None,
        "problems": {},
        "total": {
            "requests": 4 * 2193,
            "cached": 1600,
            "new": 4 * 1793,
            "input_tokens": 4 * 1234567,
            "output_tokens": 4 * 23456,
            "cost_usd": 4.938,
            "bound_usd": 18.2712,
        },
    }
    lines = render(width, print_estimate, doc)
    table = table_lines(
        lines, "Estimate: what `dxi run` would send (nothing was sent)", ("  M1 =",)
    )
    assert max(len(line) for line in table) <= width and not any("…" in line for line in table)
    told_apart(lines, table)
    said = " ".join(" ".join(lines).split())  # the reason is long: wrapped at narrow widths
    assert sum(f"{name}: new because: {NOT_IN_CACHE} (1793)" in said for name in NAMES) == len(
        NAMES
    )


@pytest.mark.parametrize("width", [80, 200])
def test_each_model_has_its_rank_with_its_interval_and_the_tied_groups_are_named(
    summary: dict, width: int
):
    ranked = dict(
        summary,
        ranking={"by": "decision_index", "groups": [NAMES[:2], NAMES[2:]], "method": "by hand"},
    )
    ranks = [(1, [1, 2], 1), (2, [1, 2], 1), (3, [3, 4], 2), (4, [3, 4], 2)]
    ranked["models"] = [
        dict(m, rank=r, rank_ci=ci, tied_group=g)
        for m, (r, ci, g) in zip(summary["models"], ranks, strict=True)
    ]
    # the index's comparisons of the adjacent pairs (one stored the other way round: turned for the
    # line)
    entry = {
        "eval": None,
        "metric": "decision_index",
        "ci": [0.0, 1.0],
        "p_value": 0.5,
        "complete": True,
    }
    ranked["comparisons"] = [
        dict(entry, a=NAMES[0], b=NAMES[1], difference=0.4, p_adjusted=0.82, significant=False),
        dict(entry, a=NAMES[2], b=NAMES[1], difference=-3.25, p_adjusted=0.0004, significant=True),
        dict(entry, a=NAMES[2], b=NAMES[3], difference=1.0, p_adjusted=0.2, significant=False),
    ]
    lines = render(width, summary_json, ranked)
    keyed = any(re.fullmatch(r"  M1 = .+", line) for line in lines)
    for k, (name, (rank, (low, high), _)) in enumerate(zip(NAMES, ranks, strict=True)):
        label = f"M{k + 1}" if keyed else name
        assert any(
            line.lstrip(" │").startswith(label) and f"{rank} [{low}–{high}]" in line
            for line in lines
        ), label
    groups = (
        "{M1, M2} > {M3, M4}"
        if keyed
        else "{" + ", ".join(NAMES[:2]) + "} > {" + ", ".join(NAMES[2:]) + "}"
    )
    text = re.sub(r"\s+", " ", " ".join(lines))  # the line wraps at the terminal's width
    assert (
        "Ranked by Decision Index in statistically tied groups (max-T step-down over every pair, adjusted "
        f"p < 0.05): {groups}"
    ) in text
    key = [f"M{k}" for k in range(1, 5)] if keyed else NAMES
    assert (
        f"; adjacent: {key[0]} − {key[1]} +0.4 (p_adj 0.820), {key[1]} − {key[2]} +3.2 (p_adj < 0.001 †), "
        f"{key[2]} − {key[3]} +1.0 (p_adj 0.200)"
    ) in text
    assert max(len(line) for line in lines if "─" in line or "━" in line) <= width


def test_a_line_under_the_index_table_names_its_interval_and_abbreviations(summary: dict):
    """The index table's "95% CI" said nothing of how it is computed, and "Omni non-halluc" was
    not explained: one line under the table (after the key legend) says both, the interval's
    method as summary.json's intervals.methods names it."""
    from dxi.runner.outputs.legend import index_legend

    method = summary["intervals"]["methods"]["decision_index"]
    assert method == (
        "MOVER combination of the terms' intervals (Zou & Donner 2008) of its five weighted terms, "
        "independent"
    )
    line = (
        f"95% CI = the index's 95% interval: {method}; Omni = AA-Omniscience-Decision; acc = "
        "accuracy; non-halluc (non-hall.) = non-hallucination rate: of the answers not correct, the "
        'share that said "I don\'t know" rather than pick a wrong answer; WildGuard F1 = mean F1 '
        "of WildGuardTest's three questions."
    )
    assert index_legend(records.decode(summary)) == line
    lines = render(80, summary_json, summary)
    start = lines.index(f"  M{len(NAMES)} = {NAMES[-1]}") + 1  # after the key legend
    end = lines.index("Data used:")
    assert " ".join(x.strip() for x in lines[start:end]) == line  # wrapped at 80 columns


@pytest.mark.parametrize("width", [80, 200])
def test_the_index_table_counts_the_missing_answers_beside_the_failed_ones(width: int):
    """The realistic summary's model-003 has no reply at all: its 48 answers are missing from the
    cache (12 + 10 + 8 + 18, none failed), model-002 has 8 failed (2 + 6) and 48 missing. The table
    showed `failed 0` for the first and 8 for the second, as if the first were complete; now a
    `missing` column (at 80 columns, the fourth figure of inv/rep/fail/miss) counts them. A table
    without missing answers has no such column (the complete run's at 200 and 80 columns: the
    widest variant keeps fitting a log's 180 columns with full model names)."""
    from .conftest import FIXTURES

    golden = FIXTURES / "summary_realistic.json"  # test_records' golden file, as it is
    lines = render(width, summary_json, orjson.loads(golden.read_bytes()))
    table = table_lines(lines, "Decision Index", ("  M1 =", "95% CI =", "        Rank"))
    rows = [line for line in table if re.match(r"[│ ]*(synthetic:model-00|M)\d", line)]
    if width == 200:
        assert "┃ invalid ┃ repaired ┃ failed ┃ missing ┃" in table[2]
        ends = [line.rsplit("│", 5)[1:5] for line in rows]
        assert [[cell.strip() for cell in end] for end in ends] == [
            ["10", "0", "2", "0"],
            ["6", "0", "1", "0"],
            ["3", "0", "8", "48"],
            ["0", "0", "0", "48"],
        ]
    else:
        assert [line.split()[-1] for line in table[1:4]] == ["inv/rep", "/fail", "/miss"]
        assert [line.split()[-1] for line in rows] == [
            "10/0/2/0",
            "6/0/1/0",
            "3/0/8/48",
            "0/0/0/48",
        ]


def test_a_table_without_missing_answers_has_no_missing_column(summary: dict):
    assert (
        "┃ invalid ┃ repaired ┃ failed ┃\n" in "\n".join(render(200, summary_json, summary)) + "\n"
    )
    narrow = table_lines(render(80, summary_json, summary), "Decision Index", ("  M1 =",))
    assert [line.split()[-1] for line in narrow[1:3]] == ["inv/rep", "/fail"]
    assert "/miss" not in "\n".join(narrow)
