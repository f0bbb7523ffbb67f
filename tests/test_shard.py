"""``--shard K/N``: a stable assignment of cache keys to shards (the same in every process),
disjoint and covering; ``--shard auto`` from Slurm's and Kubernetes' variables; 1/N of the limits
and the cost bound."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import orjson
import pytest

from dxi.adapters import Limits
from dxi.runner.planning.shard import Shard, ShardError, divide, parse

KEYS = [hashlib.sha256(f"request {i}".encode()).hexdigest() for i in range(2000)] + [
    "hand-made",
    "k1",
    "k2",
]

ASSIGN = """
import hashlib, sys
from dxi.runner.planning.shard import Shard
keys = [hashlib.sha256(f"request {i}".encode()).hexdigest() for i in range(2000)] + ["hand-made", "k1", "k2"]
print(",".join(str(next(k for k in range(5) if Shard(k, 5).owns(key))) for key in keys))
"""


@pytest.mark.process
def test_assignment_is_identical_under_two_hash_seeds():
    runs = [
        subprocess.run(
            [sys.executable, "-c", ASSIGN],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    ]
    assert runs[0] == runs[1]
    assert runs[0].strip().split(",")[:2000] == [
        str(int(k[:16], 16) * 5 // 2**64) for k in KEYS[:2000]
    ]  # its range


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_shards_are_disjoint_and_cover_every_key(n: int):
    owners = [[k for k in range(n) if Shard(k, n).owns(key)] for key in KEYS]
    assert all(len(o) == 1 for o in owners)  # exactly one shard each
    sizes = [sum(o == [k] for o in owners) for k in range(n)]
    assert sum(sizes) == len(KEYS)
    assert min(sizes) > 0.8 * len(KEYS) / n  # near-even (sha256 bits)


def test_parse_k_of_n_and_its_errors():
    assert parse("2/4") == Shard(2, 4, "--shard")
    for bad, fragment in (
        ("4/4", "not one of 0..3"),
        ("-1/4", "not one of"),
        ("2", "give the number"),
        ("a/b", "expected K/N"),
        ("0/0", "at least 1"),
    ):
        with pytest.raises(ShardError, match=fragment):
            parse(bad, env={})


def test_auto_takes_the_index_from_the_scheduler_and_the_count_from_what_survives_resubmission():
    whole = {
        "SLURM_ARRAY_TASK_ID": "3",
        "SLURM_ARRAY_TASK_MIN": "0",
        "SLURM_ARRAY_TASK_MAX": "7",
        "SLURM_ARRAY_TASK_COUNT": "8",
    }
    assert parse("auto/8", whole) == Shard(3, 8, "SLURM_ARRAY_TASK_ID")
    assert parse("auto", whole | {"DXI_SHARD_COUNT": "8"}) == Shard(3, 8, "SLURM_ARRAY_TASK_ID")
    # `sbatch --array=2` resubmitting task 2: an array of one task, numbered 2; never shard 0/1 (the
    # whole run)
    resubmitted = {
        "SLURM_ARRAY_TASK_ID": "2",
        "SLURM_ARRAY_TASK_MIN": "2",
        "SLURM_ARRAY_TASK_MAX": "2",
        "SLURM_ARRAY_TASK_COUNT": "1",
    }
    assert parse("auto/8", resubmitted) == Shard(2, 8, "SLURM_ARRAY_TASK_ID")
    for env in (
        whole,
        resubmitted,
    ):  # the count Slurm gives cannot be trusted: refused, with the fix
        with pytest.raises(
            ShardError, match=r"--shard auto/N or set DXI_SHARD_COUNT=N .* --shard K/N"
        ):
            parse("auto", env)
    with pytest.raises(
        ShardError, match=r"shard 8 \(from SLURM_ARRAY_TASK_ID\) is not one of 0..7.*--array=0-7"
    ):
        parse("auto/8", {"SLURM_ARRAY_TASK_ID": "8"})  # an array numbered 1-8


def test_auto_from_a_kubernetes_indexed_job_needs_the_count():
    assert parse("auto/8", {"JOB_COMPLETION_INDEX": "5"}) == Shard(5, 8, "JOB_COMPLETION_INDEX")
    assert parse("auto", {"JOB_COMPLETION_INDEX": "1", "DXI_SHARD_COUNT": "2"}) == Shard(
        1, 2, "JOB_COMPLETION_INDEX"
    )
    with pytest.raises(ShardError, match="--shard auto/N"):
        parse("auto", {"JOB_COMPLETION_INDEX": "1"})
    with pytest.raises(ShardError, match="neither SLURM_ARRAY_TASK_ID"):
        parse("auto", {})


def test_each_shard_keeps_one_nth_of_the_limits():
    whole = Limits(rpm=600, tpm=100_000, max_in_flight=16, max_attempts=4)
    assert divide(whole, 4) == Limits(rpm=150, tpm=25_000, max_in_flight=4, max_attempts=4)
    assert divide(Limits(max_in_flight=3), 8) == Limits(
        max_in_flight=1
    )  # unlimited stays unlimited; one in flight
    assert divide(whole, 1) == whole


@pytest.mark.process
def test_estimate_by_shard_counts_each_request_once(tmp_path):
    from tests.helpers.synthetic import data_dir

    from .conftest import DXI

    data = data_dir(tmp_path / "data", 90)
    totals = []
    for k in range(3):
        out = subprocess.run(
            [
                DXI,
                "estimate",
                "--model",
                "embedded:sparrow-nano-general-v1.1",
                "--data-dir",
                str(data),
                "--evals",
                "when2call",  # the synthetic data: When2Call only
                "--cache-dir",
                str(tmp_path / "cache"),
                "--json",
                "--shard",
                f"{k}/3",
            ],
            capture_output=True,
            check=True,
        )
        totals.append(orjson.loads(out.stdout)["total"])
        assert b"shard %d/3" % k in out.stderr
    assert sum(t["requests"] for t in totals) == sum(t["new"] for t in totals) == 90
    assert all(t["requests"] > 15 for t in totals)


def test_the_recipes_commands_are_ones_dxi_accepts():
    from pathlib import Path

    import yaml

    from dxi.runner.cli import parser

    root = Path(__file__).parents[1] / "examples"
    jobs = list(yaml.safe_load_all((root / "k8s-indexed-job.yaml").read_text()))
    assert jobs[0]["spec"]["completionMode"] == "Indexed"
    for job in jobs:
        (container,) = job["spec"]["template"]["spec"]["containers"]
        args = parser().parse_args(container["args"][1:])
        assert args.cache_remote == "s3://team-evals/dxi-cache"
    assert (
        parser().parse_args(jobs[0]["spec"]["template"]["spec"]["containers"][0]["args"][1:]).shard
        == f"auto/{jobs[0]['spec']['completions']}"
    )
    script = (root / "slurm-array.sh").read_text()
    assert (
        '--shard "auto/$SHARDS"' in script
        and "#SBATCH --array=0-7" in script
        and "\nSHARDS=${DXI_SHARDS:-8} " in script
    )
    assert (
        "SLURM_ARRAY_JOB_ID}/" not in script and "task-${SLURM_ARRAY_TASK_ID" in script
    )  # survives resubmission


@pytest.mark.process
def test_a_coordinator_that_cannot_be_reached_leaves_one_nth_of_each_limit(tmp_path, data_dir):
    from tests.helpers.servers import free_port

    from .conftest import DXI

    done = subprocess.run(
        [
            DXI,
            "run",
            "--model",
            "embedded:sparrow-nano-general-v1.1",
            "--data-dir",
            str(data_dir),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "out"),
            "-q",
            "--shard",
            "1/2",
            "--max-in-flight",
            "8",
            "--coordinator",
            f"redis://127.0.0.1:{free_port()}/0",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "unreachable" in done.stderr and "falls back to 1/2" in done.stderr
    assert "4 in flight (1/2 of 8 in flight)" in done.stderr  # never the full limit


@pytest.mark.slow
def test_a_shards_summary_tells_of_its_own_part_and_exits_0_when_it_is_complete(
    tmp_path, data_dir, capsys
):
    """A shard's summary scores every task with only its own part's answers: it said "N missing
    answer(s) ... the next `dxi run` with these options asks for N of them again", "the run is
    incomplete ... sends what is missing" and "The result is provisional: rerun", counting the other
    shards' tasks, which it never sends; also after a rerun that sent nothing."""
    import orjson

    from dxi.runner.cli import main

    def run(k: str) -> int:
        return main(
            ["run", "--model", "embedded", "--data-dir", str(data_dir), "-q"]
            + ["--cache-dir", str(tmp_path / f"c{k}"), "--out", str(tmp_path / f"o{k}")]
            + ["--shard", f"{k}/2"]
        )

    owned = {}
    for k in ("0", "1"):
        for again in (False, True):  # the rerun finds every request cached: nothing to send
            assert run(k) == 0
            said = " ".join(capsys.readouterr().out.split())
            line = orjson.loads(
                (tmp_path / f"o{k}" / "run-history.jsonl").read_bytes().splitlines()[-1]
            )
            block = line["requests"]["embedded:sparrow-nano-general-v1.1"]
            assert (block["sent"] > 0) is not again
            owned[k] = block["sent"] + block["cache_hits"]
            summary = orjson.loads((tmp_path / f"o{k}" / "summary.json").read_bytes())
            missing = sum(b["missing"] for b in summary["models"][0]["evals"].values())
            assert missing > 0
            assert (
                f"shard {k}/2: embedded:sparrow-nano-general-v1.1: this shard's part is complete: "
                f"its {owned[k]} request(s) are answered; the other answers missing above "
                f"({missing} in all) are the other shards' part, which this shard never sends: its "
                "figures are over its own answers only."
            ) in said
            for false in ("asks for", "sends what is missing", "The result is provisional"):
                assert false not in said
    tasks = orjson.loads((tmp_path / "o0" / "summary.json").read_bytes())["data"]
    assert owned["0"] + owned["1"] == sum(d["tasks"] for d in tasks.values())  # disjoint, covering


