"""The embedded decision model: sparrow-decider in-process, no key, no network.

``embedded:sparrow-nano-general-v1.1`` (the default; ``embedded`` alone means it) or any other model
``sparrow_decider.available_models()`` lists (``sparrow-nano-robot-v1.2``). Requests are System One
bodies (same bytes as ``systemone``), answered by ``Decider.ask`` on a small thread pool so the event loop
never blocks; the reply is the System One JSON a ``sparrow-decider serve`` would return, decoded and
validated by the same code as the HTTP adapter.
"""
from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor

import orjson

from .base import Limits, ModelSpec, Request
from .errors import Fatal
from .systemone import SystemOne

DEFAULT_MODEL = "sparrow-nano-general-v1.1"


class Embedded(SystemOne):
    """sparrow-decider in-process. Raises Fatal from ``start`` for an unknown model, listing the known."""

    kind = "embedded"

    def __init__(self, spec: ModelSpec, limits: Limits | None = None):
        spec.model = spec.model or DEFAULT_MODEL
        super().__init__(spec, limits)
        self._decider = None
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def default_limits(cls) -> Limits:
        return Limits(max_in_flight=max(1, os.cpu_count() or 1), attempt_timeout_s=60.0, max_attempts=1)

    @property
    def provider(self) -> str:
        return f"{self.kind}:{self.model}"

    async def start(self) -> None:
        from sparrow_decider import Decider, available_models

        if self.model not in available_models():
            raise Fatal(f"unknown embedded model {self.model!r}; available: {', '.join(available_models())}")
        self._decider = Decider.load(self.model)
        self._pool = ThreadPoolExecutor(self.limits.max_in_flight, thread_name_prefix="embedded")

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _ask(self, body: bytes) -> bytes:
        payload = orjson.loads(body)
        started = time.perf_counter()
        try:
            answers = self._decider.ask(payload["state"], payload["questions"])
        except (KeyError, ValueError, TypeError) as exc:
            raise Fatal(f"{self.label}: the model rejected the request: {exc}") from None
        return orjson.dumps({"model": self._decider.name, "answers": answers,
                             "usage": {"input_tokens": 0, "output_tokens": 0},
                             "latency_ms": round((time.perf_counter() - started) * 1000, 2)})

    async def send(self, request: Request) -> bytes:
        if self._pool is None:
            raise RuntimeError("Embedded.send() before start()")
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._ask, request.body)
