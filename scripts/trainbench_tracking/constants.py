"""Every threshold, level and limit of the tracking, in one place (no heavy imports: --help stays fast)."""

DEFAULT_THRESHOLD = 0.05    # minimum effect: the median time moves by 5%
DEFAULT_ALPHA = 0.01        # significance of the U test on the samples (the verdicts)
DEFAULT_CP_ALPHA = 0.01     # significance of the U test between the runs either side of a change point; it
                            # needs 2 runs after >= 20 before, 3 after >= 10, or 5 v 5
DEFAULT_MIN_SAMPLES = 5     # repetitions per side below which a verdict is INCONCLUSIVE (5 v 5 can reach p < 0.01)
BAND_SIGMAS = 3.0           # noise band: history median x exp(+-3 robust sigma of the per-run log medians)
BAND_MIN_RUNS = 5           # a noise band needs at least this many history runs
MAD_TO_SIGMA = 1.4826       # normal-consistent median absolute deviation

DEFAULT_PERSIST = 2         # runs a shift must last to be confirmed; the shortest level a change point starts
DEFAULT_SETTLE_RUNS = 7     # a shift older than this many runs is the machine's new level (0: never)
DEFAULT_MAX_HISTORY = 60    # latest runs of a history analysed
MAX_BASELINE_RUNS = 30      # a baseline uses at most the latest 30 runs of its level
CLOCK_TOLERANCE = 0.02      # clocks closer than 2% are the same clock
EXACT_MAX_PRODUCT = 2500    # change points: |L| * |R| up to this gets the exact U distribution

DEFAULT_REPETITIONS = 10    # nightly: benchsuite --repetitions
DEFAULT_ROUNDS = 4          # compare --interleave: rounds (each one run of either build, ABBA order)
