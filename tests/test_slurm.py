"""``examples/slurm-array.sh`` on a real scheduler: a single-node Slurm cluster from Debian's
packages (``tests/helpers/slurm.py``: munged, slurmctld, slurmd on 127.0.0.1), moto's S3 server and
redis-server. A 4-task array runs the example script against the fake provider; one task is killed
(SIGKILL, mid-run) and resubmitted on its own (``sbatch --array=1``, into the same run); then the
run scored from the remote cache alone equals a single process's run, and no request was sent twice
but those the killed task had in flight."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from .conftest import DXI, without_requests
from .fakes.fake_provider import serve
from .helpers.servers import moto_s3, needs, redis_server, requires_redis
from .helpers.slurm import missing, slurm_cluster
from .helpers.synthetic import data_dir

ROOT = Path(__file__).parents[1]
pytestmark = [
    requires_redis,
    needs(None if missing() is None else f"no Slurm cluster: {missing()}"),
    pytest.mark.process,
    pytest.mark.server,
]

TASKS = 400
# for the whole run (the coordinator shares it): at most this many sent twice by the killed task
IN_FLIGHT = 4


def _dxi_of(marker: str) -> int | None:
    """The pid of the ``dxi run`` whose command line holds ``marker`` (its task's own cache folder),
    if running."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (
                any(a.endswith(b"/dxi") for a in argv[:2])
                and b"run" in argv
                and marker.encode() in b" ".join(argv)
            ):
                return int(proc.name)
    return None


def test_a_slurm_array_with_a_task_killed_and_resubmitted_scores_as_one_process(tmp_path: Path):
    data = data_dir(tmp_path / "data", TASKS)
    caches = tmp_path / "caches"
    with (
        slurm_cluster(tmp_path / "slurm") as cluster,
        moto_s3() as s3,
        redis_server() as redis_url,
        serve(model="fake", p_first=None, p_yes=None, record=False, latency="0.02") as server,
    ):
        run_file = tmp_path / "run.toml"
        run_file.write_text(
            f'data_dir = "{data}"\n[providers.fake]\nkind = "systemone"\nbase_url = "{server.url}"\n'
            f'rpm = 1200\nmax_in_flight = {IN_FLIGHT}\n[[models]]\nprovider = "fake"\nmodel = "fake"\n'
            "price = { input = 0.0, output = 0.0 }\n"
            '[evals]\nselect = ["when2call"]\n'  # the synthetic data: When2Call only
        )
        env = {
            **cluster.env,
            **s3.env,
            "DXI_SHARDS": "4",
            "DXI_RUN_FILE": str(run_file),
            "DXI_REMOTE": s3.uri(),
            "DXI_REDIS": redis_url,
            "DXI_OUT": str(tmp_path / "out"),
            "DXI": DXI,
            "DXI_CACHE_ROOT": str(caches),
            "DXI_MAX_COST": "10",
        }
        env.pop("DXI_RUN_ID", None)
        submit = [
            "sbatch",
            "--parsable",
            f"--output={tmp_path}/logs/%A_%a.log",
            f"--chdir={ROOT}",
            "--export=ALL",
        ]
        (tmp_path / "logs").mkdir()
        job = cluster.run(*submit, "--array=0-3", "examples/slurm-array.sh", env=env).stdout.strip()
        deadline = time.monotonic() + 120
        while server.stats()["arrivals"] < 60:  # every task under way
            assert time.monotonic() < deadline, cluster.states(job)
            time.sleep(0.2)
        victim = _dxi_of(f"{caches}/{job}/task-1")
        assert victim is not None, cluster.states(job)
        os.kill(
            victim, signal.SIGKILL
        )  # task 1 dies mid-run, with requests in flight and replies not yet uploaded
        states = cluster.wait(job)
        assert (
            states[f"{job}_1"] == "FAILED"
            and [states[f"{job}_{k}"] for k in (0, 2, 3)] == ["COMPLETED"] * 3
        ), states
        before = server.stats()
        # resubmitted on its own into the same run: an array of one task, numbered 1, still shard 1
        # of 4
        again = cluster.run(
            *submit, "--array=1", "examples/slurm-array.sh", env={**env, "DXI_RUN_ID": job}
        ).stdout.strip()
        assert cluster.wait(again)[f"{again}_1"] == "COMPLETED"
        after = server.stats()
        log = (tmp_path / "logs" / f"{again}_1.log").read_text()
        assert (
            "shard 1/4 (from SLURM_ARRAY_TASK_ID)" in log
            and f"shared by every process of run {job}" in log
        ), log
        scored = subprocess.run(
            [
                DXI,
                "score",
                str(run_file),
                "--cache-remote",
                s3.uri(),
                "--cache-dir",
                str(tmp_path / "empty"),
                "--out",
                str(tmp_path / "scored"),
                "-q",
            ],
            env={**os.environ, **s3.env},
            capture_output=True,
            text=True,
        )
        assert scored.returncode == 0, scored.stderr
    assert after["keys_ok"] == TASKS  # every request answered ...
    assert (
        after["duplicates"] <= IN_FLIGHT
    )  # ... and none twice but those the killed task had in flight
    assert (
        after["arrivals"] - before["arrivals"] <= TASKS // 4
    )  # the resubmitted task sent only what was missing
    with serve(
        model="fake", p_first=None, p_yes=None, record=False
    ) as single:  # the reference: one process
        one = tmp_path / "one.toml"
        one.write_text(run_file.read_text().replace(server.url, single.url))
        assert (
            subprocess.run(
                [
                    DXI,
                    "run",
                    str(one),
                    "--cache-dir",
                    str(tmp_path / "c1"),
                    "--out",
                    str(tmp_path / "single"),
                    "-q",
                ]
            ).returncode
            == 0
        )

    def summary(out: str) -> dict:
        return without_requests(orjson.loads((tmp_path / out / "summary.json").read_bytes()))

    assert summary("scored") == summary("single")
