"""Shell completion of option values (issue 23, item 10): ``--model`` completes adapter prefixes,
the embedded models, the run file's models and the models seen in the cache; ``--evals`` the
evaluation names, in a comma-separated list; ``--price`` a model and ``=``. Driven through the real
shells (bash, zsh, fish) with the script ``dxi completion`` prints, asking the installed ``dxi``
(``tests/test_cli_usage.py`` for the commands and flags)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dxi.adapters import KINDS
from dxi.cache import runs
from dxi.cache.runs import RunRecord
from dxi.evals import EVALS
from dxi.runner import completion
from dxi.runner.cli import main

from .conftest import DXI
from .helpers.servers import need
from .helpers.shells import zsh_completes

EMBEDDED = "embedded:sparrow-nano-general-v1.1"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding the embedded model's rows (its runs.jsonl removed: the shards alone name it)
    and a recorded run of a System One model that has no rows yet."""
    from .conftest import fixture_data

    tmp = tmp_path_factory.mktemp("completion")
    data = fixture_data(tmp / "data")
    cache_dir = tmp / "cache"
    assert (
        main(
            [
                "run",
                "--model",
                EMBEDDED,
                "--evals",
                "hle_multichoice",
                "--limit",
                "1",
                "--data-dir",
                str(data),
                "--cache-dir",
                str(cache_dir),
                "--out",
                str(tmp / "out"),
                "-q",
            ]
        )
        == 0
    )
    (cache_dir / runs.RUNS_FILE).unlink()
    runs.append(
        cache_dir,
        RunRecord(
            "dxi-prompt-1",
            (("systemone", "fake-decider", "http://127.0.0.1:9/v1/systemone", "{}"),),
            ("when2call",),
        ),
    )
    return cache_dir


def test_model_candidates_are_adapters_embedded_models_the_run_files_and_the_caches(
    cache: Path, tmp_path: Path
):
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        '[providers.local]\nkind = "openai"\nbase_url = "http://127.0.0.1:8080/v1"\n'
        '[[models]]\nprovider = "local"\nmodel = "qwen2.5"\n[[models]]\nprovider = "anthropic"\n'
        'model = "claude-x"\n'
    )
    args = type("Args", (), {"run_file": run_file, "cache_dir": cache})()
    got = completion.models("", args)
    assert got[: len(KINDS)] == [f"{k}:" for k in KINDS]
    assert {"embedded", EMBEDDED, "embedded:sparrow-nano-robot-v1.2"} <= set(got)
    assert {"openai:qwen2.5@http://127.0.0.1:8080/v1", "anthropic:claude-x"} <= set(
        got
    )  # the run file's
    assert {EMBEDDED, "systemone:fake-decider"} <= set(
        completion.cached_models(cache)
    )  # shards, runs.jsonl
    assert len(got) == len(set(got))
    assert completion.prices("", args)[:2] == ["embedded=", f"{EMBEDDED}="]
    # a run file that does not parse, a folder that is no cache: fewer candidates, never an error
    run_file.write_text("[[models]\n")
    assert (
        completion.models(
            "", type("Args", (), {"run_file": run_file, "cache_dir": tmp_path / "none"})()
        )[-1]
        == "embedded:sparrow-nano-robot-v1.2"
    )


def test_evals_complete_the_last_name_of_a_list():
    assert completion.evals("") == list(EVALS)
    assert completion.evals("when2call,h") == [
        "when2call,aa_omniscience_decision",
        "when2call,hle_multichoice",
        "when2call,wildguardtest",
    ]


def _env() -> dict[str, str]:
    return dict(os.environ, PATH=f"{Path(DXI).parent}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.mark.process
def test_bash_completes_model_prefixes_and_evaluation_names(cache: Path, tmp_path: Path):
    """The generated script in a real bash: ``_python_argcomplete`` with the line as bash gives
    it."""
    script = tmp_path / "t.sh"
    lines = ["source <(dxi completion bash)"]
    for line in (
        "dxi run --model op",
        f"dxi score --cache-dir {cache} --model sys",
        "dxi run --evals when",
    ):
        words = line.split(" ")
        lines += [
            f'COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}',
            f"_python_argcomplete dxi {words[-1]} {words[-2]}",
            'printf "%s\\n" "${COMPREPLY[@]}"; echo ---',
        ]
    script.write_text("\n".join(lines) + "\n")
    out = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, check=True, timeout=120, env=_env()
    ).stdout
    assert [block.split() for block in out.split("---")[:3]] == [
        ["openai:", "openai-decisions:"],
        ["systemone:", "systemone:fake-decider"],
        ["when2call"],
    ]


@pytest.mark.server
@pytest.mark.process
def test_fish_completes_a_cached_model_an_embedded_model_and_an_evaluation_list(cache: Path):
    script = (
        f'dxi completion fish | source; complete -C "dxi score --cache-dir {cache} --model systemone:f"; '
        'complete -C "dxi run --model embedded:sparrow-nano-g"; complete -C "dxi run --evals when2call,hle"; '
        'complete -C "dxi estimate --price embedded:sparrow-nano-r"'
    )
    out = subprocess.run(
        [need("fish"), "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=_env(),
    )
    assert [line.split("\t")[0] for line in out.stdout.splitlines()] == [
        "systemone:fake-decider",
        EMBEDDED,
        "when2call,hle_multichoice",
        "embedded:sparrow-nano-robot-v1.2=",
    ]


@pytest.mark.server
def test_zsh_completes_a_model_the_cache_has_seen(cache: Path, tmp_path: Path):
    assert (
        zsh_completes(tmp_path, f"dxi score --cache-dir {cache} --model systemone:fa")
        == f"[dxi score --cache-dir {cache} --model systemone:fake-decider ]"
    )
    assert zsh_completes(tmp_path, "dxi run --evals wild") == "[dxi run --evals wildguardtest ]"
