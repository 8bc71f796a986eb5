"""scripts/tune-page: one autotune run as a self-contained HTML page. Pages built from tuned files and journals
(fixtures/tuned_entry_ranks2_ddp.yaml, fixtures/tune_page_*) are read back with html.parser: the claim and every
table hold the files' numbers, every image is an inline PNG with an alt text, nothing is fetched, a file missing
parts still gives every section, and bad input ends in one line with exit status 2, the last page left intact."""

import base64
import copy
import json
import os
import sys
from html.parser import HTMLParser

import pytest

from conftest import FIXTURES, run_script
from trainbench.pages import html as markup
from trainbench.pages.html import significant
from trainbench.pages.tune import main, tune_page

pytestmark = pytest.mark.python_only

RANKS2_YAML = os.path.join(FIXTURES, "tuned_entry_ranks2_ddp.yaml")
SECTION_IDS = ["claim", "search", "memory", "race", "time-split", "switches", "budget", "machine"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
VOID_TAGS = {"img", "meta", "br", "hr", "link", "input"}


class PageReader(HTMLParser):
    """What a test reads back from a page: each table's headers and rows (cells' text), the text inside each
    element with an id, every <img>'s attributes and every tag's name."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tables, self.text_by_id, self.images, self.tags = {}, {}, [], []
        self._open = []            # (tag, id) of the elements open around the current text
        self._table = self._row = self._cell = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        self.tags.append(tag)
        if tag == "img":
            self.images.append(attributes)
        if tag in VOID_TAGS:
            return
        self._open.append((tag, attributes.get("id")))
        if attributes.get("id"):
            self.text_by_id[attributes["id"]] = ""
        if tag == "table":
            self._table = self.tables[attributes.get("id")] = {"headers": [], "rows": []}
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in VOID_TAGS:
            return
        assert self._open and self._open[-1][0] == tag, f"</{tag}> closes <{self._open[-1][0]}>"
        self._open.pop()
        if tag in ("td", "th"):
            self._row.append(self._cell.strip())
            self._cell = None
        elif tag == "tr":
            if self._table["headers"]:
                self._table["rows"].append(self._row)
            else:
                self._table["headers"] = self._row

    def handle_data(self, data):
        for _, element_id in self._open:
            if element_id:
                self.text_by_id[element_id] += data
        if self._cell is not None:
            self._cell += data

    def rows(self, table_id: str):
        """The table's rows as {header: cell}."""
        table = self.tables[table_id]
        return [dict(zip(table["headers"], row)) for row in table["rows"]]

    def text(self, element_id: str) -> str:
        return " ".join(self.text_by_id[element_id].split())


def read_json(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return json.load(f)


def read_jsonl(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def ranks2_doc():
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the YAML fixture")
    with open(RANKS2_YAML) as f:
        return yaml.safe_load(f)


def key_of(global_batch, micro_batch, switches):
    return " ".join([f"g={global_batch}", f"mb={micro_batch}"] + [f"{k}={v}" for k, v in sorted(switches.items())])


def journal_line(micro_batch, switches, samples_per_s=0.0, outcome="ok", global_batch=16, peak_bytes=1 << 20,
                 message=""):
    """A journal line as tuner/journal.cpp writes it."""
    return {"context": "0123456789abcdef", "key": key_of(global_batch, micro_batch, switches),
            "candidate": {"accumulation": global_batch // micro_batch, "global_batch": global_batch,
                          "micro_batch": micro_batch, "switches": dict(switches)},
            "result": {"ci_high": samples_per_s, "ci_low": samples_per_s, "class": outcome, "message": message,
                       "peak_bytes": peak_bytes if outcome == "ok" else 0, "samples_per_s": samples_per_s,
                       "seconds": 1.0, "setup_seconds": 0.1, "steps": 10}}


OWN_SWITCHES = {"optimizer": "per_tensor", "sync": "every_step"}


def small_tuned_doc(chosen_switches, chosen_micro_batch=8, speedup=1.25):
    """A tuned file of one process with the keys emit.cpp writes, a choice raced against the workload's own
    configuration (global batch 16, micro-batch 16) over 4 rounds."""
    def config(micro_batch, switches):
        return {"accumulation": 16 // micro_batch, "global_batch": 16, "micro_batch": micro_batch,
                "switches": dict(switches)}
    return {"trainbench_autotune": {
        "chosen": config(chosen_micro_batch, chosen_switches),
        "measured": {"samples_per_s": 1250.0, "ci_low": 1240.0, "ci_high": 1260.0, "peak_memory_bytes": 3 << 20,
                     "steps": 40, "headroom": 0.05, "confirmed": True, "interleaved_rounds": 4},
        "workload_config": {"config": config(16, OWN_SWITCHES),
                            "measured": {"samples_per_s": 1000.0, "ci_low": 990.0, "ci_high": 1010.0,
                                         "peak_memory_bytes": 4 << 20, "steps": 30}},
        "speedup_over_workload_config": speedup, "speedup_significant": True,
        "speedup_interval": {"ci_low": 1.2, "ci_high": 1.3, "level": 0.95, "interleaved_rounds": 4},
        "speedup_note": "the choice runs at 1.250x (95% CI 1.200-1.300 over 4 interleaved rounds) the workload's "
                        "own configuration's throughput, measured interleaved",
        "search": {"strategy": "auto", "trials_run": 3, "trials_total": 4, "seconds": 5.0, "budget_seconds": 60,
                   "budget_exhausted": False, "max_micro_batch": 16, "interrupted": False,
                   "budget_spent": {"set_up_seconds": 1.5, "versus_seconds": 0.0, "search_seconds": 5.0,
                                    "race_seconds": 20.0, "profile_seconds": 2.0, "total_seconds": 28.5,
                                    "unused_seconds": 31.5, "unused_why": "the search was exhausted"}},
        "race": {"rounds": 4, "max_rounds": 12, "ended": "the finalists still in are within noise of each other",
                 "noise_margin": 0.01, "seconds": 20.0, "finalists": [
                     {"config": key_of(16, chosen_micro_batch, chosen_switches), "raced_as": "choice",
                      "status": "chosen", "samples_per_s_per_round": [1250.0, 1249.0, 1251.0, 1250.0],
                      "vs_leader": {"ratio": 1.0, "ci_low": 1.0, "ci_high": 1.0}},
                     {"config": key_of(16, 16, OWN_SWITCHES), "raced_as": "own", "workload_config": True,
                      "status": "dropped after round 3",
                      "why": "slower than the leader beyond noise: 0.800x of the leader (95% CI 0.79-0.81) over 3 "
                             "rounds",
                      "samples_per_s_per_round": [1000.0, 1001.0, 999.0],
                      "vs_leader": {"ratio": 0.8, "ci_low": 0.79, "ci_high": 0.81}}]},
        "runners_up_within_noise": [],
        "failed_trials": [],
        "device": {"backend": "cuda", "name": "Test GPU", "memory_bytes": 16 << 20},
        "workload": {"name": "tiny", "path": "tiny.yaml", "digest": "0123456789abcdef", "source": "seeds",
                     "grad_clip": 0},
        "version": "0.1.0", "git_commit": "0123456789ab"}}


def page_of(doc, journal=None) -> PageReader:
    return PageReader(tune_page(doc, journal))


def assert_self_contained(text: str):
    """Sections, inline PNGs with alt texts, and nothing that names an address or runs."""
    page = PageReader(text)
    assert [i for i in SECTION_IDS if i not in page.text_by_id] == []
    assert page.images, "a page without a single plot"
    for image in page.images:
        assert image["alt"].strip(), "an image without an alt text"
        prefix = "data:image/png;base64,"
        assert image["src"].startswith(prefix)
        assert base64.b64decode(image["src"][len(prefix):], validate=True).startswith(PNG_SIGNATURE)
    lowered = text.lower()
    assert "http://" not in lowered and "https://" not in lowered
    assert "script" not in page.tags and "link" not in page.tags and "@import" not in lowered and "url(" not in lowered
    return page


# ---- The committed fixture: an entry on 2 ranks, no journal, no time split ----

def test_the_ranks2_page_claims_what_the_tuned_file_says():
    doc = ranks2_doc()
    t = doc["trainbench_autotune"]
    page = assert_self_contained(tune_page(doc, None))
    claim = page.text("claim")
    chosen = t["chosen"]
    assert claim.startswith("Kept the workload's own configuration")
    assert f"micro-batch {chosen['micro_batch']} x {chosen['accumulation']} on {t['ranks']} ranks" in claim
    assert t["speedup_note"] in claim and claim.count(". ") == 0, "one sentence"
    assert "records no command line" in page.text("command")
    assert t["workload"]["source"] in page.text("command")


def test_the_ranks2_page_tables_hold_the_tuned_files_numbers():
    doc = ranks2_doc()
    t = doc["trainbench_autotune"]
    page = page_of(doc)
    race = page.rows("race-table")
    assert [r["status"] for r in race] == [f["status"] for f in t["race"]["finalists"]]
    assert [r["ratio to the leader"] for r in race] == \
        [significant(f["vs_leader"]["ratio"]) for f in t["race"]["finalists"]]
    assert [r["samples/s per round"] for r in race] == \
        [", ".join(significant(s) for s in f["samples_per_s_per_round"]) for f in t["race"]["finalists"]]
    assert [r["raced as"] for r in race] == [f["raced_as"] for f in t["race"]["finalists"]]
    search = {r["trial"]: r for r in page.rows("search-table")}
    assert search["chosen"]["samples/s"] == significant(t["measured"]["samples_per_s"])
    assert search["chosen"]["micro-batch"] == str(t["chosen"]["micro_batch"])
    assert [search[f"runners_up_within_noise[{i}]"]["samples/s"] for i in range(3)] == \
        [significant(r["measured"]["samples_per_s"]) for r in t["runners_up_within_noise"]]
    memory = {r["trial"]: r for r in page.rows("memory-table")}
    assert memory["chosen"]["peak memory (MiB)"] == significant(t["measured"]["peak_memory_bytes"] / 2 ** 20)
    budget = {r["part"]: r["seconds"] for r in page.rows("budget-table")}
    spent = t["search"]["budget_spent"]
    assert budget["set-up"] == significant(spent["set_up_seconds"])
    assert budget["search"] == significant(spent["search_seconds"])
    assert budget["race"] == significant(spent["race_seconds"])
    assert budget["total (total_seconds)"] == significant(spent["total_seconds"])
    assert budget["budget (search.budget_seconds)"] == significant(t["search"]["budget_seconds"])
    machine = {r["key"]: r["value"] for r in page.rows("machine-table")}
    assert machine["device.name"] == t["device"]["name"]
    assert machine["executor.launcher"] == t["executor"]["launcher"]
    assert machine["ranks"] == "2"


def test_the_ranks2_page_says_why_it_has_no_time_split_and_no_switch_effects():
    page = page_of(ranks2_doc())
    assert "no time split" in page.text("time-split")
    assert "No two measured trials" in page.text("switches")
    assert "time-split-table" not in page.tables and "switches-table" not in page.tables


# ---- Real tunes (autotune's own output): any tuned file and journal, read back ----

# (tuned file, journal or None): autotune --workload tiny (a race, no time split), an --entry whose batches are a
# DataLoader (a time split, no race round), an --entry on 2 ranks (every DDP switch, the tie rule, communication),
# the README's three examples as run on 2026-12-03 (`--entry tuner/entries/my_train.py:build` on 2 ranks at
# --budget 180 and in one process at --budget 150, `--workload small_gpt` at --budget 120: docs/images/tune-page-*)
# and the committed 2-rank entry without its journal.
REAL_TUNES = [("tune_page_tiny.json", "tune_page_tiny.jsonl"),
              ("tune_page_entry_dataloader.json", "tune_page_entry_dataloader.jsonl"),
              ("tune_page_ranks2.json", "tune_page_ranks2.jsonl"),
              ("tune_page_ranks2_readme.json", "tune_page_ranks2_readme.jsonl"),
              ("tune_page_my_train.json", "tune_page_my_train.jsonl"),
              ("tune_page_small_gpt.json", "tune_page_small_gpt.jsonl"),
              ("tuned_entry_ranks2_ddp.yaml", None)]


def load_real_tune(tuned_name, journal_name):
    doc = ranks2_doc() if tuned_name.endswith(".yaml") else read_json(tuned_name)
    return doc, (read_jsonl(journal_name) if journal_name else None)


def assert_the_claim_matches_the_choice(t, claim):
    chosen, own = t["chosen"], t["workload_config"]["config"]
    assert f"micro-batch {chosen['micro_batch']} x {chosen['accumulation']}" in claim
    assert claim.endswith(".") and ". " not in claim, "one sentence"
    changed = [f"{name}={value}" for name, value in chosen["switches"].items() if own["switches"].get(name) != value]
    if (chosen["micro_batch"], chosen["global_batch"], chosen["switches"]) == \
            (own["micro_batch"], own["global_batch"], own["switches"]):
        assert claim.startswith("Kept the workload's own configuration")
        assert "=" not in claim.partition("): ")[0], "no switch named as changed"
        return
    assert claim.startswith("Chosen: ") and all(switch in claim for switch in changed)
    if t["speedup_significant"]:
        interval = t["speedup_interval"]
        assert f"{t['speedup_over_workload_config']:.2f}x the workload's own configuration " \
               f"({round(100 * interval['level'])}% CI {interval['ci_low']:.2f}-{interval['ci_high']:.2f}, " \
               f"{interval['interleaved_rounds']} race rounds)" in claim
    else:
        assert "with no speedup claimed" in claim and t["speedup_note"] in claim


@pytest.mark.parametrize("tuned_name, journal_name", REAL_TUNES)
def test_a_real_tunes_page_holds_its_files_numbers(tuned_name, journal_name):
    doc, journal = load_real_tune(tuned_name, journal_name)
    t = doc["trainbench_autotune"]
    page = assert_self_contained(tune_page(doc, journal))
    assert_the_claim_matches_the_choice(t, page.text("claim"))
    if journal is not None:
        search = page.rows("search-table")
        assert [(r["micro-batch"], r["accumulation"], r["outcome"], r["samples/s"]) for r in search] == \
            [(str(line["candidate"]["micro_batch"]), str(line["candidate"]["accumulation"]), line["result"]["class"],
              significant(line["result"]["samples_per_s"])) for line in journal]
        peaks = [line for line in journal if line["result"]["class"] == "ok" and line["result"]["peak_bytes"]]
        assert [r["peak memory (MiB)"] for r in page.rows("memory-table")] == \
            [significant(line["result"]["peak_bytes"] / 2 ** 20) for line in peaks]
        assert_switch_effects_are_pairs_of_journal_lines(journal, page)
    finalists = t["race"]["finalists"]
    race = page.rows("race-table")
    assert [(r["status"], r["raced as"]) for r in race] == [(f["status"], f["raced_as"]) for f in finalists]
    assert [(r["ratio to the leader"], r["CI low"], r["CI high"]) for r in race] == \
        [tuple(significant(f.get("vs_leader", {}).get(k)) for k in ("ratio", "ci_low", "ci_high")) for f in finalists]
    spent = t["search"]["budget_spent"]
    parts = {"set_up_seconds": "set-up", "search_seconds": "search", "race_seconds": "race",
             "profile_seconds": "profile", "unused_seconds": "unused"}
    budget = {r["part"]: r["seconds"] for r in page.rows("budget-table") if r["part"] in parts.values()}
    assert budget == {part: significant(spent[key]) for key, part in parts.items() if key in spent}
    machine = {r["key"]: r["value"] for r in page.rows("machine-table")}
    assert machine["device.name"] == t["device"]["name"] and machine["git_commit"] == t["git_commit"]


def assert_switch_effects_are_pairs_of_journal_lines(journal, page):
    """Each row: two ok journal lines at the same batch that differ in the row's switch alone, and their ratio."""
    for row in page.rows("switches-table") if "switches-table" in page.tables else []:
        before, after = (journal[int(row[column].split()[-1]) - 1] for column in ("trial (from)", "trial (to)"))
        a, b = before["candidate"], after["candidate"]
        assert (a["global_batch"], a["micro_batch"]) == (b["global_batch"], b["micro_batch"])
        assert {k for k in a["switches"] if a["switches"][k] != b["switches"].get(k)} == {row["switch"]}
        assert (a["switches"][row["switch"]], b["switches"][row["switch"]]) == (row["from"], row["to"])
        assert row["ratio to/from (computed)"] == \
            significant(after["result"]["samples_per_s"] / before["result"]["samples_per_s"])


def test_the_communication_table_holds_measured_communication():
    doc, journal = load_real_tune(*REAL_TUNES[2])
    communication = doc["trainbench_autotune"]["measured"]["communication"]
    values = {r["measured.communication"]: r["value"] for r in page_of(doc, journal).rows("communication-table")}
    assert values == {"share": significant(communication["share"]),
                      "exposed_seconds": significant(communication["exposed_seconds"]),
                      "communication_seconds": significant(communication["communication_seconds"]),
                      "step_seconds": significant(communication["step_seconds"]),
                      "rank_shares": ", ".join(significant(v) for v in communication["rank_shares"]),
                      "steps": str(communication["steps"])}


def test_the_tie_rule_is_quoted_where_it_decided():
    doc, journal = load_real_tune(*REAL_TUNES[2])
    note = doc["trainbench_autotune"]["choice_note"]
    assert note.startswith("the race cannot tell it from the fastest")
    page = page_of(doc, journal)
    assert f"The rule that decided the choice (choice_note): {note}" in page.text("race")
    assert page.text("claim") == f"Kept the workload's own configuration (micro-batch 32 x 1 on 2 ranks): {note}."


def test_the_time_split_tables_hold_time_split():
    doc, journal = load_real_tune(*REAL_TUNES[1])
    split = doc["trainbench_autotune"]["time_split"]
    page = assert_self_contained(tune_page(doc, journal))
    names = {"the choice": "chosen", "the workload's own": "own"}
    parts = page.rows("time-split-table")
    words = {"waiting for data": "data", "forward+backward": "forward_backward", "clip+optimizer+zero": "optimizer",
             "communication": "communication", "host sync": "sync"}
    assert len(parts) == 5 * len([n for n in ("chosen", "own") if n in split])
    for row in parts:
        part = split[names[row["configuration"]]]["parts"][words[row["part"]]]
        assert (row["ms"], row["% of step"]) == (significant(part["ms"]), significant(part["percent"]))
    for row in page.rows("time-split-steps-table"):
        whole = split[names[row["configuration"]]]
        assert row["key"] == whole["config"] and row["steps"] == str(whole["steps"])
        assert [row["step ms (part by part)"], row["sum of the parts ms"], row["whole step ms"],
                row["step in the race ms"]] == \
            [significant(whole[k]) for k in ("step_ms", "parts_sum_ms", "whole_step_ms", "timed_step_ms")]
    assert "chosen.dataloader" in page.text("time-split")


def test_a_race_without_a_round_says_so_instead_of_a_plot():
    doc, journal = load_real_tune(*REAL_TUNES[1])
    assert doc["trainbench_autotune"]["race"]["rounds"] == 0
    page = page_of(doc, journal)
    assert "the race ran no complete round" in page.text("race")
    assert not any(i["alt"].startswith("Forest plot") for i in page.images)


# ---- A claim, switch effects and failed trials, from a small tuned file and its journal ----

FUSED = dict(OWN_SWITCHES, optimizer="fused")


def small_journal():
    return [journal_line(16, OWN_SWITCHES, 1000.0),
            journal_line(16, FUSED, 1100.0),
            journal_line(8, OWN_SWITCHES, 900.0),
            journal_line(8, FUSED, 1250.0),
            journal_line(8, dict(FUSED, sync="async"), 1260.0),
            journal_line(4, FUSED, 0.0, outcome="timeout", message="the trial ran past its 20 s"),
            journal_line(2, FUSED, 0.0, outcome="oom", message="CUDA out of memory")]


def test_a_significant_speedup_is_claimed_with_its_interval():
    page = page_of(small_tuned_doc(FUSED), small_journal())
    assert page.text("claim") == ("Chosen: micro-batch 8 x 2 with optimizer=fused, 1.25x the workload's own "
                                  "configuration (95% CI 1.20-1.30, 4 race rounds).")


def test_no_speedup_is_claimed_where_the_file_claims_none():
    doc = small_tuned_doc(FUSED)
    t = doc["trainbench_autotune"]
    t["speedup_significant"] = False
    t["speedup_note"] = "the choice is within noise of the workload's own configuration"
    claim = page_of(doc).text("claim")
    assert claim.startswith("Chosen: micro-batch 8 x 2 with optimizer=fused, with no speedup claimed")
    assert t["speedup_note"] in claim and "1.25x" not in claim


def test_against_versus_the_claim_and_the_tables_name_it():
    doc = small_tuned_doc(FUSED)
    t = doc["trainbench_autotune"]
    base = t.pop("workload_config")
    t["versus"] = dict(name="largest-batch", how="Lightning's BatchSizeFinder", config=base["config"],
                       measured=base["measured"], speedup=t.pop("speedup_over_workload_config"),
                       speedup_significant=t.pop("speedup_significant"), speedup_interval=t.pop("speedup_interval"),
                       note=t.pop("speedup_note"))
    t["race"]["finalists"][1]["versus"] = t["race"]["finalists"][1].pop("workload_config")
    page = page_of(doc)
    assert page.text("claim") == ("Chosen: micro-batch 8 x 2 with optimizer=fused, 1.25x --versus largest-batch "
                                  "(95% CI 1.20-1.30, 4 race rounds).")
    assert page.tables["race-table"]["headers"][1] == "switches changed from --versus's"
    assert page.rows("race-table")[1]["switches changed from --versus's"] == "none (baseline)"
    assert {r["trial"] for r in page.rows("search-table")} == {"chosen", "versus"}


def test_the_search_table_lists_every_journal_line_and_the_failed_ones_with_their_reasons():
    journal = small_journal()
    page = assert_self_contained(tune_page(small_tuned_doc(FUSED), journal))
    rows = page.rows("search-table")
    assert [r["trial"] for r in rows] == [f"journal line {n}" for n in range(1, len(journal) + 1)]
    assert [r["outcome"] for r in rows] == [line["result"]["class"] for line in journal]
    assert [r["micro-batch"] for r in rows] == [str(line["candidate"]["micro_batch"]) for line in journal]
    assert [r["samples/s"] for r in rows] == [significant(line["result"]["samples_per_s"]) for line in journal]
    failed = page.rows("failed-table")
    assert [(r["outcome"], r["reason"], r["configuration"]) for r in failed] == \
        [(line["result"]["class"], line["result"]["message"], line["key"]) for line in journal[5:]]
    assert "2 failed trials" in next(i["alt"] for i in page.images if i["alt"].startswith("Samples per second"))


def test_switch_effects_are_the_ratios_of_trials_that_differ_in_one_switch_alone():
    page = page_of(small_tuned_doc(FUSED), small_journal())
    effects = page.rows("switches-table")
    # optimizer at micro-batch 16 and 8 (from the workload's own value), sync at micro-batch 8 with fused.
    assert [(r["switch"], r["from"], r["to"], r["micro-batch"]) for r in effects] == [
        ("optimizer", "per_tensor", "fused", "16"), ("optimizer", "per_tensor", "fused", "8"),
        ("sync", "every_step", "async", "8")]
    assert [r["ratio to/from (computed)"] for r in effects] == \
        [significant(1100 / 1000), significant(1250 / 900), significant(1260 / 1250)]
    assert effects[2]["other switches changed"] == "optimizer=fused"


def test_the_race_table_names_the_dropped_finalist_its_round_and_the_tie_rule():
    doc = small_tuned_doc(FUSED)
    doc["trainbench_autotune"]["choice_note"] = "the race cannot tell it from the fastest, and it is the simpler"
    page = page_of(doc, small_journal())
    race = page.rows("race-table")
    assert race[1]["status"] == "dropped after round 3"
    assert race[1]["why dropped"].startswith("slower than the leader beyond noise")
    assert (race[1]["CI low"], race[1]["CI high"]) == (significant(0.79), significant(0.81))
    assert "The rule that decided the choice (choice_note): the race cannot tell" in page.text("race")


def test_memory_draws_the_device_capacity_where_the_file_has_it():
    page = page_of(small_tuned_doc(FUSED), small_journal())
    assert f"Device memory: {significant(16.0)} MiB (device.memory_bytes)" in page.text("memory")
    peaks = page.rows("memory-table")
    assert len(peaks) == 5 and {r["peak memory (MiB)"] for r in peaks} == {significant(1.0)}


def test_the_budget_table_holds_budget_spent_unused_included():
    doc = small_tuned_doc(FUSED)
    page = page_of(doc)
    budget = {r["part"]: r["seconds"] for r in page.rows("budget-table")}
    spent = doc["trainbench_autotune"]["search"]["budget_spent"]
    assert budget["unused"] == significant(spent["unused_seconds"]) and budget["profile"] == significant(2.0)
    assert "budget_spent.unused_why: the search was exhausted" in page.text("budget")


# ---- Files missing parts: older autotune, a tune stopped early ----

def test_a_file_without_race_time_split_budget_or_device_still_has_every_section_saying_why():
    doc = small_tuned_doc(FUSED)
    t = doc["trainbench_autotune"]
    for key in ("race", "time_split", "device", "speedup_interval", "runners_up_within_noise", "failed_trials"):
        t.pop(key, None)
    del t["search"]["budget_spent"]
    page = page_of(doc)
    assert "records no race" in page.text("race")
    assert "records no time split" in page.text("time-split")
    assert "no search.budget_spent" in page.text("budget")
    assert "records no device" in page.text("machine")
    assert "race-table" not in page.tables and "time-split-table" not in page.tables


def test_a_tune_where_nothing_ran_says_so():
    doc = small_tuned_doc(FUSED)
    t = doc["trainbench_autotune"]
    t["chosen"] = None
    t["note"] = "no configuration ran successfully; see failed_trials"
    t["failed_trials"] = [{"config": key_of(16, 16, OWN_SWITCHES), "class": "oom", "message": "out of memory"}]
    for key in ("measured", "workload_config", "race", "speedup_over_workload_config", "speedup_interval"):
        t.pop(key)
    page = page_of(doc)
    assert page.text("claim").startswith("No configuration ran successfully")
    assert [r["outcome"] for r in page.rows("failed-table")] == ["oom"]


def test_an_older_yaml_with_unquoted_on_and_off_reads_them_as_switch_values():
    # PyYAML reads the unquoted on/off of older files as booleans.
    doc = small_tuned_doc({"optimizer": "fused", "bf16_matmuls": True})
    doc["trainbench_autotune"]["workload_config"]["config"]["switches"] = {"optimizer": "per_tensor",
                                                                           "bf16_matmuls": False}
    doc["trainbench_autotune"]["race"]["finalists"][0]["config"] = "g=16 mb=8 bf16_matmuls=on optimizer=fused"
    claim = page_of(doc).text("claim")
    assert "with bf16_matmuls=on, optimizer=fused, 1.25x" in claim


# ---- The command line: bad input, the atomic write ----

def write(path, text):
    path.write_text(text)
    return str(path)


def run_main(capsys, *args):
    rc = main([str(a) for a in args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_the_command_writes_the_page_from_yaml_and_from_json(tmp_path, capsys):
    doc = ranks2_doc()
    json_path = write(tmp_path / "tuned.json", json.dumps(doc))
    for tuned in (RANKS2_YAML, json_path):
        out = tmp_path / "tune.html"
        rc, stdout, stderr = run_main(capsys, tuned, "--out", out)
        assert (rc, stderr) == (0, "")
        assert_self_contained(out.read_text())
    assert sorted(os.listdir(tmp_path)) == ["tune.html", "tuned.json"], "a temporary file was left behind"


def test_the_launcher_runs(tmp_path):
    journal = tmp_path / "j.jsonl"
    journal.write_text("".join(json.dumps(line) + "\n" for line in small_journal()))
    tuned = write(tmp_path / "tuned.json", json.dumps(small_tuned_doc(FUSED)))
    p = run_script("tune-page", tuned, "--journal", journal, "--out", tmp_path / "tune.html")
    assert p.returncode == 0, p.stderr
    assert_self_contained((tmp_path / "tune.html").read_text())


def wrong(path_in_doc, value):
    """The small tuned file with one value replaced."""
    doc = small_tuned_doc(FUSED)
    node = doc
    for key in path_in_doc[:-1]:
        node = node[key]
    node[path_in_doc[-1]] = value
    return json.dumps(doc)


GOOD_JOURNAL = "".join(json.dumps(line) + "\n" for line in small_journal())

BAD_INPUTS = {
    "not YAML": ("tuned: [unclosed\n  - : :", None, "not valid YAML"),
    "not JSON": ('{"trainbench_autotune": {', None, "not valid JSON"),
    "a YAML string": ("just words\n", None, "not an autotune tuned file"),
    "no top key": ('{"chosen": {}}', None, "not an autotune tuned file"),
    "top key a list": ('{"trainbench_autotune": []}', None, "not an autotune tuned file"),
    "race a string": (wrong(["trainbench_autotune", "race"], "abc"), None,
                      "trainbench_autotune.race: expected a mapping"),
    "a ratio that is text": (wrong(["trainbench_autotune", "race", "finalists", 1, "vs_leader", "ratio"], "fast"),
                             None, "finalists[1].vs_leader.ratio: expected a finite number"),
    "a micro-batch of zero": (wrong(["trainbench_autotune", "chosen", "micro_batch"], 0), None,
                              "chosen.micro_batch: expected a positive whole number"),
    "a finalist's key": (wrong(["trainbench_autotune", "race", "finalists", 0, "config"], "mb=8"), None,
                         "expected a configuration's key"),
    "finalists a number": (wrong(["trainbench_autotune", "race", "finalists"], 3), None, "expected a list"),
    "a journal line not JSON": (json.dumps(small_tuned_doc(FUSED)), GOOD_JOURNAL + "{oops\n" + GOOD_JOURNAL,
                                "line 8: not a journal line"),
    "a journal line of something else": (json.dumps(small_tuned_doc(FUSED)), '{"a": 1}\n',
                                         "line 1: not a journal line"),
    "a journal's samples/s text": (json.dumps(small_tuned_doc(FUSED)),
                                   GOOD_JOURNAL.replace('"samples_per_s": 1000.0', '"samples_per_s": "many"'),
                                   "line 1.result.samples_per_s: expected a finite number"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_leaves_the_last_page(tmp_path, capsys, name):
    tuned_text, journal_text, expected = BAD_INPUTS[name]
    tuned = write(tmp_path / ("tuned.yaml" if not tuned_text.startswith("{") else "tuned.json"), tuned_text)
    out = tmp_path / "tune.html"
    out.write_text("the last good page")
    args = [tuned, "--out", out]
    if journal_text is not None:
        args += ["--journal", write(tmp_path / "j.jsonl", journal_text)]
    if not tuned_text.startswith("{"):
        pytest.importorskip("yaml", reason="a file that is not JSON is read as YAML")
    rc, stdout, stderr = run_main(capsys, *args)
    assert rc == 2 and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("tune-page: error: ") and expected in stderr, stderr
    assert "Traceback" not in stderr
    assert out.read_text() == "the last good page"
    assert sorted(os.listdir(tmp_path)) == sorted(["tune.html", os.path.basename(tuned)]
                                                  + (["j.jsonl"] if journal_text is not None else []))


def test_bad_input_through_the_launcher_prints_no_traceback(tmp_path):
    tuned = write(tmp_path / "tuned.json", wrong(["trainbench_autotune", "race"], [1, 2]))
    p = run_script("tune-page", tuned, "--out", tmp_path / "tune.html")
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr
    assert not (tmp_path / "tune.html").exists()


def test_a_page_that_cannot_be_written_is_one_line_and_leaves_no_temporary_file(tmp_path, capsys):
    folder = tmp_path / "tune.html"
    folder.mkdir()  # --out names a folder: the rename over it fails
    rc, _, stderr = run_main(capsys, write(tmp_path / "tuned.json", json.dumps(small_tuned_doc(FUSED))),
                             "--out", folder)
    assert rc == 2 and stderr.count("\n") == 1 and f"{folder}: cannot write the page" in stderr, stderr
    assert sorted(os.listdir(tmp_path)) == ["tune.html", "tuned.json"] and os.listdir(folder) == []


def test_a_command_the_file_records_is_shown():
    doc = small_tuned_doc(FUSED)
    doc["trainbench_autotune"]["command"] = ["autotune", "--workload", "tiny", "--out", "my tuned.yaml"]
    assert page_of(doc).text("command") == "autotune --workload tiny --out 'my tuned.yaml'"


def test_a_binary_file_and_a_missing_file_are_one_line_each(tmp_path, capsys):
    binary = tmp_path / "tuned.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    rc, _, stderr = run_main(capsys, binary, "--out", tmp_path / "tune.html")
    assert rc == 2 and "not a text file" in stderr and stderr.count("\n") == 1
    rc, _, stderr = run_main(capsys, tmp_path / "absent.yaml", "--out", tmp_path / "tune.html")
    assert rc == 2 and "No such file or directory" in stderr and stderr.count("\n") == 1


def test_yaml_without_pyyaml_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml raises ImportError
    rc, _, stderr = run_main(capsys, RANKS2_YAML, "--out", tmp_path / "tune.html")
    assert rc == 2 and "reading YAML needs PyYAML" in stderr and stderr.count("\n") == 1


def test_a_torn_last_journal_line_is_left_out(tmp_path, capsys):
    journal = tmp_path / "j.jsonl"
    journal.write_text(GOOD_JOURNAL + GOOD_JOURNAL.splitlines()[0][:40])  # cut by a crash mid-write
    tuned = write(tmp_path / "tuned.json", json.dumps(small_tuned_doc(FUSED)))
    rc, _, stderr = run_main(capsys, tuned, "--journal", journal, "--out", tmp_path / "tune.html")
    assert (rc, stderr) == (0, "")
    rows = PageReader((tmp_path / "tune.html").read_text()).rows("search-table")
    assert len(rows) == len(small_journal())


# ---- The page's building blocks ----

def test_table_cells_are_escaped_and_an_image_needs_an_alt_text():
    text = markup.table("t", ["<b>"], [["<script>alert(1)</script>"], [None]])
    page = PageReader(text)
    assert "script" not in page.tags and page.rows("t") == [{"<b>": "<script>alert(1)</script>"},
                                                            {"<b>": markup.MISSING}]
    figure = markup.new_figure(2, 1)
    figure.add_subplot().plot([1, 2])
    with pytest.raises(ValueError):
        markup.figure_img(figure, " ")
    assert PageReader(markup.figure_img(figure, 'a "line"')).images[0]["alt"] == 'a "line"'


@pytest.mark.parametrize("value, shown", [(8089.31, "8089"), (0.531739, "0.5317"), (1.0, "1.000"), (12.4939, "12.49"),
                                          (0, "0"), (None, markup.MISSING), (123456.7, "123457")])
def test_significant_keeps_four_digits_without_an_exponent(value, shown):
    assert significant(value) == shown
