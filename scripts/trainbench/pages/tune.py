"""tune-page: one autotune run as a self-contained HTML page, from its tuned file (YAML, or JSON with autotune
--format json; tuner/emit.cpp writes it) and, where given, its journal (one JSON line per trial;
tuner/journal.cpp). The page says what was chosen and what that claims, then how the search, the race, the
step's time and the budget went, each plot beside a table of the numbers behind it.

Every number on the page is read from the two files; the only numbers computed are ratios between two
measured values (switch effects), labelled as such. Older files, tunes stopped early and tunes without a race
or a time split lack whole parts: each section then says in one line why it has nothing to show."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib
from matplotlib.ticker import FuncFormatter

from ..errors import ResultFileError, UsageError
from . import html as markup
from .html import MISSING, integer, significant

PROG = "tune-page"
EXIT_OK, EXIT_USAGE = 0, 2
TOP_KEY = "trainbench_autotune"

MIB = 2 ** 20
GIB = 2 ** 30
PLOT_WIDTH_IN = 7.5
PLOT_HEIGHT_IN = 4.2
WIDE_PLOT_WIDTH_IN = 9.5  # a plot whose rows are named by configurations
LABEL_CHARACTERS = 60     # a legend's or a tick's label, shortened beyond
COLOURED_GROUPS = 10      # switch combinations with a colour of their own in the search's plots; the rest grey
SPREAD_LOG2 = 0.5         # how far apart sideways the first and the last switch combination sit (log2 micro-batch)
CAPACITY_ON_SCALE = 4     # the device's memory is drawn where it is within this factor of the largest peak

# The classes of a trial's result (tuner/search.h TrialClass) other than ok, each with its marker.
FAILED_MARKERS = OrderedDict([("oom", "v"), ("timeout", "s"), ("incorrect", "D"), ("error", "X")])
# The parts of a step (tuner/autotune_steps.cpp split_json), in the words autotune prints for them.
STEP_PARTS = OrderedDict([("data", "waiting for data"), ("forward_backward", "forward+backward"),
                          ("optimizer", "clip+optimizer+zero"), ("communication", "communication"),
                          ("sync", "host sync")])
# Where the budget went (search.budget_spent), in its order.
BUDGET_PARTS = OrderedDict([("set_up_seconds", "set-up"), ("versus_seconds", "--versus search"),
                            ("search_seconds", "search"), ("race_seconds", "race"),
                            ("profile_seconds", "profile"), ("unused_seconds", "unused")])


# ---- Reading the files: every value with the place it came from ----

class Field:
    """A value of the tuned file or of a journal line with where it was found, so that a value of the wrong type
    is refused in one line naming its place ("trainbench_autotune.race.finalists[2].vs_leader.ratio: expected a
    number, found a string 'x'"). An absent key reads as None."""

    def __init__(self, value, where: str):
        self.value = value
        self.where = where

    def __getitem__(self, key: str) -> "Field":
        if self.value is not None and not isinstance(self.value, dict):
            raise self.refuse("a mapping")
        return Field(None if self.value is None else self.value.get(key), f"{self.where}.{key}")

    @property
    def present(self) -> bool:
        return self.value is not None

    def required(self) -> "Field":
        if self.value is None:
            raise ResultFileError(f"{self.where}: missing")
        return self

    def number(self) -> Optional[float]:
        value = self.value
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.refuse("a finite number")
        return float(value)

    def count(self) -> Optional[int]:
        value = self.value
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (isinstance(value, float) and not value.is_integer()):
            raise self.refuse("a whole number")
        return int(value)

    def text(self) -> Optional[str]:
        if self.value is None:
            return None
        if not isinstance(self.value, str):
            raise self.refuse("a string")
        return self.value

    def flag(self) -> Optional[bool]:
        if self.value is None:
            return None
        if not isinstance(self.value, bool):
            raise self.refuse("true or false")
        return self.value

    def entries(self) -> List["Field"]:
        if self.value is None:
            return []
        if not isinstance(self.value, list):
            raise self.refuse("a list")
        return [Field(v, f"{self.where}[{i}]") for i, v in enumerate(self.value)]

    def keys(self) -> List[str]:
        if self.value is None:
            return []
        if not isinstance(self.value, dict):
            raise self.refuse("a mapping")
        return [str(k) for k in self.value]

    def refuse(self, expected: str) -> ResultFileError:
        shown = repr(self.value)
        if len(shown) > 40:
            shown = shown[:37] + "..."
        kind = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(type(self.value),
                                                                                           "a number")
        return ResultFileError(f"{self.where}: expected {expected}, found {kind} {shown}")


def switch_value(field: Field) -> str:
    """A switch's value as autotune wrote it. Older YAML files left on and off unquoted, which a YAML 1.1 reader
    (PyYAML) takes for booleans, and bucket_mb's digits for a number."""
    value = field.value
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise field.refuse("a switch's value")


# ---- Configurations and trials ----

@dataclass(frozen=True)
class Config:
    """A configuration as the search ran it: the global batch of one rank (a key's g=), the micro-batch and the
    switches, sorted by name as in autotune's keys."""
    rank_batch: int
    micro_batch: int
    switches: Tuple[Tuple[str, str], ...]

    @property
    def accumulation(self) -> int:
        return self.rank_batch // self.micro_batch

    def switch(self, name: str) -> Optional[str]:
        return dict(self.switches).get(name)

    def key(self) -> str:
        """autotune's key (tuner/search.cpp Candidate::key): "g=32 mb=16 optimizer=fused ..."."""
        return " ".join([f"g={self.rank_batch}", f"mb={self.micro_batch}"] + [f"{k}={v}" for k, v in self.switches])

    def without(self, name: str) -> Tuple:
        """The configuration less one switch: what two trials differing in that switch alone share."""
        return self.rank_batch, self.micro_batch, tuple(s for s in self.switches if s[0] != name)

    def changed_from(self, own: Optional["Config"]) -> List[str]:
        """The switches set otherwise than in `own`, as name=value."""
        if own is None:
            return []
        return [f"{k}={v}" for k, v in self.switches if own.switch(k) != v]

    def batch_text(self) -> str:
        return f"micro-batch {self.micro_batch} x {self.accumulation}"


def positive_count(field: Field) -> int:
    value = field.required().count()
    if value <= 0:
        raise field.refuse("a positive whole number")
    return value


def config_from_mapping(field: Field) -> Config:
    """A configuration as the tuned file (chosen, workload_config.config: global_batch of every rank with
    per_rank_batch on ranks) or a journal line (candidate: one rank's global_batch) states it."""
    rank_batch = field["per_rank_batch"] if field["per_rank_batch"].present else field["global_batch"]
    switches = field["switches"]
    return Config(positive_count(rank_batch), positive_count(field["micro_batch"]),
                  tuple(sorted((name, switch_value(switches[name])) for name in switches.keys())))


def chosen_config(t: Field) -> Optional[Config]:
    return config_from_mapping(t["chosen"]) if t["chosen"].present else None


def config_from_key(field: Field) -> Config:
    """A configuration from its key, "g=32 mb=16 optimizer=fused ..." (race finalists, failed_trials)."""
    words = field.required().text().split()
    pairs = [w.partition("=") for w in words]
    if len(pairs) < 2 or pairs[0][0] != "g" or pairs[1][0] != "mb" or any(not sep for _, sep, _ in pairs) \
            or not pairs[0][2].isdigit() or not pairs[1][2].isdigit() or int(pairs[1][2]) == 0:
        raise field.refuse("a configuration's key (g=N mb=N switch=value ...)")
    return Config(int(pairs[0][2]), int(pairs[1][2]), tuple(sorted((k, v) for k, _, v in pairs[2:])))


@dataclass
class Trial:
    """One measured configuration: a journal line, or a configuration the tuned file records with its numbers."""
    origin: str                      # where it was read: "journal line 3", "chosen", "failed_trials[0]"
    config: Config
    outcome: str                     # ok, oom, error, timeout, incorrect (the journal's result.class)
    samples_per_s: Optional[float]
    peak_bytes: Optional[int]
    message: str

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


def trials_from_journal(lines: Sequence[dict], journal_name: str) -> List[Trial]:
    trials = []
    for number, line in enumerate(lines, start=1):
        entry = Field(line, f"{journal_name} line {number}")
        result = entry["result"].required()
        trials.append(Trial(f"journal line {number}", config_from_mapping(entry["candidate"].required()),
                            result["class"].required().text(), result["samples_per_s"].number(),
                            result["peak_bytes"].count(), result["message"].text() or ""))
    return trials


def measured_trial(origin: str, config: Config, measured: Field) -> Trial:
    return Trial(origin, config, "ok", measured["samples_per_s"].number(), measured["peak_memory_bytes"].count(), "")


def trials_from_tuned_file(t: Field, own: Optional[Config]) -> List[Trial]:
    """Without a journal: the configurations the tuned file records with their numbers (the choice, the
    baseline, the runners-up within noise, the failed trials)."""
    trials = []
    chosen = chosen_config(t)
    if chosen:
        trials.append(measured_trial("chosen", chosen, t["measured"]))
    baseline_key = "versus" if t["versus"].present else "workload_config"
    base = t[baseline_key]
    if own is not None and own != chosen:  # the choice's numbers are the baseline's where it kept it
        if base["measured"].present:
            trials.append(measured_trial(baseline_key, own, base["measured"]))
        elif base["failed"].present:
            trials.append(Trial(baseline_key, own, base["failed"]["class"].text() or "error", None, None,
                                base["failed"]["message"].text() or ""))
    for runner in t["runners_up_within_noise"].entries():
        trials.append(measured_trial(runner.where.rpartition(".")[2], config_from_mapping(runner["config"]),
                                     runner["measured"]))
    return trials + failed_trials_of(t, [])


def failed_trials_of(t: Field, known: Sequence[Trial]) -> List[Trial]:
    """failed_trials' entries that `known` does not already hold (a journal holds them all as its lines)."""
    seen = {(k.config, k.outcome, k.message) for k in known if not k.ok}
    failed = []
    for entry in t["failed_trials"].entries():
        trial = Trial(entry.where.rpartition(".")[2], config_from_key(entry["config"]),
                      entry["class"].text() or "error", None, None, entry["message"].text() or "")
        if (trial.config, trial.outcome, trial.message) not in seen:
            failed.append(trial)
    return failed


@dataclass
class Baseline:
    """What the choice is measured against: the workload's own configuration, or --versus's."""
    name: str
    config: Optional[Config]
    speedup: Optional[float]
    significant: bool
    interval: Field          # {ci_low, ci_high, level, interleaved_rounds}
    note: Optional[str]


def baseline_of(t: Field) -> Baseline:
    if t["versus"].present:
        v = t["versus"]
        name = f"--versus {v['name'].text()}" if v["name"].present else "--versus's configuration"
        return Baseline(name, config_from_mapping(v["config"]) if v["config"].present else None,
                        v["speedup"].number(), bool(v["speedup_significant"].flag()), v["speedup_interval"],
                        v["note"].text())
    own = t["workload_config"]["config"]
    return Baseline("the workload's own configuration", config_from_mapping(own) if own.present else None,
                    t["speedup_over_workload_config"].number(), bool(t["speedup_significant"].flag()),
                    t["speedup_interval"], t["speedup_note"].text())


def changes_text(config: Config, own: Optional[Config]) -> str:
    if own is None:
        return "(no baseline recorded)"
    changed = config.changed_from(own)
    return ", ".join(changed) if changed else "none"


def shortened(text: str, width: int = LABEL_CHARACTERS) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


# ---- The page's sections ----

@dataclass
class Tune:
    """What every section reads: the tuned file (its trainbench_autotune), the trials, the choice and the
    configuration it is measured against."""
    tuned: Field
    trials: List[Trial]
    from_journal: bool
    baseline: Baseline
    chosen: Optional[Config]  # None where nothing ran

    @property
    def own(self) -> Optional[Config]:
        return self.baseline.config

    @property
    def ranks(self) -> int:
        return self.tuned["ranks"].count() or 1

    @property
    def changed_header(self) -> str:
        return "switches changed from the workload's own" if not self.tuned["versus"].present \
            else "switches changed from --versus's"


def claim_sentence(tune: Tune) -> str:
    """The choice and what it claims over the baseline, in one sentence; where nothing is claimed, why."""
    t, base = tune.tuned, tune.baseline
    chosen = tune.chosen
    if chosen is None:
        return f"No configuration ran successfully ({t['note'].text() or 'see the failed trials'})."
    on_ranks = f" on {tune.ranks} ranks" if tune.ranks > 1 else ""
    changed = changes_text(chosen, base.config)
    batch = chosen.batch_text()
    if base.config and base.config.rank_batch != chosen.rank_batch:  # a global batch of its own, not the baseline's
        batch = f"global batch {chosen.rank_batch * tune.ranks} = {batch}"
    what = batch + on_ranks + (f" with {changed}" if base.config and changed != "none" else "")
    reason = t["choice_note"].text() or base.note
    if chosen == base.config:
        return f"Kept {base.name} ({what}){': ' + reason if reason else ''}."
    interval = base.interval
    if base.significant and base.speedup is not None and interval.present:
        level = interval["level"].required().number()
        low, high = interval["ci_low"].required().number(), interval["ci_high"].required().number()
        return (f"Chosen: {what}, {base.speedup:.2f}x {base.name} ({round(100 * level)}% CI {low:.2f}-{high:.2f}, "
                f"{interval['interleaved_rounds'].required().count()} race rounds).")
    if base.speedup is not None:
        # Why nothing is claimed over the baseline is the speedup's note; the choice note says why this finalist
        # rather than the race's leader.
        return f"Chosen: {what}, with no speedup claimed over {base.name}: {base.note or reason or 'no verdict recorded'}."
    return f"Chosen: {what}; the file records no comparison with {base.name}."


def command_text(t: Field) -> Optional[str]:
    """The command line the tuned file records (a string or its words), if it records one."""
    command = t["command"]
    if isinstance(command.value, list):
        return shlex.join(word.text() for word in command.entries())
    return command.text()


def claim_sections(tune: Tune) -> List[str]:
    t = tune.tuned
    command = command_text(t)
    if command:
        command_html = markup.code_block(command, element_id="command")
    else:
        source = t["workload"]["source"].text()
        command_html = markup.paragraph(
            "The tuned file records no command line (autotune writes none)"
            + (f"; it records the workload's source: {source}" if source else "") + ".",
            css_class="why", element_id="command")
    notes = [(label, t_field.text()) for label, t_field in (
        ("speedup_note", t["speedup_note"] if not t["versus"].present else t["versus"]["note"]),
        ("choice_note", t["choice_note"]), ("chosen.batch_split", t["chosen"]["batch_split"]),
        ("chosen.launch", t["chosen"]["launch"]), ("note", t["note"]))]
    notes_html = "".join(markup.paragraph(f"{label}: {text}") for label, text in notes if text)
    # The claim's section holds its sentence alone: a reader (or a test) takes the section's text as the claim.
    return [markup.section("claim", "", markup.paragraph(claim_sentence(tune))),
            markup.section("reproduce", "The command and the file's own words", command_html, notes_html)]


def switch_groups(tune: Tune, trials: Sequence[Trial]) -> "OrderedDict[str, List[Trial]]":
    """The trials by the switches they change from the baseline, in the order first met."""
    groups: "OrderedDict[str, List[Trial]]" = OrderedDict()
    for trial in trials:
        groups.setdefault(changes_text(trial.config, tune.own), []).append(trial)
    return groups


def plot_by_micro_batch(ax, tune: Tune, trials: Sequence[Trial], value_of) -> None:
    """Each trial's value by micro-batch on a log2 axis, coloured by the switches it changes from the baseline;
    the micro-batches' ticks, and each point, name their accumulation."""
    groups = switch_groups(tune, trials)
    # Trials at one micro-batch would hide each other: each switch combination is moved sideways a little, the same
    # way at every micro-batch (the table beside the plot holds the exact values).
    step = SPREAD_LOG2 / max(len(groups) - 1, 1)
    shift = {changed: 2 ** ((index - (len(groups) - 1) / 2) * step) for index, changed in enumerate(groups)}

    def x_of(trial: Trial) -> float:
        return trial.config.micro_batch * shift[changes_text(trial.config, tune.own)]

    colours = matplotlib.colormaps["tab10"]
    for index, (changed, members) in enumerate(groups.items()):
        coloured = index < COLOURED_GROUPS
        if coloured:
            label = shortened("the baseline's switches" if changed == "none" else f"changed: {changed}")
        else:  # one legend entry for every grey group
            label = "other combinations" if index == COLOURED_GROUPS else None
        ax.scatter([x_of(m) for m in members], [value_of(m) for m in members],
                   color=colours(index) if coloured else "grey", s=36, alpha=0.85, label=label, zorder=3)
    for trial in trials:  # trials at one micro-batch differ in their accumulation where the global batch was searched
        ax.annotate(f"x{trial.config.accumulation}", (x_of(trial), value_of(trial)), xytext=(5, 3),
                    textcoords="offset points", fontsize=6, color="dimgrey")
    for config, marker, label in ((tune.own, "s", tune.baseline.name), (tune.chosen, "o", "the choice")):
        ringed = [m for m in trials if config is not None and m.config == config]
        if ringed:
            ax.scatter([x_of(m) for m in ringed], [value_of(m) for m in ringed], s=190,
                       facecolors="none", edgecolors="black", marker=marker, linewidths=1.2, label=label, zorder=4)
    set_micro_batch_axis(ax, tune.trials)
    if len(groups) > 1:
        ax.set_xlabel("micro-batch (x accumulation); switch combinations spread sideways")


def set_micro_batch_axis(ax, trials: Sequence[Trial]) -> None:
    accumulations: Dict[int, List[int]] = {}
    for trial in trials:
        found = accumulations.setdefault(trial.config.micro_batch, [])
        if trial.config.accumulation not in found:
            found.append(trial.config.accumulation)
    ax.set_xscale("log", base=2)
    ticks = sorted(accumulations)
    ax.set_xticks(ticks, [f"{mb}\nx{'/'.join(str(a) for a in sorted(accumulations[mb]))}" for mb in ticks])
    ax.minorticks_off()
    ax.set_xlim(min(ticks) / 1.5, max(ticks) * 1.5)
    ax.set_xlabel("micro-batch (x accumulation)")


def search_section(tune: Tune) -> str:
    t, search = tune.tuned, tune.tuned["search"]
    origin_words = ("every trial of the journal" if tune.from_journal else
                    "no journal given (--journal): the configurations the tuned file records (the choice, the "
                    "baseline, the runners-up within noise, the failed trials); the journal holds every trial")
    summary = [f"Trials: {origin_words}."]
    if search.present:
        summary.append(
            f"Strategy {search['strategy'].text() or MISSING}; {integer(search['trials_total'].count())} trials in "
            f"the tune (search.trials_total), {integer(search['trials_run'].count())} run by this invocation "
            f"(search.trials_run); the search took {significant(search['seconds'].number())} s (search.seconds); "
            f"budget exhausted: {yes_no(search['budget_exhausted'].flag())}; "
            f"interrupted: {yes_no(search['interrupted'].flag())}.")
    if t["global_batches"]["note"].present:
        summary.append(f"global_batches.note: {t['global_batches']['note'].text()}")
    parts = [markup.paragraph(line) for line in summary]
    if not tune.trials:
        return markup.section("search", "The search", *parts,
                              markup.why_nothing("No trial to show: the file records none and no journal was given."))
    measured = [trial for trial in tune.trials if trial.ok and trial.samples_per_s is not None]
    failed = [trial for trial in tune.trials if not trial.ok]
    figure = markup.new_figure(PLOT_WIDTH_IN, PLOT_HEIGHT_IN)
    ax = figure.add_subplot()
    plot_by_micro_batch(ax, tune, measured, lambda trial: trial.samples_per_s)
    mark_failed(ax, failed, 0.03, "no samples/s")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("samples/s")
    ax.set_title("Every trial's throughput by micro-batch")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    alt = (f"Samples per second of {len(measured)} measured trials by micro-batch on a log2 axis, coloured by the "
           f"switches changed from the baseline; {len(failed)} failed trials marked along the bottom.")
    rows = [(trial.origin, trial.config.micro_batch, trial.config.accumulation,
             changes_text(trial.config, tune.own), trial.outcome, significant(trial.samples_per_s))
            for trial in tune.trials]
    table = markup.table("search-table", ["trial", "micro-batch", "accumulation", tune.changed_header, "outcome",
                                          "samples/s"], rows, caption="The trials behind the plot")
    parts.append(markup.plot_beside_table(markup.figure_img(figure, alt), table))
    parts.append(failed_table(tune))
    return markup.section("search", "The search", *parts)


def mark_failed(ax, failed: Sequence[Trial], height: float, why_no_value: str) -> None:
    """Failed trials at their micro-batch, at `height` (a fraction of the plot's): they have no value to place."""
    for outcome, marker in FAILED_MARKERS.items():
        at = [trial.config.micro_batch for trial in failed if failed_class(trial) == outcome]
        if at:
            ax.scatter(at, [height] * len(at), marker=marker, color="tab:red", s=60, transform=ax.get_xaxis_transform(),
                       label=f"{outcome} ({why_no_value})", zorder=4)


def failed_class(trial: Trial) -> str:
    return trial.outcome if trial.outcome in FAILED_MARKERS else "error"


def failed_table(tune: Tune) -> str:
    failed = [trial for trial in tune.trials if not trial.ok]
    if not failed:
        return markup.why_nothing("No trial failed (failed_trials is empty"
                                  + (" and every journal line is ok)." if tune.from_journal else ")."))
    rows = [(trial.origin, trial.config.key(), trial.outcome, trial.message or MISSING) for trial in failed]
    return markup.table("failed-table", ["trial", "configuration", "outcome", "reason"], rows,
                        caption="Failed, incorrect, out-of-memory and timed-out trials")


def yes_no(value: Optional[bool]) -> str:
    return MISSING if value is None else ("yes" if value else "no")


def memory_unit(largest_bytes: float) -> Tuple[str, int]:
    return ("GiB", GIB) if largest_bytes >= 16 * GIB else ("MiB", MIB)


def memory_section(tune: Tune) -> str:
    t = tune.tuned
    with_peak = [trial for trial in tune.trials if trial.ok and trial.peak_bytes]
    capacity = t["device"]["memory_bytes"].count()
    headroom = t["measured"]["headroom"].number()
    notes = []
    if headroom is not None:
        notes.append(f"The choice keeps its peak within the memory the tune planned for (what the device has free, "
                     f"or --memory-limit) less a headroom of {significant(headroom)} of it (measured.headroom).")
    notes.append("The --memory-limit a tune was given is not recorded in the tuned file.")
    if not with_peak:
        return markup.section("memory", "Peak memory", *map(markup.paragraph, notes),
                              markup.why_nothing("No trial recorded its peak memory."))
    largest = max(trial.peak_bytes for trial in with_peak)
    capacity_on_scale = capacity is not None and capacity <= CAPACITY_ON_SCALE * largest
    unit, scale = memory_unit(max(largest, capacity if capacity_on_scale else 0))
    figure = markup.new_figure(PLOT_WIDTH_IN, PLOT_HEIGHT_IN)
    ax = figure.add_subplot()
    plot_by_micro_batch(ax, tune, with_peak, lambda trial: trial.peak_bytes / scale)
    mark_failed(ax, [trial for trial in tune.trials if trial.outcome == "oom"], 0.97, "no peak recorded")
    if capacity is None:
        notes.insert(0, "The tuned file records no memory capacity (device.memory_bytes is written for a CUDA "
                        "device only).")
    elif capacity_on_scale:
        ax.axhline(capacity / scale, color="tab:red", linestyle="--", label="device memory (device.memory_bytes)")
        notes.insert(0, f"Device memory: {significant(capacity / scale)} {unit} (device.memory_bytes), the dashed "
                        "line.")
    else:
        notes.insert(0, f"Device memory: {significant(capacity / scale)} {unit} (device.memory_bytes), off this "
                        f"plot's scale: the largest peak is {significant(largest / scale)} {unit}.")
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"peak memory ({unit})")
    ax.set_title("Peak memory by micro-batch")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    alt = f"Peak memory in {unit} of {len(with_peak)} trials by micro-batch on a log2 axis."
    rows = [(trial.origin, trial.config.micro_batch, trial.config.accumulation, changes_text(trial.config, tune.own),
             significant(trial.peak_bytes / scale)) for trial in with_peak]
    table = markup.table("memory-table", ["trial", "micro-batch", "accumulation", tune.changed_header,
                                          f"peak memory ({unit})"], rows, caption="The peaks behind the plot")
    return markup.section("memory", "Peak memory", *map(markup.paragraph, notes),
                          markup.plot_beside_table(markup.figure_img(figure, alt), table))


