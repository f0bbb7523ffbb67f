"""The four evaluations as tasks: counts on the real data, parsing on fixtures, errors on malformed
rows."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from dxi.evals import (
    EVALS,
    DatasetError,
    Exclusions,
    Suite,
    discover,
    gold_frames,
    hle,
    omniscience,
    when2call,
)
from dxi.evals import wildguardtest as wg

from .conftest import FIXTURES, REAL_DATA, requires_real_data, write_wildguard_parquet


@requires_real_data
def test_task_counts_on_real_data():
    suite = Suite(discover(REAL_DATA))
    counts = {name: sum(1 for _ in suite.tasks(name)) for name in EVALS}
    assert counts == {
        "aa_omniscience_decision": 500,
        "hle_multichoice": 513,
        "when2call": 300,
        "wildguardtest": 880,
    }
    # every agreed WildGuardTest row has a response and all three labels: 880 × 3 questions
    assert sum(len(t.questions) for t in suite.tasks("wildguardtest")) == 2640
    block = suite.data_block()
    assert block["aa_omniscience_decision"]["stand_in"] is True
    assert block["wildguardtest"]["files"][0]["rows"] == 1725
    assert block["hle_multichoice"]["files"][0]["sha256"] == (
        "9fcc96afdc468c56a41329dd7f00d45f136a40000d0f321a06606ce7438afbeb"
    )
    # When2Call's 300-row LLM-as-judge file is a subset of the 3,423 tasks the index scores; the
    # others are whole
    assert block["when2call"]["note"] == (
        "The published Decision Index scores 3,423 When2Call tasks; this file holds 300 rows, a subset, so results "
        "are not comparable to published numbers (`dxi data fetch` downloads the full set)."
    )
    assert "note" not in block["hle_multichoice"] and "note" not in block["wildguardtest"]


@requires_real_data
def test_real_hle_gold_letters_and_option_counts():
    tasks = list(Suite(discover(REAL_DATA)).tasks("hle_multichoice"))
    counts = [len(t.questions[0].options) for t in tasks]
    assert min(counts) == 5 and max(counts) == 26
    assert sum(1 for c in counts if c >= 9) == 100
    assert sum(1 for t in tasks if t.gold["answer"] == "I") == 7


def test_omniscience_options_and_gold():
    tasks = list(omniscience.load(FIXTURES / "omniscience.jsonl"))
    assert [t.id for t in tasks] == [f"aa_omniscience_decision/q{i}" for i in range(1, 5)]
    q = tasks[0].questions[0]
    assert [o.id for o in q.options] == ["A", "B", "C", "D", "E"]
    assert q.options[4].text == "I don't know"
    assert [o.text for o in q.options[:4]] == ["90", "100", "110", "120"]
    assert [t.gold["answer"] for t in tasks] == ["B", "A", "D", "B"]
    assert tasks[0].meta["domain"] == "Science"


def test_hle_original_shape_parses_choices_in_order_and_filters():
    tasks = list(hle.load(FIXTURES / "hle_original.jsonl"))
    # h3 has an image and h4 is exactMatch: both dropped
    assert [t.id for t in tasks] == ["hle_multichoice/h1", "hle_multichoice/h2"]
    first = tasks[0]
    assert first.state == "Which number is prime?"
    assert [(o.id, o.text) for o in first.questions[0].options] == [
        ("A", "4"),
        ("B", "6"),
        ("C", "7"),
        ("D", "8"),
        ("E", "9"),
    ]
    second = tasks[1]
    # "I think ..." in the body is not a choice; the choice "I. I" is; its continuation line is kept
    # with it
    assert second.state == "Pick the pronoun used for oneself.\nI think the answer is obvious."
    options = second.questions[0].options
    assert [o.id for o in options] == list("ABCDEFGHI")
    assert options[-1].text == "I\nwhich is the first person singular"
    assert second.gold == {"answer": "I"}


def test_hle_split_shape():
    tasks = list(hle.load(FIXTURES / "hle_split.json"))
    assert [len(t.questions[0].options) for t in tasks] == [5, 6]
    assert tasks[0].gold == {"answer": "B"} and tasks[0].meta["category"] == "Physics"


def test_when2call_shuffle_is_deterministic_and_gold_follows_it():
    tasks = list(when2call.load(FIXTURES / "when2call.jsonl"))
    again = list(when2call.load(FIXTURES / "when2call.jsonl"))
    assert [t.questions for t in tasks] == [t.questions for t in again]
    for t, correct in zip(tasks, ["tool_call", "request_for_info", "cannot_answer"], strict=True):
        categories = t.meta["categories"]
        assert sorted(categories.values()) == sorted(when2call.CATEGORIES)
        assert categories[t.gold["answer"]] == correct
        assert list(categories.values()) == list(when2call.shuffled(t.id))
    # the orders differ between tasks (seeded by the task id, not one global permutation)
    assert len({tuple(t.meta["categories"].values()) for t in tasks}) > 1
    assert "(no tools)" in tasks[2].state and tasks[2].state.endswith(
        "User: Book me a flight to Rome."
    )


def test_wildguard_subsets_and_questions(tmp_path: Path):
    path = write_wildguard_parquet(tmp_path / "wg.parquet")
    agreed = list(wg.load(path))
    assert [t.id for t in agreed] == ["wildguardtest/0", "wildguardtest/1", "wildguardtest/3"]
    assert agreed[1].gold == {
        "prompt_harmful": "yes",
        "response_refusal": "yes",
        "response_harmful": "no",
    }
    assert agreed[2].gold == {
        "prompt_harmful": "yes",
        "response_refusal": "no",
        "response_harmful": "yes",
    }
    everything = list(wg.load(path, subset="all"))
    assert [t.id for t in everything] == [f"wildguardtest/{i}" for i in range(5)]
    assert [q.id for q in everything[4].questions] == ["prompt_harmful", "response_refusal"]


@pytest.mark.parametrize(
    ("column", "subset"), [("response_harm_label", "all"), ("prompt_harm_agreement", "agreed")]
)
def test_a_wildguard_file_without_a_label_or_agreement_column_is_an_error(
    tmp_path: Path, column: str, subset: str
):
    """A whole column missing is a malformed file, not rows without that label (which silently drops
    a question or, for an agreement column, every task)."""
    import pyarrow.parquet as pq

    path = write_wildguard_parquet(tmp_path / "wg.parquet")
    pq.write_table(pq.read_table(path).drop_columns([column]), path)
    with pytest.raises(
        DatasetError,
        match=rf"wg.parquet, row 1, field '{column}': missing: the file has no such column",
    ):
        list(wg.load(path, subset=subset))


@pytest.mark.parametrize(
    ("name", "line", "field_name"),
    [
        (
            "omniscience.jsonl",
            '{"question_id": "x", "question": "q?", "answers": ["a", "b", "c"], "correct_index": 0}',
            "answers",
        ),
        (
            "omniscience.jsonl",
            '{"question_id": "x", "question": "q?", "answers": ["a", "b", "c", "d"], "correct_index": 4}',
            "correct_index",
        ),
        (
            "omniscience.jsonl",
            '{"question_id": "x", "answers": ["a", "b", "c", "d"], "correct_index": 1}',
            "question",
        ),
        (
            "when2call.jsonl",
            '{"uuid": "u", "question": "q", "tools": [], "answers": {"direct": "d"}, "correct_answer": "direct"}',
            "answers.tool_call",
        ),
        (
            "hle.jsonl",
            '{"id": "h", "question": "no block here", "answer": "A", "answer_type": "multipleChoice", "image": ""}',
            "question",
        ),
        (
            "hle.jsonl",
            '{"id": "h", "question": "Q\\nAnswer Choices:\\nA. x\\nB. y", "answer": "C", "answer_type": "multipleChoice"}',
            "answer",
        ),
    ],
)
def test_malformed_row_names_file_row_and_field(
    tmp_path: Path, name: str, line: str, field_name: str
):
    path = tmp_path / name
    good = (
        (FIXTURES / "omniscience.jsonl").read_text().splitlines()[0]
        if name.startswith("omni")
        else None
    )
    path.write_text((good + "\n" if good else "") + line + "\n")
    loader = {
        "omniscience.jsonl": omniscience.load,
        "when2call.jsonl": when2call.load,
        "hle.jsonl": hle.load,
    }[name]
    with pytest.raises(DatasetError) as err:
        list(loader(path))
    row = 2 if good else 1
    assert err.value.row == row and err.value.field == field_name
    assert str(err.value).startswith(f"{path}, row {row}, field {field_name!r}")


def test_invalid_json_line_is_reported(tmp_path: Path):
    path = tmp_path / "w.jsonl"
    path.write_bytes((FIXTURES / "when2call.jsonl").read_bytes() + b'{"uuid": "broken\n')
    with pytest.raises(DatasetError, match=r"w\.jsonl, row 4: not valid JSON"):
        list(when2call.load(path))


def test_exclusions_drop_tasks_and_single_questions(tmp_path: Path, data_dir: Path):
    listing = tmp_path / "exclude.txt"
    listing.write_text(
        "# ambiguous\nwhen2call/u-2\nwildguardtest/1:response_harmful  # per question\n"
    )
    bare = tmp_path / "uuids.txt"
    bare.write_text("u-3\n")
    ex = Exclusions.read(listing)
    ex.add_file(bare, "when2call")
    suite = Suite(discover(data_dir), ex)
    assert [t.id for t in suite.tasks("when2call")] == ["when2call/u-1"]
    wg1 = next(t for t in suite.tasks("wildguardtest") if t.id == "wildguardtest/1")
    assert [q.id for q in wg1.questions] == ["prompt_harmful", "response_refusal"]
    assert "response_harmful" not in wg1.gold
    assert suite.data_block()["when2call"]["excluded"] == {"listed": 2, "matched": 2}
    with pytest.raises(ValueError, match="line 1"):
        Exclusions.read(bare)  # bare ids need an evaluation


def test_missing_evaluation_is_reported_not_fatal(tmp_path: Path):
    (tmp_path / "hle").mkdir()
    (tmp_path / "hle" / "hle_mcqa.json").write_bytes((FIXTURES / "hle_split.json").read_bytes())
    suite = Suite(discover(tmp_path))
    assert suite.selected() == ["hle_multichoice"]
    assert "no When2Call file" in suite.data_block()["when2call"]["missing"]


def test_gold_frames(data_dir: Path):
    suite = Suite(discover(data_dir))
    gold, categories = gold_frames(suite.tasks())
    assert gold.height == 4 + 2 + 3 + 3 * 3
    assert categories.height == 3 * 4
    row = gold.filter(gold["task_id"] == "hle_multichoice/s2").row(0, named=True)
    assert (row["gold"], row["kind"], row["group"]) == ("A", "choice", "Chemistry")


def test_task_digest_changes_with_content():
    tasks = list(omniscience.load(FIXTURES / "omniscience.jsonl"))
    assert len({t.digest for t in tasks}) == 4
    row = orjson.loads((FIXTURES / "omniscience.jsonl").read_text().splitlines()[0])
    row["answers"][0] = "91"
    changed = omniscience.record_to_task(Path("x"), 1, row)
    assert changed.id == tasks[0].id and changed.digest != tasks[0].digest


def test_two_files_that_could_be_one_evaluation_are_reported(
    data_dir: Path, caplog: pytest.LogCaptureFixture
):
    first = next((data_dir / "hle").iterdir())
    (data_dir / "hle" / "zz_other.parquet").write_bytes(b"x")
    found = discover(data_dir)
    assert found["hle_multichoice"].file.path == first  # the first match is used, as before
    assert f"HLE-MultiChoice: 2 files under {data_dir} could be it" in caplog.text
    assert "Name the one you mean with --hle FILE" in caplog.text


def test_a_file_smaller_than_the_published_set_is_noted_as_a_subset(data_dir: Path):
    block = Suite(discover(data_dir), limit=2).data_block()
    rows = block["hle_multichoice"]["files"][0]["rows"]
    assert rows < 513 and block["hle_multichoice"]["note"].startswith(
        f"The published Decision Index scores 513 HLE-MultiChoice tasks; this file holds {rows:,} rows, a subset"
    )
    assert "stand-in" in block["aa_omniscience_decision"]["note"]  # its own note, not the subset's


def test_only_a_stand_in_is_labelled_one(data_dir: Path, tmp_path: Path):
    standin = Suite(discover(data_dir)).data_block()["aa_omniscience_decision"]
    assert standin["stand_in"] is True  # the fixture sits in omniscience-standin/
    own = tmp_path / "aa_omniscience" / "questions.jsonl"
    own.parent.mkdir()
    own.write_bytes(next((data_dir / "omniscience-standin").iterdir()).read_bytes())
    block = Suite(discover(None, {"aa_omniscience_decision": own})).data_block()[
        "aa_omniscience_decision"
    ]
    assert block["stand_in"] is False and "not the shipped stand-in" in block["note"]
