"""Rendering an Analysis: a console table, markdown for a pull-request comment, JSON for tools."""

from __future__ import annotations

import json
import math
from typing import List

from .stats import FASTER, INCONCLUSIVE, SAME, SLOWER
from .compare import Analysis, Comparison


def fmt_time(ns) -> str:
    if ns is None or not math.isfinite(ns):
        return "-"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def _change(c: Comparison) -> str:
    return f"{c.test.ratio - 1:+.1%}" if c.test else "-"


def _p(c: Comparison) -> str:
    if not c.test or not math.isfinite(c.test.p_value):
        return "-"
    return f"{c.test.p_value:.2g}"


def verdict_text(c: Comparison) -> str:
    if c.status == "compared":
        return c.verdict + ("?" if c.unconfirmed else "")
    return {"not-passed": "not compared", "disturbed": "disturbed", "new": "new", "missing": "missing"}[c.status]


def note_text(a: Analysis, c: Comparison) -> str:
    parts = []
    if c.confirmed:
        parts.append("CONFIRMED REGRESSION")
    if c.unconfirmed:
        parts.append("unconfirmed: two single runs")
    if c.start_index is not None and c.verdict in (SLOWER, FASTER):
        parts.append(f"since {a.runs[c.start_index].label}")
    if c.status == "not-passed":
        parts.append(f"{c.disposition}" + (f": {c.reason}" if c.reason else "") + " (no timing)")
    if c.status == "disturbed":
        parts.append(f"{c.reason} (not judged: its timing measures the disturbance)")
    if c.test is not None and c.threshold != a.settings.threshold:
        parts.append(f"threshold {c.threshold:.0%}")
    parts.extend(c.notes)
    return "; ".join(parts)


def _order(c: Comparison) -> int:
    if c.confirmed:
        return 0
    return {SLOWER: 1, FASTER: 2, INCONCLUSIVE: 3}.get(c.verdict, 4 if c.status != "compared" else 5)


def summary_title(a: Analysis) -> str:
    n = len(a.regressions)
    if n:
        return f"{n} confirmed regression{'s' if n > 1 else ''}"
    u = len(a.unconfirmed)
    if u:
        return f"no confirmed regression; {u} SLOWER? (unconfirmed)"
    return "no confirmed regression"


def counts_line(a: Analysis) -> str:
    counts = {v: 0 for v in (SAME, FASTER, SLOWER, INCONCLUSIVE)}
    other = 0
    for c in a.comparisons:
        if c.status == "compared":
            counts[c.verdict] += 1
        else:
            other += 1
    parts = [f"{n} {v}" for v, n in counts.items()]
    if other:
        parts.append(f"{other} not compared")
    return ", ".join(parts)


def _context(a: Analysis) -> List[str]:
    new = a.new
    if a.mode == "interleaved":
        return [f"machine: {new.machine_key}",
                f"interleaved: {a.rounds} round{'s' if a.rounds != 1 else ''} (ABBA), "
                "each benchmark judged on its per-round new/baseline ratios",
                f"baseline: {a.builds[0] or '-'}", f"new: {a.builds[1] or '-'}"]
    lines = [f"machine: {new.machine_key}", f"new run: {new.path} ({new.label})"]
    if a.mode == "files":
        base = a.runs[0]
        lines.append(f"baseline: {base.path} ({base.label})")
    else:
        hist = a.runs[:-1]
        if hist:
            lines.append(f"history: {len(hist)} run{'s' if len(hist) > 1 else ''}, "
                         f"{hist[0].label} .. {hist[-1].label}")
        else:
            lines.append("history: none yet for this machine (this run starts it)")
    return lines


def table(a: Analysis) -> str:
    head = ["benchmark", "baseline", "new", "change", "p", "verdict", "note"]
    body = []
    for c in a.comparisons:
        base = fmt_time(c.test.base_median) if c.test else "-"
        new = fmt_time(c.test.new_median) if c.test else "-"
        body.append([c.key, base, new, _change(c), _p(c), verdict_text(c), note_text(a, c)])
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head) - 1)]
    out = _context(a) + [""]
    for r in [head] + body:
        out.append("  ".join(r[i].ljust(widths[i]) if i < len(widths) else r[i] for i in range(len(r))).rstrip())
    out.append("")
    for w in a.warnings:
        out.append(f"warning: {w}")
    out.append(f"{summary_title(a)} ({counts_line(a)})")
    return "\n".join(out) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(a: Analysis) -> str:
    what = f"interleaved A/B, {a.rounds} rounds" if a.mode == "interleaved" else "nightly"
    out = [f"### trainbench {what}: {summary_title(a)}", ""]
    out += [f"- {_md_cell(line)}" for line in _context(a)]
    out += [f"- {counts_line(a)}"]
    out += [f"- warning: {_md_cell(w)}" for w in a.warnings]
    out.append("")
    head = "| benchmark | baseline | new | change | p | verdict | note |\n|---|---:|---:|---:|---:|---|---|"
    rows = sorted(a.comparisons, key=_order)
    shown = [c for c in rows if c.verdict != SAME]
    same = [c for c in rows if c.verdict == SAME]

    def line(c):
        v = verdict_text(c)
        v = f"**{v}**" if c.confirmed else v
        base = fmt_time(c.test.base_median) if c.test else "-"
        new = fmt_time(c.test.new_median) if c.test else "-"
        cells = [f"`{_md_cell(c.key)}`", base, new, _change(c), _p(c), v, _md_cell(note_text(a, c))]
        return "| " + " | ".join(cells) + " |"

    if shown:
        out += [head] + [line(c) for c in shown] + [""]
    if same:
        out += [f"<details><summary>{len(same)} benchmarks SAME</summary>", "", head]
        out += [line(c) for c in same] + ["", "</details>", ""]
    return "\n".join(out)


def to_json(a: Analysis) -> str:
    def comp(c: Comparison):
        t = c.test
        return {
            "benchmark": c.key, "stage": c.stage, "backend": c.backend, "status": c.status,
            "disposition": c.disposition, "reason": c.reason, "verdict": c.verdict,
            "confirmed_regression": c.confirmed, "unconfirmed_slower": c.unconfirmed,
            "environment": c.environment or None,
            "threshold": c.threshold,
            "ratio": t.ratio if t else None,
            "p_value": t.p_value if t and math.isfinite(t.p_value) else None,
            "ratio_ci": list(t.ci) if t and math.isfinite(t.ci[0]) else None,
            "baseline_median_ns": t.base_median if t else None,
            "new_median_ns": t.new_median if t else None,
            "baseline_runs": [a.runs[i].name for i in c.baseline_indices],
            "shift_start": a.runs[c.start_index].name if c.start_index is not None else None,
            "change_points": [{"run": a.runs[i].name, "ratio": cp.ratio, "p_value": cp.p_value}
                              for i, cp in c.change_points],
            "notes": c.notes,
        }
    doc = {"mode": a.mode, "machine_key": a.new.machine_key, "new_run": a.new.path,
           "baseline_runs": [r.path for r in a.runs[:-1]], "confirmed_regressions": len(a.regressions),
           "unconfirmed_slower": len(a.unconfirmed),
           "exit_code": a.exit_code, "warnings": a.warnings,
           "comparisons": [comp(c) for c in a.comparisons]}
    if a.mode == "interleaved":
        doc.update(new_run=a.builds[1], baseline_runs=[a.builds[0]], rounds=a.rounds)
    return json.dumps(doc, indent=2) + "\n"
