"""Command lines of scripts/compare, scripts/report and scripts/nightly.

Exit codes (all three): 0 no confirmed regression, 1 confirmed regression, 2 bad usage or unreadable input.
nightly also: 3 the run stored has an incorrect or failed row (and no confirmed regression).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
from typing import List, Optional

from .constants import (DEFAULT_ALPHA, DEFAULT_CP_ALPHA, DEFAULT_MAX_HISTORY, DEFAULT_MIN_SAMPLES, DEFAULT_PERSIST,
                        DEFAULT_REPETITIONS, DEFAULT_ROUNDS, DEFAULT_SETTLE_RUNS, DEFAULT_THRESHOLD)
from .argtypes import positive_int
from .atomic import keep_copy, write_atomically
from ..errors import ResultFileError, UsageError
from .history import load_history, machine_keys_in, store_run
from .resultfile import load_run

# numpy / scipy / matplotlib are imported when needed, so that --help and bad usage answer at once
FORMATS = ("table", "markdown", "json")
PACKAGES_HINT = "install the Python packages: python3 -m pip install numpy scipy matplotlib"


def _tracking():
    try:
        from . import compare, render
    except ImportError as e:
        raise UsageError(f"{e}; {PACKAGES_HINT}") from None
    return compare, render


EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, EXIT_INCORRECT = 0, 1, 2, 3
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def _percent(text: str) -> float:
    t = text.strip().rstrip("%")
    try:
        v = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
    if not 0 < v < 100:
        raise argparse.ArgumentTypeError(f"percentage must be in (0, 100): {text!r}")
    return v / 100.0


def _threshold(text: str):
    """'PCT' (all stages) or 'STAGE=PCT'."""
    if "=" in text:
        stage, _, pct = text.partition("=")
        if not stage.strip():
            raise argparse.ArgumentTypeError(f"expected STAGE=PCT, got {text!r}")
        return stage.strip(), _percent(pct)
    return None, _percent(text)


def _add_analysis_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("statistics")
    g.add_argument("--threshold", action="append", type=_threshold, default=[], metavar="[STAGE=]PCT",
                   help="minimum change of the median that counts, in percent "
                        f"(default {DEFAULT_THRESHOLD * 100:g}%%); "
                        "STAGE=PCT sets one stage's; repeatable")
    g.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"significance level of the U test on the samples (default {DEFAULT_ALPHA:g})")
    g.add_argument("--cp-alpha", type=float, default=DEFAULT_CP_ALPHA,
                   help="significance level of the test between the runs either side of a change point "
                        f"(default {DEFAULT_CP_ALPHA:g})")
    g.add_argument("--min-samples", type=positive_int, default=DEFAULT_MIN_SAMPLES,
                   help=f"repetitions needed on each side, else INCONCLUSIVE (default {DEFAULT_MIN_SAMPLES})")
    g.add_argument("--persist", type=positive_int, default=DEFAULT_PERSIST,
                   help="consecutive slower runs before a regression is confirmed; also the shortest level "
                        f"a change point may start (default {DEFAULT_PERSIST})")
    g.add_argument("--settle-runs", type=int, default=DEFAULT_SETTLE_RUNS,
                   help="a shift older than this many runs is the new level and no longer fails; 0: never "
                        f"(default {DEFAULT_SETTLE_RUNS})")
    g.add_argument("--max-history", type=positive_int, default=DEFAULT_MAX_HISTORY,
                   help=f"latest runs of history analysed (default {DEFAULT_MAX_HISTORY})")
    g.add_argument("--filter", metavar="REGEX",
                   help="only compare benchmarks whose name matches (benchsuite's own --filter goes after --)")


def _settings(args):
    for name in ("alpha", "cp_alpha"):
        if not 0 < getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be in (0, 1), got {getattr(args, name):g}")
    s = _tracking()[0].Settings(alpha=args.alpha, cp_alpha=args.cp_alpha, min_samples=args.min_samples, persist=args.persist,
                 settle_runs=args.settle_runs, max_history=args.max_history, filter=args.filter)
    for stage, pct in args.threshold:
        if stage is None:
            s.threshold = pct
        else:
            s.stage_thresholds[stage] = pct
    if args.filter:
        import re
        try:
            re.compile(args.filter)
        except re.error as e:
            raise UsageError(f"--filter is not a valid regular expression: {e}")
    return s


def _unknown_stages(a) -> None:
    stages = {c.stage for c in a.comparisons}
    for stage in a.settings.stage_thresholds:
        if stage not in stages:
            a.warnings.append(f"--threshold {stage}=...: no benchmark of stage {stage!r} was compared")


def _emit(a, fmt: str, markdown_path: Optional[str]) -> None:
    render = _tracking()[1]
    text = {"table": render.table, "markdown": render.markdown, "json": render.to_json}[fmt](a)
    sys.stdout.write(text)
    sys.stdout.flush()
    if markdown_path:
        write_atomically(markdown_path, render.markdown(a).encode("utf-8"))


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _history_analysis(directory: str, new, settings, allow_mismatch: bool):
    history, warnings = load_history(directory, machine_key=new.machine_key, exclude=new)
    mismatch = False
    if not history:
        others = [k for k in machine_keys_in(directory) if k != new.machine_key]
        if others:
            msg = (f"{directory} holds runs of {', '.join(others)}, not of this run's machine "
                   f"{new.machine_key}; histories never mix machines")
            if not allow_mismatch:
                raise UsageError(msg + " (pass --allow-machine-mismatch to compare anyway)")
            history, warnings = load_history(directory, exclude=new)
            warnings = [w for w in warnings if "machine" not in w]
            warnings.append(msg + ": verdicts shown, no regression confirmed")
            mismatch = True
    a = _tracking()[0].compare_history(history, new, settings)
    a.warnings = warnings + a.warnings
    if mismatch:
        for c in a.comparisons:
            c.confirmed = False
    return a


COMPARE_EPILOG = """\
BASELINE is a result file (two-run comparison) or a history folder results/<machine-key>/ (the new run
against the runs stored before it, with change points); NEW is always a result file. Verdicts per
benchmark: SAME, FASTER, SLOWER, INCONCLUSIVE; rows that did not pass are shown, never compared.

