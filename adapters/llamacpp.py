"""A real local language model: a GGUF file served by llama.cpp (xllamacpp, the optional extra
``local-llm``) on a free 127.0.0.1 port for the duration of the run, in a child process.

Two adapters share the server (one per GGUF file in a run, started by the first ``start`` and
stopped by the last ``close``):

* ``llamacpp:NAME`` — structured outputs through the ``openai`` adapter (``response_format``
  json_schema, enforced by llama.cpp's grammar); default parameters ``temperature`` 0,
  ``max_tokens`` 256;
* ``llamacpp-logprobs:NAME`` — logprob decisions through the ``logprobs`` adapter.

``NAME`` is a known model of ``adapters.local_models`` (``qwen2.5-coder-0.5b``, fetched by
``make model`` / ``dxi fetch-model``) or the path of any ``.gguf`` file. The model's identity in the
cache key is the known name (its file pinned by sha256), or for a path the file's stem and the first
12 hex digits of its sha256; the endpoint in the key is ``/v1/chat/completions``, never the random
port.

Options (``--option KEY=VALUE``; they do not change the answers, so they are not in the cache key):
``ctx_size`` (tokens of context per request, default 16384: every prompt of the index fits, the
longest HLE one has about 12,300 tokens; a longer prompt fails with the server's 400, stored as a
deterministic failure), ``parallel`` (requests decoded together, default 1), ``threads`` (CPU
threads, default: all cores).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
import weakref
from pathlib import Path

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
    """One llama.cpp server for one GGUF file, in a child process (``python -m adapters.llamacpp``),
    shared by reference count.

    A child process because llama.cpp's in-process shutdown can hang (a race in xllamacpp's
    destructor, seen here about once in a dozen stops): the child leaves with ``os._exit`` when its
    stdin closes, so stopping never waits on it, and a runner killed outright closes that stdin too,
    so no server outlives its run.
    """

    def __init__(self, path: Path, alias: str, ctx_size: int, parallel: int, threads: int):
        self.path, self.alias, self.ctx_size, self.parallel, self.threads = (
            path,
            alias,
            ctx_size,
            parallel,
            threads,
        )
        self.users = 0
        self.url = ""
        self._proc: asyncio.subprocess.Process | None = None
        self._log = tempfile.TemporaryFile()

    async def start(self, label: str) -> str:
        """Start the child, wait for its address and for ``GET /health``; returns the base URL.
        Raises Fatal (with the end of the child's log) when it does not come up."""
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "dxi.adapters.llamacpp",
            str(self.path),
            self.alias,
            str(self.ctx_size),
            str(self.parallel),
            str(self.threads),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
            cwd=Path(__file__).resolve().parents[1],
        )
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), START_TIMEOUT_S)
        except TimeoutError:
            line = b""
        head, _, url = line.decode().strip().partition(" ")
        if head != "LISTENING" or not url:
            await self.stop(keep_log=True)
            self._log.seek(0)
            tail = self._log.read()[-1500:].decode("utf-8", "replace").strip()
            self._log.close()
            raise Fatal(f"{label}: the local llama.cpp server did not start: {tail or 'no output'}")
        self.url = url.rstrip("/")
        try:
            await _wait_healthy(self.url, label)
        except Fatal:
            await self.stop()
            raise
        return self.url

    async def stop(self, keep_log: bool = False) -> None:
        """Close the child's stdin (it exits at once); kill it if it has not gone within 10 s."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        if not keep_log:
            self._log.close()


def serve(path: str, alias: str, ctx_size: str, parallel: str, threads: str) -> None:
    """The child process: load the model, print ``LISTENING <url>``, serve until stdin closes, then
    leave at once without llama.cpp's shutdown (which can hang)."""
    signal.signal(
        signal.SIGINT, signal.SIG_IGN
    )  # Ctrl-C and SIGTERM are the parent's (a terminal or a scheduler
    signal.signal(
        signal.SIGTERM, signal.SIG_IGN
    )  # signals the whole group): it finishes its requests, closes our stdin
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = path
    params.model_alias = {alias}  # the name replies report, instead of the file's path
    params.n_ctx = int(ctx_size) * int(parallel)  # llama.cpp splits the context among the slots
    params.n_parallel = int(parallel)
    params.cpuparams.n_threads = int(threads)
    params.cpuparams_batch.n_threads = int(threads)
    params.hostnames = ["127.0.0.1"]
    params.port = 0
    params.warmup = False
    params.verbosity = -1
    try:
        server = xllamacpp.Server(params)
    except RuntimeError as exc:
        sys.exit(
            f"{exc} (is {path} a GGUF model llama.cpp can load, with {ctx_size} tokens of context?)"
        )
    print("LISTENING", server.listening_address, flush=True)
    sys.stdin.buffer.read()
    os._exit(0)


