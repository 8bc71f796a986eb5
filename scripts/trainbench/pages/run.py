"""run-page: one benchsuite run (a `trainbench-results/1` file, results/README.md) as a self-contained HTML page. It
says what the run shows in one sentence, then every pair's ratio as a forest plot grouped by stage (trainbench's C++
pairs with PyTorch's and the cross pairs beside them), each row's share of the ceilings the run measured, the rows
that did not pass with their reasons, and the machine, build and flags; each plot beside a table of its numbers.

The file is read and validated by the tracking package's reader (tracking/resultfile.py); the parts it leaves
alone (pairs, ceilings, rates) are read through accessors that name a value's place when it has the wrong type.
Every number on the page is the file's; a pair's ratio is computed (baseline median over improved median) only
where the pair lacks one, and labelled as computed. Quick, filtered and older runs lack parts: each section then
says in one line why it has nothing to show."""

from __future__ import annotations

import argparse
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import matplotlib
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from ..errors import ResultFileError, UsageError
from ..tracking.resultfile import GPU_BACKENDS, Row, Run, load_run, parse_run
from . import html as markup
from .html import MISSING, significant
from .tune import Field, flattened, shortened

PROG = "run-page"
EXIT_OK, EXIT_USAGE = 0, 2

TORCH_BACKENDS = ("torch", "torch_cuda")  # scripts/torch-peers' rows: PyTorch's world, not trainbench's
TRAINBENCH, PYTORCH, CROSS = "trainbench C++", "PyTorch", "PyTorch vs trainbench"
WORLD_COLOURS = OrderedDict([(TRAINBENCH, "tab:blue"), (PYTORCH, "tab:orange"), (CROSS, "tab:purple")])
# A disposition other than passed (results/README.md) in the page's words; failed: the benchmark threw, and was skipped.
DISPOSITION_WORDS = {"incorrect": "incorrect", "unsupported": "not supported", "failed": "failed"}
# What a row's pct_of_peak_note means (benches/results.cpp; results/README.md).
PEAK_NOTES = {"cache": "no share: hot, and its working set is below the cache threshold (a DRAM ceiling is none "
                       "for it; run --cold for DRAM)",
              "above peak": "no share: faster than the measured ceiling (the work model or the peak is off)"}
# A ceiling's unit (context.peaks) as the page shows it, and its scale.
SHOWN_UNITS = {"B/s": ("GB/s", 1e9), "FLOP/s": ("TFLOP/s", 1e12)}

PLOT_WIDTH_IN = 11.0
ROW_HEIGHT_IN = 0.2     # one pair's or one row's line in a plot
PLOT_MARGIN_IN = 1.3    # title, axis and legend around the lines
LABEL_CHARACTERS = 90   # a tick's label, shortened beyond
RATIO_PADDING = 1.15    # the ratio axis reaches this factor beyond the outermost interval (and 1)
TALL_PLOT_LINES = 40    # a plot of more lines repeats its axis's labels at the top
DISTURBED_ALPHA = 0.4   # a disturbed row's bar: its rate measures the disturbance as well


# ---- What the sections read ----

def world_of_backend(backend: str) -> str:
    return PYTORCH if backend in TORCH_BACKENDS else TRAINBENCH


def backend_of_name(name: str) -> str:
    """A benchmark's backend from its name, "stage/backend/variant/problem"."""
    parts = name.split("/")
    return parts[1] if len(parts) > 1 else ""


def problem_of_name(name: str) -> str:
    parts = name.split("/", 3)
    return parts[3] if len(parts) > 3 else ""


def problem_values(problem: str) -> str:
    """A problem with its values alone ("shape=4x6x256x64,dtype=fp32" -> "4x6x256x64 fp32")."""
    return " ".join(part.partition("=")[2] or part for part in problem.split(",") if part)


