"""Self-contained HTML pages over trainbench's output files: every figure inline, every style inline, nothing
fetched when the page is opened (it can be mailed, attached to a CI run or opened offline).

- `pages.html`: the building blocks (an inline PNG from a matplotlib figure, escaped tables, the skeleton, the
  atomic write).
- `pages.tune`: scripts/tune-page, one autotune run (its tuned file and journal) as a page.
- `pages.run`: scripts/run-page, one benchsuite run (its result file) as a page."""
