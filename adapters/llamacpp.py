"""A real local language model: a GGUF file served by llama.cpp (xllamacpp, the optional extra
``local-llm``) on a free 127.0.0.1 port for the duration of the run.

Two adapters share the server (one per GGUF file in a process, started by the first ``start`` and stopped
by the last ``close``):

* ``llamacpp:NAME`` — structured outputs through the ``openai`` adapter (``response_format`` json_schema,
  enforced by llama.cpp's grammar); default parameters ``temperature`` 0, ``max_tokens`` 256;
* ``llamacpp-logprobs:NAME`` — logprob decisions through the ``logprobs`` adapter.

``NAME`` is a known model of ``adapters.local_models`` (``qwen2.5-coder-0.5b``, fetched by ``make model`` /
``dxi fetch-model``) or the path of any ``.gguf`` file. The model's identity in the cache key is the known
name (its file pinned by sha256), or for a path the file's stem and the first 12 hex digits of its sha256;
the endpoint in the key is ``/v1/chat/completions``, never the random port.

Options (``--option KEY=VALUE``; they do not change the answers, so they are not in the cache key):
``ctx_size`` (tokens of context per request, default 16384: every prompt of the index fits, the longest
HLE one has about 12,300 tokens; a longer prompt fails with the server's 400, stored as a deterministic
failure), ``parallel`` (requests decoded together, default 1), ``threads``
(CPU threads, default: all cores).
"""
from __future__ import annotations

import asyncio
import os
import time
import weakref
from pathlib import Path
from typing import Any

import aiohttp

from . import local_models
from .base import Limits, ModelSpec
from .errors import Fatal
from .logprobs import Logprobs
from .openai import OpenAI

ENDPOINT = "/v1/chat/completions"
DEFAULT_CTX, DEFAULT_PARALLEL = 16384, 1
START_TIMEOUT_S = 120.0


class _Server:
    """One xllamacpp server for one GGUF file, shared by reference count."""

    def __init__(self, path: Path, alias: str, ctx_size: int, parallel: int, threads: int):
        self.path, self.alias, self.ctx_size, self.parallel, self.threads = path, alias, ctx_size, parallel, threads
        self.users = 0
        self.url = ""
        self._server: Any = None

    def start(self) -> str:
        """Load the model and listen on a free loopback port (blocking: seconds); returns the base URL."""
        import xllamacpp

        params = xllamacpp.CommonParams()
        params.model.path = str(self.path)
        params.model_alias = {self.alias}  # the name replies report, instead of the file's path
        params.n_ctx = self.ctx_size * self.parallel  # llama.cpp splits the context among the slots
        params.n_parallel = self.parallel
        params.cpuparams.n_threads = self.threads
        params.cpuparams_batch.n_threads = self.threads
        params.hostnames = ["127.0.0.1"]
        params.port = 0
        params.warmup = False
        params.verbosity = -1
        self._server = xllamacpp.Server(params)
        self.url = self._server.listening_address.rstrip("/")
        return self.url

    def stop(self) -> None:
        """Stop the server (blocking until its loop has exited)."""
        self._server = None


_servers: dict[Path, _Server] = {}
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


def _lock() -> asyncio.Lock:
    """The lock guarding ``_servers`` for the running event loop."""
    return _locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())


class _Local:
    """What both local adapters add to their HTTP adapter: the model file and the shared server."""

    OPTIONS = frozenset({"ctx_size", "parallel", "threads"})
    api_key_env = ""

    def __init__(self, spec: ModelSpec, limits: Limits | None = None):
        name = spec.model or ""
        if name in local_models.KNOWN:
            self.file = local_models.models_dir() / local_models.KNOWN[name].filename
            self.known: local_models.ModelFile | None = local_models.KNOWN[name]
        elif name.endswith(".gguf"):
            self.file = Path(name).expanduser().resolve()
            if not self.file.is_file():
                raise ValueError(f"{spec.kind}: no GGUF file at {self.file}")
            spec.model = f"{self.file.stem}@{local_models.sha256_of(self.file)[:12]}"
            self.known = None
        else:
            raise ValueError(f"{spec.kind}: unknown local model {name!r}; use one of {', '.join(local_models.KNOWN)} "
                             f"or the path of a .gguf file")
        opts = spec.options
        try:
            self.ctx_size = int(opts.get("ctx_size", DEFAULT_CTX))
            self.parallel = int(opts.get("parallel", DEFAULT_PARALLEL))
            self.threads = int(opts.get("threads", os.cpu_count() or 1))
        except (TypeError, ValueError):
            raise ValueError(f"{spec.kind}: ctx_size, parallel and threads must be integers") from None
        if min(self.ctx_size, self.parallel, self.threads) < 1:
            raise ValueError(f"{spec.kind}: ctx_size, parallel and threads must be at least 1")
        super().__init__(spec, limits or Limits(max_in_flight=self.parallel, attempt_timeout_s=600.0, max_attempts=2))
        self.base_url = ""
        self._server: _Server | None = None

    @property
    def endpoint(self) -> str:
        return ENDPOINT

    @property
    def url(self) -> str:
        return self.base_url + "/chat/completions"

    @property
    def provider(self) -> str:
        return f"llamacpp:{self.model}"

    async def start(self) -> None:
        try:
            import xllamacpp  # noqa: F401
        except ImportError:
            raise Fatal(f"{self.label}: xllamacpp is not installed; install the extra: "
                        "pip install -e '.[local-llm]' (or make install-llm)") from None
        if not self.file.is_file():
            raise Fatal(f"{self.label}: model file {self.file} not found; fetch it with `make model` "
                        f"(or `dxi fetch-model {self.spec.model}`)")
        if self.known is not None and self.file.stat().st_size != self.known.size:
            raise Fatal(f"{self.label}: {self.file} has {self.file.stat().st_size:,} bytes, expected "
                        f"{self.known.size:,}; delete it and run `make model` again")
        async with _lock():
            server = _servers.get(self.file)
            if server is None:
                server = _Server(self.file, self.model, self.ctx_size, self.parallel, self.threads)
                await asyncio.get_running_loop().run_in_executor(None, server.start)
                await _wait_healthy(server.url, self.label)
                _servers[self.file] = server
            server.users += 1
        self._server = server
        self.base_url = server.url + "/v1"
        await super().start()

    async def close(self) -> None:
        await super().close()
        server, self._server = self._server, None
        if server is None:
            return
        async with _lock():
            server.users -= 1
            if server.users == 0:
                _servers.pop(server.path, None)
                await asyncio.get_running_loop().run_in_executor(None, server.stop)


async def _wait_healthy(url: str, label: str) -> None:
    """Wait until the server answers ``GET /health`` with 200 (its loop is running); Fatal after a while."""
    deadline = time.monotonic() + START_TIMEOUT_S
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as client:
        while True:
            try:
                async with client.get(url + "/health") as resp:
                    if resp.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise Fatal(f"{label}: the local llama.cpp server at {url} did not become healthy")
            await asyncio.sleep(0.1)


class LlamaCpp(_Local, OpenAI):
    """A local GGUF model answering with structured outputs (JSON Schema enforced by llama.cpp's grammar)."""

    kind = "llamacpp"
    DEFAULT_PARAMS = {"temperature": 0, "max_tokens": 256}


class LlamaCppLogprobs(_Local, Logprobs):
    """A local GGUF model as a decision model, from its first-token logprobs."""

    kind = "llamacpp-logprobs"