@dataclass
class Finalist:
    """A finalist of the race as race.finalists records it; `label` (F1, F2, ...) names it in the plot and table."""
    label: str
    config: Config
    raced_as: str
    status: str
    ratio: Optional[float]
    ci_low: Optional[float]
    ci_high: Optional[float]
    per_round: List[float]
    why: str
    is_baseline: bool


def finalists_of(tune: Tune) -> List[Finalist]:
    finalists = []
    for number, entry in enumerate(tune.tuned["race"]["finalists"].entries(), start=1):
        config = config_from_key(entry["config"])
        vs_leader = entry["vs_leader"]
        finalists.append(Finalist(
            f"F{number}", config, entry["raced_as"].text() or MISSING, entry["status"].text() or MISSING,
            vs_leader["ratio"].number(), vs_leader["ci_low"].number(), vs_leader["ci_high"].number(),
            [round_entry.number() for round_entry in entry["samples_per_s_per_round"].entries()],
            entry["why"].text() or "",
            bool(entry["workload_config"].flag() or entry["versus"].flag())))
    return finalists


def race_section(tune: Tune) -> str:
    race, t = tune.tuned["race"], tune.tuned
    if not race.present:
        return markup.section("race", "The race", markup.why_nothing(
            "The tuned file records no race: the tune was interrupted before it, or was written by an autotune "
            "older than the race."))
    finalists = finalists_of(tune)
    parts = [markup.paragraph(
        f"Interleaved rounds: {integer(race['rounds'].count())} of at most {integer(race['max_rounds'].count())} "
        f"(race.rounds, max_rounds); it ended: {race['ended'].text() or MISSING}; noise margin "
        f"{significant(race['noise_margin'].number())} (race.noise_margin); "
        f"{significant(race['seconds'].number())} s (race.seconds).")]
    if t["choice_note"].present:
        parts.append(markup.paragraph(f"The rule that decided the choice (choice_note): {t['choice_note'].text()}"))
    rows = [(f.label, changes_text(f.config, tune.own) + (" (baseline)" if f.is_baseline else ""), f.config.micro_batch,
             f.config.accumulation, f.raced_as, f.status, significant(f.ratio), significant(f.ci_low),
             significant(f.ci_high), ", ".join(significant(s) for s in f.per_round) or MISSING, f.why or MISSING)
            for f in finalists]
    table = markup.table("race-table", ["finalist", tune.changed_header, "micro-batch", "accumulation", "raced as",
                                        "status", "ratio to the leader", "CI low", "CI high",
                                        "samples/s per round", "why dropped"], rows,
                         caption="The finalists: each one's samples/s over the leader's, interleaved (vs_leader)")
    with_ratio = [f for f in finalists if f.ratio is not None]
    if not with_ratio:
        parts += [markup.why_nothing("No finalist has a ratio to the leader: the race ran no complete round."),
                  table]
    else:
        parts.append(markup.plot_beside_table(forest_plot(with_ratio, tune.chosen), table))
    parts.append(runners_up_table(tune))
    return markup.section("race", "The race", *parts)


