"""Nightly performance tracking: result files (resultfile), a machine's history (history), a run compared with
another run or with that history (compare, with the statistics in stats and the change points in changepoint),
interleaved runs of two builds (interleave), the A/A check of the rules (aa), the table, markdown and JSON
(render), the HTML report and plots (plots), and benchsuite run by nightly (nightly). The command lines of
scripts/nightly, compare, report and aa-check are cli's."""
