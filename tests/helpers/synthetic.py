"""Synthetic evaluation data, the one set the tests and the benchmarks share, generated from a seed,
never the real data.

* **Rows on disk** (``data_dir(root, n)``): When2Call-shaped rows (the shape of
  ``nvidia/When2Call``'s MCQ file, see ``evals/when2call.py``) in a data directory ``dxi`` can run
  on.
* **Suites in memory** (``SyntheticSuite``): those When2Call rows streamed without writing anything
  (``SyntheticSuite.when2call(n)``, for a million tasks), or the tasks of the four evaluations
  (``SyntheticSuite(sizes)``, from ``suite``).
* **A synthetic cache** for scoring: ``suite(n_per_eval)`` builds tasks of the four evaluations
  (real ``evals.Task`` records, so their digests and gold frames come from the real code);
  ``write_cache(root,   tasks, n_models)`` writes one Parquet shard per model with
  ``cache.schema.SCHEMA``'s rows, as ``dxi run`` would leave it after one run per model: in the flat
  layout the cache writes (``cache.layout.write_shard``), or with ``layout=1`` in the nested layout
  of shards written before it. Answers are drawn with a per-model skill; about 1% of answers are
  invalid (no probabilities, an error text) and about 0.5% of requests failed (no answers).
  Probabilities are rounded to 4 decimals like the servers'. Everything is seeded: the same
  arguments give the same bytes.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from dxi.cache.layout import FLAT_LAYOUT, NESTED, WRITE_OPTIONS, write_shard
from dxi.cache.schema import ANSWER, PROBABILITY, SCHEMA
from dxi.evals import CHOICE, PROMPT_VERSION, YES_NO, Option, Question, Suite, Task
from dxi.evals.when2call import CATEGORIES, record_to_task, shuffled

TOOLS = [
    '{"name": "get_weather", "description": "Current weather for a city", "parameters": {"type": "dict", '
    '"properties": {"city": {"type": "string"}}, "required": ["city"]}}',
    '{"name": "search_flights", "description": "Flights between two airports on a date", "parameters": '
    '{"type": "dict", "properties": {"from": {"type": "string"}, "to": {"type": "string"}, "date": '
    '{"type": "string"}}, "required": ["from", "to", "date"]}}',
]


def when2call_row(i: int, seed: int = 0) -> dict:
    """Row ``i``: a user question, 0-2 tools, the four candidate replies and the correct
    category."""
    rng = random.Random(f"{seed}:{i}")
    city = rng.choice(["Paris", "Lagos", "Lima", "Osaka", "Perth", "Quito"])
    return {
        "uuid": f"synthetic-{seed}-{i:07d}",
        "question": f"What is the weather like in {city} today? (case {i})",
        "tools": TOOLS[: rng.randrange(3)],
        "answers": {
            "direct": f"It is sunny in {city}.",
            "tool_call": f'{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}',
            "request_for_info": "Which city do you mean?",
            "cannot_answer": "I cannot look up the weather.",
        },
        "correct_answer": rng.choice(CATEGORIES),
        "source": "synthetic",
    }


def data_dir(root: Path, n: int, seed: int = 0) -> Path:
    """A data directory holding ``n`` synthetic When2Call rows
    (``when2call/when2call_test_mcq.jsonl``)."""
    path = root / "when2call" / "when2call_test_mcq.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        for i in range(n):
            f.write(orjson.dumps(when2call_row(i, seed)) + b"\n")
    return root


HLE_CATEGORIES = (
    "Math",
    "Physics",
    "Biology/Medicine",
    "Computer Science/AI",
    "Humanities/Social Science",
    "Chemistry",
    "Engineering",
    "Other",
)
DOMAINS = ("Science", "History", "Law", "Health", "Finance", "Culture")
SUBCATEGORIES = (
    "benign",
    "violence",
    "privacy",
    "fraud",
    "cyberattack",
    "hate",
    "self_harm",
    "copyright",
)
WILDGUARD_QUESTIONS = ("prompt_harmful", "response_refusal", "response_harmful")
PROVIDER = "synthetic"


def suite(n: dict[str, int], seed: int = 7) -> list[Task]:
    """Tasks per evaluation: ``n`` maps evaluation name -> task count (HLE gets 5-12 options)."""
    rng = np.random.default_rng(seed)
    tasks: list[Task] = []
    letters = "ABCDEFGHIJKL"
    for i in range(n.get("aa_omniscience_decision", 0)):
        options = tuple(Option(c, f"answer {c} to {i}") for c in "ABCD") + (
            Option("E", "I don't know"),
        )
        tasks.append(
            Task(
                f"aa_omniscience_decision/q{i}",
                "aa_omniscience_decision",
                f"Question {i}?",
                (Question("answer", CHOICE, "Which answer is correct?", options),),
                gold={"answer": "ABCD"[rng.integers(4)]},
                meta={"domain": DOMAINS[i % len(DOMAINS)]},
            )
        )
    for i in range(n.get("hle_multichoice", 0)):
        k = int(rng.integers(5, 13))
        options = tuple(Option(c, f"choice {c}") for c in letters[:k])
        tasks.append(
            Task(
                f"hle_multichoice/h{i}",
                "hle_multichoice",
                f"Problem {i}",
                (Question("answer", CHOICE, "Which answer choice is correct?", options),),
                gold={"answer": letters[rng.integers(k)]},
                meta={"category": HLE_CATEGORIES[i % len(HLE_CATEGORIES)]},
            )
        )
    for i in range(n.get("when2call", 0)):
        tid = f"when2call/u{i}"
        order = shuffled(tid)
        options = tuple(Option(c, f"{cat} reply") for c, cat in zip("ABCD", order, strict=True))
        tasks.append(
            Task(
                tid,
                "when2call",
                f"Tools: none\n\nUser: request {i}",
                (
                    Question(
                        "answer", CHOICE, "Which reply should the assistant give next?", options
                    ),
                ),
                gold={"answer": "ABCD"[rng.integers(4)]},
                meta={"categories": dict(zip("ABCD", order, strict=True))},
            )
        )
    for i in range(n.get("wildguardtest", 0)):
        gold = {q: ("yes" if rng.random() < 0.35 else "no") for q in WILDGUARD_QUESTIONS}
        tasks.append(
            Task(
                f"wildguardtest/{i}",
                "wildguardtest",
                f"User: prompt {i}\n\nAssistant: reply {i}",
                tuple(Question(q, YES_NO, q) for q in WILDGUARD_QUESTIONS),
                gold=gold,
                meta={
                    "subcategory": SUBCATEGORIES[i % len(SUBCATEGORIES)],
                    "adversarial": bool(i % 3 == 0),
                },
            )
        )
    return tasks


class SyntheticSuite(Suite):
    """A Suite of synthetic tasks, made again on each read and streamed, as a real Suite streams its
    data files (nothing on disk; no process holds every task unless it keeps them).
    ``SyntheticSuite(sizes)``: the tasks of ``suite(sizes)`` (evaluation name -> task count);
    ``SyntheticSuite.when2call(n, seed)``: ``n`` When2Call tasks from ``when2call_row``
    (``SyntheticSuite.when2call(1_000_000)``)."""

    def __init__(self, sizes: dict[str, int], make: Callable[[], Iterator[Task]] | None = None):
        super().__init__({})
        self.sizes = dict(sizes)
        self._make = make if make is not None else (lambda: iter(suite(self.sizes)))

    @classmethod
    def when2call(cls, n: int, seed: int = 0) -> SyntheticSuite:
        path = Path("synthetic.jsonl")
        return cls(
            {"when2call": n},
            lambda: (record_to_task(path, i + 1, when2call_row(i, seed)) for i in range(n)),
        )

    def selected(self) -> list[str]:
        return list(self.sizes)

    def validate(self) -> None:
        """Nothing to check: the tasks are made, not read from a file (``Suite.validate`` reads
        files)."""

    def tasks(self, name: str | None = None) -> Iterator[Task]:
        return (t for t in self._make() if name is None or t.eval == name)

    def data_block(self) -> dict[str, dict]:
        return {
            n: {"files": [{"path": "synthetic", "sha256": "-", "rows": k}], "tasks": k}
            for n, k in self.sizes.items()
        }


def model_name(m: int) -> str:
    return f"model-{m:03d}"


def _strings(values: list[str], codes: np.ndarray) -> pa.Array:
    """``values[codes]`` as a string array without a Python object per element."""
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), pa.array(values)).cast(
        pa.string()
    )


def write_cache(
    root: Path,
    tasks: list[Task],
    n_models: int,
    seed: int = 11,
    invalid_rate: float = 0.01,
    failed_rate: float = 0.005,
    layout: int = FLAT_LAYOUT,
) -> int:
    """Write ``n_models`` models' answers to every task as shards under ``root/shards`` in shard
    ``layout`` (``cache.layout``: 2 flat, 1 nested); returns the number of answers (questions ×
    models, failed requests included)."""
    rng = np.random.default_rng(seed)
    shards = root / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    # structure shared by every model: questions, options and gold, flattened
    q_task, q_id, q_kind, q_k, q_gold, o_label = [], [], [], [], [], []
    labels: list[str] = ["yes", "no", *"ABCDEFGHIJKL"]
    code = {s: i for i, s in enumerate(labels)}
    for t, task in enumerate(tasks):
        for q in task.questions:
            ids = q.answer_ids
            q_task.append(t)
            q_id.append(q.id)
            q_kind.append(q.kind == YES_NO)
            q_k.append(len(ids))
            q_gold.append(ids.index(task.gold[q.id]))
            o_label += [code[o] for o in ids]
    q_task, q_k, q_gold = np.array(q_task), np.array(q_k), np.array(q_gold)
    q_yes_no = np.array(q_kind)
    o_label = np.array(o_label)
    q_first = np.concatenate([[0], np.cumsum(q_k)[:-1]])  # first option entry of each question
    o_question = np.repeat(np.arange(len(q_k)), q_k)
    qid_values = sorted(set(q_id))
    qid_codes = np.array([qid_values.index(x) for x in q_id])
    n_tasks, n_questions = len(tasks), len(q_k)
    per_task = np.bincount(q_task, minlength=n_tasks)
    task_ids = [t.id for t in tasks]
    digests = [t.digest for t in tasks]
    evals = [t.eval for t in tasks]
    for m in range(n_models):
        skill = 0.25 + 0.5 * m / max(1, n_models - 1)
        failed = rng.random(n_tasks) < failed_rate
        invalid = rng.random(n_questions) < invalid_rate
        right = rng.random(n_questions) < skill
        other = (q_gold + 1 + (rng.random(n_questions) * (q_k - 1)).astype(int)) % q_k
        pred = np.where(right, q_gold, other)
        u = rng.random(len(o_label)) ** 3
        u[q_first + pred] += 1.0  # the predicted option is the most probable
        p = u / np.bincount(o_question, weights=u)[o_question]
        p = np.round(p, 4)
        keep_q = ~failed[q_task]
        valid_q = keep_q & ~invalid
        keep_o = valid_q[o_question]
        # probabilities lists (empty for invalid answers), for kept answers only
        n_probs = np.where(valid_q, q_k, 0)[keep_q]
        probs = pa.ListArray.from_arrays(
            pa.array(np.concatenate([[0], np.cumsum(n_probs)]).astype(np.int32)),
            pa.StructArray.from_arrays(
                [_strings(labels, o_label[keep_o]), pa.array(p[keep_o])], fields=list(PROBABILITY)
            ),
        )
        pred_label = o_label[q_first + pred]
        p_pred = p[q_first + pred]
        p_yes = np.where(q_yes_no, p[q_first], np.nan)
        k = keep_q
        status = np.where(invalid, 1, 0)[k]
        answers_struct = pa.StructArray.from_arrays(
            [
                _strings(qid_values, qid_codes[k]),
                _strings(["ok", "invalid"], status),
                pa.array(
                    np.array(labels, dtype=object)[pred_label[k]], mask=invalid[k], type=pa.string()
                ),
                pa.array(p_pred[k], mask=invalid[k]),
                pa.array(p_yes[k], mask=invalid[k] | ~q_yes_no[k]),
                probs,
                pa.array(
                    np.where(
                        invalid[k], "probabilities sum to 1.700000, not 1 (tolerance 0.001)", None
                    ),
                    type=pa.string(),
                ),
                pa.array([None] * int(k.sum()), type=pa.string()),
            ],
            fields=list(ANSWER),
        )
        n_answers = np.where(failed, 0, per_task)
        answers = pa.ListArray.from_arrays(
            pa.array(np.concatenate([[0], np.cumsum(n_answers)]).astype(np.int32)), answers_struct
        )
        row_invalid = np.bincount(q_task, weights=(invalid & keep_q), minlength=n_tasks) > 0
        row_status = np.where(failed, "failed", np.where(row_invalid, "invalid", "ok"))
        name = model_name(m)
        keys = [hashlib.sha256(f"{name}|{tid}".encode()).hexdigest() for tid in task_ids]
        columns = {
            "key": keys,
            "provider": [PROVIDER] * n_tasks,
            "model": [name] * n_tasks,
            "endpoint": ["synthetic"] * n_tasks,
            "params": ["{}"] * n_tasks,
            "sample": np.zeros(n_tasks, np.int32),
            "prompt_version": [PROMPT_VERSION] * n_tasks,
            "eval": evals,
            "task_id": task_ids,
            "task_digest": digests,
            "request_body": [f'{{"model":"{name}","task":"{tid}"}}' for tid in task_ids],
            "status": row_status.tolist(),
            "error": np.where(failed, "HTTP 503: service unavailable", None).tolist(),
            "error_kind": np.where(failed, "transient", None).tolist(),
            "http_status": pa.array(np.where(failed, 503, 200).astype(np.int32)),
            "attempts": np.ones(n_tasks, np.int32),
            "raw_reply": [None] * n_tasks,
            "served_model": [name] * n_tasks,
            "input_tokens": np.full(n_tasks, 300),
            "output_tokens": np.full(n_tasks, 20),
            "latency_ms": rng.random(n_tasks) * 100,
            "created_at": 1.7e9 + m + np.arange(n_tasks) * 1e-3,
            "answers": answers,
            "repaired": pa.nulls(n_tasks, pa.bool_()),
            "cached_input_tokens": pa.nulls(n_tasks, pa.int64()),
            "cache_write_tokens": pa.nulls(n_tasks, pa.int64()),
            "cache_write_1h_tokens": pa.nulls(n_tasks, pa.int64()),
            "cut_off": pa.nulls(n_tasks, pa.string()),
            "transport": ["sync"] * n_tasks,
            "batch_id": pa.nulls(n_tasks, pa.string()),
            "retry_waits_s": pa.array([[]] * n_tasks, pa.list_(pa.float64())),
            "ttft_s": pa.nulls(n_tasks, pa.float64()),
        }
        table = pa.table({c: columns[c] for c in SCHEMA.names}).cast(SCHEMA)
        path = shards / f"synthetic-{m:03d}.parquet"
        if layout == NESTED:  # as the cache wrote shards before the flat layout
            pq.write_table(table, path, **WRITE_OPTIONS)
        else:
            write_shard(table, path)  # as the cache writes them
    return n_models * n_questions
