"""Charts for the HTML report: matplotlib figures rendered to SVG (no pyplot state, no network).

Each function returns the SVG document as text. Text in charts (model names, group names) is drawn
as text, never interpreted: mathtext is off (a "$" in a model name stays a "$") and matplotlib's SVG
writer escapes it. The report embeds each SVG as an ``<img>`` data URI, where no script can run.
Output is deterministic (fixed hash salt, no date) so two reports of the same data are identical.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib
from matplotlib.figure import Figure

STYLE = {
    "svg.hashsalt": "dxi-report",
    "svg.fonttype": "none",
    "text.parse_math": False,
    "font.size": 9,
    "font.family": "sans-serif",
    "axes.spines.top": False,
    "axes.spines.right": False,
}
COLORS = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5")


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    return buf.getvalue()


def bars(
    title: str,
    labels: Sequence[str],
    series: dict[str, Sequence[float | None]],
    low: dict[str, Sequence[float | None]] | None = None,
    high: dict[str, Sequence[float | None]] | None = None,
    xlabel: str = "score (0-100)",
    xlim: tuple[float, float] | None = (0, 100),
) -> str:
    """Horizontal grouped bars: one group per label (top to bottom in the given order), one bar per
    series, with interval whiskers where ``low``/``high`` are given. None values are left out; a
    bound on the wrong side of its value (scoring bounds every interval to hold its point: this is
    for any other caller) draws a whisker of zero length there, never a negative one (matplotlib
    refuses those)."""
    with matplotlib.rc_context(STYLE):
        n, k = len(labels), max(1, len(series))
        height = 0.8 / k
        fig = Figure(figsize=(7.5, 0.9 + max(1, n) * (0.22 + 0.16 * k)))
        ax = fig.add_subplot()
        for j, (name, values) in enumerate(series.items()):
            ys = [i + (j - (k - 1) / 2) * height for i in range(n)]
            kept = [
                (y, v, i) for i, (y, v) in enumerate(zip(ys, values, strict=True)) if v is not None
            ]
            ax.barh(
                [y for y, _, _ in kept],
                [v for _, v, _ in kept],
                height=height * 0.9,
                color=COLORS[j % len(COLORS)],
                label=name,
            )
            if low and high and name in low:
                whiskers = [
                    (y, v, low[name][i], high[name][i])
                    for y, v, i in kept
                    if low[name][i] is not None and high[name][i] is not None
                ]
                if whiskers:
                    ax.errorbar(
                        [v for _, v, _, _ in whiskers],
                        [y for y, _, _, _ in whiskers],
                        # never negative, even for a bound past its point
                        xerr=[
                            [max(0.0, v - lo) for _, v, lo, _ in whiskers],
                            [max(0.0, hi - v) for _, v, _, hi in whiskers],
                        ],
                        fmt="none",
                        ecolor="#222222",
                        elinewidth=1,
                        capsize=2,
                    )
        ax.set_yticks(range(n), labels)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        if xlim:
            ax.set_xlim(*xlim)
        ax.grid(axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
        if len(series) > 1:  # above the axes, in a row: never over a bar
            ax.legend(
                loc="lower left",
                bbox_to_anchor=(0, 1.0),
                ncol=min(k, 4),
                fontsize=8,
                frameon=False,
                borderaxespad=0.2,
                handlelength=1.2,
            )
            ax.set_title(
                title, loc="left", fontsize=10, fontweight="bold", pad=8 + 14 * ((k + 3) // 4)
            )
        else:
            ax.set_title(title, loc="left", fontsize=10, fontweight="bold")
        return _svg(fig)


def heatmap(
    title: str,
    groups: Sequence[str],
    models: Sequence[str],
    values: Sequence[Sequence[float | None]],
    marked: Sequence[bool] = (),
    vmin: float = 0,
    vmax: float = 100,
) -> str:
    """A heatmap of one metric: ``values[i][j]`` is group ``groups[i]`` (rows, top to bottom) for
    model ``models[j]`` (columns, left to right, in the report's model order), on a 0-100 scale;
    None cells are grey and show "—". Each cell shows its value; rows whose ``marked`` entry is true
    (groups with few tasks) get a "*" after their name. The colour bar sits right of the grid, never
    over a cell."""
    import numpy as np

    with matplotlib.rc_context(STYLE):
        n, k = max(1, len(groups)), max(1, len(models))
        grid = np.array(
            [[np.nan if v is None else float(v) for v in row] for row in values], dtype=float
        ).reshape(n, k)
        fig = Figure(figsize=(min(2.2 + 1.35 * k, 9.5), 0.9 + 0.32 * n))
        ax = fig.add_subplot()
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#e6e6e6")
        image = ax.imshow(
            np.ma.masked_invalid(grid), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto"
        )
        names = [
            f"{g} *" if i < len(marked) and marked[i] else str(g) for i, g in enumerate(groups)
        ]
        ax.set_yticks(range(n), names or [""])
        names_x = [_wrapped(m) for m in models] or [""]
        ax.set_xticks(range(k), names_x, fontsize=8)
        ax.xaxis.tick_top()
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
        for i in range(n):
            for j in range(k):
                v = grid[i, j]
                dark = not np.isnan(v) and (v - vmin) / (vmax - vmin or 1) < 0.6
                ax.text(
                    j,
                    i,
                    "—" if np.isnan(v) else f"{v:.1f}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if dark else "#1d1d1f",
                )
        bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
        bar.ax.tick_params(labelsize=7)
        ax.set_title(
            title,
            loc="left",
            fontsize=10,
            fontweight="bold",
            pad=8 + 11 * max(n.count("\n") + 1 for n in names_x),
        )
        return _svg(fig)


def _wrapped(label: str, width: int = 16, lines: int = 3) -> str:
    """A model label on at most ``lines`` lines of about ``width`` characters (broken after the
    adapter's ":" first), cut with "…" beyond that; the full label is in the table beside the
    chart."""
    head, sep, tail = label.partition(":")
    parts = [head + sep] if sep and tail else []
    rest = tail if sep and tail else label
    parts += [rest[i : i + width] for i in range(0, len(rest), width)]
    if len(parts) > lines:
        parts = parts[:lines]
        parts[-1] = parts[-1][:-1] + "…"
    return "\n".join(parts)


def reliability(title: str, panels: dict[str, dict[str, Sequence[float]]]) -> str:
    """Reliability diagrams, one panel per evaluation: ``panels[name]`` has ``low``, ``high`` (bin
    edges), ``accuracy``, ``confidence`` (0-1) and ``n`` per non-empty bin. Bars: accuracy per bin;
    dots: mean confidence; the diagonal is perfect calibration."""
    with matplotlib.rc_context(STYLE):
        k = max(1, len(panels))
        fig = Figure(figsize=(2.3 * k + 0.4, 2.6))
        axes = fig.subplots(1, k, squeeze=False, gridspec_kw={"wspace": 0.3})[0]
        for ax, (name, b) in zip(axes, panels.items(), strict=False):
            widths = [hi - lo for lo, hi in zip(b["low"], b["high"], strict=True)]
            ax.bar(
                b["low"],
                b["accuracy"],
                width=widths,
                align="edge",
                color=COLORS[0],
                edgecolor="white",
                linewidth=0.5,
                label="accuracy",
            )
            ax.plot(
                b["confidence"],
                b["accuracy"],
                "o",
                color=COLORS[2],
                markersize=3,
                label="mean confidence",
            )
            ax.plot([0, 1], [0, 1], "--", color="#888888", linewidth=0.8)
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.set_xticks(
                [0, 0.5, 1], ["0", "0.5", "1"]
            )  # room between panels: no label runs into the next
            ax.set_yticks([0, 0.5, 1], ["0", "0.5", "1"])
            ax.set_title(name, fontsize=8)
            ax.set_xlabel("confidence", fontsize=8)
        axes[0].set_ylabel("accuracy", fontsize=8)
        fig.suptitle(title, x=0.01, y=1.0, ha="left", va="bottom", fontsize=9, fontweight="bold")
        return _svg(fig)


def risk_coverage(title: str, curves: dict[str, Sequence[Sequence[float]]]) -> str:
    """Risk–coverage curves (``scoring.measures``), one line per evaluation: ``curves[name]`` is a
    list of [coverage, risk] points (both 0-1). Lower is better; the area under a curve is its
    AURC."""
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(4.2, 2.8))
        ax = fig.add_subplot()
        for j, (name, points) in enumerate(curves.items()):
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                "-o",
                markersize=2,
                linewidth=1,
                color=COLORS[j % len(COLORS)],
                label=name,
            )
        ax.set_xlim(0, 1)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("coverage (share of answers, most confident first)", fontsize=8)
        ax.set_ylabel("risk (error rate)", fontsize=8)
        if curves:
            ax.legend(fontsize=7, frameon=False)
        ax.set_title(title, loc="left", fontsize=9, fontweight="bold")
        return _svg(fig)
