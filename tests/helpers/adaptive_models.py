"""Ten decision models with known per-question answers, for the adaptive-run tests (issue 35).

``write_data(root, n)`` writes ``n`` tasks of each of the four evaluations (files in the real
shapes, all rows distinct; WildGuardTest's labels in four combinations of unequal sizes, every row
fully agreed). ``knowing(model)`` is a System One responder (``tests.fakes.fake_provider``:
``route_factories={"/v1/systemone": "tests.helpers.adaptive_models:knowing"}``) that reads the data
folder named by ``$DXI_TEST_ADAPTIVE_DATA`` and answers each question of task ``t`` right exactly
when ``knows(model, t, question)``: sha256(model, task, question) below the model's ``SKILL`` (the
near-twins share most of their draws). A right answer puts 0.9 on the gold option (P(yes) 0.9 for a
gold "yes"), a wrong one 0.9 on the first other option (P(yes) 0.1).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

DATA_ENV = "DXI_TEST_ADAPTIVE_DATA"
# the share of questions each model answers right: two far from every other (m00 never right, m100
# always), six between, and two near-twins of equal skill that agree on 98% of the questions
SKILL = {
    "m00": 0.0,
    "m30": 0.30,
    "m40": 0.40,
    "m45": 0.45,
    "m50": 0.50,
    "m55": 0.55,
    "m70": 0.70,
    "m100": 1.0,
    "twin-a": 0.60,
    "twin-b": 0.60,
}
MODELS = tuple(SKILL)
WGT_LABELS = (
    ("harmful", "refusal", "unharmful"),
    ("unharmful", "compliance", "unharmful"),
    ("harmful", "compliance", "harmful"),
    ("unharmful", "refusal", "unharmful"),
)


def _draw(key: str, task_id: str, question: str) -> float:
    digest = hashlib.sha256(f"{key}\0{task_id}\0{question}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def knows(model: str, task_id: str, question: str) -> bool:
    """Whether ``model`` answers ``question`` of ``task_id`` right (see the module docstring). The
    near-twins draw from one shared key, except on 1 question in 50 where each draws its own: they
    agree on about 98% of the questions."""
    key = model
    if model.startswith("twin-") and _draw(model, task_id, question + "\0own") >= 0.02:
        key = "twin"
    return _draw(key, task_id, question) < SKILL[model]


def write_data(root: Path, n: int) -> Path:
    """``n`` tasks of each evaluation under ``root`` (laid out like shared/data); returns
    ``root``."""
    omni = [
        {
            "question_id": f"q{i}",
            "domain": ("Science", "History", "Law")[i % 3],
            "topic": "t",
            "question": f"Omniscience question {i}?",
            "answers": [f"a{i}-{k}" for k in range(4)],
            "correct_index": i % 4,
        }
        for i in range(n)
    ]
    hle = [
        {
            "id": f"h{i}",
            "question": f"HLE problem {i}",
            "choices": [[c, f"choice {c} of {i}"] for c in "ABCDE"],
            "answer": "ABCDE"[i % 5],
            "num_choices": 5,
            "category": ("Math", "Physics")[i % 2],
        }
        for i in range(n)
    ]
    w2c = [
        {
            "uuid": f"w2c-{i}",
            "question": f"Tool question {i}?",
            "tools": [],
            "answers": {
                "direct": f"direct {i}",
                "tool_call": f"call {i}",
                "request_for_info": f"which {i}?",
                "cannot_answer": f"cannot {i}",
            },
            "correct_answer": ("direct", "tool_call", "request_for_info", "cannot_answer")[i % 4],
            "source": "test",
        }
        for i in range(n)
    ]
    wgt = []
    for i in range(n):
        prompt_label, refusal, harm = WGT_LABELS[
            0 if i % 10 < 4 else 1 if i % 10 < 7 else 2 if i % 10 < 9 else 3
        ]
        wgt.append(
            {
                "prompt": f"Prompt {i}",
                "response": f"Response {i}",
                "adversarial": i % 3 == 0,
                "prompt_harm_label": prompt_label,
                "response_refusal_label": refusal,
                "response_harm_label": harm,
                "subcategory": "benign",
                "prompt_harm_agreement": 3.0,
                "response_refusal_agreement": 3.0,
                "response_harm_agreement": 3.0,
            }
        )
    for rel, rows in (
        ("omniscience-standin/omniscience.jsonl", omni),
        ("when2call/when2call_test_mcq.jsonl", w2c),
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    (root / "hle").mkdir(parents=True, exist_ok=True)
    (root / "hle" / "hle_mcqa.json").write_bytes(orjson.dumps(hle))
    (root / "wildguardtest").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(wgt), root / "wildguardtest" / "wildguardtest.parquet")
    return root


def knowing(model: str | None):
    """The responder factory (``tests.fakes.fake_provider``'s ``route_factories``); ``model`` is
    unused: each request names its model."""
    from dxi.evals import Suite, discover

    tasks = {t.state: t for t in Suite(discover(Path(os.environ[DATA_ENV]))).tasks()}

    def respond(payload: dict) -> dict:
        served = str(payload["model"])
        task = tasks[payload["state"]]
        answers = {}
        for qid, q in payload["questions"].items():
            right = knows(served, task.id, qid)
            gold = task.gold[qid]
            if q["type"] == "choice":
                options = list(q["criteria"])
                pick = gold if right else next(o for o in options if o != gold)
                rest = round(0.1 / (len(options) - 1), 4)
                answers[qid] = {
                    "type": "choice",
                    "choice": pick,
                    "probabilities": {o: 0.9 if o == pick else rest for o in options},
                }
            else:
                answers[qid] = {"type": "noul", "noul": 0.9 if (gold == "yes") == right else 0.1}
        return {
            "model": served,
            "answers": answers,
            "usage": {"input_tokens": 10, "output_tokens": 1},
            "latency_ms": 1.0,
        }

    return respond
