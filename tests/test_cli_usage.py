"""The command line as a user meets it: grouped help with every exit code, "did you mean", the run
file after ``--param``, ``--version``, shell completion, the data folder's default, ``--sample``."""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from dxi.runner import rescore, session
from dxi.runner.cli import main, parser
from dxi.runner.errors import EXIT_PROVIDER_STOPPED, EXIT_USAGE
from dxi.runner.planning import plan
from dxi.runner.planning.inputs import PlanInputs

from .conftest import DXI, REAL_DATA, requires_real_data
from .helpers.servers import need
from .helpers.shells import zsh_completes

COMMANDS = ("run", "estimate", "score", "report")


def help_of(*words: str, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        parser().parse_args([*words, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_grouped_lists_every_exit_code_and_cites_nothing_internal(command: str, capsys):
    text = help_of(command, capsys=capsys)
    groups = ["models:", "data:", "cache:", "output:"] + (
        ["limits, retries and cost:"] if command in ("run", "estimate") else []
    )
    for g in groups:
        assert f"\n{g}\n" in text, g
    for code in (
        ("0", "1", "2", "3", "4", "6", "130", "143") if command == "run" else ("0", "2")
    ):  # the others':
        assert f"\n  {code} " in text, code  # tests/test_exit_codes.py
    assert "``" not in text and "dxi." not in text and "runner." not in text and "SPEC" not in text
    assert "(default: .dxi-cache" in text and "$DXI_DATA_DIR" in text


def _commands(p: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and sub-command of the parser ``p``, as the words that name it."""
    found = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [(*words, name), *_commands(sub, (*words, name))]
    return found


def test_every_command_and_sub_command_lists_its_exit_codes(capsys):
    """Each command's --help ends with an "exit codes:" section: at least 0, 2 (bad input) and 70
    (an unexpected error), each code once, in increasing order, its meaning beside it."""
    commands = _commands(parser())
    assert len(commands) == 19  # 12 commands, 7 sub-commands (data 2, cache 1, batches 4)
    assert ("batches", "resume") in commands and ("cache", "compact") in commands
    for words in commands:
        text = help_of(*words, capsys=capsys)
        assert "\nexit codes:\n" in text, words
        section = text.split("\nexit codes:\n", 1)[1]
        codes = [
            int(line.split()[0])
            for line in section.splitlines()
            if line[2:3].isdigit() and line.startswith("  ")
        ]
        assert codes == sorted(set(codes)) and {0, 2, 70} <= set(codes), (words, codes)
        numbered = [line for line in section.splitlines() if line[2:3].isdigit()]
        assert all(len(line.split()) > 1 for line in numbered), words


def test_top_level_help_lists_the_commands_and_exit_codes(capsys):
    text = help_of(capsys=capsys)
    for command in (*COMMANDS, "data", "fetch-model", "completion"):
        assert f"\n    {command}" in text
    assert "\n  4    the cache could not be written" in text


def test_a_mistyped_flag_is_one_error_line_and_a_hint_not_the_usage_block(capsys):
    assert main(["run", "--model", "embedded", "--limt", "5"]) == 2
    assert capsys.readouterr() == (
        "",
        "dxi run: error: unrecognized arguments: --limt (did you mean --limit?)\n"
        "run 'dxi run --help' for the options\n",
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["run", "--model", "embedded", "--lim", "5"],
            "dxi run: error: unrecognized arguments: --lim (did you mean --limit?)",
        ),
        (
            ["batches", "list", "--cache-d", "x"],
            "dxi batches list: error: unrecognized arguments: --cache-d x (did you mean "
            "--cache-dir?)",
        ),
    ],
)
def test_a_flag_is_taken_only_whole_never_abbreviated(argv, line, capsys):
    """argparse's abbreviations are off: "--lim" is not "--limit" (a script's abbreviation
    cannot change meaning, or break, when a later version adds a flag); it is a mistyped flag."""
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines()[0] == line


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (  # the trial's: argparse took x.csv for TARGET and named --output alone
            ["export", "--format", "csv", "--output", "x.csv"],
            "dxi export: error: unrecognized arguments: --output; TARGET is positional (no flag): "
            "dxi export [RUN_FILE] [options] --format csv x.csv",
        ),
        (  # a run file first: argparse took it for TARGET, a.parquet is left over
            ["export", "examples/run.toml", "--format", "parquet", "-o", "a.parquet"],
            "dxi export: error: unrecognized arguments: -o a.parquet; TARGET is positional (no "
            "flag): dxi export [RUN_FILE] [options] --format parquet a.parquet",
        ),
        (
            ["export", "--format", "jsonl", "--output=a.jsonl"],
            "dxi export: error: the following arguments are required: TARGET; unrecognized "
            "arguments: --output=a.jsonl; TARGET is positional (no flag): dxi export [RUN_FILE] "
            "[options] --format jsonl a.jsonl",
        ),
        (  # dxi score's flag: named as such, and the hint
            ["export", "--out", "eee", "--format", "eee"],
            "dxi export: error: --out is not an option of dxi export (dxi run, dxi estimate, dxi "
            "score, dxi report and dxi batches collect take it); TARGET is positional (no flag): "
            "dxi export "
            "[RUN_FILE] [options] --format eee eee",
        ),
        (
            ["export", "--output"],
            "dxi export: error: the following arguments are required: --format, TARGET; "
            "unrecognized arguments: --output; TARGET is positional (no flag): dxi export "
            "[RUN_FILE] [options] --format FORMAT TARGET",
        ),
    ],
    ids=["output", "o", "output=", "out", "nothing-else"],
)
def test_exports_target_given_by_a_flag_is_said_to_be_positional(argv, line, capsys):
    """`dxi export --format csv --output x.csv` said only `unrecognized arguments: --output x.csv`
    (or `--output`): nothing told that TARGET is positional. The hint gives the command with the
    flag's value as TARGET and the --format given."""
    assert main(argv) == 2
    assert capsys.readouterr() == ("", f"{line}\nrun 'dxi export --help' for the options\n")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["batches", "collect", "--max-cost", "5"],
            "dxi batches collect: error: --max-cost is not an option of dxi batches collect (dxi "
            "run and dxi estimate take it)",
        ),
        (  # argparse gave 3 to RUN_FILE and named the run file as the unrecognized word
            ["batches", "collect", "--max-cost", "3", "examples/run.toml"],
            "dxi batches collect: error: --max-cost is not an option of dxi batches collect (dxi "
            "run and dxi estimate take it)",
        ),
        (
            ["batches", "collect", "--rpm=5", "--max-cost", "3"],
            "dxi batches collect: error: --rpm and --max-cost are not options of dxi batches "
            "collect (dxi run and dxi estimate take them)",
        ),
        (
            ["batches", "collect", "--deadline", "03:00", "--limt", "3"],
            "dxi batches collect: error: --deadline is not an option of dxi batches collect (dxi "
            "run takes it); unrecognized arguments: --limt (did you mean --limit?)",
        ),
        (
            ["batches", "collect", "--all"],
            "dxi batches collect: error: --all is not an option of dxi batches collect (dxi "
            "batches list, dxi batches cancel and dxi batches resume take it)",
        ),
        (
            ["batches", "cancel", "--max-cost", "3"],
            "dxi batches cancel: error: one of the arguments --model --entry --all is required; "
            "--max-cost is not an option of dxi batches cancel (dxi run and dxi estimate take it)",
        ),
    ],
    ids=["value", "value-then-run-file", "two", "and-mistyped", "sub-commands", "required"],
)
def test_another_commands_flag_is_named_with_the_commands_that_take_it(argv, line, capsys):
    """``dxi batches collect --max-cost 5``: argparse gives 5 to RUN_FILE and reports the flag
    without it (or the word after it instead); the error names the flag and who takes it."""
    assert main(argv) == 2
    assert capsys.readouterr() == (
        "",
        f"{line}\nrun 'dxi {argv[0]} {argv[1]} --help' for the options\n",
    )


