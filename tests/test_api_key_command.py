"""Expiring credentials (``api_key_command``): a command whose output is the key or bearer token,
run again before the token's stated expiry and after a 401, so an overnight run does not die with
its first token; the token reaches the server's header and nothing else (cache, summary, terminal,
error texts)."""

from __future__ import annotations

import asyncio
import calendar
import sys
import time
from pathlib import Path

import orjson
import pytest

from dxi import adapters
from dxi.adapters import Fatal, ModelSpec
from dxi.adapters.credentials import KeyCommand, parse_output
from dxi.runner.cli import main
from dxi.runner.errors import EXIT_PROVIDER_STOPPED, EXIT_USAGE, UsageError
from dxi.runner.planning.plan import from_args

from .fakes.fake_llm_server import FakeLLM

SECRET = "s3cr3t-token-value"


def token_script(tmp_path: Path, body: str) -> list[str]:
    """A command (argument vector) running ``body`` as a Python script; ``n`` is its run count (1,
    2, ...), kept in a file beside it."""
    count, script = tmp_path / "runs", tmp_path / "token.py"
    script.write_text(
        f"import json, pathlib, sys\ncount = pathlib.Path({str(count)!r})\n"
        "n = int(count.read_text()) + 1 if count.exists() else 1\ncount.write_text(str(n))\n" + body
    )
    return [sys.executable, str(script)]


def runs(tmp_path: Path) -> int:
    return int((tmp_path / "runs").read_text()) if (tmp_path / "runs").exists() else 0


def test_the_commands_output_is_read_as_documented():
    now = 1_800_000_000.0
    assert parse_output("  ya29.token\n", now) == ("ya29.token", None)
    assert parse_output('{"accessToken": "t", "expires_on": 1800003600}', now) == (
        "t",
        1800003600.0,
    )
    assert parse_output('{"access_token": "t", "expires_in": 3599}', now) == ("t", now + 3599)
    local = time.mktime(
        (2027, 1, 15, 9, 30, 0, 0, 0, -1)
    )  # az prints expiresOn in local time, without a zone
    assert parse_output('{"accessToken": "t", "expiresOn": "2027-01-15 09:30:00.000000"}', now) == (
        "t",
        local,
    )
    assert parse_output('{"token": "t", "expiry": "2027-01-15T09:30:00Z"}', now)[
        1
    ] == calendar.timegm((2027, 1, 15, 9, 30, 0))
    for bad, why in (
        ("", "it printed nothing"),
        ("a\nb", "more than one line"),
        ('{"x": 1}', "has no token"),
        (f'{{"token": {SECRET!r}', "not JSON"),
    ):
        with pytest.raises(ValueError, match=why) as caught:
            parse_output(bad, now)
        assert SECRET not in str(caught.value)