def plot_label(words: str, problems: Sequence[str]) -> str:
    """A plot's label: `words` and the problem(s), whole where that fits, else their values alone (the tables
    beside hold them whole), else shortened."""
    whole = f"{words}  {' -> '.join(problems)}".strip()
    if len(whole) <= LABEL_CHARACTERS:
        return whole
    return shortened(f"{words}  {' -> '.join(problem_values(p) for p in problems)}".strip(), LABEL_CHARACTERS)


def row_label(row: Row) -> str:
    """A row as a plot names it: "attention/sdpa [PyTorch torch_cuda] shape=..."; PyTorch's rows say so."""
    side = f"PyTorch {row.backend}" if row.backend in TORCH_BACKENDS else row.backend
    mode = "" if row.mode in ("", "hot") else f" {row.mode}"
    problem = problem_of_name(row.name)
    return plot_label(f"{row.stage}/{row.variant} [{side}{mode}]", [problem] if problem else [])


@dataclass
class Pair:
    """One entry of the file's pairs: baseline time over improved time, with its interval where the file has one."""
    stage: str
    label: str
    baseline: str
    improved: str
    world: str
    kind: str
    ratio: Optional[float]
    ci_low: Optional[float]
    ci_high: Optional[float]
    ci_level: Optional[float]
    rounds: Optional[int]
    computed_from: str      # "" where the file holds the ratio, else what it was computed from
    predicted_ratio: Optional[float]
    moved_out: str

    @property
    def problems(self) -> List[str]:
        """The problem both sides ran, or the baseline's and the improved side's where they differ."""
        baseline, improved = problem_of_name(self.baseline), problem_of_name(self.improved)
        return [p for p in ([improved] if baseline in ("", improved) else [baseline, improved]) if p]

    @property
    def problem(self) -> str:
        return " -> ".join(self.problems)

    @property
    def plot_label(self) -> str:
        return plot_label(self.shown_label, self.problems)

    @property
    def shown_label(self) -> str:
        """The pair's label, saying PyTorch where both sides are PyTorch's ("torch AdamW: ..." -> "PyTorch: ...")."""
        if self.world == PYTORCH and "pytorch" not in self.label.lower():
            return f"PyTorch: {self.label}"
        return self.label

    @property
    def ratio_from(self) -> str:
        if self.computed_from:
            return self.computed_from
        return "file" if self.ratio is not None else "nowhere: the pair holds no ratio and no medians"

    @property
    def faster(self) -> bool:
        """A speedup beyond noise: the interval lies above 1."""
        return self.ratio is not None and self.ci_low is not None and self.ci_low > 1

    @property
    def slower(self) -> bool:
        return self.ratio is not None and self.ci_high is not None and self.ci_high < 1

    @property
    def verdict(self) -> str:
        if self.ratio is None:
            return "no ratio"
        if self.ci_low is None or self.ci_high is None:
            return "no interval"
        return "faster beyond noise" if self.faster else "slower beyond noise" if self.slower else "within noise"


@dataclass
class Withheld:
    """A pair with no ratio, and why: the file's pairs_withheld, or a pair whose side did not pass."""
    stage: str
    label: str
    baseline: str
    improved: str
    why: str


@dataclass
class RunView:
    """What every section reads: the validated run, its context and its pairs."""
    run: Run
    name: str
    context: Field
    pairs: List[Pair]
    withheld: List[Withheld]
    has_pairs_list: bool
    row_index: Dict[int, int]  # id of a row's dict -> its place in the file's benchmarks

    @property
    def rows(self) -> List[Row]:
        return list(self.run.rows.values())

    def row_field(self, row: Row) -> Field:
        """The row's keys, each named by its place in the file ("RUN.json: benchmarks[7].pct_of_peak")."""
        return Field(row.raw, f"{self.name}: benchmarks[{self.row_index[id(row.raw)]}]")


def positive(field: Field) -> Optional[float]:
    value = field.number()
    if value is not None and value <= 0:
        raise field.refuse("a positive number")
    return value


def rows_by_name(run: Run) -> Dict[str, List[Row]]:
    found: Dict[str, List[Row]] = {}
    for row in run.rows.values():
        found.setdefault(row.name, []).append(row)
    return found


