"""``dxi view``: serve the read-only results browser (``dxi.view``) over what ``dxi score`` would
score (``runner.rescore``), rescoring in the background as the cache fills. Its options, and
``main``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from .. import signals
from ..distributed import setup as distributed
from ..errors import EXIT_INTERRUPTED, EXIT_SOFTWARE, EXIT_TERMINATED, EXIT_USAGE, UsageError
from ..planning import numbers
from . import options

if TYPE_CHECKING:
    from rich.console import Console

DESCRIPTION = """\
Serve the results browser until stopped (Ctrl-C, or kill): the Decision Index table of what `dxi score`
would score (the same selection options), each evaluation's questions, every answer and its request,
two models compared, calibration. On 127.0.0.1 unless --host says otherwise; --port 0 picks a free port
(printed). It rescores in the background as the cache fills. Read-only: nothing is written to the cache."""

EXIT_CODES = f"""\
exit codes:
  0    stopped (Ctrl-C, kill -INT or kill -TERM); its private folder under the temporary folder removed
  {EXIT_USAGE}    bad input (flags, run file, model string, data, no cache folder and no --cache-remote, a
       port that cannot be served), with a message
  {EXIT_SOFTWARE}   an unexpected error (a bug in dxi): one line, and the file holding the full trace
  {EXIT_INTERRUPTED}  interrupted before serving ({EXIT_TERMINATED}: by SIGTERM)
"""


def add_parser(sub) -> None:
    s = options.command(sub, "view", None, DESCRIPTION, EXIT_CODES)
    options.add_models(s.add_argument_group("models"), True, True)
    options.add_data(s.add_argument_group("data"))
    options.add_cache(s.add_argument_group("cache"))
    options.add_price(s.add_argument_group("prices"))
    options.add_output(s.add_argument_group("output"), out=False)  # the view writes no outputs
    p = s.add_argument_group("server")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to serve on (default 127.0.0.1: this machine only; another exposes every answer "
        "in the cache to the network, with a warning)",
    )
    p.add_argument(
        "--port",
        type=numbers.PORT,
        default=8765,
        help="port to serve on (default 8765; 0: any free port)",
    )
    s.set_defaults(out=None)
    distributed.add_flags(
        s.add_argument_group("past one machine (shards, a remote cache, shared limits)"), "view"
    )


def _check_port(host: str, port: int) -> None:
    """Bind ``host``:``port`` once and let it go: UsageError (exit code 2) naming them when it
    cannot be served (taken, not an address of this machine, a host that does not resolve). The
    server binds it again once the cache is scored."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
            probe.bind(address)
    except OSError as exc:
        raise UsageError(
            f"cannot serve on {host}:{port}: {exc.strerror or exc} (choose another --port, or --port 0 "
            "for a free one)"
        ) from None


def main(args: argparse.Namespace, console: Console) -> int:
    """Serve until stopped. Nothing is written to the cache folder: the snapshots, and a remote
    cache's mirror, go to the view's private folder (``view.home``)."""
    from rich.markup import escape

    from dxi.view.app import (  # aiohttp.web and Jinja2 load only for the viewer
        is_loopback_host,
        serve,
    )
    from dxi.view.home import private_home

    from ..rescore import browse, select

    _check_port(args.host, args.port)  # before scoring, which takes seconds on a large cache
    home = private_home()  # stale ones of killed views removed first
    try:
        selection = select(args, mirror=Path(home.name) / "remote")
        if (
            not args.quiet
        ):  # scoring the cache takes a while on a large one: the server starts after it
            console.print(
                f"reading and scoring the cache in {escape(str(selection.cache_dir))}; the address follows "
                "once it is ready",
                highlight=False,
            )
        browser, notes = browse(selection, home)
    except KeyboardInterrupt:
        home.cleanup()
        options.make_console(stderr=True).print(
            "[yellow]Interrupted[/] before serving (nothing was written to the cache)."
        )
        return signals.exit_code()
    except BaseException:
        home.cleanup()
        raise
    browser.source.owns_home = True  # removed with the last snapshot, when the server stops
    for note in [] if args.quiet else notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    options.warn_differs(selection)
    if not is_loopback_host(args.host):
        options.make_console(stderr=True).print(
            f"[red]warning:[/] serving on {escape(args.host)}, not this machine only: anyone who can reach "
            "it can read every prompt and reply in the cache (there is no login). Use the default "
            "--host 127.0.0.1 unless that is what you want."
        )
    try:
        serve(browser, args.host, args.port, print_=lambda text: console.print(escape(text)))
    except (
        OSError,
        OverflowError,
    ) as exc:  # a port taken or out of range, a host that does not resolve
        raise UsageError(
            f"cannot serve on {args.host}:{args.port}: {exc} (choose another --port, or --port 0 for "
            "a free one)"
        ) from None
    return 0
