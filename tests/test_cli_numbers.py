"""Every numeric flag of every command is checked when the command line is parsed
(``runner.planning.numbers``): zero where it means nothing, a negative, NaN, an infinity or a value
too large to use is refused with the flag named and exit code 2, before anything is read, planned or
sent (issue 32: ``--max-in-flight 0`` and ``--tpm -1`` made a run hang silently, ``--timeout nan`` a
traceback, ``--max-stated-wait nan`` a circuit breaker that never gave up,
``--shard 541984153/5000000000`` a ``struct.error``).

The flags are found in the parser itself, so a numeric flag added later is covered without a new
test."""

from __future__ import annotations

import argparse
import subprocess

import pytest

from dxi.runner.cli import main, parser
from dxi.runner.errors import EXIT_USAGE
from dxi.runner.planning.numbers import Number

from .conftest import DXI

# The flags for which 0 means something: any free port, the seed 0, no wait before a retry, no grace
# period, a cost bound of nothing at all, `dxi plan`'s simulation seed 0 and a tolerance of none.
ZERO_ALLOWED = {
    "--port",
    "--seed",
    "--backoff",
    "--grace",
    "--max-cost",
    "--simulation-seed",
    "--tolerance",
}
REFUSED_ALWAYS = [
    "-3",
    "-0.5",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e400",
    "1" + "0" * 30,
]  # overflow: 1e400, 10**30


def _commands(p: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    """(the words naming each command, its parser), every level down (``dxi batches collect``,
    ...)."""
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield words, p
    for sub in subs:
        for name, child in sub.choices.items():
            yield from _commands(child, (*words, name))


def numeric_flags() -> list[tuple[tuple[str, ...], str, Number]]:
    """(command words, flag, its Number) for every flag of every command that takes a number."""
    found = []
    for words, p in _commands(parser()):
        for action in p._actions:
            if isinstance(action.type, Number):
                found.append((words, action.option_strings[-1], action.type))
    return found


FLAGS = numeric_flags()


def test_every_numeric_flag_takes_a_checked_number_not_a_bare_int_or_float():
    bare = [
        (" ".join(w), a.option_strings)
        for w, p in _commands(parser())
        for a in p._actions
        if a.type in (int, float)
    ]
    assert bare == []
    flags = {f for _, f, _ in FLAGS}
    assert {
        "--max-in-flight",
        "--rpm",
        "--tpm",
        "--timeout",
        "--max-attempts",
        "--backoff",
        "--max-stated-wait",
        "--max-reply-bytes",
        "--max-cost",
        "--grace",
        "--epochs",
        "--limit",
        "--sample",
        "--seed",
        "--poll",
        "--batch-size",
        "--upload-every",
        "--port",
        "--target-rows",
    } <= flags
    assert ZERO_ALLOWED <= flags


@pytest.mark.parametrize("value", ["0", *REFUSED_ALWAYS])
@pytest.mark.parametrize(
    ("words", "flag", "number"), FLAGS, ids=[f"{' '.join(w)} {f}" for w, f, _ in FLAGS]
)
def test_zero_negative_nan_infinite_and_overflow_are_refused_naming_the_flag(
    capsys, words, flag, number, value
):
    if value == "0" and flag in ZERO_ALLOWED:
        assert number.check(value) == 0
        return
    assert not number.accepts(value)
    assert main([*words, f"{flag}={value}"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"dxi {' '.join(words)}: error: argument {flag}: expected " in err
    assert f"got '{value}'" in err


@pytest.mark.parametrize(
    ("words", "flag", "number"), FLAGS, ids=[f"{' '.join(w)} {f}" for w, f, _ in FLAGS]
)
def test_a_value_in_range_is_taken(words, flag, number):
    value = "1" if number.kind is int else "1.5"
    assert number.check(value) == (1 if number.kind is int else 1.5)


def test_messages_say_what_is_expected():
    numbers = {f: n for _, f, n in FLAGS}
    assert (
        numbers["--max-in-flight"].expected()
        == "a whole number from 1 to 100,000 (requests at once)"
    )
    assert numbers["--timeout"].expected() == "a number above 0 and at most 86,400 (seconds)"
    assert numbers["--port"].expected() == "a whole number from 0 to 65,535"
    assert (
        numbers["--epochs"].accepts(3)
        and not numbers["--epochs"].accepts(2.5)
        and not numbers["--epochs"].accepts(True)
    )


@pytest.mark.process
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["run", "--model", "embedded", "--max-in-flight", "0"],
            "argument --max-in-flight: expected a whole number from 1",
        ),
        (
            ["run", "--model", "embedded", "--max-in-flight", "-3"],
            "argument --max-in-flight: expected",
        ),
        (
            ["run", "--model", "embedded", "--tpm", "-1"],
            "argument --tpm: expected a number above 0",
        ),
        (
            ["run", "--model", "embedded", "--timeout", "nan"],
            "argument --timeout: expected a number above 0",
        ),
        (
            ["run", "--model", "embedded", "--max-stated-wait", "nan"],
            "argument --max-stated-wait: expected",
        ),
        (
            ["view", "--port", "99999"],
            "argument --port: expected a whole number from 0 to 65,535, got '99999'",
        ),
        (
            ["run", "--model", "embedded", "--shard", "541984153/5000000000"],
            "--shard 541984153/5000000000: the number of shards must be at most 1,000,000",
        ),
    ],
)
def test_the_cases_of_issue_32_in_a_real_dxi(tmp_path, args, message):
    """The installed command: exit 2 at once, one error line, no traceback, nothing written (these
    hung, crashed or scored for 10 s first)."""
    done = subprocess.run(
        [DXI, *args, "--cache-dir", str(tmp_path / "c"), "--data-dir", str(tmp_path)]
        if args[0] == "run"
        else [DXI, *args, "--cache-dir", str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "c").exists()


@pytest.mark.process
def test_view_refuses_a_port_it_cannot_serve_before_reading_the_cache(tmp_path):
    """Issue 32: ``dxi view --port 99999`` scored the cache for 10 s before refusing the port. A
    port out of range is refused as the command line is parsed; a port taken, before the cache is
    read (here there is none: the port's error comes first)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [DXI, "view", "--port", str(port), "--cache-dir", str(tmp_path / "none")],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
    assert done.returncode == EXIT_USAGE and done.stdout == "", (done.stdout, done.stderr)
    assert done.stderr.strip() == (
        f"dxi view: error: cannot serve on 127.0.0.1:{port}: Address already in use (choose another "
        "--port, or --port 0 for a free one)"
    )
