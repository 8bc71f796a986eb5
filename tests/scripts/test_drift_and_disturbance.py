"""What the machine does to a run, kept apart from what the code does: whole-run drift (a shift of every stage
by 10-20% between runs, no change of the code) and rows benchsuite marked disturbed."""

import copy

import numpy as np
import pytest

import synth
from conftest import by_name, scaled, write_json
from trainbench.tracking.interleave import compare_interleaved
from trainbench.tracking.resultfile import parse_run
from trainbench.tracking.stats import FASTER, INCONCLUSIVE, SAME, SLOWER
from trainbench.tracking.compare import Settings, compare_files, compare_history

PEAK, FUSED, PER_TENSOR, ATTN = synth.names()


def run(seed, day, scale=None, **kw):
    doc = synth.make_run(seed, day, scale=scale, **kw)
    return parse_run(doc, synth.file_name(doc))


def drifting_history(nights, seed, *, shifted=(), real=None):
    """Every run moved as a whole by a random factor of 0.85..1.15 (the machine, no change of the code); the
    nights in `shifted` by +10..20% more, every stage alike; `real`: (first night, stage, factor), a change
    of the code from that night on."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(nights):
        f = float(rng.uniform(0.85, 1.15)) * (float(rng.uniform(1.10, 1.20)) if i in shifted else 1.0)
        scale = {"*": f}
        if real is not None and i >= real[0]:
            scale[real[1]] = f * real[2]
        out.append(run(seed * 1000 + i, i, scale))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_whole_run_drift_never_confirms_a_regression_young_or_old(seed):
    h = drifting_history(25, seed, shifted=set(range(8, 12)) | {20, 21, 22})
    for night in range(1, 25):
        a = compare_history(h[:night], h[night], Settings())
        assert a.regressions == [], (night, [(c.key, c.test.ratio, c.notes) for c in a.regressions])


def test_a_persistent_whole_run_shift_is_drift_not_a_regression():
    h = [run(500 + i, i, {"*": 1.0}) for i in range(12)] + [run(600 + i, 12 + i, {"*": 1.15}) for i in range(3)]
    a = compare_history(h[:-1], h[-1], Settings())
    assert a.exit_code == 0
    c = next(c for c in a.comparisons if c.key == PEAK)
    assert c.verdict in (SAME, INCONCLUSIVE) and not c.confirmed
    assert c.environment.startswith("the whole run moved +1")
    assert any("while the whole run moved +1" in n and "compare --interleave" in n for n in c.notes)


def test_a_real_regression_stands_out_of_the_drift():
    """The same persistent shift of the whole run, and adamw 30% slower on top of it from night 12."""
    h = [run(500 + i, i, {"*": 1.0}) for i in range(12)]
    h += [run(600 + i, 12 + i, {"*": 1.15, "adamw": 1.15 * 1.3}) for i in range(3)]
    a = compare_history(h[:-1], h[-1], Settings())
    assert {c.key for c in a.regressions} == {FUSED, PER_TENSOR}
    assert any("beyond the whole run's drift (+14.9%" in n for n in a.regressions[0].notes)
    assert {c.key: c.confirmed for c in a.comparisons}[PEAK] is False


def test_two_files_allow_for_a_drift_of_the_whole_run_and_say_what_they_cannot_tell():
    base = synth.make_run(1)
    drifted = scaled(synth.make_run(2), 1.18)
    a = compare_files(parse_run(base, "a.json"), parse_run(drifted, "b.json"), Settings())
    assert a.exit_code == 0 and all(c.verdict in (SAME, INCONCLUSIVE) for c in a.comparisons)
    assert any("two single runs cannot separate a change from the machine's run-to-run drift" in w
               and "--interleave" in w for w in a.warnings)
    real = scaled(drifted, 1.3, ["adamw"])
    a = compare_files(parse_run(base, "a.json"), parse_run(real, "c.json"), Settings())
    assert {c.key for c in a.unconfirmed} == {FUSED, PER_TENSOR} and not a.regressions


def test_drift_is_not_estimated_from_too_few_other_stages():
    base = synth.make_run(1)
    only_adamw = {"benchmarks": [r for r in base["benchmarks"] if r["stage"] == "adamw"]}
    doc = dict(base, **only_adamw)
    a = compare_files(parse_run(doc, "a.json"), parse_run(scaled(doc, 1.2), "b.json"), Settings())
    assert [c.verdict for c in a.comparisons] == [SLOWER, SLOWER] and len(a.unconfirmed) == 2 and a.exit_code == 0


def disturbed(doc, names, share=0.62):
    doc = copy.deepcopy(doc)
    for row in doc["benchmarks"]:
        if row["name"] in names:
            row.update(disturbed=True, others_cpu_share=share)
    return doc


def test_a_disturbed_row_is_listed_never_judged(cli, tmp_path):
    base = synth.make_run(1)
    new = disturbed(scaled(base, 50.0, [PER_TENSOR]), [PER_TENSOR])     # 50x under a competing load
    rc, out, _ = cli("compare", write_json(tmp_path / "a.json", base), write_json(tmp_path / "b.json", new),
                     "--format", "json")
    c = by_name(out)[PER_TENSOR]
    assert rc == 0
    assert (c["status"], c["verdict"], c["confirmed_regression"]) == ("disturbed", None, False)
    assert c["reason"] == "disturbed: other processes used 62% of the CPUs"
    rc, out, _ = cli("compare", write_json(tmp_path / "a.json", base), write_json(tmp_path / "b.json", new))
    assert "disturbed: other processes used 62% of the CPUs (not judged: its timing measures the disturbance)" in out
    # the other way round: the baseline was disturbed
    rc, out, _ = cli("compare", write_json(tmp_path / "b.json", new), write_json(tmp_path / "a.json", base),
                     "--format", "json")
    assert (by_name(out)[PER_TENSOR]["status"], rc) == ("disturbed", 0)


def test_a_disturbed_night_is_left_out_of_the_history():
    h = [run(700 + i, i) for i in range(10)]
    noisy = synth.make_run(710, 10, scale={"peak": 3.0})
    h.append(parse_run(disturbed(noisy, [PEAK]), "night10.json"))
    h += [run(711, 11)]
    a = compare_history(h[:-1], h[-1], Settings())
    c = next(c for c in a.comparisons if c.key == PEAK)
    assert c.verdict == SAME and "1 disturbed run left out of the history" in c.notes
    a = compare_history(h[:-2], h[-2], Settings())
    assert next(c for c in a.comparisons if c.key == PEAK).status == "disturbed"


def test_interleaved_rounds_with_a_disturbed_side_are_left_out():
    rng = np.random.default_rng(3)
    pairs = []
    for r in range(4):
        d = float(rng.uniform(0.85, 1.15))
        old, new = synth.make_run(10 * r, r, scale={"*": d}), synth.make_run(10 * r + 1, r, scale={"*": d * 1.2})
        if r == 1:
            new = disturbed(scaled(new, 0.5), [PEAK])        # would look faster, and is not clean
        pairs.append((parse_run(old, f"o{r}.json"), parse_run(new, f"n{r}.json")))
    a = compare_interleaved(pairs, Settings())
    c = next(c for c in a.comparisons if c.key == PEAK)
    assert c.verdict == SLOWER and c.notes[0] == "1 disturbed round left out (round 2 new)"
    for r in (0, 2):
        pairs[r] = (pairs[r][0], parse_run(disturbed(pairs[r][1].data, [PEAK]), "x.json"))
    a = compare_interleaved(pairs, Settings())
    c = next(c for c in a.comparisons if c.key == PEAK)
    assert (c.status, c.verdict, c.confirmed) == ("disturbed", None, False)
    assert c.reason.startswith("3 of 4 rounds disturbed: other processes used 62% of the CPUs")


def test_gpu_throttling_is_shown_as_the_disturbance():
    doc = synth.make_run(1, backend="cuda")
    name = doc["benchmarks"][0]["name"]
    doc["benchmarks"][0].update(disturbed=True, throttle_reasons=["sw_thermal_slowdown"], sm_clock_min_mhz=1410,
                                sm_clock_max_mhz=1980)
    row = parse_run(doc, "g.json").rows[name]
    assert row.disturbance == "disturbed: GPU throttled (sw_thermal_slowdown); SM clock 1410-1980 MHz"