def test_a_mistyped_flag_beside_a_missing_required_one_is_named(capsys):
    assert main(["data", "fetch", "--dta-dir", "x"]) == 2
    assert capsys.readouterr().err == (
        "dxi data fetch: error: the following arguments are required: --data-dir; unrecognized "
        "arguments: --dta-dir (did you mean --data-dir?)\n"
        "run 'dxi data fetch --help' for the options\n"
    )


def test_a_mistyped_command_gets_a_suggestion(capsys):
    assert main(["scroe"]) == 2
    assert capsys.readouterr().err == (
        "dxi: error: unknown command 'scroe' (did you mean score?)\n"
        "run 'dxi --help' for the commands\n"
    )


@pytest.mark.parametrize(
    "words, error",
    [
        (
            ["batches", "list", "--bogus"],
            "dxi batches list: error: unrecognized arguments: --bogus\n"
            "run 'dxi batches list --help' for the options\n",
        ),
        (
            ["batches", "lst"],
            "dxi batches: error: unknown command 'lst' (did you mean list?); the commands: list, "
            "collect, cancel, resume\nrun 'dxi batches --help' for the commands\n",
        ),
        (
            ["batches", "cancel", "--cache-dir", "c"],
            "dxi batches cancel: error: one of the arguments --model --entry --all is required\n"
            "run 'dxi batches cancel --help' for the options\n",
        ),
        (
            ["cache", "compact", "--target-rws", "5"],
            "dxi cache compact: error: unrecognized arguments: --target-rws 5 (did you mean "
            "--target-rows?)\nrun 'dxi cache compact --help' for the options\n",
        ),
        (
            ["run", "--stream", "x"],
            "dxi run: error: argument --stream: invalid choice: 'x' (choose from 'auto', "
            "'always', 'never')\nrun 'dxi run --help' for the options\n",
        ),
        (
            ["view", "--port", "-1"],
            "dxi view: error: argument --port: expected a whole number from 0 to 65,535, got "
            "'-1'\nrun 'dxi view --help' for the options\n",
        ),
    ],
    ids=["sub-command-flag", "sub-command", "sub-command-required", "cache", "choice", "number"],
)
def test_every_command_and_sub_command_words_a_usage_error_alike(words, error, capsys):
    assert main(words) == 2
    assert capsys.readouterr() == ("", error)


@pytest.mark.parametrize(
    "every, line", [([], "no open batches in {}\n"), (["--all"], "no batches in {}\n")]
)
def test_batches_list_of_a_cache_without_batches_is_one_line(
    tmp_path: Path, every: list[str], line: str, capsys
):
    cache = tmp_path / "cache"
    (cache / "shards").mkdir(parents=True)
    assert main(["batches", "list", "--cache-dir", str(cache), *every]) == 0
    assert capsys.readouterr() == (line.format(cache), "")
    assert main(["batches", "list", "--cache-dir", str(cache), "--json", *every]) == 0
    assert capsys.readouterr() == ("[]\n", "")