def median_ns(rows: Sequence[Row]) -> Optional[float]:
    """A passed row's median as the file records it (median_ns), else of its samples."""
    for row in rows:
        if row.passed:
            value = row.raw.get("median_ns")
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 \
                else row.median
    return None


def read_pair(entry: Field, by_name: Dict[str, List[Row]]) -> Pair:
    baseline, improved = entry["baseline"].required().text(), entry["improved"].required().text()
    worlds = {world_of_backend(backend_of_name(baseline)), world_of_backend(backend_of_name(improved))}
    world = worlds.pop() if len(worlds) == 1 else CROSS
    ratio, computed_from = positive(entry["ratio"]), ""
    if ratio is None:
        # The one number this page computes: the medians' ratio, where the pair holds none.
        base_ns, improved_ns = positive(entry["baseline_median_ns"]), positive(entry["improved_median_ns"])
        if base_ns is not None and improved_ns is not None:
            ratio, computed_from = base_ns / improved_ns, "computed: baseline_median_ns / improved_median_ns"
        else:
            base_ns, improved_ns = median_ns(by_name.get(baseline, [])), median_ns(by_name.get(improved, []))
            if base_ns is not None and improved_ns is not None:
                ratio, computed_from = base_ns / improved_ns, "computed: the two rows' median_ns"
    moved_out = entry["moved_out"]
    moved_text = ""
    if moved_out.present:
        moved_text = f"{moved_out['what'].text() or 'a cost'} moved out of the loop, " \
                     f"{significant(moved_out['ns_per_call'].number())} ns per call added"
    return Pair(entry["stage"].text() or baseline.split("/")[0],
                entry["label"].text() or f"{baseline} -> {improved}", baseline, improved, world,
                entry["kind"].text() or "timed", ratio,
                None if computed_from else positive(entry["ci_low"]),
                None if computed_from else positive(entry["ci_high"]),
                None if computed_from else entry["ci_level"].number(),
                entry["rounds"].count(), computed_from, entry["predicted"]["ratio"].number(), moved_text)


def not_passed_side(pair: Pair, by_name: Dict[str, List[Row]]) -> Optional[str]:
    """Why a pair is not shown where one of its sides did not pass: such a variant is never shown as fast."""
    for side, name in (("improved", pair.improved), ("baseline", pair.baseline)):
        for row in by_name.get(name, []):
            if not row.passed:
                return f"its {side} side {name} is {DISPOSITION_WORDS.get(row.disposition, row.disposition)}" \
                       f"{': ' + row.reason if row.reason else ''}"
    return None


def read_view(run: Run) -> RunView:
    def top(key: str) -> Field:
        return Field(run.data.get(key), f"{run.path}: {key}")

    by_name = rows_by_name(run)
    pairs, withheld = [], []
    for entry in top("pairs").entries():
        pair = read_pair(entry, by_name)
        why = not_passed_side(pair, by_name)
        if why:
            withheld.append(Withheld(pair.stage, pair.label, pair.baseline, pair.improved, why))
        else:
            pairs.append(pair)
    for entry in top("pairs_withheld").entries():
        withheld.append(Withheld(entry["stage"].text() or MISSING, entry["label"].text() or MISSING,
                                 entry["baseline"].text() or MISSING, entry["improved"].text() or MISSING,
                                 entry["why"].text() or "no reason recorded"))
    return RunView(run, run.path, top("context"), pairs, withheld, top("pairs").present,
                   {id(raw): index for index, raw in enumerate(run.data["benchmarks"])})


def machine_name(view: RunView) -> str:
    """The GPU's name for a GPU run (as the machine key decides), else the CPU's model and cores."""
    context = view.context
    devices = context["devices"].entries()
    if devices and any(row.backend in GPU_BACKENDS for row in view.rows) and devices[0]["name"].text():
        return devices[0]["name"].text()
    host = context["host"]
    model, cores = host["cpu_model"].text() or "an unnamed CPU", host["cores"].count()
    return model if cores is None else f"{model} ({cores} cores)"


