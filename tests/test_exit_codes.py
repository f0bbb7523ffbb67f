"""Each command's help lists the exit codes that command can return, and only those (``runner.errors``)."""
from __future__ import annotations

import re

import pytest

from dxi.runner.cli import main


def _listed(capsys: pytest.CaptureFixture, command: str) -> list[int]:
    assert main([command, "--help"]) == 0
    help_text = capsys.readouterr().out
    section = help_text.split("exit codes:\n", 1)[1]
    return [int(code) for code in re.findall(r"^  (\d+) ", section, flags=re.MULTILINE)]


@pytest.mark.parametrize(("command", "codes"), [
    ("run", [0, 1, 2, 3, 4, 5, 6, 130, 143]),
    ("score", [0, 1, 2]),
    ("report", [0, 1, 2]),
    ("estimate", [0, 2]),
    ("view", [0, 2, 130]),
])
def test_a_commands_help_lists_the_exit_codes_it_returns(capsys: pytest.CaptureFixture, command: str, codes: list[int]):
    assert _listed(capsys, command) == codes


def test_only_a_command_that_sends_says_how_a_stop_drains(capsys: pytest.CaptureFixture):
    main(["run", "--help"])
    assert "The first Ctrl-C or SIGTERM of a run lets the requests in flight finish" in capsys.readouterr().out
    main(["score", "--help"])
    assert "Ctrl-C" not in capsys.readouterr().out.split("exit codes:", 1)[1]