@pytest.mark.process
async def test_the_token_is_renewed_before_its_stated_expiry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    command = KeyCommand(
        token_script(
            tmp_path, 'print(json.dumps({"access_token": f"tok-{n}", "expires_in": 3600}))'
        ),
        "m",
    )
    clock = [1_800_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    assert await command.token() == "tok-1"
    clock[0] += 3600 - 301  # more than five minutes left: the same token
    assert await command.token() == "tok-1" and runs(tmp_path) == 1
    clock[0] += 2  # within five minutes of its expiry: run again
    assert await command.token() == "tok-2" and runs(tmp_path) == 2
    # after a 401 met with tok-2 it runs again, once however many requests met it
    assert await asyncio.gather(command.refresh("tok-2"), command.refresh("tok-2")) == [
        "tok-3",
        "tok-3",
    ]
    assert command.secrets == (b"tok-1", b"tok-2", b"tok-3")


@pytest.mark.process
async def test_a_failing_command_names_its_status_never_its_output_nor_its_stderr(tmp_path: Path):
    """A failing command's standard error was quoted (trial 9: ``echo sk-... >&2; exit 3`` printed
    the key): neither its output nor its standard error is shown, only its name and status."""
    command = KeyCommand(
        token_script(
            tmp_path,
            f"print({SECRET!r})\nprint('not logged in', {SECRET!r}, file=sys.stderr)\nsys.exit(3)\n",
        ),
        "openai:m",
    )
    with pytest.raises(Fatal) as caught:
        await command.token()
    assert str(caught.value) == (
        f"openai:m: api_key_command ({Path(sys.executable).name}) exited with status 3 (its "
        "standard error is not shown: it could hold the key; run the command yourself to see why)"
    )
    with pytest.raises(ValueError, match="api_key_command is empty"):
        KeyCommand("  ", "m")


@pytest.mark.process
@pytest.mark.parametrize("stream", ["auto", "always"])  # always: renewed for streamed requests too
async def test_a_401_renews_the_token_and_the_run_goes_on_with_it_nowhere_but_the_header(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, stream: str
):
    command = token_script(tmp_path, f'print(json.dumps({{"accessToken": f"tok-{{n}}-{SECRET}"}}))')
    accepted: list[str] = []
    valid = {"token": f"tok-1-{SECRET}"}

    def auth(headers: dict[str, str]) -> bool:
        token = headers.get("Authorization", "").removeprefix("Bearer ")
        if token != valid["token"]:
            return False
        accepted.append(token)
        if len(accepted) == 3:  # the provider lets the first token expire after three requests
            valid["token"] = f"tok-2-{SECRET}"
        return True

    out, cache = tmp_path / "out", tmp_path / "c"
    run = tmp_path / "run.toml"
    async with FakeLLM(auth=auth) as server:
        run.write_text(
            f'[providers.vertex]\nkind = "openai"\nbase_url = "https://vertex.example.test/v1"\n'
            f"api_key_command = {orjson.dumps(command).decode()}\n\n"
            '[[models]]\nprovider = "vertex"\nmodel = "gpt-fake"\n'
        )
        text = run.read_text().replace("https://vertex.example.test/v1", f"{server.url}/v1")
        run.write_text(text)
        args = [
            "run",
            str(run),
            "--data-dir",
            str(data_dir),
            "--cache-dir",
            str(cache),
            "--out",
            str(out),
            "--max-in-flight",
            "1",
            "--stream",
            stream,
        ]
        code = await asyncio.to_thread(main, args)
        sent = [h["Authorization"] for h in server.headers]
        assert set(server.streamed) == {stream == "always"}  # (the refused request is not answered)
    captured = capsys.readouterr()
    n = len(accepted)
    assert code == 0 and runs(tmp_path) == 2
    assert sent == [f"Bearer tok-1-{SECRET}"] * 4 + [f"Bearer tok-2-{SECRET}"] * (
        n - 3
    )  # one 401, then the new token
    assert orjson.loads((out / "summary.json").read_bytes())["models"][0]["requests"]["failed"] == 0
    _nowhere(SECRET, [cache, out], captured.out + captured.err)


@pytest.mark.process
async def test_a_token_refused_again_stops_the_provider_and_its_echo_is_redacted(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    command = token_script(tmp_path, f"print('tok-{SECRET}')\n")
    out, cache = tmp_path / "out", tmp_path / "c"
    async with FakeLLM(
        auth=lambda headers: False
    ) as server:  # every token refused, and echoed in the 401
        code = await asyncio.to_thread(
            main,
            [
                "run",
                "--model",
                f"openai:gpt-fake@{server.url}/v1",
                "--option",
                f"api_key_command={' '.join(command)}",
                "--data-dir",
                str(data_dir),
                "--cache-dir",
                str(cache),
                "--out",
                str(out),
                "--max-in-flight",
                "1",
            ],
        )
        assert (
            len(server.requests) == 2
        )  # the 401, the command run again, the same token refused: stopped
    captured = capsys.readouterr()
    summary = orjson.loads((out / "summary.json").read_bytes())
    (block,) = summary["stopped_providers"]
    assert (
        code == EXIT_PROVIDER_STOPPED
        and block["cause"] == "API key refused"
        and runs(tmp_path) == 2
    )
    assert "Incorrect API key provided: [REDACTED]" in block["message"]
    _nowhere(SECRET, [cache, out], captured.out + captured.err + block["message"])


def _nowhere(secret: str, folders: list[Path], text: str) -> None:
    """``secret`` in no file under ``folders`` (the cache, summary.json, answers.parquet) and not in
    ``text``."""
    files = [p for folder in folders for p in folder.rglob("*") if p.is_file()]
    assert files and not [p for p in files if secret.encode() in p.read_bytes()]
    assert secret not in text


@pytest.mark.process
async def test_a_command_that_fails_at_the_start_is_a_usage_error(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
):
    command = token_script(
        tmp_path,
        f"print({SECRET!r})\nprint('run gcloud auth login', {SECRET!r}, file=sys.stderr)\n"
        "sys.exit(1)\n",
    )
    async with FakeLLM() as server:
        code = await asyncio.to_thread(
            main,
            [
                "run",
                "--model",
                f"openai:gpt-fake@{server.url}/v1",
                "--option",
                f"api_key_command={' '.join(command)}",
                "--data-dir",
                str(data_dir),
                "--cache-dir",
                str(tmp_path / "c"),
                "--out",
                str(tmp_path / "o"),
            ],
        )
        assert server.requests == []
    err = capsys.readouterr().err
    assert (
        code == EXIT_USAGE
        and "api_key_command (python" in err
        and "exited with status 1 (its standard error is not shown: it could hold the key; run "
        "the command yourself to see why)"
        in err
    )
    assert SECRET not in err


def test_api_key_command_in_a_run_file(data_dir: Path, tmp_path: Path):
    from dxi.runner.cli import parser

    run = tmp_path / "run.toml"
    run.write_text(
        '[providers.azure]\nkind = "openai"\nbase_url = "https://dxi.openai.azure.com/openai/v1"\n'
        'api_key_command = "az account get-access-token --resource https://cognitiveservices.azure.com"\n\n'
        '[[models]]\nprovider = "azure"\nmodel = "gpt-6-luna"\n'
    )
    (m,) = from_args(parser().parse_args(["run", str(run), "--data-dir", str(data_dir)])).models
    assert (
        m.adapter.key_command.command.startswith("az account") and m.adapter.missing_setup() is None
    )
    assert "api_key_command" not in m.adapter.params_key and m.adapter.key_command.shown == "az"
    run.write_text(
        run.read_text().replace('kind = "openai"\n', 'kind = "openai"\napi_key_env = "K"\n')
    )
    with pytest.raises(UsageError, match="api_key_env and api_key_command do not combine"):
        from_args(parser().parse_args(["run", str(run), "--data-dir", str(data_dir)]))
    assert (
        adapters.get(
            ModelSpec(
                "gemini", "g", options={"api_key_command": ["gcloud", "auth", "print-access-token"]}
            )
        ).key_command.shown
        == "gcloud"
    )
