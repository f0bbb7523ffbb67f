"""The real local language model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M served by xllamacpp on
127.0.0.1): the first task of each evaluation through it twice, with structured outputs and with
logprob decisions.

Needs the ``local-llm`` extra and the model file (``make test`` installs and fetches both; CI runs
``.ci/run``). Elsewhere the integration test is skipped with the reason, except under CI (``CI``
set), where a missing model is a failure: CI must never pass without running it. One task of each
evaluation, not three: the test's time is llama.cpp's prompt processing (When2Call's tool lists are
600 tokens a request), and three tasks took 424 s of a CI run for no more coverage of dxi's code.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import polars as pl
import pytest

from dxi import adapters
from dxi.adapters import local_models
from dxi.evals import Suite, discover
from dxi.runner import session
from dxi.runner.planning import plan

from .conftest import REAL_DATA, requires_real_data

NAME = "qwen2.5-coder-0.5b"
MODELS = [f"llamacpp:{NAME}", f"llamacpp-logprobs:{NAME}"]


def _missing() -> str | None:
    try:
        import xllamacpp  # noqa: F401
    except ImportError:
        return "xllamacpp is not installed (pip install -e '.[local-llm]', or make install-llm)"
    path = local_models.models_dir() / local_models.known(NAME).filename
    return None if path.is_file() else f"{path} not found (make model)"


@pytest.fixture(scope="module")
def local_model() -> None:
    why = _missing()
    if why and os.environ.get("CI"):
        pytest.fail(f"CI must run the local language model: {why}")
    if why:
        pytest.skip(why)


@pytest.mark.local_llm
@requires_real_data
def test_one_task_of_each_evaluation_through_the_real_model_twice(
    local_model: None, tmp_path: Path
):
    settings = {
        "models": MODELS,
        "data_dir": REAL_DATA,
        "limit": 1,
        "cache_dir": tmp_path / "cache",
        "out": tmp_path / "out",
    }
    assert session.run(plan.build(**settings)).exit_code == 0
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    assert [m["model"] for m in summary["models"]] == MODELS
    for m in summary["models"]:
        assert {e: (b["n"], b["failed"], b["missing"]) for e, b in m["evals"].items()} == {
            e: (1, 0, 0)
            for e in ("aa_omniscience_decision", "hle_multichoice", "when2call", "wildguardtest")
        }
        assert (m["requests"]["sent"], m["requests"]["failed"]) == (4, 0)

    # every answer is valid, or invalid with a reason; valid ones are allowed answers
    tasks = {t.id: t for t in Suite(discover(REAL_DATA), limit=1).tasks()}
    answers = pl.read_parquet(tmp_path / "out" / "answers.parquet")
    assert answers.height == 2 * sum(len(t.questions) for t in tasks.values())
    for row in answers.iter_rows(named=True):
        assert row["status"] in ("ok", "invalid")
        if row["status"] == "invalid":
            assert row["error"] and row["predicted"] is None
            continue
        question = next(q for q in tasks[row["task_id"]].questions if q.id == row["question_id"])
        assert row["predicted"] in question.answer_ids
        if (
            row["model"] == MODELS[1]
        ):  # logprob decisions carry a probability and the renormalised mass
            assert 0.0 <= row["p_predicted"] <= 1.0
            assert row["warning"].startswith("renormalised over the allowed answers, which held ")

    # every request was answered by the server, with its usage; the served name is the model's, not
    # a path
    with_rows = pl.scan_parquet(str(tmp_path / "cache" / "shards" / "*.parquet")).collect()
    assert with_rows.height == 8 and set(with_rows["status"]) <= {"ok", "invalid"}
    assert with_rows["raw_reply"].null_count() == 0 and (with_rows["input_tokens"] > 0).all()
    assert set(with_rows["served_model"]) == {NAME}
    # invalid replies are counted per model (requests) and per evaluation (answers)
    for m in summary["models"]:
        kind = m["model"].split(":")[0]
        assert (
            m["requests"]["invalid"]
            == with_rows.filter(
                (pl.col("provider") == kind) & (pl.col("status") == "invalid")
            ).height
        )
        mine = answers.filter((pl.col("model") == m["model"]) & (pl.col("status") == "invalid"))
        assert {e: b["invalid"] for e, b in m["evals"].items()} == {
            e: mine.filter(pl.col("eval") == e).height for e in m["evals"]
        }

    # a second run starts a new server on another port and finds everything in the cache
    assert session.run(plan.build(**settings)).exit_code == 0
    again = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    assert [(m["requests"]["sent"], m["requests"]["cache_hits"]) for m in again["models"]] == [
        (0, 4),
        (0, 4),
    ]
    assert [m["evals"] for m in again["models"]] == [m["evals"] for m in summary["models"]]


def test_local_model_strings_and_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DXI_MODELS_DIR", str(tmp_path / "models"))
    a = adapters.get(f"llamacpp:{NAME}")
    b = adapters.get(f"llamacpp-logprobs:{NAME}")
    assert (a.label, a.endpoint, a.limits_key, a.params) == (
        f"llamacpp:{NAME}",
        "/v1/chat/completions",
        f"llamacpp:{NAME}",
        {"temperature": 0, "max_tokens": 256},
    )
    assert (b.label, b.limits_key, b.params) == (
        f"llamacpp-logprobs:{NAME}",
        f"llamacpp:{NAME}",
        {"max_tokens": 1, "top_logprobs": 20},
    )
    assert a.file == tmp_path / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF not really")
    c = adapters.get(
        adapters.ModelSpec("llamacpp", str(gguf), options={"ctx_size": 2048, "parallel": 2})
    )
    sha = local_models.sha256_of(gguf)
    assert (c.model, c.ctx_size, c.parallel, c.limits.max_in_flight) == (
        f"tiny@{sha[:12]}",
        2048,
        2,
        2,
    )
    with pytest.raises(
        ValueError, match="unknown local model 'gpt-9'; use one of qwen2.5-coder-0.5b"
    ):
        adapters.get("llamacpp:gpt-9")
    with pytest.raises(ValueError, match="must be at least 1"):
        adapters.get(adapters.ModelSpec("llamacpp", NAME, options={"parallel": 0}))


async def test_a_missing_model_file_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("DXI_MODELS_DIR", str(tmp_path / "models"))
    with pytest.raises(
        adapters.Fatal,
        match=r"not (found; fetch it with `make model`|installed; install the extra)",
    ):
        await adapters.get(f"llamacpp:{NAME}").start()


@pytest.mark.slow
async def test_a_file_llama_cpp_cannot_load_fails_with_its_message(tmp_path: Path):
    pytest.importorskip("xllamacpp")
    gguf = tmp_path / "broken.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    adapter = adapters.get(f"llamacpp:{gguf}")
    with pytest.raises(
        adapters.Fatal,
        match=r"^llamacpp:broken@[0-9a-f]{12}: the local llama.cpp server did not start: .+",
    ):
        await adapter.start()
