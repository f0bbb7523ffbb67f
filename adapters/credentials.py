"""Expiring credentials: a command whose standard output is the API key or bearer token (a run
file's ``api_key_command``, or ``--option api_key_command=...``), run again before the token's
stated expiry and after a 401, so that an overnight run against an endpoint whose tokens last an
hour (Vertex AI's OpenAI-compatible endpoint: ``gcloud auth print-access-token``; Azure OpenAI with
Entra ID: ``az account get-access-token --resource https://cognitiveservices.azure.com``) does not
stop when the first one expires.

What the command prints (standard output, UTF-8):

* the token alone, on one line (``gcloud auth print-access-token``): no stated expiry, so it is run
  again only after a 401;
* or a JSON object with the token in ``accessToken`` / ``access_token`` / ``token`` / ``api_key``
  and its expiry in ``expires_on`` / ``expiresOn`` / ``expires_at`` / ``expiry`` / ``expire_time`` /
  ``expiration`` (Unix seconds, ISO 8601, or ``YYYY-MM-DD HH:MM:SS[.ffffff]`` local time as ``az``
  prints ``expiresOn``) or ``expires_in`` (seconds from now): run again ``margin`` seconds before
  the expiry (five minutes, or half the token's lifetime when that is shorter).

A string command runs in the shell (``/bin/sh -c``: pipes such as ``az ... | jq -r .accessToken``
work); a list is the argument vector itself (no shell). The token lives in memory only: it is sent
in the request's header and nowhere else; the command's standard output is never quoted, and every
token it ever gave is in ``secrets`` for the HTTP layer to redact from what a provider echoes. A
failing command (non-zero exit, no output, more than ``timeout_s`` seconds) raises ``Fatal`` naming
the command and its exit status, never what it wrote: its standard error is not read (``DEVNULL``),
since a command that fails may print the key there (``echo $KEY >&2; exit 3``), which no
redaction of the tokens it gave before can know (``FAILED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from datetime import datetime
from typing import Any

import orjson

from .errors import Fatal

FAILED = (
    "(its standard error is not shown: it could hold the key; run the command yourself to see why)"
)
"""What the error of a failing ``api_key_command`` says instead of the command's standard error."""
TOKEN_KEYS = ("accessToken", "access_token", "token", "api_key")
EXPIRY_KEYS = ("expires_on", "expiresOn", "expires_at", "expiry", "expire_time", "expiration")
MARGIN_S = 300.0
TIMEOUT_S = 60.0


