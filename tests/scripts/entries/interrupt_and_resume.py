"""Ctrl-C during `autotune --entry`, then `--resume`: run as `interrupt_and_resume.py AUTOTUNE OUTDIR`.

The tune is interrupted (SIGINT to autotune alone, as a terminal's Ctrl-C reaches it: each trial's child is in
its own process group) as soon as its journal holds a finished trial, found by polling the file, never by a
guessed sleep. It must exit 130, write the best so far, and keep the finished trials in the journal. A rerun
with --resume must say it resumes those trials, not run the entry's own configuration again, and keep them
in place when it is interrupted in turn after a trial of its own. Every wait is for a state, with generous
limits, and no budget ends a run: the verdict does not depend on the machine's load. Exit 0 when all of that
holds; else the first thing that did not."""
import json
import os
import signal
import subprocess
import sys
import tempfile
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


def interrupt_after(autotune, args, journal, lines):
    """Runs autotune, sends it SIGINT once `journal` holds more than `lines` finished trials; (exit code,
    standard error), or the reason it could not."""
    with tempfile.TemporaryFile("w+") as err:  # a file, not a pipe: nothing blocks autotune while it is polled
        tune = subprocess.Popen([autotune, *args], stdout=subprocess.DEVNULL, stderr=err, text=True)
        deadline = time.monotonic() + WAIT_FOR_TRIAL_S
        why = None
        while len(finished_lines(journal)) <= lines:
            if tune.poll() is not None:
                why = f"autotune ended (exit {tune.returncode}) before it journaled a trial"
                break
            if time.monotonic() > deadline:
                tune.kill()
                why = f"no new trial in {journal} after {WAIT_FOR_TRIAL_S} s"
                break
            time.sleep(0.2)
        if why is None:
            tune.send_signal(signal.SIGINT)
            try:
                tune.wait(timeout=WAIT_FOR_EXIT_S)
            except subprocess.TimeoutExpired:
                tune.kill()
                why = f"autotune did not stop within {WAIT_FOR_EXIT_S} s of SIGINT"
        tune.wait()
        err.seek(0)
        text = err.read()
    return (None, f"{why}: {text}") if why else (tune.returncode, text)


def main(autotune, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "interrupted.yaml")
    journal = os.path.join(out_dir, "interrupted.autotune.jsonl")
    for path in (out, journal):
        if os.path.exists(path):
            os.remove(path)
    tune = [*ENTRY, "--budget", "1800", "--out", out]  # the budget never ends these runs: SIGINT does
    code, err = interrupt_after(autotune, tune, journal, 0)
    if code != 130:
        return f"exit {code} after SIGINT, expected 130: {err}"
    kept = finished_lines(journal)
    if not kept or any(not json.loads(line).get("result") for line in kept):
        return f"the journal lost its trials: {kept}"
    with open(out) as f:
        written = yaml.safe_load(f)["trainbench_autotune"]
    if not written["search"]["interrupted"] or not written.get("chosen"):
        return f"the interrupted tune did not write the best so far: {written['search']}"

    # Resumed, it takes the journaled trials as done (the entry's own configuration, measured first, is not
    # run again: the first trial it runs is another), and keeps them when interrupted again.
    code, err = interrupt_after(autotune, [*tune, "--resume"], journal, len(kept))
    if code != 130:
        return f"the resumed tune exited {code} after SIGINT, expected 130: {err}"
    if f"resuming with {len(kept)} trials from {journal}" not in err:
        return f"the rerun did not resume the {len(kept)} journaled trials: {err}"
    now = finished_lines(journal)
    if now[:len(kept)] != kept:
        return "the rerun changed the journaled trials"
    own = json.loads(kept[0])["key"]
    if json.loads(now[len(kept)])["key"] == own:
        return f"the rerun ran the entry's own configuration ({own}) again"
    with open(out) as f:
        written = yaml.safe_load(f)["trainbench_autotune"]
    if not written.get("chosen"):
        return f"the interrupted rerun did not write the best so far, the resumed trials included: {written}"
    print(f"interrupted after {len(kept)} journaled trial(s), exit 130; resumed them, ran "
          f"{len(now) - len(kept)} more, interrupted again, exit 130")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
