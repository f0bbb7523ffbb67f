"""What the coordinator's tests hand ``runner.distributed.shared_limits``: a request and a model
that carries only its limits."""

from __future__ import annotations

from dxi.adapters import Limits, Request

REQUEST = Request("systemone", "m", "e", b"{}", 0, "{}", "v")


class LimitsOnly:
    """What shared_limits.limiters reads of a ModelRun: its limits key and its adapter's limits."""

    limits_key = "p"

    def __init__(self, limits: Limits):
        self.adapter = type("A", (), {"limits": limits})()
