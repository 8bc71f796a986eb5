"""Every threshold, level and limit of the tracking, in one place (no heavy imports: --help stays fast)."""

DEFAULT_THRESHOLD = 0.05    # minimum effect: the median time moves by 5%
DEFAULT_ALPHA = 0.01        # significance of the U test on the samples (the verdicts)
DEFAULT_CP_ALPHA = 0.01     # significance of the U test between the runs either side of a change point; it
                            # needs 2 runs after >= 20 before, 3 after >= 10, or 5 v 5
DEFAULT_MIN_SAMPLES = 5     # repetitions per side below which a verdict is INCONCLUSIVE (5 v 5 can reach p < 0.01)
BAND_TAIL = 0.00135         # noise band: the range a run of an unchanged build leaves with this chance on
                            # either side (the normal +-3 sigma), given its spread was measured on n runs
ROBUST_MIN_RUNS = 20        # from this many runs the spread is the robust sigma (MAD), whose band by n is
# below (the 99.73% quantile of |new - median| / MAD-sigma over 4 million simulated histories of normal
# night-to-night noise each); with fewer runs a MAD is itself too noisy (5 runs: 28 sigma would be needed)
# and the band is a Student t prediction interval on the standard deviation (5 runs: 7.6 sigma)
BAND_SIGMAS_BY_RUNS = {20: 4.47, 25: 4.17, 30: 3.90, 40: 3.65, 50: 3.51, 60: 3.41, 80: 3.30, 100: 3.24, 150: 3.16}
BAND_MIN_RUNS = 5           # a noise band needs at least this many history runs; with fewer, a history run
                            # is never SLOWER or FASTER (it cannot tell a change from night-to-night drift)
RUN_DRIFT_MIN_ROWS = 2      # whole-run drift: estimated from at least this many rows of other stages...
RUN_DRIFT_MIN_STAGES = 2    # ...of at least this many stages
MAD_TO_SIGMA = 1.4826       # normal-consistent median absolute deviation

DEFAULT_PERSIST = 2         # runs a shift must last to be confirmed; the shortest level a change point starts
DEFAULT_SETTLE_RUNS = 7     # a shift older than this many runs is the machine's new level (0: never)
DEFAULT_MAX_HISTORY = 60    # latest runs of a history analysed
MAX_BASELINE_RUNS = 30      # a baseline uses at most the latest 30 runs of its level
CLOCK_TOLERANCE = 0.02      # clocks closer than 2% are the same clock
EXACT_MAX_PRODUCT = 2500    # change points: |L| * |R| up to this gets the exact U distribution

DEFAULT_REPETITIONS = 10    # nightly: benchsuite --repetitions
MIN_ROUNDS = 2              # compare --interleave: rounds a verdict needs (fewer: INCONCLUSIVE)
DEFAULT_ROUNDS = 4          # compare --interleave: rounds (each one run of either build, ABBA order)
