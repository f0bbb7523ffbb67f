"""A model's identity (``adapters.ModelIdentity``): the one record the cache keys, the run record,
the scoring frame and the plan's duplicate check derive from."""

from __future__ import annotations

from pathlib import Path

import pytest

from dxi import adapters, scoring
from dxi.adapters import ModelIdentity
from dxi.evals import PROMPT_VERSION, Suite, discover
from dxi.runner.cli import parser
from dxi.runner.dispatch import identity
from dxi.runner.errors import UsageError
from dxi.runner.planning.plan import from_args
from dxi.runner.planning.selection import record_of


def _plan(data_dir: Path, *argv: str):
    return from_args(parser().parse_args(["run", *argv, "--data-dir", str(data_dir)]))


def test_an_adapters_identity_is_what_its_requests_and_the_scoring_frame_carry(data_dir: Path):
    adapter = adapters.get("openai:gpt-6-luna@http://127.0.0.1:9/v1")
    adapter.params = {"temperature": 0, "max_tokens": 64}
    mine = adapter.identity
    assert mine == ModelIdentity(
        "openai:gpt-6-luna",
        "openai",
        "gpt-6-luna",
        adapter.endpoint,
        '{"max_tokens":64,"temperature":0}',
        None,
    )
    task = next(Suite(discover(data_dir)).tasks("hle_multichoice"))
    request = adapter.encode(task, sample=1)
    assert (request.kind, request.model, request.endpoint, request.params) == mine.key
    assert mine.row() == ("openai:gpt-6-luna", *mine.key, PROMPT_VERSION)
    assert len(mine.row()) == len(scoring.MODELS_SCHEMA)


def test_the_plans_frame_record_and_digests_derive_from_each_models_identity(
    data_dir: Path, tmp_path: Path
):
    plan = _plan(
        data_dir,
        "--model",
        "openai:gpt-6-luna",
        "--model",
        "embedded",
        "--effort",
        "high",
        "--epochs",
        "2",
    )
    ids = [m.identity for m in plan.models]
    assert [i.effort for i in ids] == ["high", None]
    frame = plan.models_frame()
    assert frame.rows() == [(*i.row(), 2, i.effort) for i in ids]
    assert record_of(plan).models == tuple(i.key for i in ids)
    assert len({identity(m) for m in plan.models}) == 2  # each configuration its own digest
    run = tmp_path / "run.toml"  # one configuration under two names: the identities' keys are equal
    run.write_text(
        '[[models]]\nprovider = "openai"\nmodel = "gpt-6-luna"\nname = "a"\n\n'
        '[[models]]\nprovider = "openai"\nmodel = "gpt-6-luna"\nname = "b"\n'
    )
    with pytest.raises(UsageError, match="a and b are the same model"):
        _plan(data_dir, str(run)).check_labels()
