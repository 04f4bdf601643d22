"""What several commands print through rich, defined once: a console that does not squeeze a
pipe or a log file into 80 columns, and tables whose titles do not wrap.

Without a terminal (`sweep plan > plan.txt`, `sweep status DIR | less`), rich assumes 80 columns
and wraps a title to its table's width, however narrow the table: a title of a two-column table
came out one word per line. So a console without a terminal gets `width` columns, and every
table is at least as wide as its title.
"""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

PIPE_WIDTH = 160  # columns of a console that writes to a pipe or a file


def output_console(width: int = PIPE_WIDTH) -> Console:
    """A console for stdout: the terminal's width, else at least `width` columns."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, width))
    return console


def titled_table(title: str, **options: Any) -> Table:
    """A table at least as wide as its title (and its frame), so the title never wraps where
    the console is wide enough."""
    return Table(title=title, min_width=cell_len(title) + 4, **options)
