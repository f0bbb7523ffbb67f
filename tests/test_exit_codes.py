"""Each command's help lists the exit codes that command can return, and only those
(``runner.errors``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dxi.runner.cli import main


def _listed(capsys: pytest.CaptureFixture, command: str) -> list[int]:
    assert main([command, "--help"]) == 0
    help_text = capsys.readouterr().out
    section = help_text.split("exit codes:\n", 1)[1]
    return [int(code) for code in re.findall(r"^  (\d+) ", section, flags=re.MULTILINE)]


@pytest.mark.parametrize(
    ("command", "codes"),
    [
        ("run", [0, 1, 2, 3, 4, 5, 6, 70, 130, 143]),
        ("score", [0, 1, 2, 70]),
        ("report", [0, 1, 2, 70]),
        ("estimate", [0, 2, 4, 70]),
        ("view", [0, 2, 70, 130]),
    ],
)
def test_a_commands_help_lists_the_exit_codes_it_returns(
    capsys: pytest.CaptureFixture, command: str, codes: list[int]
):
    assert _listed(capsys, command) == codes


def test_only_a_command_that_sends_says_how_a_stop_drains(capsys: pytest.CaptureFixture):
    main(["run", "--help"])
    assert (
        "The first Ctrl-C or SIGTERM of a run lets the requests in flight finish"
        in capsys.readouterr().out
    )
    main(["score", "--help"])
    assert "Ctrl-C" not in capsys.readouterr().out.split("exit codes:", 1)[1]


# ---- an unexpected error: exit 70, one line, the trace in a file with the secrets redacted
# (issue 32)
CRASH = """
import os, sys
from dxi.runner import rescore

def crash(*args, **kwargs):
    raise RuntimeError("the scoring broke: Bearer abcdefghijkl " + "sk-" + "proj1234567890 "
                       + os.environ["OPENAI_API_KEY"])

rescore.rescore = crash
from dxi.__main__ import command
sys.argv = ["dxi", *sys.argv[1:]]
command()
"""


@pytest.mark.process
def test_an_unexpected_error_exits_70_with_one_line_and_the_trace_in_a_redacted_file(tmp_path):
    """A bug (here a scoring function that raises) is neither exit 1 ("provisional") nor a
    traceback: one line saying what failed, where, and the file holding the full trace; the API keys
    of the environment, a bearer token and an ``sk-`` key are redacted in both."""
    import subprocess
    import sys

    from dxi.runner.errors import EXIT_SOFTWARE

    from .helpers.synthetic import data_dir

    data_dir(tmp_path / "data", 3)
    (tmp_path / "cache").mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "TMPDIR": str(tmp_path),
        "OPENAI_API_KEY": "sk-secret-of-the-environment",
        "HOME": str(tmp_path),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            CRASH,
            "score",
            "--data-dir",
            "data",
            "--cache-dir",
            "cache",
            "--model",
            "embedded",
            "--evals",
            "when2call",  # the synthetic data's one evaluation
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == EXIT_SOFTWARE, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        "dxi score: error: unexpected error: RuntimeError: the scoring broke: Bearer [REDACTED] [REDACTED] [REDACTED] at "
    )
    assert "runner/commands/score.py:" in line and "(main); the full trace is in " in line
    trace = Path(line.split("the full trace is in ", 1)[1].split(". This is a bug", 1)[0])
    assert trace.parent == tmp_path and trace.name.startswith("dxi-crash-")
    text = trace.read_text()
    assert (
        "Traceback (most recent call last)" in text and 'File "<string>", line 6, in crash' in text
    )
    assert (
        "sk-secret-of-the-environment" not in text
        and "abcdefghijkl" not in text
        and "proj1234567890" not in text
    )
    assert "command: dxi score --data-dir data" in text
    assert oct(trace.stat().st_mode & 0o777) == "0o600"