async def test_a_shard_whose_own_requests_failed_says_so_and_exits_1(tmp_path, data_dir, capsys):
    """Every request of the shard refused with a 400 (kept: deterministic): its part is not
    complete, the run exits 1 and says how many of its own requests are not answered."""
    import asyncio

    import orjson

    from dxi.runner.cli import main
    from dxi.runner.errors import EXIT_FAILED_REQUESTS

    from .fakes.fake_provider import FakeProvider

    async with FakeProvider(model=None, default="400") as server:
        args = ["run", "--model", f"systemone:m1@{server.url}", "--data-dir", str(data_dir)]
        args += ["--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path / "o"), "--shard", "1/2"]
        assert await asyncio.to_thread(main, [*args, "-q"]) == EXIT_FAILED_REQUESTS
    said = " ".join(capsys.readouterr().out.split())
    line = orjson.loads((tmp_path / "o" / "run-history.jsonl").read_bytes())
    block = line["requests"]["systemone:m1"]
    assert block["failed"] == block["sent"] > 0 and block["cache_hits"] == 0
    n = block["sent"]
    assert (
        f"shard 1/2: systemone:m1: {n} of this shard's {n} request(s) are not answered ({n} "
        "failed): a rerun of this shard sends again those not sent and those that failed "
        "transiently (--retry-failed: the deterministic failures too); the other answers missing "
        "above"
    ) in said
    assert "asks for" not in said and "The result is provisional" not in said
