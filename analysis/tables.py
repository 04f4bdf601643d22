"""Tables for papers: Markdown, LaTeX (booktabs) and CSV.

Display tables format numbers (2 decimals for MFU and memory, like the playbook); the CSV files
keep full precision, so nobody has to re-derive a number from a rounded table. The ranked
column's header says so, and a cell where a run failed a check carries the mark of
analysis.checks beside its ranked figure, explained in a footnote under the table.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.best import DEFAULT_METRIC, best_csv_frame
from analysis.checks import MARK
from analysis.labels import Labels

_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                  "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                  "^": r"\textasciicircum{}"}


RANKED = " (ranked)"


def value_headers(labels: Labels | None = None) -> dict[str, str]:
    """The display headers of the two figures, per metric: tokens/s per GPU, or per rank on CPU."""
    return {"mfu": "MFU (%)", "tokens_per_sec_per_gpu": f"Tokens/s/{(labels or Labels()).unit}"}


def best_display(best: pd.DataFrame, labels: Labels | None = None) -> pd.DataFrame:
    """The best-config table as strings: one row per cell, empty cells with their reason. The
    ranked figure's header ends in " (ranked)"; a cell with a run that failed a check gets MARK
    beside it (check_footnotes says which run and why). `labels` name the unit (GPU or rank)."""
    metric = best["metric"].iloc[0] if "metric" in best.columns and len(best) else DEFAULT_METRIC
    headers = value_headers(labels)
    ranked = headers[metric]
    rows = []
    for _, cell in best.iterrows():
        row = {"Model": str(cell["model"]), "Nodes": str(int(cell["nodes"]))}
        if pd.isna(cell.get("run_id")):
            row.update({k: "–" for k in ("DP", "TP", "PP", "CP", "EP", "MBS", "GAS", "ZeRO",
                                         "Recompute", *headers.values())})
            row["Memory (GiB)"] = "–"
            row["Note"] = str(cell["empty_reason"])
        else:
            for key, column in (("DP", "dp"), ("TP", "tp"), ("PP", "pp"), ("CP", "cp"), ("EP", "ep"),
                                ("MBS", "mbs"), ("GAS", "grad_acc"), ("ZeRO", "zero_stage")):
                row[key] = str(int(cell[column]))
            row["Recompute"] = str(cell["recompute"])
            row["MFU (%)"] = f"{cell['mfu_pct']:.2f}" if pd.notna(cell["mfu_pct"]) else "–"
            row[headers["tokens_per_sec_per_gpu"]] = f"{cell['tokens_per_sec_per_gpu']:,.0f}"
            memory = cell.get("gpu_memory_GB")
            row["Memory (GiB)"] = f"{memory:.2f}" if pd.notna(memory) else "–"
            row["Note"] = ""
        if _failed_checks(cell):
            row[ranked] += f" {MARK}"
        rows.append(row)
    frame = pd.DataFrame(rows).rename(columns={ranked: ranked + RANKED})
    if not frame.empty and (frame["Note"] == "").all():
        frame = frame.drop(columns="Note")
    return frame


def _failed_checks(cell: pd.Series) -> int:
    count = cell.get("n_failed_checks")
    return int(count) if pd.notna(count) else 0


def check_footnotes(best: pd.DataFrame) -> list[str]:
    """One footnote per marked cell: which runs failed which check (they were not ranked)."""
    return [f"{MARK} {cell['model']}, {int(cell['nodes'])} node(s): {_failed_checks(cell)} "
            f"completed run(s) left out of the ranking, having failed a check: {cell['failed_checks']}"
            for _, cell in best.iterrows() if _failed_checks(cell)]


def to_markdown(frame: pd.DataFrame, notes: list[str] | tuple[str, ...] = ()) -> str:
    """A Markdown table; `notes` (footnotes) follow it as paragraphs."""
    def cell(value: object) -> str:
        return str(value).replace("|", "\\|")
    numeric = [_is_numeric(frame[c]) for c in frame.columns]
    lines = ["| " + " | ".join(cell(c) for c in frame.columns) + " |",
             "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    lines += [line for note in notes for line in ("", note)]
    return "\n".join(lines) + "\n"


def latex_escape(text: object) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def to_latex(frame: pd.DataFrame, caption: str, label: str,
             notes: list[str] | tuple[str, ...] = ()) -> str:
    """A booktabs table (\\usepackage{booktabs}); numeric columns right-aligned; `notes`
    (footnotes) set small under the rule."""
    spec = "".join("r" if _is_numeric(frame[c]) else "l" for c in frame.columns)
    lines = [r"\begin{table}[t]", r"\centering", r"\small", rf"\begin{{tabular}}{{{spec}}}",
             r"\toprule", " & ".join(latex_escape(c) for c in frame.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_escape(v) for v in row) + r" \\" for row in frame.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}"]
    lines += [rf"\par\smallskip{{\footnotesize {latex_escape(note)}}}" for note in notes]
    lines += [rf"\caption{{{latex_escape(caption)}}}",
              rf"\label{{{label}}}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def _is_numeric(column: pd.Series) -> bool:
    values = [str(v).replace(",", "").replace("–", "").removesuffix(f" {MARK}") for v in column]
    def numeric(text: str) -> bool:
        try:
            float(text)
        except ValueError:
            return False
        return True
    return any(values) and all(numeric(v) for v in values if v)


def write_best_tables(best: pd.DataFrame, out_dir: Path, caption: str,
                      labels: Labels | None = None) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    display = best_display(best, labels)
    paths = [out_dir / "best_configs.csv", out_dir / "best_configs_detail.csv",
             out_dir / "best_configs.md", out_dir / "best_configs.tex"]
    best_csv_frame(best).to_csv(paths[0], index=False)
    best.to_csv(paths[1], index=False)
    notes = check_footnotes(best)
    paths[2].write_text(to_markdown(display, notes), encoding="utf-8")
    paths[3].write_text(to_latex(display, caption, "tab:best-configs", notes), encoding="utf-8")
    return paths


def write_failure_tables(counts: pd.DataFrame, out_dir: Path) -> list[Path]:
    frame = counts.reset_index().rename(columns={"model_label": "model"})
    display = frame.astype(str)
    paths = [out_dir / "failures.csv", out_dir / "failures.md", out_dir / "failures.tex"]
    frame.to_csv(paths[0], index=False)
    paths[1].write_text(to_markdown(display), encoding="utf-8")
    paths[2].write_text(to_latex(display, "Attempts per cell by outcome class.", "tab:failures"),
                        encoding="utf-8")
    return paths
