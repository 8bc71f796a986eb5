"""The building blocks of a self-contained page: a matplotlib figure as an inline PNG, tables and paragraphs
with every text escaped, a skeleton whose only style is inline CSS (no script, no link, no font, nothing with
an address), and the atomic write of the page."""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Iterable, Optional, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..tracking.atomic import write_atomically

FIGURE_DPI = 100
SIGNIFICANT_DIGITS = 4
MISSING = "-"  # a table's cell for a value the file does not hold

# System fonts only: a named web font would be fetched, or silently replaced.
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 90em; padding: 0 1em; color: #222; }
h1 { font-size: 1.4em; }
h2 { font-size: 1.15em; border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 1.6em; }
section#claim p { font-size: 1.2em; font-weight: 600; background: #eef4ff; padding: 0.6em 0.8em; }
.pair { display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }
.pair img { max-width: 100%; height: auto; border: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
caption { text-align: left; font-weight: 600; padding-bottom: 0.3em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { font-family: ui-monospace, monospace; background: #f6f6f6; padding: 0.1em 0.3em; }
pre { white-space: pre-wrap; padding: 0.5em; }
.why { color: #555; font-style: italic; }
"""


def significant(value: Optional[float], digits: int = SIGNIFICANT_DIGITS) -> str:
    """A number as a table shows it: `digits` significant digits, without an exponent (8089.31 -> "8089",
    0.531739 -> "0.5317"); MISSING for None. One rule for every table, so a reader (or a test) can round the
    file's value the same way."""
    if value is None:
        return MISSING
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    places = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{places}f}"


def integer(value: Optional[int]) -> str:
    return MISSING if value is None else str(int(value))


def new_figure(width_in: float, height_in: float) -> Figure:
    """A figure on the Agg canvas, apart from pyplot's global state (nothing to close, nothing shown)."""
    figure = Figure(figsize=(width_in, height_in), dpi=FIGURE_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def figure_img(figure: Figure, alt: str) -> str:
    """The figure as `<img src="data:image/png;base64,...">`; `alt` says what the plot shows for a reader who
    cannot see it."""
    if not alt.strip():
        raise ValueError("an image needs an alt text")
    png = io.BytesIO()
    # No "Software" metadata: matplotlib's names its web address, and the page holds none.
    figure.savefig(png, format="png", metadata={"Software": None})
    data = base64.b64encode(png.getvalue()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'


def table(table_id: str, headers: Sequence[str], rows: Iterable[Sequence[object]], caption: str = "") -> str:
    """An escaped table; a cell is shown as str(cell), None as MISSING. Cells that read as numbers are aligned
    right."""
    def cell(value: object) -> str:
        text = MISSING if value is None else str(value)
        numeric = _reads_as_number(text)
        return f'<td class="number">{html.escape(text)}</td>' if numeric else f"<td>{html.escape(text)}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(c) for c in row) + "</tr>" for row in rows)
    caption_html = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (f'<table id="{html.escape(table_id)}">{caption_html}<thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def _reads_as_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def paragraph(text: str, css_class: str = "", element_id: str = "") -> str:
    attributes = (f' id="{html.escape(element_id)}"' if element_id else "") + \
                 (f' class="{html.escape(css_class)}"' if css_class else "")
    return f"<p{attributes}>{html.escape(text)}</p>"


def why_nothing(text: str) -> str:
    """The one line a section shows instead of an empty plot."""
    return paragraph(text, css_class="why")


def code_block(text: str, element_id: str = "") -> str:
    attribute = f' id="{html.escape(element_id)}"' if element_id else ""
    return f"<pre{attribute}>{html.escape(text)}</pre>"


def plot_beside_table(img: str, table_html: str) -> str:
    """A plot with the table of the numbers behind it, side by side where the page is wide enough."""
    return f'<div class="pair">{img}<div>{table_html}</div></div>'


def section(section_id: str, heading: str, *parts: str) -> str:
    """`parts` are HTML already escaped (this module's other functions)."""
    title = f"<h2>{html.escape(heading)}</h2>" if heading else ""
    return f'<section id="{html.escape(section_id)}">{title}{"".join(parts)}</section>\n'


def page(title: str, sections: Sequence[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n{''.join(sections)}</body>\n</html>\n")


def write_page(path: str, text: str) -> None:
    """Whole or not at all: a page being written never replaces the last good one half-way."""
    write_atomically(path, text.encode("utf-8"))


def page_command(prog: str, source: str, out: str, build) -> int:
    """A page tool's run after its arguments: `build()` the page's text, write it to `out` atomically, and say so;
    any failure is one line on stderr and exit status 2, the page at `out` left as it was. `source` names the input
    a shape the checks did not foresee is blamed on (a file a person may have edited)."""
    import sys
    from ..errors import ResultFileError, UsageError

    def fail(message: str) -> int:
        print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
        return 2
    try:
        text = build()
        try:
            write_page(out, text)
        except OSError as e:  # its filename may be the temporary file beside --out
            raise UsageError(f"{out}: cannot write the page ({e.strerror})") from None
    except (ResultFileError, UsageError) as e:
        return fail(str(e))
    except OSError as e:
        return fail(f"{e.filename}: {e.strerror}")
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as e:
        return fail(f"{source}: unexpected content ({type(e).__name__}: {e})")
    print(f"{prog}: wrote {out}")
    return 0
