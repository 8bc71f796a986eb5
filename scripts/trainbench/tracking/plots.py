"""Trend plots per stage (PNG) and a static HTML page: per-run medians with their intervals, the noise band
of each level, change points, and the latest run's verdict."""

from __future__ import annotations

import html
import io
import math
import os
import re
from collections import OrderedDict
from typing import Dict, List

import numpy as np

from .atomic import write_atomically
from .render import counts_line, fmt_time, note_text, summary_title, verdict_text
from .constants import BAND_MIN_RUNS, BAND_TAIL
from .stats import FASTER, SLOWER, NightSpread
from .compare import Analysis, Comparison

PLOTS_PER_FIGURE = 12
COLUMNS = 3
_VERDICT_COLOUR = {SLOWER: "tab:orange", FASTER: "tab:green"}


def _unit(values) -> tuple:
    top = max(values) if values else 1.0
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if top >= scale:
            return unit, scale
    return "ns", 1.0


TITLE_WIDTH = 48   # characters of a plot title's line at its font size
TITLE_LINES = 3


def _shorten_middle(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    keep = width - 3
    return text[:(keep + 1) // 2] + "..." + text[len(text) - keep // 2:]


def plot_title(key: str, width: int = TITLE_WIDTH, max_lines: int = TITLE_LINES) -> List[str]:
    """A benchmark name as a plot title's lines: stage/backend/variant on the first (the variant is what
    tells the plots of a stage apart), the problem wrapped at its commas, and, where it is still too long,
    shortened in the middle, never from the left."""
    parts = key.split("/", 3)
    if len(parts) == 4:
        head, problem = "/".join(parts[:3]), parts[3]
    else:
        head, problem = key, ""
    lines = [_shorten_middle(head, width)]
    current = ""
    for item in problem.split(",") if problem else []:
        piece = item if not current else "," + item
        if current and len(current) + len(piece) > width:
            lines.append(current + ",")
            current = item
        else:
            current += piece
    if current:
        lines.append(current)
    if len(lines) > max_lines:   # the problem's middle gives way: its first and last lines stay
        kept = lines[1:max_lines - 1]
        kept[-1] = kept[-1][:width - 3] + "..."
        lines = lines[:1] + kept + [lines[-1]]
    return [_shorten_middle(line, width) for line in lines]


def tick_labels(dates) -> List[str]:
    """The x ticks' labels of runs: the day, and the time as well when two runs share a day (a run index
    where even that repeats, or a run has no date)."""
    days = [d.strftime("%m-%d") if d else None for d in dates]
    same_day = len({d for d in days if d}) < len([d for d in days if d])
    labels = [(d.strftime("%m-%d\n%H:%M") if same_day else day) if d else str(i)
              for i, (d, day) in enumerate(zip(dates, days))]
    if len(set(labels)) < len(labels):
        labels = [f"{label}\n#{i}" for i, label in enumerate(labels)]
    return labels


def _plot_one(ax, a: Analysis, c: Comparison) -> None:
    pts = [p for p in c.series if p.disposition == "passed"]
    bad = [p for p in c.series if p.disposition not in ("passed", "absent")]
    unit, scale = _unit([p.median for p in pts])
    n = len(a.runs)
    if pts:
        x = np.array([p.run_index for p in pts])
        y = np.array([p.median for p in pts]) / scale
        lo = np.array([p.low for p in pts]) / scale
        hi = np.array([p.high for p in pts]) / scale
        ax.errorbar(x, y, yerr=[np.maximum(y - lo, 0), np.maximum(hi - y, 0)], fmt="o-", ms=3, lw=0.8,
                    color="tab:blue", ecolor="0.6", elinewidth=0.8, capsize=0, zorder=3)
        # levels between change points, each with its noise band
        bounds = [0] + [i for i, _ in c.change_points] + [n]
        levels, resid = [], []
        for a0, b0 in zip(bounds[:-1], bounds[1:]):
            seg = [p.median for p in pts if a0 <= p.run_index < b0]
            if seg:
                centre = float(np.median(np.log(seg)))
                levels.append((a0, b0, centre))
                resid += list(np.log(seg) - centre)
        spread = NightSpread.of(resid) if len(resid) >= BAND_MIN_RUNS else None
        for a0, b0, centre in levels:
            w = spread.half_width(b0 - a0) if spread else 0.0
            lo_b, hi_b = math.exp(centre - w), math.exp(centre + w)
            ax.fill_between([a0 - 0.5, b0 - 0.5], lo_b / scale, hi_b / scale, color="tab:blue", alpha=0.12, lw=0)
            ax.hlines(math.exp(centre) / scale, a0 - 0.5, b0 - 0.5, colors="tab:blue", linestyles=":", lw=1)
    for i, cp in c.change_points:
        colour = "tab:red" if cp.ratio > 1 else "tab:green"
        ax.axvline(i - 0.5, color=colour, ls="--", lw=1.2, zorder=2)
        ax.annotate(f"{cp.ratio - 1:+.0%}", (i - 0.5, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(2, -10), textcoords="offset points", color=colour, fontsize=7)
    last = c.series[-1] if c.series else None
    if last is not None and last.disposition == "passed":
        colour = "tab:red" if c.confirmed else _VERDICT_COLOUR.get(c.verdict, "0.3")
        ax.plot([last.run_index], [last.median / scale], "D", ms=7, color=colour, zorder=4)
    if bad:
        ymin = ax.get_ylim()[0] if pts else 0.0
        ax.plot([p.run_index for p in bad], [ymin] * len(bad), "x", color="tab:red", ms=6, clip_on=False,
                zorder=4, label="not passed")
        ax.legend(loc="lower left", fontsize=6, frameon=False)
    verdict = verdict_text(c) + (" - REGRESSION" if c.confirmed else "")
    ax.set_title("\n".join(plot_title(c.key) + [verdict]), fontsize=8, color="tab:red" if c.confirmed else "black")
    ax.set_ylabel(f"time per call ({unit})", fontsize=7)
    step = max(1, math.ceil(n / 6))
    ticks = list(range(0, n, step))
    ax.set_xticks(ticks)
    labels = tick_labels([r.date for r in a.runs])
    ax.set_xticklabels([labels[i] for i in ticks], fontsize=6)
    ax.tick_params(axis="y", labelsize=6)
    ax.set_xlim(-0.7, n - 0.3)
    ax.grid(alpha=0.3, lw=0.5)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "stage"


def write_report(a: Analysis, out_dir: str) -> List[str]:
    """Writes <stage>.png (or <stage>-2.png ... for large stages) and index.html, each atomically (a full disk leaves
    the earlier file whole, and the OSError names the file); returns their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    stages: Dict[str, List[Comparison]] = OrderedDict()
    for c in a.comparisons:
        stages.setdefault(c.stage, []).append(c)
    written, images = [], []
    for stage, comps in stages.items():
        for part in range(0, len(comps), PLOTS_PER_FIGURE):
            chunk = comps[part:part + PLOTS_PER_FIGURE]
            cols = min(COLUMNS, len(chunk))
            rows = math.ceil(len(chunk) / cols)
            fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.0 * rows), squeeze=False)
            for ax, c in zip(axes.flat, chunk):
                _plot_one(ax, a, c)
            for ax in list(axes.flat)[len(chunk):]:
                ax.set_visible(False)
            fig.suptitle(f"{stage}: {a.new.machine_key}", fontsize=10)
            fig.tight_layout()
            name = _safe(stage) + (f"-{part // PLOTS_PER_FIGURE + 1}" if part else "") + ".png"
            path = os.path.join(out_dir, name)
            png = io.BytesIO()
            fig.savefig(png, format="png", dpi=90)
            plt.close(fig)
            write_atomically(path, png.getvalue())
            written.append(path)
            images.append((stage, name))
    page = os.path.join(out_dir, "index.html")
    write_atomically(page, _html(a, images).encode("utf-8"))
    written.append(page)
    return written


def _html(a: Analysis, images) -> str:
    e = html.escape
    rows = []
    for c in a.comparisons:
        t = c.test
        cls = "reg" if c.confirmed else (c.verdict or c.status).lower()
        rows.append(
            f"<tr class='{e(cls)}'><td><code>{e(c.key)}</code></td><td>{e(c.stage)}</td>"
            f"<td>{e(fmt_time(t.base_median) if t else '-')}</td><td>{e(fmt_time(t.new_median) if t else '-')}</td>"
            f"<td>{e(f'{t.ratio - 1:+.1%}' if t else '-')}</td><td>{e(verdict_text(c))}</td>"
            f"<td>{e(note_text(a, c))}</td></tr>")
    hist = a.runs[:-1]
    span = f"{len(hist)} earlier run{'' if len(hist) == 1 else 's'}" + (f", {e(hist[0].label)} .. {e(hist[-1].label)}" if hist else "")
    figs = "\n".join(f"<h2>{e(stage)}</h2><img src='{e(name)}' alt='{e(stage)} trend'>" for stage, name in images)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>trainbench nightly: {e(a.new.machine_key)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }} table {{ border-collapse: collapse; font-size: 13px; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; text-align: left; }}
tr.reg td {{ background: #fbb; }} tr.slower td {{ background: #fed; }} tr.faster td {{ background: #dfd; }}
tr.inconclusive td, tr.not-passed td {{ background: #eee; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>trainbench nightly: {e(summary_title(a))}</h1>
<p>machine <code>{e(a.new.machine_key)}</code>; latest run <code>{e(a.new.name)}</code> ({e(a.new.label)});
{span}. {e(counts_line(a))}.</p>
<p>Points: median time per call of each run, bars: its interval; dotted line and band: the level between
change points and its noise band (an unchanged build's run leaves it with a chance of {BAND_TAIL:.2%} on either
side: a Student t prediction interval on the night-to-night spread); dashed lines: change points
(red slower, green faster); diamond: the latest run; crosses: runs where the row did not pass.</p>
<table>
<tr><th>benchmark</th><th>stage</th><th>baseline</th><th>latest</th><th>change</th><th>verdict</th><th>note</th></tr>
{chr(10).join(rows)}
</table>
{figs}
</body></html>
"""
