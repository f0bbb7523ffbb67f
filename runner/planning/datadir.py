"""Where the evaluation data is when no ``--data-dir`` is given (light: the command line's help
reads it)."""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "DXI_DATA_DIR"
DEFAULT_DATA_DIRS = (Path("data"), Path("..") / "shared" / "data")
DEFAULT_DATA_DIRS_TEXT = "./data, else ../shared/data, whichever exists"


def default_data_dir() -> Path | None:
    """The data folder when neither ``--data-dir`` nor a run file names one: ``$DXI_DATA_DIR``, else
    the first of ``DEFAULT_DATA_DIRS`` (relative to the current folder) that exists, else None."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    return next((d for d in DEFAULT_DATA_DIRS if d.is_dir()), None)
