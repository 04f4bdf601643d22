"""Figure files: every format written, and a format that cannot be written is an error."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from analysis.style import FORMATS, save


def test_every_format_is_written(tmp_path: Path) -> None:
    fig, axes = plt.subplots()
    axes.plot([1, 2, 3])
    paths = save(fig, tmp_path / "figure")
    assert [p.suffix for p in paths] == [f".{f}" for f in FORMATS]
    assert all(p.stat().st_size > 500 for p in paths)
    assert paths[0].read_bytes().startswith(b"\x89PNG")
    assert paths[1].read_bytes().startswith(b"%PDF")


def test_a_format_that_cannot_be_written_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "figure.svg").mkdir()  # a folder where the SVG should go
    fig, axes = plt.subplots()
    axes.plot([1, 2, 3])
    with pytest.raises(RuntimeError, match=r"figure\.svg"):
        save(fig, tmp_path / "figure")
