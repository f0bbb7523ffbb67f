"""An unexpected error (a bug in dxi, or a failure nothing anticipated): one line for the user, the
full trace in a file, exit code 70 (``runner.errors.EXIT_SOFTWARE``, sysexits' ``EX_SOFTWARE``).
Exit code 1 keeps its one meaning, "done, but provisional".

The file (``dxi-crash-YYYYmmddTHHMMSSZ-PID.txt`` in the temporary folder, ``tempfile.gettempdir()``:
the cache folder may be what failed) holds the command line, the versions and the traceback, with
secrets redacted as a provider's echoed key is (``adapters.http.redact``): the values of environment
variables whose names hold KEY, TOKEN, SECRET, PASSWORD or CREDENTIAL, the password of a URL
(``redis://:PASSWORD@host``), a bearer token and an ``sk-`` key. When the redaction cannot be done,
no file is written and the line says so.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

from dxi.shown import shown

_SECRET_NAMES = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_SECRET_PATTERNS = (
    re.compile(rb"(?<=://)[^/@\s:]*:[^/@\s]+(?=@)"),  # user:password@ of a URL
    re.compile(rb"(?i)(?<=bearer )[A-Za-z0-9._~+/=-]{6,}"),
    re.compile(rb"\bsk-[A-Za-z0-9_-]{8,}"),
)
_PACKAGE = Path(__file__).resolve().parents[1]  # the folder dxi's modules are installed under


def secrets(env: dict[str, str] | None = None) -> tuple[bytes, ...]:
    """The values (as bytes, at least 6 characters: never a word) of the environment variables whose
    names say they hold a secret, longest first."""
    env = dict(os.environ) if env is None else env
    found = {v.encode() for k, v in env.items() if _SECRET_NAMES.search(k) and len(v.strip()) >= 6}
    return tuple(sorted(found, key=len, reverse=True))


def redacted(text: str, env: dict[str, str] | None = None) -> str:
    """``text`` with the secrets of ``env`` (default ``os.environ``) and of the patterns above
    replaced by ``[REDACTED]``. ImportError when ``adapters.http`` cannot be imported (the caller
    then writes nothing)."""
    from dxi.adapters.http import REDACTED, redact

    data = redact(text.encode("utf-8", "replace"), secrets(env))
    for pattern in _SECRET_PATTERNS:
        data = pattern.sub(REDACTED, data)
    return data.decode("utf-8", "replace")


def where(exc: BaseException) -> str:
    """Where ``exc`` was raised, as ``runner/outputs/files.py:60 (score_all)``: the innermost frame
    of dxi's own code (else the innermost frame), its path relative to the package."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place"
    ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(_PACKAGE)]
    frame = (ours or frames)[-1]
    path = Path(frame.filename).resolve()
    shown = path.relative_to(_PACKAGE) if path.is_relative_to(_PACKAGE) else path
    return f"{shown}:{frame.lineno} ({frame.name})"


def report(exc: BaseException, argv: list[str] | None = None, folder: Path | None = None) -> str:
    """Write ``exc``'s full trace (with the command line ``argv`` and the versions, redacted) to a
    new file in ``folder`` (default: the temporary folder) and return the one line to print, e.g.
    ``unexpected error: NotADirectoryError: [Errno 20] Not a directory: 'a/b' at
    runner/outputs/files.py:60 (score_all); the full trace is in
    /tmp/dxi-crash-20261203T190000Z-4242.txt. This is a bug in dxi: please report it with that
    file.`` Never raises."""
    argv = sys.argv if argv is None else argv
    what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    try:
        what = redacted(what)
    except Exception:  # noqa: BLE001 (the message itself is then left out: it might hold a secret)
        what = type(exc).__name__
    what = shown(" ".join(what.split()))  # one line, no control character (``dxi.shown``)
    head = f"unexpected error: {what[:300]}{'...' if len(what) > 300 else ''} at {where(exc)}"
    try:
        from importlib.metadata import version

        try:
            release = version("decision-index")
        except Exception:  # noqa: BLE001
            release = "unknown"
        body = (
            f"dxi {release}, Python {sys.version.split()[0]} on {sys.platform}\n"
            f"command: {' '.join(argv)}\ncwd: {os.getcwd()}\n\n"
            + "".join(traceback.format_exception(exc))
        )
        body = redacted(body)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = Path(folder or tempfile.gettempdir()) / f"dxi-crash-{stamp}-{os.getpid()}.txt"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # only its owner reads it
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body)
    except Exception as failed:  # noqa: BLE001 (the one line still goes out)
        return f"{head}; the full trace could not be written ({type(failed).__name__}: {failed})."
    return (
        f"{head}; the full trace is in {path}. This is a bug in dxi: please report it with that "
        "file."
    )