Two single result files cannot separate a change from the machine's run-to-run drift: a slowdown between
them is SLOWER? (unconfirmed) and exits 0 (1 with --fail-on-unconfirmed). What can confirm it: --interleave
(both builds run alternately here), or a history (BASELINE a folder; scripts/nightly --confirm-with runs a
regression the history holds again, interleaved with the previous build).

--interleave: BASELINE and NEW are two benchsuite binaries, run alternately on this machine (ABBA: round
r runs the baseline first when r is even, the new build first when odd), each run with the arguments
after --. Each benchmark is judged on its per-round ratios new/baseline (paired t test on their logs,
Hodges-Lehmann change), so a drift of the machine that hits both builds within a round cancels.

examples:
  scripts/compare results/nvidia-h100-80gb-hbm3_drv13000_cuda13000/20261120T030000Z_abc1234.json new.json
  scripts/compare results/amd-epyc-7b13_2c/ new.json --format markdown > comment.md
  scripts/compare old.json new.json --threshold 3 --threshold attention=10
  scripts/compare --interleave base/build/benches/benchsuite build/benches/benchsuite --rounds 4 \\
      -- --backend cpu --filter 'peak|adamw' --quick

exit codes: 0 no confirmed regression (two files: also a SLOWER?), 1 confirmed regression (--interleave: a
SLOWER verdict; a history: a slowdown that persisted; two files: a SLOWER? with --fail-on-unconfirmed),
2 bad usage or unreadable input (--interleave: also a benchsuite run that failed)
"""


def compare_main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: List[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="compare",
                                description="Compare a trainbench result with another or with a history, "
                                            "or two builds run interleaved.",
                                usage="compare [options] BASELINE NEW\n"
                                      "       compare --interleave [--rounds K] [options] OLD_BENCHSUITE "
                                      "NEW_BENCHSUITE [-- benchsuite arguments]",
                                epilog=COMPARE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("baseline", help="result file, or history folder results/<machine-key>/ "
                                    "(--interleave: the baseline's benchsuite binary)")
    p.add_argument("new", help="result file to judge (--interleave: the new build's benchsuite binary)")
    p.add_argument("--interleave", action="store_true",
                   help="run the two benchsuite binaries alternately here and compare them round by round")
    p.add_argument("--rounds", type=positive_int, default=DEFAULT_ROUNDS,
                   help=f"--interleave: rounds, each one run of either build (default {DEFAULT_ROUNDS}, "
                        f"at least 2)")
    p.add_argument("--timeout", type=float, help="--interleave: seconds one benchsuite run may take")
    p.add_argument("--format", choices=FORMATS, default="table", help="stdout format (default table)")
    p.add_argument("--markdown", metavar="FILE", help="also write the markdown (pull-request comment) to FILE")
    p.add_argument("--allow-machine-mismatch", action="store_true",
                   help="compare runs of different machines (shown, never a confirmed regression)")
    p.add_argument("--fail-on-unconfirmed", action="store_true",
                   help="two result files: exit 1 on a SLOWER? too (a slowdown two single runs cannot confirm)")
    _add_analysis_args(p)
    args = p.parse_args(argv)
    try:
        settings = _settings(args)
        if args.interleave:
            return _compare_interleaved(args, settings, extra)
        if extra:
            raise UsageError("benchsuite arguments after -- need --interleave")
        if os.path.isdir(args.new):
            swapped = (f"; the history goes first: compare {args.new} {args.baseline}"
                       if not os.path.isdir(args.baseline) else "")
            raise UsageError(f"NEW ({args.new}) is a folder: NEW takes one result file; a history folder "
                             f"results/<machine-key>/ is BASELINE, the first argument{swapped}")
        new = load_run(args.new)
        if os.path.isdir(args.baseline):
            a = _history_analysis(args.baseline, new, settings, args.allow_machine_mismatch)
        else:
            a = _tracking()[0].compare_files(load_run(args.baseline), new, settings, args.allow_machine_mismatch)
            a.fail_on_unconfirmed = args.fail_on_unconfirmed
        _unknown_stages(a)
        _emit(a, args.format, args.markdown)
    except (ResultFileError, UsageError) as e:
        return _fail("compare", str(e))
    except OSError as e:
        return _fail("compare", f"{e.filename}: {e.strerror}")
    return a.exit_code


def _compare_interleaved(args, settings, extra: List[str]) -> int:
    if args.rounds < 2:
        raise UsageError(f"--rounds must be at least 2 (a paired test needs two rounds), got {args.rounds}")
    if "--out" in extra or any(e.startswith("--out=") for e in extra):
        raise UsageError("--out after --: --interleave chooses each run's result file itself")
    _tracking()
    try:
        from .interleave import run_interleaved
    except ImportError as e:
        raise UsageError(f"{e}; {PACKAGES_HINT}") from None
    a, incorrect = run_interleaved(args.baseline, args.new, args.rounds, extra, settings, args.timeout)
    _unknown_stages(a)
    if incorrect:
        a.warnings.append(f"benchsuite exited 1 (a variant incorrect or a benchmark failed) in "
                          f"{', '.join(incorrect)}: those rows are listed, not compared")
    _emit(a, args.format, args.markdown)
    return a.exit_code


REPORT_EPILOG = """\
The newest run of the folder is judged against the runs before it, as scripts/nightly does, and drawn:
one PNG per stage (per-run medians with their intervals, each level's noise band, change points, the
latest run's verdict) and an index.html with the table.

examples:
  scripts/report results/amd-epyc-7b13_2c/
  scripts/report results/nvidia-h100-80gb-hbm3_drv13000_cuda13000/ --out /tmp/report --filter adamw

exit codes: 0 report written (whatever the verdicts), 2 bad usage or unreadable input
"""


def report_main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="report", description="Trend plots (PNG + static HTML) of a machine's history.",
                                epilog=REPORT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("history", help="history folder results/<machine-key>/")
    p.add_argument("--out", metavar="DIR", help="output folder (default HISTORY/report)")
    _add_analysis_args(p)
    args = p.parse_args(argv)
    try:
        settings = _settings(args)
        if not os.path.isdir(args.history):
            raise UsageError(f"{args.history}: not a directory")
        runs, warnings = load_history(args.history)
        if not runs:
            raise UsageError(f"{args.history}: no readable result files")
        latest = runs[-1]
        a = _history_analysis(args.history, latest, settings, allow_mismatch=False)
        try:
            from .plots import write_report
        except ImportError as e:
            raise UsageError(f"{e}; {PACKAGES_HINT}") from None
        out = args.out or os.path.join(args.history, "report")
        paths = write_report(a, out)
    except (ResultFileError, UsageError) as e:
        return _fail("report", str(e))
    except OSError as e:
        return _fail("report", f"{e.filename}: {e.strerror}")
    for w in a.warnings:
        print(f"report: warning: {w}", file=sys.stderr)
    print(f"report: wrote {len(paths)} files to {out} (open {os.path.join(out, 'index.html')})")
    return EXIT_OK


NIGHTLY_EPILOG = """\
Runs benchsuite, checks and stores its result as results/<machine-key>/<UTC timestamp>_<commit>.json,
compares it with that machine's history (scripts/compare's rules), prints the table, writes the report,
and appends the markdown to $GITHUB_STEP_SUMMARY when set. Arguments after -- go to benchsuite.

