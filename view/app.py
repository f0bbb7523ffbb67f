"""The ``dxi view`` web app: aiohttp's server, Jinja2 templates (autoescaped), read-only.

Routes (stable URLs: a page's address names everything it shows, so it can be pasted into a bug
report):

    GET /                                   the Decision Index table (the summary ``dxi score`` computes)
    GET /eval/{eval}?m=&status=&result=&a=&b=&category=&q=&sort=&desc=&page=&epoch=
                                            an evaluation's questions, paged by the server
    GET /task/{task_id}                     one question (task ids contain "/": the rest of the path)
    GET /compare/{eval}?a=&b=&cell=&page=&epoch=
                                            two models: the 2x2 of right/wrong and the questions they differ on
    GET /calibration?m=&eval=&bin=&page=&epoch=
                                            a model's reliability diagrams and the questions of one bin
    GET /static/{file}                      the style sheet and the one script (no inline script or style)

Every response carries a strict Content-Security-Policy (nothing but this server's own files; no
inline script or style, no frames, no form posts elsewhere) and ``X-Content-Type-Options: nosniff``.
Every text from a model, a dataset or the cache goes through Jinja2's autoescaping. Only GET and
HEAD are served; nothing is written anywhere but the app's temporary folder (``data.Browser``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, urlencode

import jinja2
import markupsafe
from aiohttp import web

from dxi.evals import EVALS
from dxi.hosts import is_loopback_host  # noqa: F401  (dxi view and its tests use it)
from dxi.scoring import adaptive, measures, provisional
from dxi.scoring.calibration import ECE_BINS
from dxi.scoring.records import unset
from dxi.scoring.replies import model_notes
from dxi.scoring.summary import p_text, signed
from dxi.scoring.sums import METRICS

from .data import CELLS, SORTS, VIEW_STATUSES, BadQuery, Browser, EvalQuery, NotFound
from .live import Live

STATIC = Path(__file__).parent / "static"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
METRIC_TITLES = {
    "accuracy": "accuracy",
    "non_hallucination_rate": "non-halluc.",
    "f1_prompt_harm": "F1 prompt harm",
    "f1_response_refusal": "F1 refusal",
    "f1_response_harm": "F1 response harm",
    "mean_f1": "mean F1",
}
LIVE = web.AppKey("live", Live)
REFRESH_S = 5.0  # how often ``dxi view`` looks for newer rows in the cache (``view.live``)


def _url(path: str, **params: object) -> str:
    """``path`` with the query ``params`` whose value is not None or empty (in the given order)."""
    query = {
        k: ("1" if v is True else str(v)) for k, v in params.items() if v not in (None, "", False)
    }
    return path + ("?" + urlencode(query) if query else "")


def task_url(task_id: str) -> str:
    return "/task/" + quote(task_id, safe="/")


def _num(v: float | None, digits: int = 1) -> str:
    """``v`` to ``digits`` decimals; "—" for a value that is null or absent (a metric the summary
    does not have for this cache, e.g. an AUROC where a question's answers are all of one class:
    Jinja2's Undefined)."""
    return "—" if v is None or isinstance(v, jinja2.Undefined) else f"{v:.{digits}f}"


def _breakable(text: object) -> markupsafe.Markup:
    """``text`` escaped, with a line-break opportunity (``<wbr>``) after each underscore, so that a
    long identifier (WildGuardTest's ``disseminating_false_or_misleading_information_...``) wraps in
    its column instead of running over the next."""
    return markupsafe.Markup("_<wbr>").join(
        markupsafe.escape("" if text is None else str(text)).split("_")
    )


def _pvalue(p: float | None) -> str:
    """A p-value as the pages print it: 3 significant digits, "< 0.001" below that, "—" for none
    (``scoring.summary.p_text``: never the 0.05 threshold for one below it)."""
    return p_text(p, significant=True)


def _p_is(p: float) -> str:
    """A p-value in a sentence: "p < 0.001" below 0.001, else "p = 0.123" (``_pvalue``'s digits)."""
    return f"p {'' if p < 0.001 else '= '}{_pvalue(p)}"


def _when(seconds: float) -> str:
    """Unix seconds as UTC to the second: 2026-12-01 12:03:04 UTC."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("dxi.view", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["breakable"] = _breakable
    env.filters["signed"] = signed
    env.globals.update(
        url=_url,
        task_url=task_url,
        num=_num,
        when=_when,
        EVALS=EVALS,
        METRICS=METRICS,
        METRIC_TITLES=METRIC_TITLES,
        STATUSES=VIEW_STATUSES,
        SORTS=SORTS,
        CELLS=CELLS,
        BINS=ECE_BINS,
        MARK=provisional.MARK,
        pvalue=_pvalue,
        p_is=_p_is,
        provisional_notes=provisional.notes,
        model_notes=model_notes,
        adaptive_notes=adaptive.sentences,
        estimated=adaptive.estimated,  # an adaptive run's figure: an estimate of the whole set
        ESTIMATE=adaptive.MARK,
        span=provisional.span,
    )
    env.globals["measure_rows"] = measures.model_rows  # (evaluation or "all", block) of a model
    return env


def _int(request: web.Request, name: str, default: int) -> int:
    value = request.query.get(name, "")
    if value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise BadQuery(f"{name} must be a whole number, not {value!r}") from None


def _opt(request: web.Request, name: str) -> str | None:
    return request.query.get(name) or None


def make_app(target: Browser | Live, refresh: float | None = None) -> web.Application:
    """The application over ``target``: a ``data.Browser`` (one snapshot, served as it is) or a
    ``live.Live``; with ``refresh`` (seconds) a Browser is wrapped in a Live that looks for newer
    rows that often, while the app runs. ``serve`` runs it."""
    live = target if isinstance(target, Live) else Live(target, refresh or 0.0)
    env = _environment()
    for name in env.list_templates():  # compiled now, not by the first request of each page
        env.get_template(name)

    def page(template: str, status: int = 200, **context: object) -> web.Response:
        browser = live.browser  # the snapshot being served (``live.Live`` swaps in newer ones)
        html = env.get_template(template).render(
            view=browser, summary=browser.summary, live=live, **context
        )
        return web.Response(text=html, content_type="text/html", charset="utf-8", status=status)

    def handler(render: Callable[[web.Request], web.Response]):
        async def handle(request: web.Request) -> web.Response:
            try:
                return render(request)
            except NotFound as exc:
                return page("error.html.j2", 404, title="Not found", message=str(exc))
            except BadQuery as exc:
                return page("error.html.j2", 400, title="Bad request", message=str(exc))

        return handle

    def overview(request: web.Request) -> web.Response:
        return page("overview.html.j2", title="Decision Index", section="overview")

    def evaluation(request: web.Request) -> web.Response:
        name = request.match_info["eval"]
        q = EvalQuery(
            model=_opt(request, "m"),
            status=_opt(request, "status"),
            result=_opt(request, "result"),
            a=_opt(request, "a"),
            b=_opt(request, "b"),
            category=_opt(request, "category"),
            text=_opt(request, "q"),
            sort=request.query.get("sort") or "task",
            desc=request.query.get("desc") == "1",
            page=_int(request, "page", 1),
            epoch=_int(request, "epoch", 0),
        )
        result = live.browser.evaluation(name, q)
        params = {
            "m": q.model,
            "status": q.status,
            "result": q.result,
            "a": q.a,
            "b": q.b,
            "category": q.category,
            "q": q.text,
            "sort": q.sort if q.sort != "task" else None,
            "desc": q.desc,
            "epoch": q.epoch or None,
        }
        return page(
            "eval.html.j2",
            title=EVALS[name].title,
            section="eval",
            name=name,
            q=q,
            result=result,
            params=params,
            categories=live.browser.categories.get(name, []),
            epochs=live.browser.epochs_of(name),
        )

    def task(request: web.Request) -> web.Response:
        detail = live.browser.question(request.match_info["task_id"])
        return page(
            "task.html.j2",
            title=detail["task"].id,
            section="eval",
            d=detail,
            name=detail["task"].eval,
        )

    def no_models(title: str, section: str) -> web.Response:
        return page(
            "error.html.j2",
            title=title,
            section=section,
            kind="note",
            message="No model in this view yet: the cache holds no answers of this prompt version. This "
            "page fills in as `dxi run` adds them.",
        )

    def compare(request: web.Request) -> web.Response:
        name = request.match_info["eval"]
        if not live.browser.labels:
            live.browser.frame(name)  # an unknown evaluation: 404
            return no_models("Compare two models", "compare")
        a = _opt(request, "a") or live.browser.labels[0]
        b = _opt(request, "b") or live.browser.labels[min(1, len(live.browser.labels) - 1)]
        epoch, cell = _int(request, "epoch", 0), _opt(request, "cell")
        table, result = live.browser.compare(name, a, b, epoch, cell, _int(request, "page", 1))
        return page(
            "compare.html.j2",
            title=f"Compare: {EVALS[name].title}",
            section="compare",
            name=name,
            a=a,
            b=b,
            table=table,
            cell=cell,
            result=result,
            epoch=epoch,
            epochs=live.browser.epochs_of(name),
            differences=live.browser.differences(name, a, b),
            method=unset(live.browser.summary.comparison_method),
            params={"a": a, "b": b, "cell": cell, "epoch": epoch or None},
        )

    def calibration(request: web.Request) -> web.Response:
        if not live.browser.labels and not _opt(request, "m"):
            return no_models("Calibration", "calibration")
        label = _opt(request, "m") or live.browser.labels[0]
        bins = live.browser.reliability_bins(label)
        name, b = _opt(request, "eval"), _opt(request, "bin")
        epoch = _int(request, "epoch", 0)
        listing = None
        if b is not None:
            if name is None:
                raise BadQuery("a confidence bin needs its evaluation: eval")
            listing = live.browser.in_bin(
                name, label, _int(request, "bin", 0), epoch, _int(request, "page", 1)
            )
        entry = live.browser.summary.entry(label)
        figures = {
            e: ((entry.evals.get(e) or {}).get("calibration") or None) for e in bins
        }  # dxi score's
        # the risk-coverage curve of each evaluation with one (summary.json's measures)
        risk = {
            e: b["measures"]["risk_coverage"]
            for e, b in entry.evals.items()
            if (b.get("measures") or {}).get("risk_coverage")
        }
        return page(
            "calibration.html.j2",
            title=f"Calibration: {label}",
            section="calibration",
            label=label,
            bins=bins,
            figures=figures,
            risk=risk,
            name=name,
            p_yes_range=unset(entry.p_yes_range),
            bin=None if b is None else int(b),
            listing=listing,
            epoch=epoch,
            params={"m": label, "eval": name, "bin": b, "epoch": epoch or None},
        )

    @web.middleware
    async def headers(request: web.Request, handler):
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status == 404:
                response = page(
                    "error.html.j2", 404, title="Not found", message=f"no page at {request.path}"
                )
            else:  # 405 for a POST, ...: the same headers
                response = web.Response(status=exc.status, text=exc.text, headers=exc.headers)
        response.headers.update(HEADERS)
        return response

    app = web.Application(middlewares=[headers])
    app[LIVE] = live
    if live.interval > 0:

        async def watching(app: web.Application):
            task = asyncio.create_task(live.watch())
            yield
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        app.cleanup_ctx.append(watching)
    app.router.add_get("/", handler(overview))
    app.router.add_get("/eval/{eval}", handler(evaluation))
    app.router.add_get("/task/{task_id:.+}", handler(task))
    app.router.add_get("/compare/{eval}", handler(compare))
    app.router.add_get("/calibration", handler(calibration))
    app.router.add_static("/static/", STATIC, show_index=False, follow_symlinks=False)
    return app


def serve(
    browser: Browser,
    host: str = "127.0.0.1",
    port: int = 8765,
    print_: Callable[[str], None] = print,
    refresh: float = REFRESH_S,
) -> None:
    """Serve ``browser`` on ``host``:``port`` until interrupted (Ctrl-C), rescoring newer rows of
    the cache in the background (``view.live``; looked for every ``refresh`` seconds, 0: never),
    then remove the snapshots and the private folder."""
    live = Live(browser, refresh)
    try:
        web.run_app(make_app(live), host=host, port=port, print=print_, access_log=None)
    finally:
        live.close()
