"""The heatmap: every cell annotated like the playbook; empty cells say why; text stays legible."""

from __future__ import annotations

import pandas as pd

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