examples:
  scripts/nightly -- --backend cuda
  scripts/nightly --benchsuite build/benches/benchsuite --repetitions 15 -- --backend cpu --filter 'adamw|peak'
  scripts/nightly --input result.json --no-report      # store and judge a run made elsewhere
  scripts/nightly --confirm-with prev/build/benches/benchsuite -- --backend cpu
      # a regression the history confirms must hold run interleaved with the previous build too

exit codes: 0 no confirmed regression, 1 confirmed regression, 2 bad usage, benchsuite could not run or
its result is unreadable, 3 the run has an incorrect or failed benchmark (stored; no confirmed regression)
"""


def nightly_main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: List[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="nightly",
                                description="Run the suite, store the result, compare with history, report.",
                                usage="nightly [options] [-- benchsuite arguments]",
                                epilog=NIGHTLY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--benchsuite", default=os.path.join(REPO_ROOT, "build", "benches", "benchsuite"),
                   help="benchsuite binary (default build/benches/benchsuite in the repository)")
    p.add_argument("--repetitions", type=positive_int, default=DEFAULT_REPETITIONS,
                   help=f"benchsuite --repetitions (default {DEFAULT_REPETITIONS})")
    p.add_argument("--timeout", type=float, help="seconds benchsuite may run")
    p.add_argument("--input", metavar="FILE", help="store and judge this result file instead of running benchsuite")
    p.add_argument("--results-dir", default=os.path.join(REPO_ROOT, "results"),
                   help="histories root (default results/ in the repository)")
    p.add_argument("--report-dir", help="report folder (default RESULTS_DIR/<machine-key>/report)")
    p.add_argument("--no-report", action="store_true", help="do not draw the report")
    p.add_argument("--format", choices=FORMATS, default="table", help="stdout format (default table)")
    p.add_argument("--markdown", metavar="FILE", help="also write the markdown summary to FILE")
    p.add_argument("--confirm-with", metavar="OLD_BENCHSUITE",
                   help="the previous build's benchsuite: a regression the history confirms is run again, its rows "
                        "only, interleaved with this build (compare --interleave), and fails only if that agrees")
    p.add_argument("--confirm-rounds", type=positive_int, default=DEFAULT_ROUNDS,
                   help=f"--confirm-with: rounds of the interleaved check (default {DEFAULT_ROUNDS}, at least 2)")
    _add_analysis_args(p)
    args = p.parse_args(argv)
    tmpdir = None
    try:
        settings = _settings(args)
        if args.confirm_with is not None:
            if args.confirm_rounds < 2:
                raise UsageError(f"--confirm-rounds must be at least 2 (a paired test needs two rounds), "
                                 f"got {args.confirm_rounds}")
            for what, path in (("--confirm-with", args.confirm_with), ("--benchsuite", args.benchsuite)):
                if not os.access(path, os.X_OK):
                    raise UsageError(f"{what} {path}: not an executable benchsuite (--confirm-with runs the "
                                     "previous build and this one interleaved)")
        if args.repetitions < settings.min_samples:
            print(f"nightly: warning: --repetitions {args.repetitions} < --min-samples {settings.min_samples}: "
                  "every verdict will be INCONCLUSIVE", file=sys.stderr)
        bench_rc = 0
        if args.input:
            if extra:
                raise UsageError("benchsuite arguments after -- make no sense with --input")
            source = args.input
        else:
            tmpdir = tempfile.mkdtemp(prefix="trainbench-nightly-")
            source = os.path.join(tmpdir, "result.json")
            bench_rc = run_benchsuite_checked(args, source, extra)
        try:
            run = load_run(source)
        except ResultFileError as e:
            if tmpdir:   # keep the bad file for a look
                kept = keep_copy(source, "trainbench-bad-result-")
                raise ResultFileError(f"{e} (kept at {kept})") from None
            raise
        stored, stored_now = store_run(source, run, args.results_dir)
        run = dataclasses.replace(run, path=stored)
        folder = os.path.dirname(stored)
        if stored_now:
            print(f"nightly: stored {stored}", file=sys.stderr)
        else:
            print(f"nightly: already stored as {stored}; not stored again", file=sys.stderr)
        history, warnings = load_history(folder, machine_key=run.machine_key, exclude=run)
        if not history:
            print(f"nightly: first run on machine {run.machine_key}: a new history starts here", file=sys.stderr)
        compare, render = _tracking()
        a = compare.compare_history(history, run, settings)
        a.warnings = warnings + a.warnings
        if args.confirm_with is not None and a.regressions:
            from .interleave import confirm_regressions
            print(f"nightly: {len(a.regressions)} regression(s) in the history: running them interleaved with "
                  f"{args.confirm_with}", file=sys.stderr, flush=True)
            confirm_regressions(a, args.confirm_with, args.benchsuite,
                                ["--repetitions", str(args.repetitions)] + extra, settings, args.confirm_rounds,
                                args.timeout, progress=lambda line: print("nightly: " + line, file=sys.stderr,
                                                                          flush=True))
        _unknown_stages(a)
        _emit(a, args.format, args.markdown)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            try:
                with open(summary, "a", encoding="utf-8") as f:
                    f.write(render.markdown(a) + "\n")
            except OSError as e:   # a full disk's error comes from the flush, which names no file
                raise OSError(e.errno, e.strerror, summary) from None
        if not args.no_report:
            report_dir = args.report_dir or os.path.join(folder, "report")
            try:
                from .plots import write_report
                write_report(a, report_dir)
                print(f"nightly: report in {os.path.join(report_dir, 'index.html')}", file=sys.stderr)
            except Exception as e:   # a failed drawing must not hide the verdict
                print(f"nightly: warning: report not written: {e}", file=sys.stderr)
    except (ResultFileError, UsageError) as e:
        return _fail("nightly", str(e))
    except OSError as e:
        return _fail("nightly", f"{e.filename}: {e.strerror}")
    finally:
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)
    if a.regressions:
        return EXIT_REGRESSION
    broken = [c.key for c in a.comparisons if c.disposition in ("incorrect", "failed")]
    if broken:
        print(f"nightly: {len(broken)} benchmark(s) incorrect or failed: {', '.join(broken[:5])}"
              + (" ..." if len(broken) > 5 else ""), file=sys.stderr)
        return EXIT_INCORRECT
    if bench_rc:
        print("nightly: benchsuite exited 1 (a variant incorrect or a benchmark failed)", file=sys.stderr)
        return EXIT_INCORRECT
    return EXIT_OK


AA_EPILOG = """\
Runs one benchsuite build against itself and counts the false alarms of each comparison mode on this
machine: COMPARISONS interleaved A/A comparisons of ROUNDS rounds (2 x ROUNDS x COMPARISONS runs in all,
kept in --keep), judged as interleaved comparisons, as file-vs-file comparisons of back-to-back runs, and
as a history (each run against the runs before it, as scripts/nightly; the runs before a noise band is
possible get their own line), and, when it makes the runs, as a history whose confirmed regressions are
run again interleaved, as scripts/nightly --confirm-with does. Arguments after -- go to every benchsuite
run.

