"""The heatmap: every cell annotated like the playbook; empty cells say why; text stays legible;
cells with a run that failed a check are marked; --metric decides what the cells show."""

from __future__ import annotations

import pandas as pd

from analysis.checks import MARK
from analysis.heatmap import plot_heatmap
from analysis.style import text_colour


def cells() -> pd.DataFrame:
    base = {"metric": "mfu", "convention": "full_attention", "cp": 1, "ep": 1, "recompute": "none",
            "world_size": 8, "model_params": 1.34e9}
    return pd.DataFrame([
        {**base, "model": "1B", "nodes": 1, "run_id": "a", "dp": 8, "tp": 1, "pp": 1, "mbs": 2,
         "grad_acc": 16, "zero_stage": 0, "mfu_pct": 40.63, "gpu_memory_GB": 50.18, "empty_reason": ""},
        {**base, "model": "1B", "nodes": 2, "run_id": "b", "dp": 4, "tp": 2, "pp": 2, "cp": 2,
         "mbs": 1, "grad_acc": 64, "zero_stage": 1, "recompute": "selective", "mfu_pct": 12.5,
         "gpu_memory_GB": None, "empty_reason": "", "world_size": 16},
        {**base, "model": "80B", "nodes": 1, "run_id": None, "mfu_pct": None, "model_params": 8e10,
         "empty_reason": "no successful run: all 12 oom"},
        {**base, "model": "80B", "nodes": 2, "run_id": None, "mfu_pct": None, "model_params": 8e10,
         "empty_reason": "not run", "world_size": 16},
    ])


def test_cells_carry_mfu_layout_memory_and_empty_reasons(tmp_path) -> None:
    paths = plot_heatmap(cells(), tmp_path / "h", flagged={("1B", 1)})
    assert [p.suffix for p in paths] == [".png", ".pdf", ".svg"]
    svg = (tmp_path / "h.svg").read_text()
    for text in ("40.63% †", "DP8 TP1 PP1", "GAS16 MBS2 ZeRO-0", "50.18 GiB", "12.50%",
                 "DP4 TP2 PP2 CP2", "recompute selective", "no successful run:", "all 12 oom",
                 "not run", "MFU (%), full_attention", "(8 GPUs each)", "† the best configuration"):
        assert text in svg, text
    assert "12.50% †" not in svg


def test_annotation_colour_contrasts_with_the_cell() -> None:
    assert text_colour((0.993, 0.906, 0.144, 1.0)) == "black"  # viridis yellow
    assert text_colour((0.267, 0.005, 0.329, 1.0)) == "white"  # viridis purple


def test_a_cell_with_a_run_that_failed_a_check_is_marked_with_a_note(tmp_path) -> None:
    best = cells()
    best["n_failed_checks"] = [0, 2, 1, 0]
    plot_heatmap(best, tmp_path / "h")
    svg = (tmp_path / "h.svg").read_text()
    assert svg.count(f">{MARK}<") == 2  # filled and empty cells alike
    assert f"{MARK} a completed run of this cell failed a check" in svg
    plot_heatmap(cells(), tmp_path / "clean")
    clean = (tmp_path / "clean.svg").read_text()
    assert f">{MARK}<" not in clean and "failed a check" not in clean


def test_the_metric_decides_what_the_cells_and_the_colour_bar_show(tmp_path, svg_words) -> None:
    best = cells().assign(metric="tokens_per_sec_per_gpu",
                          tokens_per_sec_per_gpu=[38894.5, 1234.4, None, None])
    plot_heatmap(best, tmp_path / "h")
    svg = svg_words(tmp_path / "h.svg")
    for text in ("38,894 tok/s", "1,234 tok/s", "Tokens/s per GPU", "ranked by tokens/s per GPU",
                 "Cell: tokens/s per GPU of the best run"):
        assert text in svg, text
    assert "40.63%" not in svg and "MFU (%)" not in svg
