"""Tables for papers: Markdown and booktabs LaTeX that render as written, CSV at full precision."""

from __future__ import annotations

import pandas as pd

from analysis.tables import best_display, latex_escape, to_latex, to_markdown


def test_latex_special_characters_are_escaped() -> None:
    assert latex_escape("MFU (%) & tokens_per_sec #1 {x} ~ ^ $ \\") == (
        r"MFU (\%) \& tokens\_per\_sec \#1 \{x\} \textasciitilde{} \textasciicircum{} \$ "
        r"\textbackslash{}")


def test_booktabs_table_right_aligns_numbers() -> None:
    frame = pd.DataFrame({"Model": ["1B", "8B"], "MFU (%)": ["44.32", "45.22"],
                          "Tokens/s/GPU": ["38,895", "7,503"]})
    tex = to_latex(frame, "Best configs.", "tab:x")
    assert r"\begin{tabular}{lrr}" in tex
    assert tex.index(r"\toprule") < tex.index(r"\midrule") < tex.index(r"\bottomrule")
    assert r"1B & 44.32 & 38,895 \\" in tex and r"\label{tab:x}" in tex


def test_markdown_escapes_pipes_and_marks_numeric_columns() -> None:
    text = to_markdown(pd.DataFrame({"Note": ["a|b"], "Nodes": ["8"]}))
    assert text.splitlines() == ["| Note | Nodes |", "|---|---:|", "| a\\|b | 8 |"]


def test_an_empty_cell_keeps_its_reason_in_the_display_table() -> None:
    best = pd.DataFrame([{"model": "80B", "nodes": 1, "run_id": None,
                          "empty_reason": "no successful run: all 9 oom"},
                         {"model": "80B", "nodes": 4, "run_id": "r", "dp": 1, "tp": 8, "pp": 4, "cp": 1,
                          "ep": 1, "mbs": 1, "grad_acc": 256, "zero_stage": 0, "recompute": "none",
                          "mfu_pct": 14.756, "tokens_per_sec_per_gpu": 301.4, "gpu_memory_GB": 65.974,
                          "empty_reason": ""}])
    display = best_display(best)
    assert display.loc[0, "Note"] == "no successful run: all 9 oom" and display.loc[0, "DP"] == "–"
    assert (display.loc[1, "MFU (%) (ranked)"], display.loc[1, "Memory (GiB)"], display.loc[1, "PP"]) == \
        ("14.76", "65.97", "4")