def forest_plot(finalists: Sequence[Finalist], chosen: Optional[Config]) -> str:
    """Each finalist's ratio to the leader with its interval, the dropped ones greyed with the round they left.
    A row is named by what sets it apart from the choice: most finalists share most of the choice's switches."""
    figure = markup.new_figure(WIDE_PLOT_WIDTH_IN, 1.0 + 0.42 * len(finalists))
    ax = figure.add_subplot()
    labels = []
    for row, f in enumerate(finalists):
        dropped = f.status.startswith("dropped")
        colour = "tab:green" if f.status == "chosen" else ("grey" if dropped else "tab:blue")
        has_interval = f.ci_low is not None and f.ci_high is not None
        xerr = [[max(f.ratio - f.ci_low, 0.0)], [max(f.ci_high - f.ratio, 0.0)]] if has_interval else None
        ax.errorbar([f.ratio], [row], xerr=xerr, fmt="o", color=colour, capsize=3,
                    markerfacecolor=colour if has_interval else "white")
        apart = "the baseline" if f.is_baseline and f.status != "chosen" else apart_from(f.config, chosen)
        out_in_round = f.status.replace("dropped after round ", "out in round ")
        labels.append(f"{f.label} {shortened(apart, 44)}" + (f" ({out_in_round})" if dropped else ""))
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(finalists)), labels, fontsize=8)
    for tick, f in zip(ax.get_yticklabels(), finalists):
        if f.status.startswith("dropped"):
            tick.set_color("grey")
    ax.invert_yaxis()
    ax.set_xlabel("samples/s over the leader's in the interleaved rounds (bars: interval; hollow: none)")
    ax.set_title("The race's finalists against its leader")
    ax.grid(axis="x", alpha=0.3)
    alt = (f"Forest plot of {len(finalists)} race finalists: each one's throughput ratio to the leader with its "
           f"confidence interval; dropped finalists in grey with the round they were dropped in.")
    return markup.figure_img(figure, alt)


