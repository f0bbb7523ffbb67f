"""Four models of four kinds in one cache, for the report and export tests: the embedded decision
model, and a System One decider, an OpenAI-compatible language model (structured outputs) and a
logprob decider served by the fake provider on 127.0.0.1 (``tests.fakes.fake_provider``), all run
over the hand-written fixtures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from dxi.runner import export, rescore, session
from dxi.runner.planning import plan
from dxi.runner.planning.inputs import PlanInputs

from ..fakes.fake_provider import serve

EMBEDDED = "embedded:sparrow-nano-general-v1.1"


@dataclass
class FourModels:
    """``data`` and ``cache`` folders, ``models``: the model strings in the order the run gave them,
    and ``labels``: the names the run and the report give them (the fake provider's URL is not part
    of them)."""

    data: Path
    cache: Path
    models: list[str]
    labels: list[str]

    def selection(self) -> list[str]:
        """The ``--model`` flags of the run, in its order."""
        return [arg for m in self.models for arg in ("--model", m)]

    def args(self, command: str, *extra: str) -> list[str]:
        return [command, "--data-dir", str(self.data), "--cache-dir", str(self.cache), *extra, "-q"]

    def inputs(self, **fields) -> PlanInputs:
        """The settings of ``dxi score`` / ``export`` over this cache and data, with ``fields``
        (``PlanInputs``)."""
        return PlanInputs(data_dir=self.data, cache_dir=self.cache, **fields)

    def rescore(self, out: Path, html: bool = False, **fields) -> rescore.Rescored:
        """``dxi score``'s work (``dxi report``'s with ``html``) into ``out``."""
        return rescore.rescore(rescore.select(self.inputs(out=out, **fields)), html=html)

    def export(self, fmt: str, target: Path, **fields) -> export.Exported:
        """``dxi export --format FMT TARGET``'s work."""
        return export.export(rescore.select(self.inputs(**fields)), fmt, target)


def four_models(data: Path, root: Path) -> FourModels:
    """Run the four models (the logprob one first, so the run's order is not alphabetical) into
    ``root/cache``."""
    with pytest.MonkeyPatch.context() as env, serve() as server:
        env.setenv("OPENAI_API_KEY", "sk-test-four-models")
        models = [
            f"logprobs:lp-fake@{server.url}/v1",
            EMBEDDED,
            f"systemone:fake-decider@{server.url}",
            f"openai:gpt-fake@{server.url}/v1",
        ]
        run = FourModels(data, root / "cache", models, [m.split("@")[0] for m in models])
        done = session.run(
            plan.build(models=models, data_dir=data, cache_dir=run.cache, out=root / "run")
        )
        assert done.exit_code == 0
    return run
