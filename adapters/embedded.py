"""The embedded decision model: sparrow-decider in-process, no key, no network.

``embedded:sparrow-nano-general-v1.1`` (the default; ``embedded`` alone means it) or any other model
``sparrow_decider.available_models()`` lists (``sparrow-nano-robot-v1.2``). Requests are System One
bodies (the same bytes as ``systemone``), answered by ``Decider.ask`` in a pool of worker processes,
one per core (sparrow's tokenizer is pure Python, so threads would share one core), so the event
loop never blocks. The reply is the System One JSON a ``sparrow-decider serve`` would return,
decoded and validated by the same code as the HTTP adapter. What a worker runs is
``dxi.embedded_worker`` (outside this package, so that a worker does not import aiohttp).
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ProcessPoolExecutor

from dxi import embedded_worker

from .base import Limits, ModelSpec, Request
from .errors import Fatal
from .systemone import ENDPOINT, SystemOne

DEFAULT_MODEL = "sparrow-nano-general-v1.1"
WORKERS = max(1, os.cpu_count() or 1)


class Embedded(SystemOne):
    """sparrow-decider in worker processes. ``start`` raises Fatal for an unknown model, listing the
    known."""

    kind = "embedded"
    own_timeout = False  # no session: the runner times each attempt
    free = True  # in-process: nothing is billed
    fixed_endpoint = True  # ``endpoint``: the cache key's, no server

    def __init__(self, spec: ModelSpec, limits: Limits | None = None):
        spec.model = spec.model or DEFAULT_MODEL
        super().__init__(spec, limits)
        self._pool: ProcessPoolExecutor | None = None

    @classmethod
    def default_limits(cls) -> Limits:
        # two requests per worker keep every worker busy while replies travel back
        return Limits(max_in_flight=2 * WORKERS, attempt_timeout_s=60.0, max_attempts=1)

    @property
    def limits_key(self) -> str:
        return f"{self.kind}:{self.model}"

    @property
    def endpoint(self) -> str:  # type: ignore[override]
        return ENDPOINT  # in-process, no server: the endpoint its cache keys have always had

    def missing_setup(self) -> str | None:
        return self.unknown_model()

    def unknown_model(self) -> str | None:
        """An unknown model (sparrow-decider has no such file), naming those it has; None when it is
        there."""
        from sparrow_decider import available_models

        if self.model not in available_models():
            return (
                f"unknown embedded model {self.model!r}; available: {', '.join(available_models())}"
            )
        return None

    async def check_reachable(self) -> None:
        return None  # in worker processes of this one: no server to reach

    async def start(self) -> None:
        problem = self.missing_setup()
        if problem is not None:
            raise Fatal(problem)
        self._pool = ProcessPoolExecutor(
            WORKERS,
            mp_context=embedded_worker.SpawnHeld(),  # "spawn", SIGINT and SIGTERM held at start
            initializer=embedded_worker.load,
            initargs=(self.model,),
        )

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    async def send(self, request: Request) -> bytes:
        if self._pool is None:
            raise RuntimeError("Embedded.send() before start()")
        ok, result = await asyncio.get_running_loop().run_in_executor(
            self._pool, embedded_worker.ask, request.body
        )
        if not ok:
            raise Fatal(f"{self.label}: the model rejected the request: {result}")
        return result
