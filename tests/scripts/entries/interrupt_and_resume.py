"""Ctrl-C during `autotune --entry`, then `--resume`: run as `interrupt_and_resume.py AUTOTUNE OUTDIR`.

The tune is interrupted (SIGINT to autotune alone, as a terminal's Ctrl-C reaches it: each trial's child is in
its own process group) as soon as its journal holds a finished trial, found by polling the file, never by a
guessed sleep. It must exit 130, write the best so far, and keep the finished trials in the journal. A rerun
with --resume must say it resumes those trials, leave them in place, and count them in its output's
trials_total beside the trials it ran itself. Every wait is generous: the verdict does not depend on the
machine's load. Exit 0 when all of that holds; else the first thing that did not."""
import json
import os
import signal
import subprocess
import sys
import time

import yaml

ENTRY = ["--gpu", "cpu", "--entry", "tuner/entries/my_train.py:build", "--batch", "16", "--switches", "optimizer",
         "--trial-seconds", "1"]
WAIT_FOR_TRIAL_S = 600   # the entry's probe and its first trial, on a busy machine
WAIT_FOR_EXIT_S = 300


def finished_lines(path):
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return []
    return [line for line in text.split("\n")[:-1] if line]  # a line is finished once its newline is written


def main(autotune, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "interrupted.yaml")
    journal = os.path.join(out_dir, "interrupted.autotune.jsonl")
    for path in (out, journal):
        if os.path.exists(path):
            os.remove(path)
    tune = subprocess.Popen([autotune, *ENTRY, "--budget", "900", "--out", out], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + WAIT_FOR_TRIAL_S
    while not finished_lines(journal):
        if tune.poll() is not None:
            return f"autotune ended (exit {tune.returncode}) before a trial was journaled: {tune.stderr.read()}"
        if time.monotonic() > deadline:
            tune.kill()
            return f"no trial in {journal} after {WAIT_FOR_TRIAL_S} s"
        time.sleep(0.2)
    tune.send_signal(signal.SIGINT)
    try:
        _, err = tune.communicate(timeout=WAIT_FOR_EXIT_S)
    except subprocess.TimeoutExpired:
        tune.kill()
        return f"autotune did not stop within {WAIT_FOR_EXIT_S} s of SIGINT"
    if tune.returncode != 130:
        return f"exit {tune.returncode} after SIGINT, expected 130: {err}"
    kept = finished_lines(journal)
    if not kept or any(not json.loads(line).get("result") for line in kept):
        return f"the journal lost its trials: {kept}"
    with open(out) as f:
        written = yaml.safe_load(f)["trainbench_autotune"]
    if not written["search"]["interrupted"] or not written.get("chosen"):
        return f"the interrupted tune did not write the best so far: {written['search']}"

    rerun = subprocess.run([autotune, *ENTRY, "--budget", "90", "--race-rounds", "0", "--resume", "--out", out],
                           capture_output=True, text=True, timeout=WAIT_FOR_EXIT_S + 90)
    if rerun.returncode != 0:
        return f"the resumed tune exited {rerun.returncode}: {rerun.stderr}"
    if f"resuming with {len(kept)} trials from {journal}" not in rerun.stderr:
        return f"the rerun did not resume the {len(kept)} journaled trials: {rerun.stderr}"
    if finished_lines(journal)[:len(kept)] != kept:
        return "the rerun changed the journaled trials"
    with open(out) as f:
        search = yaml.safe_load(f)["trainbench_autotune"]["search"]
    if search["trials_total"] != len(kept) + search["trials_run"]:
        return f"the resumed trials are not counted: {len(kept)} journaled, {search}"
    print(f"interrupted after {len(kept)} journaled trial(s), exit 130; resumed them and ran {search['trials_run']} more")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