@pytest.mark.parametrize(
    "words",
    [
        ["list"],
        ["list", "--all", "--json"],
        ["cancel", "--all"],
        ["resume", "--all"],
        ["collect", "--model", "embedded"],
    ],
    ids=["list", "list-json", "cancel", "resume", "collect"],
)
def test_batches_of_a_cache_folder_that_is_not_there_is_a_usage_error_naming_it(
    tmp_path: Path, words: list[str], capsys
):
    """As ``dxi score`` (``rescore.select``): exit code 2, one line naming the folder; nothing
    created (a mistyped --cache-dir must not read as "no open batches")."""
    cache = tmp_path / "nowhere"
    assert main(["batches", *words, "--cache-dir", str(cache)]) == 2
    assert capsys.readouterr() == (
        "",
        f"dxi batches {words[0]}: error: no cache at {cache}: run `dxi run` first, or pass "
        "--cache-dir\n",
    )
    assert not cache.exists()


def test_batches_list_json_has_the_keys_docs_batch_md_lists(tmp_path: Path, capsys):
    """One entry recorded (its intent): ``--json`` prints it with exactly the keys the docs name."""
    import re

    from dxi.cache.ledger import Ledger

    cache = tmp_path / "cache"
    Ledger(cache).intent("dxi-1", ["k1", "k2"], label="openai:m", kind="openai", requests=2)
    assert main(["batches", "list", "--cache-dir", str(cache), "--json"]) == 0
    (entry,) = orjson.loads(capsys.readouterr().out)
    text = " ".join((Path(__file__).parents[1] / "docs" / "batch.md").read_text().split())
    listed = text.split("With `--json`, a JSON list of the same entries")[1].split("; times in")[0]
    assert list(entry) == re.findall(r"`(\w+)`", listed)
    assert (entry["id"], entry["requests"], entry["phase"], entry["running_s"]) == (
        "dxi-1",
        2,
        "intent",
        None,
    )