def apart_from(config: Config, chosen: Optional[Config]) -> str:
    """What sets a configuration apart from the choice: "the choice", else its batch where it differs and the
    switches it sets otherwise."""
    if chosen is None:
        return config.batch_text()
    if config == chosen:
        return "the choice"
    differences = [] if (config.rank_batch, config.micro_batch) == (chosen.rank_batch, chosen.micro_batch) \
        else [config.batch_text()]
    return ", ".join(differences + config.changed_from(chosen))


def runners_up_table(tune: Tune) -> str:
    runners = tune.tuned["runners_up_within_noise"].entries()
    if not runners:
        return markup.why_nothing("No runner-up within noise of the choice (runners_up_within_noise is empty).")
    rows = []
    for runner in runners:
        config, measured = config_from_mapping(runner["config"]), runner["measured"]
        rows.append((config.micro_batch, config.accumulation, changes_text(config, tune.own),
                     significant(measured["samples_per_s"].number()), significant(measured["ci_low"].number()),
                     significant(measured["ci_high"].number())))
    return markup.table("runners-up-table", ["micro-batch", "accumulation", tune.changed_header, "samples/s",
                                             "CI low", "CI high"], rows,
                        caption="Runners-up within noise of the choice (runners_up_within_noise)")


def time_split_section(tune: Tune) -> str:
    split = tune.tuned["time_split"]
    names = [name for name in ("chosen", "own") if split[name].present]
    if not names:
        return markup.section("time-split", "Where the step's time goes", markup.why_nothing(
            "The tuned file records no time split: autotune splits the step into its parts for an --entry only, "
            "after the race, while the budget lasts."), *step_notes(tune))
    labels = {"chosen": "the choice", "own": "the workload's own"}
    figure = markup.new_figure(PLOT_WIDTH_IN, 1.4 + 0.6 * len(names))
    ax = figure.add_subplot()
    colours = matplotlib.colormaps["tab10"]
    part_rows, step_rows = [], []
    in_legend = set()  # the parts drawn: a part of zero ms in every bar has no place in the legend
    for row, name in enumerate(names):
        config = split[name]
        left = 0.0
        for index, (part, words) in enumerate(STEP_PARTS.items()):
            ms, percent = config["parts"][part]["ms"].number(), config["parts"][part]["percent"].number()
            part_rows.append((labels[name], words, significant(ms), significant(percent)))
            if ms:
                ax.barh(row, ms, left=left, color=colours(index), label=None if words in in_legend else words)
                in_legend.add(words)
                left += ms
        step_rows.append((labels[name], config["config"].text() or MISSING,
                          *(significant(config[key].number()) for key in
                            ("step_ms", "parts_sum_ms", "whole_step_ms", "timed_step_ms")),
                          integer(config["steps"].count())))
    ax.set_yticks(range(len(names)), [labels[name] for name in names])
    ax.invert_yaxis()
    ax.set_xlabel("ms per step, part by part (time_split.*.parts.*.ms)")
    ax.set_title("Where a step's time goes")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    alt = ("Stacked horizontal bars of a step's time in ms split into waiting for data, forward+backward, "
           f"clip+optimizer+zero, communication and host sync, for {' and '.join(labels[n] for n in names)}.")
    parts_table = markup.table("time-split-table", ["configuration", "part", "ms", "% of step"], part_rows,
                               caption="Each part of the step (time_split.*.parts)")
    steps_table = markup.table("time-split-steps-table",
                               ["configuration", "key", "step ms (part by part)", "sum of the parts ms",
                                "whole step ms", "step in the race ms", "steps"], step_rows,
                               caption="The step whole: part by part, timed whole between those, in the race")
    parts = [markup.plot_beside_table(markup.figure_img(figure, alt), parts_table), steps_table]
    if split["how"].present:
        parts.append(markup.paragraph(f"time_split.how: {split['how'].text()}"))
    return markup.section("time-split", "Where the step's time goes", *parts, *step_notes(tune))