def _when(value: Any, now: float) -> float | None:
    """Unix seconds of an expiry value: a number (Unix seconds; milliseconds when it is that large),
    or a date and time (ISO 8601 with or without a zone; without one, local time, as ``az`` prints
    it)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) or (
        isinstance(value, str) and value.strip().replace(".", "", 1).isdigit()
    ):
        number = float(value)
        if not math.isfinite(number):
            return None
        return number / 1000 if number > 1e11 else number
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            return (
                when.timestamp() if when.tzinfo else when.astimezone().timestamp()
            )  # naive: local time
    return None


def parse_output(text: str, now: float) -> tuple[str, float | None]:
    """``(token, expires_at)`` from the command's standard output (see the module docstring);
    ``expires_at`` is Unix seconds, None when the output states none. Raises ValueError (never
    quoting the output) when it holds no token."""
    text = text.strip()
    if text.startswith("{"):
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise ValueError("its output starts with '{' but is not JSON") from None
        token = next(
            (doc[k] for k in TOKEN_KEYS if isinstance(doc.get(k), str) and doc[k].strip()), None
        )
        if token is None:
            raise ValueError(f"its JSON output has no token ({', '.join(TOKEN_KEYS)})")
        expires = next(
            (w for k in EXPIRY_KEYS if k in doc and (w := _when(doc[k], now)) is not None), None
        )
        if (
            expires is None
            and isinstance(doc.get("expires_in"), (int, float))
            and not isinstance(doc["expires_in"], bool)
        ):
            expires = now + float(doc["expires_in"])
        return token.strip(), expires
    if not text:
        raise ValueError("it printed nothing")
    if len(text.splitlines()) > 1:
        raise ValueError(
            "it printed more than one line (the token alone, or a JSON object, is expected)"
        )
    return text, None


class KeyCommand:
    """The current token of an ``api_key_command`` (see the module docstring). ``what`` names the
    model in messages. ``token()`` is the token to send (the command runs on first use and again
    once the stated expiry is within the margin); ``refresh(stale)`` runs it again after a 401 met
    with ``stale`` (once, however many requests met it). One run of the command at a time."""

    def __init__(
        self,
        command: str | list[str],
        what: str,
        timeout_s: float = TIMEOUT_S,
        margin_s: float = MARGIN_S,
    ):
        if isinstance(command, list) and (
            not command or not all(isinstance(a, str) for a in command)
        ):
            raise ValueError(
                f"{what}: api_key_command must be a command line (text) or a non-empty list of arguments"
            )
        if isinstance(command, str) and not command.strip():
            raise ValueError(f"{what}: api_key_command is empty")
        if not isinstance(command, (str, list)):
            raise ValueError(
                f"{what}: api_key_command must be a command line (text) or a list of arguments"
            )
        self.command, self.what, self.timeout_s, self.margin_s = command, what, timeout_s, margin_s
        self.runs = 0
        self._token: str | None = None
        self._expires: float | None = None
        self._issued = 0.0
        self._lock = asyncio.Lock()
        self._secrets: list[bytes] = []

    @property
    def secrets(self) -> tuple[bytes, ...]:
        """Every token the command gave (UTF-8), for redaction."""
        return tuple(self._secrets)

    @property
    def shown(self) -> str:
        """The command as messages show it (the program's name only: arguments could hold a
        secret)."""
        first = self.command.split()[0] if isinstance(self.command, str) else self.command[0]
        return os.path.basename(first)

    def _fresh(self, now: float) -> bool:
        if self._token is None:
            return False
        if self._expires is None:
            return True
        margin = min(self.margin_s, max(0.0, self._expires - self._issued) / 2)
        return now < self._expires - margin

    async def token(self) -> str:
        """The token to send now."""
        if self._fresh(time.time()):
            return self._token  # type: ignore[return-value]
        async with self._lock:
            if not self._fresh(time.time()):
                await self._run()
            return self._token  # type: ignore[return-value]

    async def refresh(self, stale: str) -> str:
        """A new token after a 401 met with ``stale`` (the command runs again unless another
        request's 401 already renewed it)."""
        async with self._lock:
            if self._token == stale:
                await self._run()
            return self._token  # type: ignore[return-value]

    async def _run(self) -> None:
        self.runs += 1
        now = time.time()
        try:
            if isinstance(self.command, str):
                proc = await asyncio.create_subprocess_shell(
                    self.command,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.DEVNULL,
                )
            else:
                proc = await asyncio.create_subprocess_exec(
                    *self.command,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.DEVNULL,
                )
        except OSError as exc:
            raise Fatal(
                f"{self.what}: api_key_command ({self.shown}) could not start: {exc.strerror or exc}"
            ) from None
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise Fatal(
                f"{self.what}: api_key_command ({self.shown}) gave no token within {self.timeout_s:g} s"
            ) from None
        if proc.returncode != 0:
            raise Fatal(
                f"{self.what}: api_key_command ({self.shown}) exited with status {proc.returncode}"
                f" {FAILED}"
            )
        try:
            token, expires = parse_output(out.decode("utf-8", "replace"), now)
        except ValueError as exc:
            raise Fatal(
                f"{self.what}: api_key_command ({self.shown}) gave no usable token: {exc}"
            ) from None
        self._token, self._expires, self._issued = token, expires, now
        if token.encode() not in self._secrets:
            self._secrets.append(token.encode())
