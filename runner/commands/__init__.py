"""The commands of ``dxi``, one module each: its options (``add_parser(sub)``) and ``main(args, console)``,
which turns them into library calls (``runner.session.run``, ``runner.rescore.rescore``, ...) and prints what
they return, ending in an exit code (``runner.errors``). The options several commands share are in
``options``. A command module imports the library, never another command module; ``runner.cli`` builds the
parser from them in ``COMMANDS``' order and dispatches. Light at import: parsing loads no Polars or aiohttp.
"""
from __future__ import annotations

# command -> its module under runner/commands/, in the order `dxi --help` lists them
COMMANDS = {"run": "run", "estimate": "estimate", "plan": "plan", "score": "score", "report": "report",
            "view": "view",
            "export": "export", "data": "data", "fetch-model": "fetch_model", "cache": "cache", "batches": "batches",
            "completion": "completion"}
