"""One figure style for every report figure, and one way to save them (PNG 300 dpi, PDF, SVG).

Fonts stay text in PDF (Type 42) and SVG, so a paper's editor can still select and restyle them.
The outcome colours are fixed per class so that every figure of every sweep reads the same.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import matplotlib

matplotlib.use("Agg")  # no display on a login node; must precede pyplot

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

FORMATS: Final = ("png", "pdf", "svg")
DPI: Final = 300
RC: Final[dict[RcKeyType, Any]] = {
    "font.family": "DejaVu Sans", "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9,
    "xtick.labelsize": 8, "ytick.labelsize": 8, "legend.fontsize": 8, "figure.titlesize": 11,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": False,
    "pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none", "savefig.bbox": "tight",
    "savefig.pad_inches": 0.08, "figure.dpi": 100, "svg.hashsalt": "llm-sweep",
    "path.simplify": True,
}
# Okabe-Ito, colour-blind safe; grey for "unknown".
OUTCOME_COLOURS: Final = {
    "completed": "#009E73", "oom": "#D55E00", "hang": "#CC79A7", "timeout": "#E69F00",
    "crashed": "#0072B2", "node_fail": "#56B4E9", "cancelled": "#F0E442", "preempted": "#999933",
    "failed": "#882255", "unknown": "#999999",
}
SERIES: Final = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
HEATMAP_CMAP: Final = "viridis"
EMPTY_CELL: Final = "#EEEEEE"
CHECK_COLOUR: Final = "#C0392B"  # the "failed a check" badge: red, unlike any viridis cell


@contextlib.contextmanager
def paper_style() -> Iterator[None]:
    with plt.rc_context(RC):
        yield


def save(fig: Figure, stem: Path) -> list[Path]:
    """Write stem.png (300 dpi), stem.pdf and stem.svg; close the figure.

    Drawing the three files is most of a report's time, and they are independent: where the
    platform forks, the vector files are written by forked children while this process writes
    the PNG. A failure in a child is raised here, with the file it could not write."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(f".{extension}") for extension in FORMATS]
    children = [(_write_in_child(fig, path), path) for path in paths[1:]] if _CAN_FORK else []
    for path in paths[:1] if children else paths:
        _write(fig, path)
    failed = [path for pid, path in children if os.waitpid(pid, 0)[1] != 0]
    plt.close(fig)
    if failed:
        raise RuntimeError(f"could not write {', '.join(map(str, failed))} (see the error above)")
    return paths


_CAN_FORK = hasattr(os, "fork")


def _write(fig: Figure, path: Path) -> None:
    extension = path.suffix.lstrip(".")
    metadata = {"Date": None} if extension in ("pdf", "svg") else {}  # reproducible bytes
    fig.savefig(path, dpi=DPI, format=extension, metadata=metadata)


def _write_in_child(fig: Figure, path: Path) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        _write(fig, path)
        code = 0
    except BaseException:  # noqa: BLE001 - reported, then the child's exit status says it
        traceback.print_exc()
    finally:
        os._exit(code)


def text_colour(rgba: tuple[float, float, float, float]) -> str:
    """Black on light cells, white on dark ones (relative luminance, WCAG)."""
    def channel(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    red, green, blue = (channel(c) for c in rgba[:3])
    return "black" if 0.2126 * red + 0.7152 * green + 0.0722 * blue > 0.22 else "white"
