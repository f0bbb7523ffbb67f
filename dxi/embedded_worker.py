"""The worker side of the embedded decision model (``dxi.adapters.embedded``): what each worker process of
its pool runs. Kept outside ``dxi.adapters`` so that a spawned worker imports sparrow-decider, orjson and
this module, not the adapters package with aiohttp (~0.1 s of CPU a worker, at the start of every fresh
run, on the cores the run itself needs: issue 14)."""
from __future__ import annotations

import signal
import time

import orjson

_decider = None  # one per worker process


def load(name: str) -> None:
    """The pool's initializer: load sparrow-decider model ``name`` once in this worker; Ctrl-C is left to
    the parent."""
    global _decider
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    from sparrow_decider import Decider

    _decider = Decider.load(name)


def ask(body: bytes) -> tuple[bool, bytes | str]:
    """Answer one System One request body (UTF-8 JSON bytes): ``(True, the reply body)`` as ``sparrow-decider
    serve`` would return it, or ``(False, why the model rejected the request)``."""
    payload = orjson.loads(body)
    started = time.perf_counter()
    try:
        answers = _decider.ask(payload["state"], payload["questions"])
    except (KeyError, ValueError, TypeError) as exc:
        return False, str(exc)
    return True, orjson.dumps({"model": _decider.name, "answers": answers,
                               "usage": {"input_tokens": 0, "output_tokens": 0},
                               "latency_ms": round((time.perf_counter() - started) * 1000, 2)})
