"""Batch mode under a cost bound beside a batch the provider refused whole (``failed``: its input
did not pass validation), end to end: ``dxi run --batch --max-cost`` in a process of its own against
two fake batch providers in processes of their own (``tests.fakes.fake_batches``).

The prices make every amount exact in binary: each request is one When2Call question, capped at
``max_completion_tokens = 5``, which is what the fake reports (``OUTPUT_TOKENS_PER_QUESTION``), and
input is free, so a request reserves exactly what it costs. At the batch price (half the price) a
request of model A costs 5 x $200,000 / 10^6 = $1.00 and one of model B 5 x $12,500 / 10^6 = $0.0625
(1/16)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest

from .conftest import DXI
from .fakes.fake_provider import serve
from .helpers.synthetic import data_dir

TASKS = 12
A_PRICE = {"input": 0.0, "output": 400000.0}  # batch: $1.00 a request
B_PRICE = {"input": 0.0, "output": 25000.0}  # batch: $0.0625 a request


def run_file(tmp: Path, models: dict[str, tuple[str, dict]]) -> Path:
    """A run file of the OpenAI-kind ``models`` (name -> (the fake's URL, price)) in batch mode,
    each on a provider table of its own, on ``tmp/data``, caching in ``tmp/cache``, writing
    ``tmp/out``."""
    lines = ['data_dir = "data"', 'cache_dir = "cache"', 'out = "out"']
    for name, (url, price) in models.items():
        lines += [
            f"[providers.p{name}]",
            'kind = "openai"',
            f'base_url = "{url}/v1"',
            "batch = true",
            "[[models]]",
            f'name = "{name}"',
            f'provider = "p{name}"',
            'model = "m"',
            "params = { max_completion_tokens = 5 }",
            f"price = {{ input = {price['input']}, output = {price['output']} }}",
        ]
    path = tmp / "run.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def dxi_run(path: Path, bound: str) -> tuple[int, str]:
    """``dxi run RUN_FILE --poll 0.05 --max-cost BOUND`` in a process of its own: its exit code and
    its standard output, blanks collapsed."""
    done = subprocess.run(
        [DXI, "run", str(path), "--poll", "0.05", "--max-cost", bound],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done.returncode, " ".join(done.stdout.split())


def requests(s: dict) -> dict[str, dict]:
    return {m["model"]: m["requests"] for m in s["models"]}


def counts(r: dict) -> tuple[int, int, int, int]:
    return r["sent"], r["cache_hits"], r["not_sent"], r["refused"]


@pytest.mark.process
@pytest.mark.slow
def test_a_batch_run_stopped_at_the_bound_submits_its_last_batch_once(tmp_path: Path):
    """Model A alone, $1.00 a request at the batch price, 12 requests under a bound of $4.75: 4 fit
    and go in a batch; the 5th waits for it to settle ($4.00 spent), still does not fit ($5.00 >
    $4.75) and the run stops at the bound. The old code then submitted the batch of those 4 a second
    time (the same entry and requests: answered and billed twice, $8.00 at the provider against a
    bound of $4.75; its results thrown away as unknown ids) and counted 8 sent and 1 not sent (the
    other 7 of the same lookup were not counted).

    Expected, by hand: one batch of 4, answered once; sent 4, not sent 8, $4.00 spent; exit code 3
    and the bound's line: 8 not sent, about $8.00 expected (at the batch price, which the next
    ``--batch`` run pays: the old line said $16.00, the synchronous price). The rerun with a higher
    bound sends the other 8, once, in one batch."""
    data_dir(tmp_path / "data", TASKS)
    with serve(model=None, record=False) as a:
        path = run_file(tmp_path, {"A": (a.url, A_PRICE)})
        code, out = dxi_run(path, "4.75")
        first, stats = orjson.loads((tmp_path / "out" / "summary.json").read_bytes()), a.stats()
        code2, _ = dxi_run(path, "20")
        second, stats2 = orjson.loads((tmp_path / "out" / "summary.json").read_bytes()), a.stats()
    assert (code, code2) == (3, 0), out
    assert (stats["batch_creates"], stats["batch_lines"], stats["batch_answers"]) == (1, 4, 4)
    assert counts(requests(first)["A"]) == (4, 0, 8, 0)
    assert first["cost_bound"] == {
        "max_cost_usd": 4.75,
        "spent_usd": 4.0,
        "stopped": True,
        "remaining_requests": 8,
        "remaining_cost_usd": 8.0,
        "remaining_bound_usd": 8.0,
    }
    assert (
        "Stopped at the cost bound: spent $4.000000 of $4.75 in this run; 8 request(s) not sent "
        "(about $8.0000 expected)."
    ) in out
    assert (stats2["batch_creates"], stats2["batch_lines"], stats2["batch_answers"]) == (2, 12, 12)
    assert (stats2["batch_keys"], stats2["batch_resubmitted"]) == (12, 0)
    assert counts(requests(second)["A"]) == (8, 4, 0, 0)
    assert second["cost_bound"]["spent_usd"] == 8.0