def stage_groups(pairs: Sequence[Pair]) -> "OrderedDict[str, List[Pair]]":
    """The pairs by stage in the file's order of stages; in a stage trainbench's first, then PyTorch's, then the
    cross pairs, each in the file's order."""
    groups: "OrderedDict[str, List[Pair]]" = OrderedDict()
    for pair in pairs:
        groups.setdefault(pair.stage, []).append(pair)
    order = list(WORLD_COLOURS)
    return OrderedDict((stage, sorted(members, key=lambda p: order.index(p.world)))
                       for stage, members in groups.items())


# ---- The claim ----

def count_of(number: int, one: str, many: str) -> str:
    return f"{number} {one if number == 1 else many}"


def claim_sentence(view: RunView) -> str:
    pairs = view.pairs
    words = [f"On {machine_name(view)}, "]
    if pairs:
        worlds = OrderedDict((world, sum(p.world == world for p in pairs)) for world in WORLD_COLOURS)
        split = ", ".join(f"{n} {world}" for world, n in worlds.items() if n)
        words.append(f"{count_of(len(pairs), 'pair was', 'pairs were')} judged ({split})")
        faster = [p for p in pairs if p.faster]
        words.append(f": {len(faster)} {'shows' if len(faster) == 1 else 'show'} a speedup beyond noise "
                     "(interval above 1)")
        if faster:
            best = max(faster, key=lambda p: p.ratio)
            level = f"{round(100 * best.ci_level)}% " if best.ci_level is not None else ""
            named = best.shown_label if best.stage.lower() in best.shown_label.lower() else \
                f"{best.stage}: {best.shown_label}"
            where = f", {best.problem}" if best.problem else ""
            words.append(f", the largest {best.ratio:.2f}x ({named}{where}; "
                         f"{level}CI {best.ci_low:.2f}-{best.ci_high:.2f})")
        slower = sum(p.slower for p in pairs)
        if slower:
            words.append(f", {slower} a slowdown beyond noise")
    else:
        words.append("no pair was judged")
    if view.withheld:
        words.append(f", {count_of(len(view.withheld), 'pair', 'pairs')} withheld")
    rows = view.rows
    not_passed = [row for row in rows if not row.passed]
    if not_passed:
        counts = ", ".join(f"{sum(r.disposition == d for r in not_passed)} {DISPOSITION_WORDS[d]}"
                           for d in DISPOSITION_WORDS)
        words.append(f"; {len(not_passed)} of {count_of(len(rows), 'row', 'rows')} were incorrect or skipped "
                     f"({counts})")
    else:
        words.append(f"; none of its {count_of(len(rows), 'row', 'rows')} was incorrect or skipped")
    interrupted = view.context["interrupted"].text()
    if interrupted:
        words.append(f"; the run was stopped early ({interrupted})")
    return "".join(words) + "."


# ---- The sections ----

def ratio_axis(ax, values: Sequence[float]) -> None:
    """A log axis around 1 that holds every value, labelled 0.5, 1, 2 rather than 2^-1."""
    low, high = min(list(values) + [1.0]) / RATIO_PADDING, max(list(values) + [1.0]) * RATIO_PADDING
    ax.set_xscale("log", base=2)
    ax.set_xlim(low, high)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.axvline(1.0, color="black", linewidth=0.9)


def label_tall_axis(ax, lines: int) -> None:
    """A plot taller than a screen has its x axis's labels at the top as well."""
    if lines > TALL_PLOT_LINES:
        ax.tick_params(axis="x", top=True, labeltop=True)