def test_a_commands_own_check_of_its_flags_is_worded_as_the_parsers(tmp_path: Path, capsys):
    """A usage error found once the flags are parsed (``UsageError``) names the command too."""
    assert main(["plan", "--model", "embedded", "--cache-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "dxi plan: error: give one of --precision P or --separate A B --difference D\n"
    )


@pytest.mark.parametrize("flag, value", [("--difference", "3"), ("--tolerance", "2")])
def test_plan_refuses_a_separation_flag_with_precision(
    tmp_path: Path, flag: str, value: str, capsys
):
    """``--difference`` and ``--tolerance`` belong to ``--separate``: each is refused beside
    ``--precision`` alike (``--tolerance``'s default, 1, is taken only by ``--separate``)."""
    words = ["plan", "--model", "embedded", "--precision", "5", flag, value]
    assert main([*words, "--cache-dir", str(tmp_path)]) == 2
    assert capsys.readouterr() == (
        "",
        f"dxi plan: error: {flag} goes with --separate, not with --precision\n",
    )
    assert "(--until separated=Δ; default 1)" in " ".join(help_of("plan", capsys=capsys).split())


@pytest.mark.parametrize(
    "command, shown",
    [
        (["plan", "--precision", "5"], "dxi plan run.toml"),
        (["run"], "dxi run run.toml"),
        (["estimate"], "dxi run run.toml"),
    ],
    ids=["plan", "run", "estimate"],
)
def test_no_models_shows_a_run_file_given_to_the_command(command: list[str], shown: str, capsys):
    assert main(command) == 2
    assert capsys.readouterr() == (
        "",
        f"dxi {command[0]}: error: name the models: a run file ({shown}) or --model ADAPTER:MODEL\n",
    )


def test_a_run_file_after_param_is_the_run_file_not_a_parameter(tmp_path: Path, capsys):
    args = parser().parse_args(["score", "--param", "temperature=0", "seed=1", "runs/tonight.toml"])
    assert args.run_file == Path("runs/tonight.toml") and args.param == ["temperature=0", "seed=1"]
    args = parser().parse_args(
        ["run", "--option", "ctx_size=4096", "--param", "temperature=0", "--model", "m"]
    )
    assert (
        args.run_file is None
        and args.param == ["temperature=0"]
        and args.option == ["ctx_size=4096"]
    )
    with pytest.raises(SystemExit):
        parser().parse_args(["score", "--param", "temperature", "0"])
    assert "--param 'temperature': expected KEY=VALUE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser().parse_args(["score", "a.toml", "--param", "t=0", "b.toml"])
    assert "two run files: a.toml and b.toml" in capsys.readouterr().err


def test_param_before_a_run_file_is_refused_for_what_it_is(tmp_path: Path, capsys):
    run_file = tmp_path / "tonight.toml"
    run_file.write_text('[[models]]\nprovider = "embedded"\nmodel = "sparrow-nano-general-v1.1"\n')
    assert main(["score", "--param", "temperature=0", str(run_file), "-q"]) == 2
    assert f"--param cannot be combined with a run file ({run_file})" in capsys.readouterr().err


def test_version(capsys):
    assert main(["--version"]) == 0
    from importlib.metadata import version

    assert capsys.readouterr().out == f"dxi {version('decision-index')}\n"


@pytest.mark.server
@pytest.mark.process
@pytest.mark.parametrize(
    "shell,marker",
    [
        ("bash", "complete -o nospace -o default -o bashdefault -F _python_argcomplete dxi"),
        ("zsh", "#compdef dxi"),
        ("fish", "complete --command dxi"),
    ],
)
def test_completion_scripts(shell: str, marker: str, capsys):
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    assert marker in script
    subprocess.run(
        [need(shell), "-n"], input=script, text=True, check=True, timeout=60
    )  # its syntax


@pytest.mark.server
@pytest.mark.process
def test_fish_completes_through_the_installed_dxi():
    script = 'dxi completion fish | source; complete -C "dxi run --sam"; complete -C "dxi sc"'
    env = dict(os.environ, PATH=f"{Path(DXI).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    out = subprocess.run(
        [need("fish"), "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    )
    assert [line.split("\t")[0] for line in out.stdout.splitlines()] == ["--sample", "score"]


@pytest.mark.server
@pytest.mark.process
def test_zsh_completes_through_the_installed_dxi(tmp_path: Path):
    """The generated script, loaded by a real interactive zsh (compinit), completes a subcommand's
    flag and a subcommand by asking the installed ``dxi``; without it, zsh completes nothing of
    dxi's."""
    assert zsh_completes(tmp_path, "dxi run --mo") == "[dxi run --model ]"
    assert zsh_completes(tmp_path, "dxi sc") == "[dxi score ]"
    assert (
        zsh_completes(tmp_path, "dxi run --mo", load=False) == "[dxi run --mo]"
    )  # the test sees a missing one


@pytest.mark.process
def test_bash_completes_a_subcommands_flags_through_the_installed_dxi(tmp_path: Path):
    """The generated script, sourced in a real bash, asks the installed ``dxi`` for the
    completions."""
    script = tmp_path / "t.sh"
    script.write_text(
        f"PATH={Path(DXI).parent}:$PATH\nsource <(dxi completion bash)\n"
        'COMP_LINE="dxi run --sam"; COMP_POINT=${#COMP_LINE}; COMP_WORDS=(dxi run --sam); COMP_CWORD=2\n'
        '_python_argcomplete dxi --sam run\nprintf "%s\\n" "${COMPREPLY[@]}"\n'
        'COMP_LINE="dxi sc"; COMP_POINT=${#COMP_LINE}; COMP_WORDS=(dxi sc); COMP_CWORD=1\n'
        '_python_argcomplete dxi sc dxi\nprintf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    out = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.split() == ["--sample", "score"]


def test_the_data_folder_defaults_to_the_environment_then_data(
    data_dir: Path, tmp_path: Path, monkeypatch
):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("DXI_DATA_DIR", str(data_dir))
    assert (
        session.run(plan.build(models=["embedded"])).exit_code == 0
    )  # the command line's defaults
    s = orjson.loads((work / "out" / "summary.json").read_bytes())
    assert s["data"]["hle_multichoice"]["files"][0]["path"] == str(
        data_dir / "hle" / "hle_mcqa.json"
    )
    monkeypatch.delenv("DXI_DATA_DIR")
    shutil.copytree(data_dir, work / "data")
    assert rescore.rescore(rescore.select(PlanInputs())).exit_code == 0
    s = orjson.loads((work / "out" / "summary.json").read_bytes())
    assert s["data"]["hle_multichoice"]["files"][0]["path"] == "data/hle/hle_mcqa.json"
    assert s["models"][0]["evals"]["hle_multichoice"]["n"] == 2


def test_no_data_anywhere_says_where_it_looked(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DXI_DATA_DIR", raising=False)
    assert main(["run", "--model", "embedded", "-q"]) == EXIT_USAGE
    assert (
        "no --data-dir given, $DXI_DATA_DIR is not set and neither ./data nor ../shared/data exists"
        in (capsys.readouterr().err)
    )


def test_an_evaluation_not_selected_is_not_read(data_dir: Path, tmp_path: Path):
    (data_dir / "wildguardtest" / "wildguardtest.parquet").write_bytes(b"not parquet")
    ran = session.run(
        plan.build(
            models=["embedded"],
            data_dir=data_dir,
            evals=["hle_multichoice"],
            cache_dir=tmp_path / "c",
            out=tmp_path / "o",
        )
    )
    assert ran.exit_code == 0
    s = orjson.loads((tmp_path / "o" / "summary.json").read_bytes())
    assert s["data"]["wildguardtest"] == {"missing": "not selected (--evals)"}
    assert s["models"][0]["evals"]["hle_multichoice"]["n"] == 2
    assert (
        main(
            [
                "run",
                "--model",
                "embedded",
                "--data-dir",
                str(data_dir),
                "--cache-dir",
                str(tmp_path / "c"),
                "--out",
                str(tmp_path / "o"),
                "-q",
            ]
        )
        == EXIT_USAGE
    )  # selected, it is refused


@pytest.mark.process
def test_help_runs_in_a_process_of_its_own():
    out = subprocess.run(
        [DXI, "run", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "100"},
    ).stdout
    assert out.startswith("usage: dxi run ")


def test_estimate_tells_requests_not_in_the_cache_from_a_new_evaluation(
    data_dir: Path, tmp_path: Path, capsys
):
    where = ["--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "c")]
    ran = session.run(
        plan.build(
            models=["embedded"],
            limit=1,
            evals=["hle_multichoice", "when2call"],
            data_dir=data_dir,
            cache_dir=tmp_path / "c",
            out=tmp_path / "o",
        )
    )
    assert ran.exit_code == 0
    capsys.readouterr()
    assert main(["estimate", "--model", "embedded", *where, "--json"]) == 0
    (m,) = orjson.loads(capsys.readouterr().out)["models"]
    # HLE and When2Call were started (a run that stopped, or a smaller --limit, or one killed with
    # requests on the wire: the cache cannot tell, so it never says "not sent yet"); the other two
    # never were
    never_or_lost = (
        "not in the cache (never sent, or sent by a run stopped before storing its reply)"
    )
    assert m["reasons"] == {"new evaluation": 4 + 3, never_or_lost: 1 + 2}
    assert (m["requests"], m["cached"], m["new"]) == (12, 2, 10)


@pytest.mark.process
def test_a_run_with_everything_cached_needs_no_server(data_dir: Path, tmp_path: Path, capsys):
    """The server answers the first run, then is gone: the rerun (all cached) still scores, and says
    so."""
    from .fakes.fake_provider import serve

    where = [
        "--data-dir",
        str(data_dir),
        "--cache-dir",
        str(tmp_path / "c"),
        "--out",
        str(tmp_path / "o"),
    ]
    with serve(model="m", p_first=None, p_yes=None, record=False) as server:
        model = f"systemone:m@{server.url}"
        ran = session.run(
            plan.build(
                models=[model, "embedded"],
                data_dir=data_dir,
                cache_dir=tmp_path / "c",
                out=tmp_path / "o",
            )
        )
        assert ran.exit_code == 0
    first = orjson.loads((tmp_path / "o" / "summary.json").read_bytes())
    capsys.readouterr()
    assert main(["run", "--model", model, "--model", "embedded", *where]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "Running 2 models (systemone:m (all cached); embedded:sparrow-nano-general-v1.1 (all cached)) on "
        "12 tasks (AA-Omniscience-Decision 4, HLE-MultiChoice 2, When2Call 3, WildGuardTest 3): "
        "24 requests; cache "
    )
    assert "\nEvery request is in the cache (24): nothing to send.\n" in out
    again = orjson.loads((tmp_path / "o" / "summary.json").read_bytes())
    assert [m["decision_index"] for m in again["models"]] == [
        m["decision_index"] for m in first["models"]
    ]
    assert [m["requests"]["cache_hits"] for m in again["models"]] == [12, 12]
    # a task not cached yet needs the server: its provider is stopped, with the reason, nothing sent
    assert (
        main(
            [
                "run",
                "--model",
                model,
                *where[:2],
                "--cache-dir",
                str(tmp_path / "empty"),
                "--out",
                str(tmp_path / "o2"),
                "-q",
            ]
        )
        == EXIT_PROVIDER_STOPPED
    )
    assert "cannot reach" in capsys.readouterr().out


def test_progress_counts_the_rate_from_the_run_start_and_shows_no_spend_for_free_models():
    from rich.console import Console

    from dxi.runner.sending.progress import RunProgress
    from dxi.runner.sending.scheduler import Stats

    start = 1000.0
    progress = RunProgress(
        Console(), {"local": 100, "paid": 100}, free=frozenset({"local"}), started=start
    )
    s = Stats(sent=10, ok=10, cache_hits=0, attempts=10, started=start + 9.999, cost_usd=0.0)
    assert progress.line("local", s, now=start + 10) == (
        "10/100 10% 1.0 req/s ETA 1m30s retries 0 429s 0 invalid replies 0 failed 0 cached 0"
    )
    assert progress.line("paid", s, now=start + 10).startswith(
        "10/100 10% 1.0 req/s ETA 1m30s $0.0000 retries 0"
    )


def test_the_command_modules_import_the_library_never_each_other():
    import ast

    from dxi.runner import commands

    folder = Path(commands.__file__).parent
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    assert modules == set(commands.COMMANDS.values()) | {
        "options"
    }  # one module per command, and the shared options
    for name in sorted(modules - {"options"}):
        tree = ast.parse((folder / f"{name}.py").read_text())
        imported = set()
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom) and node.level == 1
            ):  # from . import x / from .x import y
                imported |= {node.module} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "dxi.runner.commands"
            ):
                imported.add(node.module.rsplit(".", 1)[-1])
        assert imported <= {"options"}, (
            f"runner/commands/{name}.py imports {sorted(imported - {'options'})}"
        )
        assert hasattr(importlib.import_module(f"dxi.runner.commands.{name}"), "main")
    # the dispatcher stays small: 200 lines before ruff format's one-argument-per-line layout at
    # 100 columns (issue 33), which grew the tree's lines by ~36%
    assert len((folder.parent / "cli.py").read_text().splitlines()) <= 240


@pytest.mark.parametrize(
    "argv",
    [
        [
            "export",
            "runs/two.toml",
            "--format",
            "csv",
            "answers.csv",
        ],  # the form docs/outputs.md gives
        ["export", "--format", "csv", "runs/two.toml", "answers.csv"],
        ["export", "runs/two.toml", "answers.csv", "--format", "csv"],
        ["export", "--format", "csv", "--include-missing", "runs/two.toml", "-q", "answers.csv"],
    ],
)
def test_export_takes_its_run_file_and_target_with_the_flags_anywhere(argv: list[str]):
    """Issue 32: ``dxi export runs/two.toml --format csv answers.csv`` was refused (argparse gave
    the run file to TARGET, RUN_FILE being optional, and left answers.csv over)."""
    parsed = parser().parse_args(argv)
    assert (parsed.run_file, parsed.target, parsed.format) == (
        Path("runs/two.toml"),
        Path("answers.csv"),
        "csv",
    )


def test_export_without_a_run_file_still_refuses_a_word_too_many(capsys):
    assert main(["export", "--format", "csv", "answers.csv", "-q", "more.csv"]) == EXIT_USAGE
    assert (
        "unrecognized arguments: more.csv" in capsys.readouterr().err
    )  # answers.csv: not a run file
    parsed = parser().parse_args(["export", "--format", "csv", "answers.csv"])
    assert (parsed.run_file, parsed.target) == (None, Path("answers.csv"))


@pytest.mark.process
def test_export_with_a_run_file_before_the_flags_in_a_real_dxi(tmp_path: Path):
    from .helpers.synthetic import data_dir

    data_dir(tmp_path / "data", 3)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "two.toml").write_text(
        'data_dir = "../data"\ncache_dir = "../cache"\n\n[[models]]\nprovider = "embedded"\n'
        '[evals]\nselect = ["when2call"]\n'  # the synthetic data: When2Call only
    )
    done = subprocess.run(
        [DXI, "run", "runs/two.toml", "-q"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    done = subprocess.run(
        [DXI, "export", "runs/two.toml", "--format", "csv", "answers.csv"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("Exported 1 file(s) (csv) to answers.csv")
    assert (
        len((tmp_path / "answers.csv").read_text().splitlines()) == 1 + 3
    )  # the header, one row per task


@pytest.mark.process
def test_data_check_finds_the_data_folder_as_every_other_command_does(tmp_path: Path):
    """Issue 32: ``dxi data check`` alone required --data-dir; it now takes $DXI_DATA_DIR, else
    ./data, else ../shared/data, and says so when none exists."""
    from .helpers.synthetic import data_dir

    env = {k: v for k, v in os.environ.items() if k != "DXI_DATA_DIR"}
    (tmp_path / "empty").mkdir()
    done = subprocess.run(
        [DXI, "data", "check"],
        capture_output=True,
        text=True,
        cwd=tmp_path / "empty",
        env=env,
        timeout=120,
    )
    assert done.returncode == EXIT_USAGE and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "dxi data check: error: no data folder: give --data-dir DIR (default: $DXI_DATA_DIR, else ./data, "
        "else ../shared/data, whichever exists)"
    )
    data_dir(tmp_path / "here" / "data", 3)
    done = subprocess.run(
        [DXI, "data", "check"],
        capture_output=True,
        text=True,
        cwd=tmp_path / "here",
        env=env,
        timeout=120,
    )
    assert "Evaluation data in data" in done.stdout and "when2call_test_mcq.jsonl" in done.stdout, (
        done.stdout
    )
    done = subprocess.run(
        [DXI, "data", "check"],
        capture_output=True,
        text=True,
        cwd=tmp_path / "empty",
        timeout=120,
        env={**env, "DXI_DATA_DIR": str(tmp_path / "here" / "data")},
    )
    assert f"Evaluation data in {tmp_path / 'here' / 'data'}" in " ".join(done.stdout.split()), (
        done.stdout
    )


def _plan(tmp_path: Path, *words: str) -> list[str]:
    return [
        "plan",
        *words,
        "--data-dir",
        str(REAL_DATA),
        "--limit",
        "3",
        "--cache-dir",
        str(tmp_path / "c"),
        "--difference",
        "3",
        "--runs",
        "2",
    ]


@requires_real_data
@pytest.mark.parametrize(
    "a", ["embedded", "embedded:sparrow-nano-general-v1.1"], ids=["as-given", "label"]
)
def test_plan_separate_takes_a_model_as_price_names_it(tmp_path: Path, a: str, capsys):
    """``--separate A B``: the ``--model`` text (``embedded``) or the label, as ``--price`` takes
    them (``runner.planning.plan.model_named``)."""
    words = ["--model", "embedded", "--model", "openai:m", "--separate", a, "openai:m", "--json"]
    assert main(_plan(tmp_path, *words)) == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert [m["model"] for m in doc["models"]] == ["embedded:sparrow-nano-general-v1.1", "openai:m"]


TWO = """[[models]]
provider = "openai"
model = "m"
name = "cold"
params = { temperature = 0 }

[[models]]
provider = "openai"
model = "m"
name = "warm"
params = { temperature = 1 }
"""


@requires_real_data
@pytest.mark.parametrize(
    "a, error",
    [
        (
            "openai:m",
            "dxi plan: error: --separate openai:m: names 2 models of this run (cold, warm); give "
            "its label\n",
        ),
        (
            "hot",
            "dxi plan: error: --separate hot: no model of this run is named so (its models: cold, "
            "warm)\n",
        ),
        (
            "warm",
            "dxi plan: error: --separate warm warm: both name warm; give two different models\n",
        ),
    ],
    ids=["several", "none", "same"],
)
def test_plan_separate_refuses_a_name_that_is_not_one_model(
    tmp_path: Path, a: str, error: str, capsys
):
    run_file = tmp_path / "two.toml"
    run_file.write_text(TWO)
    assert main(_plan(tmp_path, str(run_file), "--separate", a, "warm")) == 2
    assert capsys.readouterr() == ("", error)


def test_plan_help_lists_no_sending_option_and_refuses_one(capsys):
    """``dxi plan`` sends nothing: of the limits it takes only --price; a sending option is an
    unrecognized argument, worded as every usage error."""
    text = help_of("plan", capsys=capsys)
    assert "\nprices:\n  --price MODEL=IN/OUT[/CACHED]" in text
    for flag in (
        "--max-in-flight",
        "--rpm",
        "--tpm",
        "--timeout",
        "--max-attempts",
        "--backoff",
        "--max-cost",
        "--retry-failed",
        "--stream",
        "--option",
        "--batch",
        "--out",
    ):
        assert flag not in text, flag
    assert "--max-in-flight" in help_of("run", capsys=capsys)
    assert main(["plan", "--model", "embedded", "--precision", "5", "--max-in-flight", "4"]) == 2
    assert capsys.readouterr() == (
        "",
        "dxi plan: error: --max-in-flight is not an option of dxi plan (dxi run and dxi estimate "
        "take it)\nrun 'dxi plan --help' for the options\n",
    )


def test_a_refused_export_leaves_no_folder_behind(data_dir: Path, tmp_path: Path, capsys):
    """`dxi export` checks before scoring that TARGET can be written, but makes its folder only as
    it writes: an export refused (no cache; an evaluation selected without its data) leaves nothing
    behind (it left the empty folders a/b). One that writes makes them."""
    cache = tmp_path / "cache"
    folders = ["--data-dir", str(data_dir), "--cache-dir", str(cache)]
    targets = {"csv": tmp_path / "a" / "b" / "out.csv", "eee": tmp_path / "a" / "b" / "records"}

    def export(fmt: str, *more: str) -> int:
        return main(["export", "--format", fmt, str(targets[fmt]), *folders, "-q", *more])

    for fmt in targets:
        assert export(fmt) == EXIT_USAGE
        assert capsys.readouterr().err == (
            f"dxi export: error: no cache at {cache}: run `dxi run` first, or pass --cache-dir\n"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    run = ["run", "--model", "embedded", "--evals", "when2call", *folders, "-q"]
    assert main([*run, "--out", str(tmp_path / "out")]) == 0
    shutil.rmtree(data_dir / "hle")
    for fmt in targets:
        assert export(fmt) == EXIT_USAGE
        assert capsys.readouterr().err.startswith(
            "dxi export: error: no data for hle_multichoice, which the scoring selects"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "data", "out"]
    for fmt in targets:  # written: the folders made
        assert export(fmt, "--evals", "when2call") == 0
    capsys.readouterr()
    files = (p for p in (tmp_path / "a/b").rglob("*") if p.is_file())
    written = sorted(p.relative_to(tmp_path / "a/b") for p in files)
    model = Path("records/data/decision-index/embedded/sparrow-nano-general-v1.1")
    assert [p.parent for p in written] == [Path("."), model, model]  # out.csv, When2Call's two
    assert [p.suffix for p in written] == [".csv", ".json", ".jsonl"]


@pytest.mark.parametrize("command", ["score", "report"])
def test_a_refused_rescoring_leaves_no_out_folder_behind(
    command: str, data_dir: Path, tmp_path: Path, capsys
):
    """`dxi score` and `dxi report` check before scoring that --out can be written but make it only
    as they write: one refused (a model the cache does not hold; an evaluation selected without its
    data) leaves nothing behind (the first left the empty folders a/b); one that writes makes
    them."""
    cache, out = tmp_path / "cache", tmp_path / "a" / "b"
    folders = ["--data-dir", str(data_dir), "--cache-dir", str(cache)]
    run = ["run", "--model", "embedded", "--evals", "when2call", *folders, "-q"]
    assert main([*run, "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    nosuch = ["--model", "embedded:nosuch", "--evals", "when2call"]
    assert main([command, *folders, *nosuch, "--out", str(out), "-q"]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith(
        f"dxi {command}: error: embedded:nosuch: no such model"
    )
    shutil.rmtree(data_dir / "hle")
    assert main([command, *folders, "--out", str(out), "-q"]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith(
        f"dxi {command}: error: no data for hle_multichoice, which the scoring selects"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "data", "run"]
    assert main([command, *folders, "--out", str(out), "--evals", "when2call", "-q"]) == 0
    assert {"answers.parquet", "summary.json"} <= {p.name for p in out.iterdir()}


@pytest.mark.parametrize("command", ["run", "estimate"])
def test_a_selected_evaluation_without_data_is_refused_before_anything_is_sent(
    command: str, data_dir: Path, tmp_path: Path, capsys
):
    """A data folder without the AA-Omniscience-Decision file: `dxi run` selects all four by
    default, so it is refused (exit 2) naming the evaluation, the file looked for and the folder,
    and the --evals that runs the others; no cache, no summary.json (it wrote one marked complete
    and accepted, exit 0, with the index "not computed"). `dxi estimate` refuses as `dxi run`
    would."""
    shutil.rmtree(data_dir / "omniscience-standin")
    folders = ["--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
    argv = [command, "--model", "embedded", "--data-dir", str(data_dir), *folders]
    assert main(argv if command == "run" else argv[:-2]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"dxi {command}: error: no data for aa_omniscience_decision, which the run selects: no "
        f"AA-Omniscience-Decision file under {data_dir} (looked for omniscience*/*.jsonl, "
        "*omniscience*.jsonl, aa_omniscience*/*.jsonl). Nothing was sent (the Decision Index needs "
        "all four evaluations). Put the file there or name it (--data-dir DIR; --omniscience, "
        "--hle, --when2call or --wildguardtest FILE; `dxi data check` lists what is found); to run "
        "the others alone: --evals hle_multichoice,when2call,wildguardtest\n"
    )
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["run", "estimate"])
def test_the_one_evaluation_selected_without_data_is_named_though_the_others_are_there(
    command: str, data_dir: Path, tmp_path: Path, capsys
):
    """A folder holding the three others but no HLE file, `--evals hle_multichoice`: the same
    refusal as when all four are selected, naming HLE and the file looked for (it said "no
    evaluation data found in DIR", false: three are there); the generic message stays for a folder
    holding no evaluation at all."""
    shutil.rmtree(data_dir / "hle")
    folders = ["--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
    argv = [
        command,
        "--model",
        "embedded",
        "--data-dir",
        str(data_dir),
        "--evals",
        "hle_multichoice",
    ]
    assert main([*argv, *(folders if command == "run" else folders[:2])]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"dxi {command}: error: no data for hle_multichoice, which the run selects: no "
        f"HLE-MultiChoice file under {data_dir} (looked for hle/*.json, hle/*.jsonl, hle/*.parquet, "
        "hle*.json, hle*.jsonl, hle*.parquet). Nothing was sent. Put the file there or name it "
        "(--data-dir DIR; --omniscience, --hle, --when2call or --wildguardtest FILE; `dxi data "
        "check` lists what is found)\n"
    )
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    argv[4] = str(empty)
    assert main([*argv, *(folders if command == "run" else folders[:2])]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith(
        f"dxi {command}: error: no evaluation data found in {empty}.\n"
    )


@pytest.mark.slow
def test_the_evaluations_a_folder_holds_run_when_selected(data_dir: Path, tmp_path: Path, capsys):
    """The folder of the test above, the three others selected with --evals: the run goes on,
    exit 0, its summary of those three (the index not computed: it needs all four)."""
    shutil.rmtree(data_dir / "omniscience-standin")
    folders = ["--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
    argv = ["run", "--model", "embedded", "--data-dir", str(data_dir), *folders, "-q"]
    assert main([*argv, "--evals", "hle_multichoice,when2call,wildguardtest"]) == 0
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    assert (summary["complete"], summary["accepted"]) == (True, True)
    assert summary["data"]["aa_omniscience_decision"] == {"missing": "not selected (--evals)"}
    assert [m["evals"]["when2call"]["n"] for m in summary["models"]] == [3]


@pytest.mark.slow
def test_a_rescoring_with_an_evaluation_selected_without_data_is_refused_and_changes_nothing(
    data_dir: Path, tmp_path: Path, capsys, monkeypatch
):
    """A run of all four, then the HLE file gone: `dxi score`, `report`, `export` and `view` select
    all four by default, as `dxi run` does, and refuse as it does (exit 2, the same message); the
    earlier outputs in --out are left byte for byte, no export is written, nothing is served. They
    rewrote summary.json (exit 0) with HLE "not selected (--evals)" and the index "not computed".
    With --evals the three others are rescored."""
    assert (
        session.run(
            plan.build(
                models=["embedded"],
                data_dir=data_dir,
                cache_dir=tmp_path / "cache",
                out=tmp_path / "out",
            )
        ).exit_code
        == 0
    )
    out = tmp_path / "out"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    shutil.rmtree(data_dir / "hle")
    from dxi.view import app

    monkeypatch.setattr(app, "serve", lambda *args, **kwargs: None)  # reached: not refused
    folders = ["--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache")]
    refused = (
        "error: no data for hle_multichoice, which the scoring selects: no HLE-MultiChoice file "
        f"under {data_dir} (looked for hle/*.json, hle/*.jsonl, hle/*.parquet, hle*.json, "
        "hle*.jsonl, hle*.parquet). Nothing was scored or written (the Decision Index needs all "
        "four evaluations). Put the file there or name it (--data-dir DIR; --omniscience, --hle, "
        "--when2call or --wildguardtest FILE; `dxi data check` lists what is found); to score the "
        "others alone: "
        "--evals aa_omniscience_decision,when2call,wildguardtest\n"
    )
    capsys.readouterr()
    for argv in (
        ["score", "--out", str(out)],
        ["score", "--model", "embedded", "--out", str(out)],  # a plan's selection: the same
        ["report", "--out", str(out)],
        ["export", "--format", "csv", str(tmp_path / "answers.csv")],
        ["view", "--port", "0"],
    ):
        assert main([*argv, *folders]) == EXIT_USAGE, argv
        assert capsys.readouterr() == ("", f"dxi {argv[0]}: {refused}"), argv
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not (tmp_path / "answers.csv").exists()
    three = ["--evals", "aa_omniscience_decision,when2call,wildguardtest", "-q"]
    assert main(["score", "--out", str(tmp_path / "three"), *folders, *three]) == 0
    summary = orjson.loads((tmp_path / "three" / "summary.json").read_bytes())
    assert summary["data"]["hle_multichoice"] == {"missing": "not selected (--evals)"}
    assert [m["decision_index"] for m in summary["models"]] == [None]