_servers: dict[Path, _Server] = {}
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


def _lock() -> asyncio.Lock:
    """The lock guarding ``_servers`` for the running event loop."""
    return _locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())


class _Local:
    """What both local adapters add to their HTTP adapter: the model file and the shared server."""

    OPTIONS = frozenset({"ctx_size", "parallel", "threads"})
    api_key_env = ""
    free = True  # on this machine: nothing is billed
    fixed_endpoint = True  # ``endpoint``: the cache key's, never the random port
    EFFORT_FIELD = ""  # the local models do not reason: no effort setting (--effort is refused, naming the adapter)

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
            raise ValueError(
                f"{spec.kind}: unknown local model {name!r}; use one of {', '.join(local_models.KNOWN)} "
                f"or the path of a .gguf file"
            )
        opts = spec.options
        try:
            self.ctx_size = int(opts.get("ctx_size", DEFAULT_CTX))
            self.parallel = int(opts.get("parallel", DEFAULT_PARALLEL))
            self.threads = int(opts.get("threads", os.cpu_count() or 1))
        except (TypeError, ValueError):
            raise ValueError(
                f"{spec.kind}: ctx_size, parallel and threads must be integers"
            ) from None
        if min(self.ctx_size, self.parallel, self.threads) < 1:
            raise ValueError(f"{spec.kind}: ctx_size, parallel and threads must be at least 1")
        super().__init__(
            spec,
            limits or Limits(max_in_flight=self.parallel, attempt_timeout_s=600.0, max_attempts=2),
        )
        self.base_url = ""
        self._server: _Server | None = None

    @property
    def endpoint(self) -> str:
        return ENDPOINT

    @property
    def url(self) -> str:
        return self.base_url + "/chat/completions"

    @property
    def limits_key(self) -> str:
        return f"llamacpp:{self.model}"

    async def start(self) -> None:
        try:
            import xllamacpp  # noqa: F401
        except ImportError:
            raise Fatal(
                f"{self.label}: xllamacpp is not installed; install the extra: "
                "pip install -e '.[local-llm]' (or make install-llm)"
            ) from None
        if not self.file.is_file():
            raise Fatal(
                f"{self.label}: model file {self.file} not found; fetch it with `make model` "
                f"(or `dxi fetch-model {self.spec.model}`)"
            )
        if self.known is not None and self.file.stat().st_size != self.known.size:
            raise Fatal(
                f"{self.label}: {self.file} has {self.file.stat().st_size:,} bytes, expected "
                f"{self.known.size:,}; delete it and run `make model` again"
            )
        async with _lock():
            server = _servers.get(self.file)
            if server is None:
                server = _Server(self.file, self.model, self.ctx_size, self.parallel, self.threads)
                await server.start(self.label)
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
                await server.stop()


async def _wait_healthy(url: str, label: str) -> None:
    """Wait until the server answers ``GET /health`` with 200 (its loop is running); Fatal after a
    while."""
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
    """A local GGUF model answering with structured outputs (JSON Schema enforced by llama.cpp's
    grammar)."""

    kind = "llamacpp"
    DEFAULT_PARAMS = {"temperature": 0, "max_tokens": 256}


class LlamaCppLogprobs(_Local, Logprobs):
    """A local GGUF model as a decision model, from its first-token logprobs."""

    kind = "llamacpp-logprobs"
    default_base_url = (
        ""  # the local server's, set at start: never OpenAI's (whose cap is max_completion_tokens)
    )


if __name__ == "__main__":
    serve(*sys.argv[1:])