def step_notes(tune: Tune) -> List[str]:
    """What else the file says of the chosen step: its loader's settings, and on ranks the communication it waits
    for (measured.communication, from a profiled step)."""
    notes = []
    loader = tune.tuned["chosen"]["dataloader"]
    if loader.present:
        settings = ", ".join(f"{key.rpartition('.')[2]}={value}" for key, value in flattened(loader, "dataloader"))
        notes.append(markup.paragraph(f"The choice's loader as it ran (chosen.dataloader): {settings}"))
    communication = tune.tuned["measured"]["communication"]
    if communication.present:
        rows = [(key, significant(communication[key].number())) for key in
                ("share", "exposed_seconds", "communication_seconds", "step_seconds") if communication[key].present]
        rows.append(("rank_shares", ", ".join(significant(share.number())
                                              for share in communication["rank_shares"].entries()) or MISSING))
        rows.append(("steps", integer(communication["steps"].count())))
        notes.append(markup.table("communication-table", ["measured.communication", "value"], rows,
                                  caption="The chosen step's wait for communication, profiled on the ranks"))
        if communication["how"].present:
            notes.append(markup.paragraph(f"measured.communication.how: {communication['how'].text()}"))
    return notes


@dataclass
class SwitchEffect:
    """Two trials that differ in one switch alone, and the ratio of their samples/s."""
    switch: str
    before: Trial
    after: Trial

    @property
    def ratio(self) -> float:
        return self.after.samples_per_s / self.before.samples_per_s

    @property
    def label(self) -> str:
        return f"{self.switch}: {self.before.config.switch(self.switch)} -> {self.after.config.switch(self.switch)}"