examples:
  scripts/aa-check --comparisons 5 -- --backend cpu --filter 'peak/cpu|spmv/cpu/csr|adamw/cpu/fused' --quick
  scripts/aa-check --input /tmp/aa-runs --rounds 4 --format markdown     # judge kept runs again

exit codes: 0 measured (whatever the rates; with --max-rate: 1 when the interleaved or history rate is above
it), 2 bad usage or a benchsuite run that failed
"""


def aa_check_main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: List[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="aa-check", description="False-alarm rates of trainbench's comparisons, "
                                "measured by running one build against itself.",
                                usage="aa-check [options] [-- benchsuite arguments]",
                                epilog=AA_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--benchsuite", default=os.path.join(REPO_ROOT, "build", "benches", "benchsuite"),
                   help="benchsuite binary (default build/benches/benchsuite in the repository)")
    p.add_argument("--comparisons", type=positive_int, default=5, help="interleaved A/A comparisons (default 5)")
    p.add_argument("--rounds", type=positive_int, default=DEFAULT_ROUNDS,
                   help=f"rounds per comparison, two runs each (default {DEFAULT_ROUNDS}, at least 2)")
    p.add_argument("--repetitions", type=positive_int, default=7, help="benchsuite --repetitions (default 7)")
    p.add_argument("--timeout", type=float, help="seconds one benchsuite run may take")
    p.add_argument("--keep", metavar="DIR", help="keep the runs in DIR (default: a temporary folder, removed)")
    p.add_argument("--input", metavar="DIR", help="judge the runs kept in DIR instead of running benchsuite")
    p.add_argument("--max-rate", type=_percent, metavar="PCT",
                   help="exit 1 when the interleaved or the history false-alarm rate is above PCT percent")
    p.add_argument("--format", choices=FORMATS, default="table", help="stdout format (default table)")
    _add_analysis_args(p)
    args = p.parse_args(argv)
    tmpdir = None
    try:
        settings = _settings(args)
        if args.rounds < 2:
            raise UsageError(f"--rounds must be at least 2 (a paired test needs two rounds), got {args.rounds}")
        try:
            from . import aa
        except ImportError as e:
            raise UsageError(f"{e}; {PACKAGES_HINT}") from None
        if args.input:
            if extra:
                raise UsageError("benchsuite arguments after -- make no sense with --input")
            runs = aa.load_folder(args.input)
            shown = "(runs from " + args.input + ")"
        else:
            if "--out" in extra or any(e.startswith("--out=") or e.startswith("--repetitions") for e in extra):
                raise UsageError("--out and --repetitions after --: aa-check sets them itself (use --repetitions)")
            folder = args.keep or tempfile.mkdtemp(prefix="trainbench-aa-")
            tmpdir = None if args.keep else folder
            os.makedirs(folder, exist_ok=True)
            runs = aa.collect(args.benchsuite, args.comparisons, args.rounds,
                              ["--repetitions", str(args.repetitions)] + extra, folder, args.timeout,
                              aa.progress_to_stderr)
            shown = " ".join(["--repetitions", str(args.repetitions)] + extra)
        confirm = None
        if not args.input:
            from .interleave import confirm_regressions

            def confirm(a, where):
                confirm_regressions(a, args.benchsuite, args.benchsuite,
                                    ["--repetitions", str(args.repetitions)] + extra, settings, args.rounds,
                                    args.timeout, progress=lambda line: aa.progress_to_stderr(
                                        f"aa-check: {where} confirmed interleaved: {line}"))
        rates = aa.analyse(runs, args.rounds, settings, confirm)
        sys.stdout.write(aa.render(rates, len(runs), args.rounds, shown, args.format))
    except (ResultFileError, UsageError) as e:
        return _fail("aa-check", str(e))
    except OSError as e:
        return _fail("aa-check", f"{e.filename}: {e.strerror}")
    finally:
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)
    if args.max_rate is not None:
        over = [r for r in rates if r.mode in ("interleaved", "history") and r.rate is not None and r.rate > args.max_rate]
        if over:
            print("aa-check: above --max-rate: " + ", ".join(f"{r.mode} {r.rate:.1%}" for r in over), file=sys.stderr)
            return EXIT_REGRESSION
    return EXIT_OK


def run_benchsuite_checked(args, out_path: str, extra: List[str]) -> int:
    from .nightly import run_benchsuite
    shown = f"{args.benchsuite} --repetitions {args.repetitions} {' '.join(extra)}".rstrip()
    print(f"nightly: running {shown}", file=sys.stderr, flush=True)
    return run_benchsuite(args.benchsuite, out_path, args.repetitions, extra, args.timeout)
