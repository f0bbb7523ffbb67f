"""``dxi data fetch`` / ``dxi data check`` against a local directory laid out like the hub (never
the network)."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dxi.evals import Suite, discover
from dxi.evals.fetch import Hub, Mirror, check, fetch, revisions
from dxi.runner.cli import main

from .conftest import FIXTURES, write_wildguard_parquet
from .fakes.fake_hub import Repo, fake_hub


def hle_rows() -> list[dict]:
    return [
        orjson.loads(line) for line in (FIXTURES / "hle_original.jsonl").read_text().splitlines()
    ]


@pytest.fixture
def mirror(tmp_path: Path) -> Path:
    """The hub's layout: cais/hle as two Parquet shards, nvidia/When2Call's MCQ file,
    allenai/wildguardmix."""
    root = tmp_path / "mirror"
    rows = hle_rows()
    (root / "cais/hle/data").mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist(rows[:2]), root / "cais/hle/data/test-00000-of-00002.parquet"
    )
    pq.write_table(
        pa.Table.from_pylist(rows[2:]), root / "cais/hle/data/test-00001-of-00002.parquet"
    )
    (root / "cais/hle/README.md").write_text("card")
    (root / "nvidia/When2Call/test").mkdir(parents=True)
    shutil.copy(
        FIXTURES / "when2call.jsonl", root / "nvidia/When2Call/test/when2call_test_mcq.jsonl"
    )
    (root / "nvidia/When2Call/test/when2call_test_llm_judge.jsonl").write_text("")
    write_wildguard_parquet(root / "allenai/wildguardmix/test/wildguardtest.parquet")
    return root


def test_fetch_lays_out_and_verifies_every_public_set(mirror: Path, tmp_path: Path):
    data = tmp_path / "data"
    outcomes = {o.eval: o for o in fetch(data, Mirror(mirror))}
    assert outcomes["aa_omniscience_decision"].status == "unavailable"
    assert "private" in outcomes["aa_omniscience_decision"].message
    hle = outcomes["hle_multichoice"]
    # two shards concatenated: 4 rows, of which 2 are text-only multipleChoice
    assert (hle.status, hle.file.rows, hle.tasks) == ("fetched", 4, 2)
    assert hle.file.path == data / "hle/hle_test.parquet"
    assert "published: 2500 rows / 513 tasks, here 4 / 2" in hle.message
    assert (outcomes["when2call"].file.rows, outcomes["when2call"].tasks) == (3, 3)
    assert (outcomes["wildguardtest"].file.rows, outcomes["wildguardtest"].tasks) == (5, 3)
    found = discover(data)
    assert found["when2call"].file.path == data / "when2call/when2call_test_mcq.jsonl"
    assert found["wildguardtest"].file.sha256 == outcomes["wildguardtest"].file.sha256
    again = {o.eval: o.status for o in fetch(data, Mirror(mirror))}
    assert again == {
        "aa_omniscience_decision": "unavailable",
        "hle_multichoice": "present",
        "when2call": "present",
        "wildguardtest": "present",
    }


def test_one_bad_set_does_not_stop_the_others(mirror: Path, tmp_path: Path):
    (mirror / "nvidia/When2Call/test/when2call_test_mcq.jsonl").write_text('{"uuid": "u"}\n')
    shutil.rmtree(mirror / "allenai")
    outcomes = {
        o.eval: o
        for o in fetch(
            tmp_path / "data", Mirror(mirror), ["when2call", "wildguardtest", "hle_multichoice"]
        )
    }
    assert outcomes["when2call"].status == "failed"
    assert "row 1, field 'question': missing" in outcomes["when2call"].message
    assert outcomes["wildguardtest"].status == "failed"
    assert "allenai/wildguardmix: not in the mirror" in outcomes["wildguardtest"].message
    assert outcomes["hle_multichoice"].status == "fetched"


def test_hle_shards_with_different_columns_are_joined_and_a_corrupt_one_fails_alone(
    mirror: Path, tmp_path: Path
):
    rows = hle_rows()
    shards = sorted((mirror / "cais/hle/data").glob("*.parquet"))
    pq.write_table(
        pa.Table.from_pylist([{k: v for k, v in r.items() if k != "category"} for r in rows[2:]]),
        shards[1],
    )
    hle = fetch(tmp_path / "data", Mirror(mirror), ["hle_multichoice"])[0]
    assert (hle.status, hle.file.rows, hle.tasks) == (
        "fetched",
        4,
        2,
    )  # the missing column read as nulls
    shards[0].write_bytes(b"not parquet")
    outcomes = {
        o.eval: o
        for o in fetch(tmp_path / "data2", Mirror(mirror), ["hle_multichoice", "when2call"])
    }
    assert (
        outcomes["hle_multichoice"].status == "failed"
        and "Parquet" in outcomes["hle_multichoice"].message
    )
    assert outcomes["when2call"].status == "fetched"
    assert not list((tmp_path / "data2").rglob("*.part"))  # nothing half-written left behind


def test_check_reports_counts_and_problems(data_dir: Path):
    outcomes = {o.eval: o for o in check(data_dir)}
    assert {k: o.tasks for k, o in outcomes.items()} == {
        "aa_omniscience_decision": 4,
        "hle_multichoice": 2,
        "when2call": 3,
        "wildguardtest": 3,
    }
    assert "stand-in" in outcomes["aa_omniscience_decision"].message
    assert "published: 3652 rows / 3652 tasks, here 3 / 3" in outcomes["when2call"].message
    # both published counts: the hub file's (and the product's default selection of it) and the
    # index's
    assert {k: o.published() for k, o in outcomes.items()} == {
        "aa_omniscience_decision": "index 500 tasks",
        "hle_multichoice": "file 2500 rows / 513 tasks; index 513 tasks",
        "when2call": "file 3652 rows / 3652 tasks; index 3423 tasks",
        "wildguardtest": "file 1725 rows / 880 tasks; index 835 tasks",
    }


def test_cli_fetch_and_check_exit_codes(
    mirror: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    data = tmp_path / "data"
    assert (
        main(
            [
                "data",
                "fetch",
                "--data-dir",
                str(data),
                "--mirror",
                str(mirror),
                "--evals",
                "when2call",
            ]
        )
        == 0
    )
    assert "fetched" in capsys.readouterr().out
    assert (
        main(["data", "check", "--data-dir", str(data)]) == 1
    )  # no HLE, WildGuardTest or Omniscience here
    out = capsys.readouterr().out  # (a cell may wrap within its column)
    assert "file 3652 rows / 3652 tasks; index 3423" in out
    shutil.rmtree(mirror / "nvidia")
    assert (
        main(
            [
                "data",
                "fetch",
                "--data-dir",
                str(tmp_path / "other"),
                "--mirror",
                str(mirror),
                "--evals",
                "when2call",
            ]
        )
        == 1
    )


def test_a_revision_is_fetched_at_its_commit_through_huggingface_hub_and_recorded_to_the_summary(
    tmp_path: Path,
):
    # a hub on 127.0.0.1 serving nvidia/When2Call at two commits: v1 (two rows) and main (all three
    # rows)
    rows = (FIXTURES / "when2call.jsonl").read_bytes().splitlines(keepends=True)
    old, new = "a" * 40, "b" * 40
    repo = Repo(
        {
            old: {"test/when2call_test_mcq.jsonl": b"".join(rows[:2])},
            new: {"test/when2call_test_mcq.jsonl": b"".join(rows), "README.md": b"card"},
        },
        {"main": new, "v1": old},
    )
    data = tmp_path / "data"
    with fake_hub({"nvidia/When2Call": repo}) as hub:
        source = Hub(endpoint=hub.url, cache_dir=tmp_path / "hf-cache")
        (outcome,) = fetch(data, source, ["when2call"], revisions={"when2call": "v1"})
        assert (outcome.status, outcome.tasks, outcome.message.split(";")[0]) == (
            "fetched",
            2,
            f"from nvidia/When2Call at revision {old}",
        )
        assert outcome.file.source == {
            "hf_repo": "nvidia/When2Call",
            "revision": old,
            "requested_revision": "v1",
        }
        # the summary's data block records it beside the file's sha256
        block = Suite(discover(data, selected=["when2call"]), evals=("when2call",)).data_block()[
            "when2call"
        ]
        (entry,) = block["files"]
        assert (entry["revision"], entry["hf_repo"], entry["requested_revision"]) == (
            old,
            "nvidia/When2Call",
            "v1",
        )
        assert entry["sha256"] == outcome.file.sha256
        # kept as it is while the same revision is asked for; fetched again for another one
        assert (
            fetch(data, source, ["when2call"], revisions={"when2call": "v1"})[0].status == "present"
        )
        (latest,) = fetch(data, source, ["when2call"])  # no revision asked: the file there is kept
        assert latest.status == "present"
        (latest,) = fetch(data, source, ["when2call"], revisions={"when2call": "main"})
        assert (latest.status, latest.tasks, latest.file.source["revision"]) == ("fetched", 3, new)
        assert [r for r in hub.requests if "/resolve/" in r and r.startswith("GET")] == [
            f"GET /datasets/nvidia/When2Call/resolve/{old}/test/when2call_test_mcq.jsonl",
            f"GET /datasets/nvidia/When2Call/resolve/{new}/test/when2call_test_mcq.jsonl",
        ]  # at the commits
        (missing,) = fetch(data, source, ["when2call"], revisions={"when2call": "v9"})
        assert missing.status == "failed" and "no revision 'v9'" in missing.message
    # a file replaced since it was fetched no longer claims the record's revision
    (data / "when2call" / "when2call_test_mcq.jsonl").write_bytes(b"".join(rows[:1]))
    assert discover(data, selected=["when2call"])["when2call"].file.source is None


def test_revision_values_name_one_evaluation_or_every_one():
    assert revisions(["main"], ["hle_multichoice", "when2call"]) == {
        "hle_multichoice": "main",
        "when2call": "main",
    }
    assert revisions(
        ["main", "when2call=abc123"], ["hle_multichoice", "when2call", "aa_omniscience_decision"]
    ) == {"hle_multichoice": "main", "when2call": "abc123"}
    with pytest.raises(ValueError, match="'hle' is not an evaluation fetched from the hub"):
        revisions(["hle=main"], ["hle_multichoice"])
    with pytest.raises(ValueError, match="no revision"):
        revisions(["when2call="], ["when2call"])
