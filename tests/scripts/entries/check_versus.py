"""Reads what `autotune --entry fits_eight.py:build --batch 32 --versus largest-batch --format json` wrote and
checks what does not depend on timing: the largest-batch search found micro-batch 8 (16 ran out of memory), that
configuration (8 x 4) was measured as the baseline, and the choice is compared with it (a ratio and a note).
Exit 0 when it holds; else the reason."""
import json
import sys


def main(path):
    with open(path) as f:
        t = json.load(f)["trainbench_autotune"]
    v = t.get("versus")
    problems = []
    if not v:
        return f"{path}: no versus in it"
    if v.get("name") != "largest-batch" or v.get("micro_batch") != 8 or v.get("accumulation") != 4:
        problems.append(f"expected largest-batch at 8 x 4, got {v.get('name')} "
                        f"{v.get('micro_batch')} x {v.get('accumulation')}")
    tried = [(s["micro_batch"], s["outcome"].split(" (")[0]) for s in v.get("search", {}).get("tried", [])]
    if tried != [(1, "fits"), (2, "fits"), (4, "fits"), (8, "fits"), (16, "out of memory")]:
        problems.append(f"tried {tried}")
    if v.get("config", {}).get("micro_batch") != 8 or not v.get("measured"):
        problems.append(f"the baseline was not measured at micro-batch 8: {v.get('config')} {v.get('failed')}")
    # the ratio is a timing, and whether the race had time for a round depends on the machine's load: only
    # that the choice is compared with the baseline is checked
    if t.get("chosen") and not ("speedup" in v and v.get("note")):
        problems.append(f"the choice is not compared with the largest-batch configuration: {v}")
    if "workload_config" in t or "speedup_over_workload_config" in t:
        problems.append("the entry's own configuration is reported beside the versus one")
    if problems:
        return f"{path}: " + "; ".join(problems)
    print(f"versus largest-batch 8 x 4: {v.get('note')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
