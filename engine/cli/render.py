"""Human output of the command line, with rich: tables that fit the terminal, status colours.

Everything a submitter or an upstream wrote (a tenant, a payload, an error message) reaches the
terminal through :func:`printable` (control characters written as visible escapes) inside a
:class:`rich.text.Text`, and the consoles here have markup, emoji and highlighting off: rich
markup such as ``[bold red]`` in user data prints as it is, and nothing in a task can drive the
operator's terminal.

On a terminal, tables fit its width: long cells are folded or cut with an ellipsis (the
``ERROR`` and ``MESSAGE`` columns), statuses are coloured (``failed`` red, ``manual_review``
yellow, ``succeeded`` green). Anything else (a pipe, a file) gets plain text: no colour, no
width limit, no trailing spaces, one row a line, so scripts can parse it (``--json`` is still
the form for scripts).
"""

from __future__ import annotations

import os
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Final, TextIO

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

__all__ = [
    "CUT_MIN",
    "NONE",
    "STATUS_STYLES",
    "Col",
    "FitTable",
    "cell",
    "make_console",
    "print_out",
    "printable",
    "status_text",
    "table",
    "when",
]

#: How an absent value is shown.
NONE: Final = "-"
#: Styles of task statuses and job states on a terminal.
STATUS_STYLES: Final = {
    "failed": "bold red",
    "discarded": "bold red",
    "manual_review": "bold yellow",
    "succeeded": "green",
    "completed": "green",
    "running": "cyan",
    "cancelled": "dim",
}
# Width of a console that is not a terminal: tables keep their natural width.
_UNBOUNDED: Final = 100_000


def printable(text: str) -> str:
    """``text`` safe to print to an operator's terminal: control and format characters
    (escape sequences, a carriage return, a right-to-left override) written as escapes, so
    that what a submitter put in a task can neither drive the terminal nor disguise itself."""
    if text.isprintable():
        return text
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if unicodedata.category(ch) in ("Cc", "Cf") or ch in "\u2028\u2029"
        else ch
        for ch in text
    )


def make_console(stream: TextIO | None = None, *, width: int | None = None) -> Console:
    """A console on ``stream`` (default stdout) that never interprets markup in what it prints.

    A terminal gets its width (``COLUMNS`` overrides it) and colours (unless ``NO_COLOR``);
    anything else an unbounded width and no colour."""
    out = sys.stdout if stream is None else stream
    common: dict[str, Any] = {
        "file": out,
        "markup": False,
        "emoji": False,
        "highlight": False,
        "soft_wrap": False,
    }
    if out.isatty():
        return Console(width=width, **common)
    columns = os.environ.get("COLUMNS", "")
    return Console(
        width=width or (int(columns) if columns.isdigit() else _UNBOUNDED),
        color_system=None,
        force_terminal=False,
        **common,
    )


def when(value: datetime) -> str:
    """A timestamp for humans: local time, to the second."""
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def cell(value: Any) -> Text:
    """One table cell: ``-`` for None, yes/no, local time, two decimals, else the text made
    :func:`printable`; never markup."""
    if isinstance(value, Text):
        return value
    if value is None:
        return Text(NONE)
    if isinstance(value, bool):
        return Text("yes" if value else "no")
    if isinstance(value, datetime):
        return Text(when(value))
    if isinstance(value, float):
        return Text(f"{value:.2f}")
    return Text(printable(str(value)))


def status_text(status: Any) -> Text:
    """A task status or job state, coloured on a terminal."""
    value = str(getattr(status, "value", status))
    return Text(printable(value), style=STATUS_STYLES.get(value, ""))


class Col:
    """A column of :func:`table`: its header and how it gives way on a narrow terminal.

    ``cut``: free text (errors, messages): narrowed first (down to :data:`CUT_MIN` cells) when
    the table is too wide, its cells cut with an ellipsis. ``drop``: when narrowing the free
    text is not enough, the columns with a ``drop`` rank are left out, the highest rank first.
    ``keep``: never narrowed (ids). What still does not fit then folds onto more lines.
    """

    def __init__(
        self, header: str, *, cut: bool = False, keep: bool = False, drop: int = 0
    ) -> None:
        self.header = header
        self.cut = cut
        self.keep = keep
        self.drop = drop


#: The narrowest a ``cut`` column gets before other columns are dropped.
CUT_MIN: Final = 12
_GAP: Final = 2


class FitTable:
    """A table laid out for the width it is rendered at (see :class:`Col`): a terminal's
    width, or the natural width on an unbounded console."""

    def __init__(self, columns: Sequence[str | Col], rows: Iterable[Sequence[Any]]) -> None:
        self.specs = [col if isinstance(col, Col) else Col(col) for col in columns]
        self.rows = [[cell(v) for v in row] for row in rows]

    def layout(self, width: int) -> tuple[list[int], list[int]]:
        """The columns shown (indexes) and their widths, for ``width`` cells."""
        widths = [
            max([cell_len(spec.header), *(row[i].cell_len for row in self.rows)])
            for i, spec in enumerate(self.specs)
        ]
        shown = list(range(len(self.specs)))

        def excess() -> int:
            return sum(widths[i] for i in shown) + _GAP * (len(shown) - 1) - width

        natural = list(widths)
        cut = [i for i in shown if self.specs[i].cut]
        for i in cut:
            if excess() > 0:
                widths[i] -= max(0, min(excess(), widths[i] - CUT_MIN))
        droppable = sorted(
            (i for i in shown if self.specs[i].drop), key=lambda i: -self.specs[i].drop
        )
        for i in droppable:
            if excess() <= 0:
                break
            shown.remove(i)
        for i in cut:  # still too wide: the free text goes too, rather than one cell of it
            if excess() > 0:
                shown.remove(i)
        for i in cut:  # room left after a drop: the free text takes it back
            if i in shown and excess() < 0:
                widths[i] = min(natural[i], widths[i] - excess())
        return shown, widths

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        shown, widths = self.layout(options.max_width)
        out = Table(
            box=None,
            show_edge=False,
            pad_edge=False,
            padding=(0, _GAP, 0, 0),
            header_style="bold",
            expand=False,
        )
        for i in shown:
            spec = self.specs[i]
            out.add_column(
                spec.header,
                overflow="ellipsis" if spec.cut else "fold",
                no_wrap=spec.cut or spec.keep,
                max_width=widths[i] if spec.cut else None,
            )
        for row in self.rows:
            out.add_row(*(row[i] for i in shown))
        yield out


def table(columns: Sequence[str | Col], rows: Iterable[Sequence[Any]]) -> FitTable:
    """A borderless table: a bold header line, then one line per row, columns two spaces
    apart, fit to the width it is printed at (:class:`Col`)."""
    return FitTable(columns, rows)


def print_out(console: Console, *renderables: RenderableType | str) -> None:
    """Print ``renderables`` (a str is plain text, never markup), one after the other; on a
    console that is not a terminal, without trailing spaces."""
    items = [Text(r) if isinstance(r, str) else r for r in renderables]
    if console.is_terminal:
        for item in items:
            console.print(item)
        return
    with console.capture() as captured:
        for item in items:
            console.print(item)
    text = "\n".join(line.rstrip() for line in captured.get().split("\n"))
    console.file.write(text)
    console.file.flush()
