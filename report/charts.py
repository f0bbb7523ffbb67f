"""Charts for the HTML report: matplotlib figures rendered to SVG (no pyplot state, no network).

Each function returns the SVG document as text. Text in charts (model names, group names) is drawn as
text, never interpreted: mathtext is off (a "$" in a model name stays a "$") and matplotlib's SVG
writer escapes it. The report embeds each SVG as an ``<img>`` data URI, where no script can run.
Output is deterministic (fixed hash salt, no date) so two reports of the same data are identical.
"""
from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib
from matplotlib.figure import Figure

STYLE = {"svg.hashsalt": "dxi-report", "svg.fonttype": "none", "text.parse_math": False, "font.size": 9,
         "font.family": "sans-serif", "axes.spines.top": False, "axes.spines.right": False}
COLORS = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5")


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    return buf.getvalue()


def bars(title: str, labels: Sequence[str], series: dict[str, Sequence[float | None]],
         low: dict[str, Sequence[float | None]] | None = None, high: dict[str, Sequence[float | None]] | None = None,
         xlabel: str = "score (0-100)", xlim: tuple[float, float] | None = (0, 100)) -> str:
    """Horizontal grouped bars: one group per label (top to bottom in the given order), one bar per
    series, with interval whiskers where ``low``/``high`` are given. None values are left out."""
    with matplotlib.rc_context(STYLE):
        n, k = len(labels), max(1, len(series))
        height = 0.8 / k
        fig = Figure(figsize=(7.5, 0.9 + max(1, n) * (0.22 + 0.16 * k)))
        ax = fig.add_subplot()
        for j, (name, values) in enumerate(series.items()):
            ys = [i + (j - (k - 1) / 2) * height for i in range(n)]
            kept = [(y, v, i) for i, (y, v) in enumerate(zip(ys, values, strict=True)) if v is not None]
            ax.barh([y for y, _, _ in kept], [v for _, v, _ in kept], height=height * 0.9, color=COLORS[j % len(COLORS)],
                    label=name)
            if low and high and name in low:
                whiskers = [(y, v, low[name][i], high[name][i]) for y, v, i in kept
                            if low[name][i] is not None and high[name][i] is not None]
                if whiskers:
                    ax.errorbar([v for _, v, _, _ in whiskers], [y for y, _, _, _ in whiskers],
                                xerr=[[v - lo for _, v, lo, _ in whiskers], [hi - v for _, v, _, hi in whiskers]],
                                fmt="none", ecolor="#222222", elinewidth=1, capsize=2)
        ax.set_yticks(range(n), labels)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        if xlim:
            ax.set_xlim(*xlim)
        ax.set_title(title, loc="left", fontsize=10, fontweight="bold")
        ax.grid(axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
        if len(series) > 1:
            ax.legend(loc="lower right", fontsize=8, frameon=False)
        return _svg(fig)


def reliability(title: str, panels: dict[str, dict[str, Sequence[float]]]) -> str:
    """Reliability diagrams, one panel per evaluation: ``panels[name]`` has ``low``, ``high`` (bin
    edges), ``accuracy``, ``confidence`` (0-1) and ``n`` per non-empty bin. Bars: accuracy per bin;
    dots: mean confidence; the diagonal is perfect calibration."""
    with matplotlib.rc_context(STYLE):
        k = max(1, len(panels))
        fig = Figure(figsize=(2.3 * k + 0.4, 2.6))
        axes = fig.subplots(1, k, squeeze=False)[0]
        for ax, (name, b) in zip(axes, panels.items(), strict=False):
            widths = [hi - lo for lo, hi in zip(b["low"], b["high"], strict=True)]
            ax.bar(b["low"], b["accuracy"], width=widths, align="edge", color=COLORS[0], edgecolor="white",
                   linewidth=0.5, label="accuracy")
            ax.plot(b["confidence"], b["accuracy"], "o", color=COLORS[2], markersize=3, label="mean confidence")
            ax.plot([0, 1], [0, 1], "--", color="#888888", linewidth=0.8)
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.set_title(name, fontsize=8)
            ax.set_xlabel("confidence", fontsize=8)
        axes[0].set_ylabel("accuracy", fontsize=8)
        fig.suptitle(title, x=0.01, y=1.0, ha="left", va="bottom", fontsize=9, fontweight="bold")
        return _svg(fig)