def forest_img(groups: "OrderedDict[str, List[Pair]]") -> str:
    lines = sum(len(members) + 1 for members in groups.values())
    figure = markup.new_figure(PLOT_WIDTH_IN, PLOT_MARGIN_IN + ROW_HEIGHT_IN * lines)
    ax = figure.add_subplot()
    labels, headings, values = [], [], []
    y = 0
    for stage, members in groups.items():
        headings.append(y)
        labels.append(stage)
        if y:
            ax.axhline(y - 0.5, color="lightgrey", linewidth=0.8)
        y += 1
        for pair in members:
            labels.append(pair.plot_label)
            colour = WORLD_COLOURS[pair.world]
            if pair.ratio is not None:
                if pair.ci_low is not None and pair.ci_high is not None:
                    ax.hlines(y, pair.ci_low, pair.ci_high, color=colour, linewidth=1.6)
                    values += [pair.ci_low, pair.ci_high]
                ax.plot([pair.ratio], [y], marker="s" if pair.kind == "amortised" else "o", markersize=4.5,
                        color=colour, markerfacecolor="white" if pair.computed_from else colour, zorder=3)
                values.append(pair.ratio)
            y += 1
    ratio_axis(ax, values)
    ax.set_yticks(range(lines), labels, fontsize=7)
    for index in headings:
        ax.get_yticklabels()[index].set_fontweight("bold")
    ax.set_ylim(lines - 0.5, -0.5)
    ax.tick_params(axis="y", length=0)
    label_tall_axis(ax, lines)
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlabel("ratio: baseline time / improved time (above 1: the improved side is faster)")
    ax.set_title("Each pair's ratio with its interval, by stage")
    present = [world for world in WORLD_COLOURS if any(p.world == world for ms in groups.values() for p in ms)]
    handles = [Line2D([], [], color=WORLD_COLOURS[w], marker="o", label=w) for w in present]
    every = [p for members in groups.values() for p in members]
    if any(p.kind == "amortised" for p in every):
        handles.append(Line2D([], [], color="grey", marker="s", linestyle="", label="amortised"))
    if any(p.computed_from for p in every):
        handles.append(Line2D([], [], color="grey", marker="o", markerfacecolor="white", linestyle="",
                              label="ratio computed (no interval)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    alt = (f"Forest plot of {count_of(len(every), 'pair', 'pairs')} in {count_of(len(groups), 'stage', 'stages')} "
           f"({', '.join(groups)}): each pair's ratio of baseline time to improved time as a dot with its interval "
           f"as a line, on a log axis with a vertical line at 1; coloured by world ({', '.join(present)}).")
    return markup.figure_img(figure, alt)


def measured_text(pair: Pair) -> str:
    return f"interleaved, {pair.rounds} rounds" if pair.rounds else "apart"


def kind_text(pair: Pair) -> str:
    return f"{pair.kind}: {pair.moved_out}" if pair.moved_out else pair.kind


def pairs_section(view: RunView) -> str:
    heading = "Pairs: each fast variant against its baseline"
    filter_text = view.context["settings"]["filter"].text()
    parts = []
    if not view.pairs:
        if not view.has_pairs_list:
            why = "The file has no pairs list (a benchsuite older than pairs, or a file of Google Benchmark's own)."
        else:
            why = ("The file records no judged pair: the run selected no two rows of a declared pair"
                   + (f" (settings.filter {filter_text!r})" if filter_text else "")
                   + (", and every declared pair it did select was withheld (below)" if view.withheld else "") + ".")
        parts.append(markup.why_nothing(why))
    else:
        groups = stage_groups(view.pairs)
        parts.append(markup.paragraph(
            "A ratio is the baseline's time over the improved side's (results/README.md): above 1 the improved "
            "variant is faster, and a pair whose interval lies above 1 is a speedup beyond noise. PyTorch's pairs "
            "(both sides PyTorch: what a user gains by changing their PyTorch code) and the cross pairs (PyTorch's "
            "row against the trainbench row it mirrors: above 1 trainbench's is faster) stand beside trainbench's "
            "in each stage. Interleaved pairs were measured in alternating rounds; the others from the two rows' "
            "samples taken apart."))
        rows = [(p.stage, p.shown_label, p.problem or MISSING, p.world, significant(p.ratio), significant(p.ci_low),
                 significant(p.ci_high), significant(p.ci_level), p.verdict, measured_text(p), kind_text(p),
                 significant(p.predicted_ratio), p.ratio_from)
                for members in groups.values() for p in members]
        table = markup.table("pairs-table", ["stage", "pair", "problem", "world", "ratio", "CI low", "CI high",
                                             "CI level", "verdict", "measured", "kind", "predicted ratio",
                                             "ratio from"], rows,
                             caption="The pairs behind the plot, top to bottom (the file's pairs)")
        parts.append(markup.plot_beside_table(forest_img(groups), table))
    if view.withheld:
        rows = [(w.stage, w.label, w.baseline, w.improved, w.why) for w in view.withheld]
        parts.append(markup.table("pairs-withheld-table", ["stage", "pair", "baseline", "improved", "why"], rows,
                                  caption="Pairs with no ratio shown (pairs_withheld, and pairs with a side that "
                                          "did not pass)"))
    return markup.section("pairs", heading, *parts)


@dataclass
class Ceiling:
    """A measured ceiling of the run (context.peaks): the best figure of the peak's work the run measured."""
    key: str
    value: float
    unit: str
    benchmark: str
    configuration: str
    own_samples_value: Optional[float]

    @property
    def shown_unit(self) -> str:
        return SHOWN_UNITS.get(self.unit, (self.unit or MISSING, 1.0))[0]

    def scaled(self, value: Optional[float]) -> str:
        """A value in this ceiling's unit as the page shows it, in shown_unit (B/s in GB/s, FLOP/s in TFLOP/s)."""
        return significant(None if value is None else value / SHOWN_UNITS.get(self.unit, ("", 1.0))[1])


def ceilings_of(view: RunView) -> "OrderedDict[str, Ceiling]":
    peaks = view.context["peaks"]
    ceilings: "OrderedDict[str, Ceiling]" = OrderedDict()
    for key in peaks.keys():
        peak = peaks[key]
        ceilings[key] = Ceiling(key, positive(peak["value"].required()), peak["unit"].text() or "",
                                peak["benchmark"].text() or MISSING, peak["configuration"].text() or "",
                                peak["own_samples_value"].number())
    return ceilings


@dataclass
class PeakRow:
    row: Row
    ceiling_key: str
    percent: Optional[float]
    gb_per_s: Optional[float]
    tflop_per_s: Optional[float]
    note: str


def peak_rows(view: RunView, ceilings: Dict[str, Ceiling]) -> List[PeakRow]:
    """The passed rows measured against a ceiling (a peak_key), by ceiling in the order of the ceilings, then in
    the file's order."""
    found = []
    for row in view.rows:
        field = view.row_field(row)
        key = field["peak_key"].text()
        if not row.passed or not key:
            continue
        percent = field["pct_of_peak"].number()
        note = ""
        if percent is None:
            written = field["pct_of_peak_note"].text()
            note = PEAK_NOTES.get(written, f"no share: {written}") if written else \
                "no share: this run measured no such ceiling" if key not in ceilings else "no share recorded"
        if row.disturbed:
            note = "; ".join(n for n in (note, row.disturbance) if n)
        found.append(PeakRow(row, key, percent, field["gb_per_s"].number(), field["tflop_per_s"].number(), note))
    order = list(ceilings)
    return sorted(found, key=lambda p: order.index(p.ceiling_key) if p.ceiling_key in order else len(order))


def peak_img(rows: Sequence[PeakRow], ceilings: Dict[str, Ceiling]) -> str:
    figure = markup.new_figure(PLOT_WIDTH_IN, PLOT_MARGIN_IN + ROW_HEIGHT_IN * len(rows))
    ax = figure.add_subplot()
    colours = matplotlib.colormaps["tab10"]
    keys = list(OrderedDict.fromkeys(p.ceiling_key for p in rows))
    for y, p in enumerate(rows):
        torch = p.row.backend in TORCH_BACKENDS
        ax.barh(y, p.percent, color=colours(keys.index(p.ceiling_key) % 10), hatch="///" if torch else None,
                edgecolor="white" if torch else None, alpha=DISTURBED_ALPHA if p.row.disturbed else 1.0)
    ax.axvline(100.0, color="black", linewidth=0.9)
    ax.set_yticks(range(len(rows)), [row_label(p.row) for p in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, max([100.0] + [p.percent for p in rows]) * 1.05)
    label_tall_axis(ax, len(rows))
    ax.set_xlabel("% of the measured ceiling (pct_of_peak); the line is the ceiling")
    ax.set_title("Each row's share of the ceiling it is bound by")
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=colours(i % 10), label=f"{key}: {ceilings[key].scaled(ceilings[key].value)} "
                                                  f"{ceilings[key].shown_unit}" if key in ceilings else key)
               for i, key in enumerate(keys)]
    if any(p.row.backend in TORCH_BACKENDS for p in rows):
        handles.append(Patch(facecolor="grey", hatch="///", edgecolor="white", label="PyTorch's row"))
    if any(p.row.disturbed for p in rows):
        handles.append(Patch(facecolor="grey", alpha=DISTURBED_ALPHA, label="disturbed (see the table)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    alt = (f"Horizontal bars of the percentage of its measured ceiling each of {count_of(len(rows), 'row', 'rows')} "
           f"reaches, with a vertical line at 100%, coloured by ceiling ({', '.join(keys)})"
           + ("; PyTorch's rows hatched" if any(p.row.backend in TORCH_BACKENDS for p in rows) else "")
           + ("; disturbed rows pale." if any(p.row.disturbed for p in rows) else "."))
    return markup.figure_img(figure, alt)


def peak_section(view: RunView) -> str:
    heading = "Share of the measured peak"
    ceilings = ceilings_of(view)
    parts = []
    if ceilings:
        rows = [(c.key, c.scaled(c.value), c.shown_unit, c.benchmark, c.configuration or MISSING,
                 c.scaled(c.own_samples_value)) for c in ceilings.values()]
        parts.append(markup.table("ceilings-table", ["ceiling", "measured", "unit", "set by", "configuration",
                                                     "the peak rows' own samples (own_samples_value)"], rows,
                                  caption="The machine's ceilings as this run measured them (context.peaks)"))
    else:
        parts.append(markup.why_nothing("The file records no measured ceiling (context.peaks is empty or absent: "
                                        "the run selected no peak row and no row doing a peak's work)."))
    found = peak_rows(view, ceilings)
    shown = [p for p in found if p.percent is not None]
    if shown:
        table_rows = [(p.row.key, world_of_backend(p.row.backend), p.ceiling_key, significant(p.percent),
                       significant(p.gb_per_s), significant(p.tflop_per_s), p.note or MISSING) for p in found]
        table = markup.table("peak-table", ["row", "world", "ceiling", "% of peak", "GB/s", "TFLOP/s", "note"],
                             table_rows, caption="Every passed row with a ceiling (peak_key); the bars are those "
                                                 "with a share (pct_of_peak)")
        parts.append(markup.plot_beside_table(peak_img(shown, ceilings), table))
    else:
        why = ("No passed row is measured against a ceiling (no row has a peak_key)." if not found else
               f"None of the {count_of(len(found), 'row', 'rows')} measured against a ceiling has a share of it: "
               + "; ".join(sorted({p.note for p in found})) + ".")
        parts.append(markup.why_nothing(why))
        if found:
            parts.append(markup.table("peak-table", ["row", "world", "ceiling", "GB/s", "TFLOP/s", "note"],
                                      [(p.row.key, world_of_backend(p.row.backend), p.ceiling_key,
                                        significant(p.gb_per_s), significant(p.tflop_per_s), p.note)
                                       for p in found]))
    unbound = sum(1 for row in view.rows if row.passed and not view.row_field(row)["peak_key"].text())
    if unbound:
        parts.append(markup.paragraph(f"{count_of(unbound, 'passed row has', 'passed rows have')} no ceiling "
                                      "(no peak_key: the peak rows themselves, and work no measured ceiling "
                                      "bounds, such as launches and host reads)."))
    return markup.section("peak", heading, *parts)


def incorrect_section(view: RunView) -> str:
    heading = "Rows that did not pass"
    rows = [row for row in view.rows if not row.passed]
    if not rows:
        return markup.section("incorrect", heading, markup.why_nothing(
            f"Every one of the {count_of(len(view.rows), 'row', 'rows')} passed its check against the reference: "
            "none is incorrect or skipped."))
    table_rows = []
    for row in rows:
        field = view.row_field(row)
        max_error = field["max_error"].number() if row.disposition == "incorrect" else None
        table_rows.append((row.key, world_of_backend(row.backend), DISPOSITION_WORDS.get(row.disposition,
                                                                                         row.disposition),
                           row.reason or "no reason recorded", significant(max_error)))
    return markup.section("incorrect", heading, markup.paragraph(
        "These rows have no timings: they are on no plot, in no pair's ratio and in no share of a peak."),
        markup.table("incorrect-table", ["row", "world", "disposition", "message", "max error"], table_rows,
                     caption="Incorrect, unsupported and failed rows with their reasons"))


# The context's parts in the order the machine's table shows them; the rest follow in the file's order.
MACHINE_FIRST = ("trainbench", "settings", "devices", "host", "torch")
MACHINE_LEFT_OUT = ("peaks",)  # shown in the peak section


def machine_section(view: RunView) -> str:
    heading = "Machine, build and flags"
    context = view.context
    rows = [("machine", machine_name(view)),
            ("machine key (derived, results/README.md)", view.run.machine_key),
            ("date", context["date"].text() or MISSING),
            ("commit (trainbench.git_commit)", view.run.commit or MISSING)]
    keys = context.keys()
    for key in [k for k in MACHINE_FIRST if k in keys] + [k for k in keys if k not in MACHINE_FIRST]:
        if key in MACHINE_LEFT_OUT or key == "date":
            continue
        if key == "devices" and isinstance(context[key].value, list):
            for index, device in enumerate(context[key].entries()):
                rows += flattened(device, f"devices[{index}]")
            if not context[key].value:
                rows.append(("devices", "none"))
            continue
        rows += flattened(context[key], key)
    return markup.section("machine", heading, markup.table("machine-table", ["key", "value"], rows,
                                                           caption="As the file's context records them"))


def title_of(view: RunView) -> str:
    when = view.run.date.strftime("%Y-%m-%d %H:%M UTC") if view.run.date else "undated"
    commit = f" at {view.run.commit}" if view.run.commit else ""
    return f"benchsuite run: {machine_name(view)}, {when}{commit}"


def page_of_run(run: Run) -> str:
    """The page of a run read and validated by tracking/resultfile.py. Raises ResultFileError, naming the place,
    for a value of the wrong type."""
    view = read_view(run)
    sections = [markup.section("claim", "", markup.paragraph(claim_sentence(view))), pairs_section(view),
                peak_section(view), incorrect_section(view), machine_section(view)]
    return markup.page(title_of(view), sections)


def run_page(run: dict, name: str = "the run file") -> str:
    """The page of one benchsuite run: `run` is its decoded result document. Raises ResultFileError, naming the
    place, where the document is not a valid result file or a value has the wrong type."""
    return page_of_run(parse_run(run, name))


# ---- The command ----

def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description="One benchsuite run (its result file) as a self-contained HTML page (no script, "
                               "nothing fetched).",
        epilog="example: scripts/run-page results/<machine-key>/<run>.json --out run.html")
    parser.add_argument("run", metavar="RUN.json", help="a benchsuite result file (trainbench-results/1)")
    parser.add_argument("--out", metavar="PAGE.html", required=True, help="the page to write (atomically)")
    args = parser.parse_args(argv)
    return markup.page_command(PROG, args.run, args.out, lambda: page_of_run(load_run(args.run)))


if __name__ == "__main__":
    sys.exit(main())
