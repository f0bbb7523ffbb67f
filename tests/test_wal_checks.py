"""What the cache checks in each write-ahead log line it reads (``cache.verify.line_problem``): a
sealed line's CRC-32, and in a line without a seal (written before seals) the key as the content
address of its request and values no adapter gives. A damaged line is never indexed or scored: it
is dropped with a warning naming it, the log is set aside in quarantine/, and its request is sent
again (trial 9: a one-bit edit of a log line, "A" to "C", moved HLE accuracy from 0.0 to 33.3 with
no warning)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from dxi.adapters import Request
from dxi.cache import Cache
from dxi.cache.verify import seal
from dxi.stored import request_key

from .helpers.rows import row, sealed

LOG = "1-1-dead.jsonl"  # a log left by a killed writer: the next Cache compacts it


def real(n: int, **extra) -> dict:
    """A row whose key is the content address of its request (body ``{"n":N}``)."""
    r = row("", request_body=f'{{"n":{n}}}', **extra)
    return r | {
        "key": request_key(
            r["provider"],
            r["model"],
            r["endpoint"],
            r["sample"],
            r["prompt_version"],
            r["params"],
            r["request_body"].encode(),
        )
    }


def write_log(root: Path, lines: list[bytes]) -> Path:
    (root / "wal").mkdir(parents=True)
    path = root / "wal" / LOG
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def damaged(path: Path, n: int, why: str) -> str:
    return f"cache: {path} line {n} {why}: damaged; skipped it, its request will be sent again."


def test_a_line_is_sealed_with_the_crc32_of_its_json_object():
    assert seal(b'{"a":1}') == b'{"a":1,"crc32":1444654255}\n'  # zlib.crc32(b'{"a":1}')


def test_the_key_is_one_function_of_the_request_s_parts():
    request = Request("embedded", "m", "/v1/systemone", b'{"n":1}', 0, "{}", "p")
    # sha256 of b'embedded\0m\0/v1/systemone\x000\0p\0{}\0{"n":1}', computed by hand
    expected = "58f7a7216f63b56cb74d31822377b866e23bb9090ff1734801687bf429c746a8"
    assert request.key == expected == real(1)["key"]


def test_rows_appended_are_sealed_lines_and_read_back(tmp_path: Path):
    rows = [real(n) for n in range(3)]
    with Cache(tmp_path) as cache:
        cache.append_many(rows)
        (log,) = tmp_path.glob("wal/*.jsonl")
        assert log.read_bytes() == b"".join(seal(orjson.dumps(r)) for r in rows)
    assert Cache(tmp_path).has_many([r["key"] for r in rows]) == [True, True, True]


def test_one_flipped_bit_in_a_sealed_line_sets_the_line_aside_and_its_request_is_sent_again(
    tmp_path: Path,
):
    rows = [real(n) for n in range(3)]
    lines = [sealed(r) for r in rows]
    flipped = lines[1].replace(b'"predicted":"A"', b'"predicted":"C"')  # 0x41 -> 0x43: one bit
    assert sum(bin(a ^ b).count("1") for a, b in zip(lines[1], flipped, strict=True)) == 1
    path = write_log(tmp_path, [lines[0], flipped, lines[2]])
    cache = Cache(tmp_path)
    assert damaged(path, 2, "does not match its checksum (crc32)") in cache.warnings
    assert cache.has_many([r["key"] for r in rows]) == [True, False, True]
    assert len(list(tmp_path.glob(f"quarantine/{LOG}.*"))) == 1 and not path.exists()
    scanned = cache.scan().select("key", "answer_predicted").collect()
    assert scanned.rows() == [(rows[0]["key"], ["A"]), (rows[2]["key"], ["A"])]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"key": "0" * 64}, "has a key that is not the content address of its request"),
        ({"request_body": '{"n":9}'}, "has a key that is not the content address of its request"),
        ({"input_tokens": -1_000_000_000}, "has input_tokens -1000000000, not a token count"),
        ({"output_tokens": 1.5}, "has output_tokens 1.5, not a token count"),
        (
            {"answers": [row("")["answers"][0] | {"predicted": None}]},
            "has an ok answer to 'answer' with no predicted answer",
        ),
        (
            {"answers": [row("")["answers"][0] | {"probabilities": [{"option": "A", "p": 7.0}]}]},
            "has an ok answer to 'answer' with probability 7.0, not in [0, 1]",
        ),
        (
            {"answers": [row("")["answers"][0] | {"p_predicted": -0.1}]},
            "has an ok answer to 'answer' with probability -0.1, not in [0, 1]",
        ),
    ],
)
def test_an_unsealed_line_no_adapter_would_have_written_is_damaged(
    tmp_path: Path, change: dict, why: str
):
    """A line without a seal (written before seals) is accepted as before when its key is its
    request's content address and its values are ones the adapters give."""
    good, bad = real(1), real(2) | change
    path = write_log(tmp_path, [orjson.dumps(good), orjson.dumps(bad)])
    cache = Cache(tmp_path)
    assert [w for w in cache.warnings if " line " in w] == [damaged(path, 2, why)]
    assert cache.has_many([good["key"], bad["key"]]) == [True, False]
    assert cache.scan().select("key").collect()["key"].to_list() == [good["key"]]


def test_an_unsealed_line_with_nan_is_damaged_not_read_as_a_number(tmp_path: Path):
    good, bad = real(1), orjson.dumps(real(2)).replace(b'"p_predicted":0.9', b'"p_predicted":NaN')
    path = write_log(tmp_path, [orjson.dumps(good), bad])
    cache = Cache(tmp_path)
    assert [w for w in cache.warnings if " line " in w] == [damaged(path, 2, "is not JSON")]
    assert cache.scan().select("key").collect()["key"].to_list() == [good["key"]]