def switch_effects(tune: Tune) -> List[SwitchEffect]:
    """For each switch, every pair of measured trials with the same micro-batch, batch and other switches; from the
    baseline's value where the pair has it. A configuration measured more than once counts with its latest trial."""
    latest: "OrderedDict[Config, Trial]" = OrderedDict()
    for trial in tune.trials:
        if trial.ok and trial.samples_per_s:
            latest.pop(trial.config, None)
            latest[trial.config] = trial
    names = sorted({name for config in latest for name, _ in config.switches})
    effects = []
    for name in names:
        by_context: "OrderedDict[Tuple, List[Trial]]" = OrderedDict()
        for config, trial in latest.items():
            if config.switch(name) is not None:
                by_context.setdefault(config.without(name), []).append(trial)
        own_value = tune.own.switch(name) if tune.own else None
        for trials in by_context.values():
            # From the baseline's value where the pair has it, else in the values' order: one direction per pair.
            trials = sorted(trials, key=lambda trial: (trial.config.switch(name) != own_value,
                                                       trial.config.switch(name)))
            effects += [SwitchEffect(name, a, b) for i, a in enumerate(trials) for b in trials[i + 1:]]
    return effects


def switches_section(tune: Tune) -> str:
    effects = switch_effects(tune)
    if not effects:
        scope = "in the journal" if tune.from_journal else "among the configurations the tuned file records " \
                                                           "(give --journal for every trial)"
        return markup.section("switches", "Switch effects", markup.why_nothing(
            f"No two measured trials {scope} differ in one switch alone at the same micro-batch and batch."))
    pairs: "OrderedDict[str, List[SwitchEffect]]" = OrderedDict()
    for effect in effects:
        pairs.setdefault(effect.label, []).append(effect)
    figure = markup.new_figure(WIDE_PLOT_WIDTH_IN, 1.0 + 0.38 * len(pairs))
    ax = figure.add_subplot()
    for row, members in enumerate(pairs.values()):
        ax.scatter([e.ratio for e in members], [row] * len(members), color="tab:blue", s=30, zorder=3)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 0.5, 1, 2 rather than 2^-1
    ax.set_yticks(range(len(pairs)), [shortened(label, 45) for label in pairs], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("samples/s after the change over before (one point per micro-batch and other switches)")
    ax.set_title("What each switch changes, between trials run apart")
    ax.grid(axis="x", alpha=0.3)
    alt = (f"Dot plot of {len(effects)} measured ratios of samples per second between two trials that differ in "
           f"one switch alone, one row per switch and pair of values, on a log axis around 1.")
    rows = [(e.switch, e.before.config.switch(e.switch), e.after.config.switch(e.switch), e.before.config.micro_batch,
             e.before.config.accumulation,
             ", ".join(c for c in e.before.config.changed_from(tune.own) if not c.startswith(e.switch + "="))
             or "none",
             e.before.origin, e.after.origin, significant(e.before.samples_per_s), significant(e.after.samples_per_s),
             significant(e.ratio)) for e in effects]
    table = markup.table("switches-table", ["switch", "from", "to", "micro-batch", "accumulation",
                                            "other switches changed", "trial (from)", "trial (to)",
                                            "samples/s (from)", "samples/s (to)", "ratio to/from (computed)"],
                         rows, caption="Measured pairs; the ratio is the one number this page computes")
    caveat = markup.paragraph(
        "Each ratio divides the samples/s of two trials run apart, not interleaved: it holds the machine's drift "
        "between them as well as the switch's effect; the race's interleaved rounds are what the claim rests on. "
        "A configuration measured more than once counts with its latest trial.")
    return markup.section("switches", "Switch effects", caveat,
                          markup.plot_beside_table(markup.figure_img(figure, alt), table))


def budget_section(tune: Tune) -> str:
    search, spent = tune.tuned["search"], tune.tuned["search"]["budget_spent"]
    budget = search["budget_seconds"].number()
    if not spent.present:
        rows = [("search (search.seconds)", significant(search["seconds"].number())),
                ("race (race.seconds)", significant(tune.tuned["race"]["seconds"].number())),
                ("budget (search.budget_seconds)", significant(budget))]
        return markup.section("budget", "The budget", markup.why_nothing(
            "The tuned file has no search.budget_spent (an older autotune): only the search's and the race's "
            "seconds are recorded."), markup.table("budget-table", ["part", "seconds"], rows))
    present = [(index, words, spent[key].number()) for index, (key, words) in enumerate(BUDGET_PARTS.items())
               if spent[key].present]
    figure = markup.new_figure(PLOT_WIDTH_IN, 2.0)
    ax = figure.add_subplot()
    colours = matplotlib.colormaps["tab10"]
    left = 0.0
    for index, words, seconds in present:
        if seconds > 0:
            ax.barh(0, seconds, left=left, color="lightgrey" if words == "unused" else colours(index), label=words)
            left += seconds
    if budget is not None:
        ax.axvline(budget, color="black", linestyle="--", label="budget")
    ax.set_yticks([])
    ax.set_xlabel("seconds")
    ax.set_title("Where the budget went (search.budget_spent)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    alt = "One stacked bar of the tune's seconds: " + ", ".join(w for _, w, s in present if s > 0) + \
          (", against the budget line." if budget is not None else ".")
    rows = [(words, significant(seconds)) for _, words, seconds in present]
    rows += [(label, significant(value)) for label, value in (
        ("total (total_seconds)", spent["total_seconds"].number()), ("budget (search.budget_seconds)", budget),
        ("set-up per candidate, median (set_up_per_candidate_seconds)",
         spent["set_up_per_candidate_seconds"].number())) if value is not None]
    table = markup.table("budget-table", ["part", "seconds"], rows, caption="search.budget_spent")
    parts = [markup.plot_beside_table(markup.figure_img(figure, alt), table)]
    if not spent["unused_seconds"].present:
        parts.append(markup.paragraph("Unused: not recorded (autotune records it where more than a tenth of the "
                                      "budget is left)."))
    for key in ("unused_why", "note"):
        if spent[key].present:
            parts.append(markup.paragraph(f"budget_spent.{key}: {spent[key].text()}"))
    return markup.section("budget", "The budget", *parts)


def flattened(field: Field, prefix: str) -> List[Tuple[str, str]]:
    """(dotted key, value as text) for every scalar under a mapping; lists joined."""
    if isinstance(field.value, dict):
        return [row for key in field.keys() for row in flattened(field[key], f"{prefix}.{key}")]
    if isinstance(field.value, list):
        items = [scalar_text(entry) for entry in field.entries()]
        return [(prefix, "; ".join(items) if items else "none")]
    return [(prefix, scalar_text(field))]


def scalar_text(field: Field) -> str:
    value = field.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return MISSING if value is None else str(value)


def machine_section(tune: Tune) -> str:
    t = tune.tuned
    if not t["device"].present:
        return markup.section("machine", "Machine and provenance", markup.why_nothing(
            "The tuned file records no device."))
    rows = flattened(t["device"], "device")
    for key in ("ranks", "executor", "workload", "version", "git_commit"):
        if t[key].present:
            rows += flattened(t[key], key)
    return markup.section("machine", "Machine and provenance",
                          markup.table("machine-table", ["key", "value"], rows,
                                       caption="As the tuned file records them"))


def tune_page(tuned: dict, journal: Optional[List[dict]], tuned_name: str = "the tuned file",
              journal_name: str = "the journal") -> str:
    """The page of one autotune run: `tuned` is the tuned file's document (its top key trainbench_autotune),
    `journal` its journal's lines, or None. Raises ResultFileError, naming the place, for a value of the wrong
    type."""
    if not isinstance(tuned, dict) or not isinstance(tuned.get(TOP_KEY), dict):
        raise ResultFileError(f"{tuned_name}: not an autotune tuned file (no '{TOP_KEY}' mapping at the top)")
    t = Field(tuned[TOP_KEY], f"{tuned_name}: {TOP_KEY}")
    baseline = baseline_of(t)
    if journal is not None:
        trials = trials_from_journal(journal, journal_name)
        trials += failed_trials_of(t, trials)
    else:
        trials = trials_from_tuned_file(t, baseline.config)
    tune = Tune(t, trials, journal is not None, baseline, chosen_config(t))
    title = f"autotune: {t['workload']['name'].text() or 'a workload'} on {t['device']['name'].text() or 'a device'}"
    sections = claim_sections(tune) + [search_section(tune), memory_section(tune), race_section(tune),
                                       time_split_section(tune), switches_section(tune), budget_section(tune),
                                       machine_section(tune)]
    return markup.page(title, sections)


# ---- The command ----

def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise ResultFileError(f"{path}: not a text file (not UTF-8)") from None


def load_tuned(path: str) -> dict:
    """The tuned file's document: JSON (autotune --format json) when it starts with '{', else YAML."""
    text = read_text(path)
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ResultFileError(f"{path}: not valid JSON ({e})") from None
    try:
        import yaml
    except ImportError:
        raise UsageError(f"{path}: reading YAML needs PyYAML (python3-yaml, or pip install pyyaml); "
                         "or give the tuned file autotune writes with --format json") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ResultFileError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None


def load_journal(path: str) -> List[dict]:
    """The journal's lines. A last line without its newline that does not read was cut by a crash mid-write
    (tuner/journal.h): it holds no trial and is left out, as autotune --resume leaves it out."""
    lines = read_text(path).split("\n")
    torn = lines.pop()  # after the last newline: "" unless the last line was cut
    entries = [journal_entry(line, f"{path} line {number}") for number, line in enumerate(lines, start=1)
               if line.strip()]
    if torn.strip():
        try:
            entries.append(journal_entry(torn, f"{path} line {len(lines) + 1}"))
        except ResultFileError:
            pass
    return entries


def journal_entry(line: str, where: str) -> dict:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as e:
        raise ResultFileError(f"{where}: not a journal line (not JSON: {e.msg})") from None
    if not isinstance(entry, dict) or "candidate" not in entry or "result" not in entry:
        raise ResultFileError(f"{where}: not a journal line (no candidate and result)")
    return entry


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description="One autotune run as a self-contained HTML page (no script, nothing fetched).",
        epilog="example: scripts/tune-page tuned.yaml --journal tuned.autotune.jsonl --out tune.html")
    parser.add_argument("tuned", metavar="TUNED", help="autotune's tuned file, YAML or JSON (--format json)")
    parser.add_argument("--journal", metavar="J.jsonl",
                        help="the tune's journal (autotune prints its path): every trial, not only those the "
                             "tuned file records")
    parser.add_argument("--out", metavar="PAGE.html", required=True, help="the page to write (atomically)")
    args = parser.parse_args(argv)
    return markup.page_command(PROG, args.tuned, args.out, lambda: tune_page(
        load_tuned(args.tuned), load_journal(args.journal) if args.journal else None, tuned_name=args.tuned,
        journal_name=args.journal or "the journal"))


if __name__ == "__main__":
    sys.exit(main())
