"""runner.batch.memory: the allocators ``dxi run --batch`` sets before Polars and PyArrow are
imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dxi.runner.batch import memory


@pytest.mark.process
def test_tune_sets_jemalloc_and_pyarrow_in_a_fresh_process_and_keeps_what_the_user_set():
    code = (
        "import os; from dxi.runner.batch.memory import tune; done = tune(); "
        "import pyarrow as pa, polars; print(os.environ['_RJEM_MALLOC_CONF']); "
        "print(pa.default_memory_pool().backend_name); print(len(done))"
    )
    env = {"PATH": "/usr/bin:/bin", "_RJEM_MALLOC_CONF": "narenas:4"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    # Polars puts its defaults first, then what the variable held: ours, then the user's (jemalloc
    # takes an option's last value: ours over Polars' defaults, the user's narenas over ours)
    assert out[0].endswith(f",{memory.JEMALLOC},narenas:4")
    assert out[1] == "system"
    assert out[2] == "4"  # jemalloc, PyArrow, and glibc's two mallopt settings
    env = {
        "PATH": "/usr/bin:/bin",
        "ARROW_DEFAULT_MEMORY_POOL": "mimalloc",
        "MALLOC_ARENA_MAX": "8",
        "MALLOC_MMAP_THRESHOLD_": "65536",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0].endswith(f",{memory.JEMALLOC}")
    assert out[1] == "mimalloc"
    assert out[2] == "1"  # only jemalloc's: the user's pool and glibc settings are kept


def test_tune_leaves_a_library_already_imported_alone():
    import polars  # noqa: F401  (imported in this process already)
    import pyarrow  # noqa: F401

    env: dict[str, str] = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072"}
    assert memory.tune(env) == []
    assert env == {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072"}


def test_a_task_digest_is_computed_once_and_a_changed_copy_has_its_own():
    from dataclasses import replace

    from dxi.evals.task import Question, Task

    task = Task("t/1", "e", "state", (Question("q", "yes_no", "Is it?"),), {"q": "yes"})
    digest = task.digest
    assert task.digest is digest  # kept on the task
    assert (
        replace(task).digest == digest
        and replace(task) == task
        and hash(replace(task)) == hash(task)
    )
    changed = replace(task, state="other")
    assert changed.digest != digest
    assert changed.digest == Task("t/1", "e", "other", task.questions, task.gold).digest


@pytest.mark.process
def test_only_a_batch_run_tunes_the_allocators(tmp_path):
    from .helpers.synthetic import data_dir

    data = data_dir(tmp_path / "data", 3)

    def jemalloc_at_send(*flags: str) -> str:
        code = (
            "import os, sys\nfrom dxi.runner import cli, session\n"
            "def stop_here(plan, **kwargs):\n    raise SystemExit(os.environ.get('_RJEM_MALLOC_CONF', 'unset'))\n"
            "session.run = stop_here\n"
            "try:\n"
            f"    cli.main(['run', '--model', 'openai:gpt-x@http://127.0.0.1:9/v1', '--data-dir', {str(data)!r}, "
            f"'--cache-dir', {str(tmp_path / 'cache')!r}, '--out', {str(tmp_path / 'out')!r}, '-q', "
            f"'--evals', 'when2call', *{list(flags)!r}])\n"
            "except SystemExit as stop:\n    print(stop.code)"
        )
        env = {"PATH": "/usr/bin:/bin", "OPENAI_API_KEY": "sk-test"}
        return subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()

    assert (
        jemalloc_at_send() == "unset"
    )  # a synchronous run keeps the defaults (runner.batch.memory: they cost CPU)
    assert jemalloc_at_send("--batch") == memory.JEMALLOC
