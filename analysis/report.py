"""write_report(runs, out_dir): every figure and table of a sweep, and one index.html for them.

Input is a runs.parquet table (sweep.collect.schema) and nothing else, so the same report can be drawn
from our own sweeps and from imported published runs.
"""

from __future__ import annotations

import html
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import pandas as pd
from markupsafe import Markup

from analysis.best import DEFAULT_CONVENTION, DEFAULT_METRIC, best_configs
from analysis.cells import budget_reasons, unplaced_note
from analysis.figures import outcome_counts, plot_distribution, plot_failures, plot_scaling
from analysis.flags import Flag, all_flags, straggler_cells
from analysis.heatmap import plot_heatmap
from analysis.labels import Labels, labels_for
from analysis.tables import (
    best_display,
    check_footnotes,
    to_markdown,
    write_best_tables,
    write_failure_tables,
)
from sweep.collect.schema import check_frame


@dataclass(frozen=True)
class Report:
    out_dir: Path
    files: list[Path]
    flags: list[Flag]
    best: pd.DataFrame
    convention: str
    notes: list[str] = field(default_factory=list)
    attempts: int = 0
    labels: Labels = field(default_factory=Labels)


def resolve_convention(runs: pd.DataFrame, convention: str) -> tuple[str, list[str]]:
    """`reported` falls back to full_attention when no completed run reported an MFU (e.g.
    Megatron logs). Without a completed run nothing is computed under any convention, and the
    one asked for stays."""
    completed = runs[runs["outcome"] == "completed"]
    if convention == "reported" and not completed.empty and completed["mfu_reported"].isna().all():
        return "full_attention", ["No run reported its own MFU: MFU recomputed under "
                                  "full_attention (6N + 12·L·h·s) against the dense peak."]
    return convention, []


def write_report(runs: pd.DataFrame, out_dir: str | Path, metric: str = DEFAULT_METRIC,
                 convention: str = DEFAULT_CONVENTION, plan: pd.DataFrame | None = None,
                 search: pd.DataFrame | None = None,
                 budget_left_out: Collection[str] = ()) -> Report:
    """Every figure and table of `runs` (runs.parquet) under `out_dir`; `plan` (plan.parquet,
    optional) names why cells that never ran are empty; `search` (a search strategy's per-cell
    progress, optional) shows how many runs each cell launched and skipped, and why;
    `budget_left_out` (the run ids a GPU-hour cap kept from being launched) makes the cells of
    those runs say so."""
    out_dir = Path(out_dir)
    check_frame(runs.columns)
    if runs.empty:
        raise ValueError("runs.parquet has no rows: nothing to report; run `sweep collect` first")
    convention, notes = resolve_convention(runs, convention)
    unplaced = runs["model"].isna() | runs["nodes"].isna()
    if unplaced.any():
        notes.append(f"{int(unplaced.sum())} attempt(s) have no configuration (run.json missing or "
                     "invalid; see collect_issues) and are left out of every cell.")
    out_dir.mkdir(parents=True, exist_ok=True)
    if plan is not None and not {"model", "nodes", "status", "prune_rule"} <= set(plan.columns):
        notes.append("plan.parquet lacks model/nodes/status/prune_rule columns: not used.")
        plan = None
    best = budget_reasons(best_configs(runs, metric, convention, plan), plan, budget_left_out)
    notes += unplaced_note(plan, budget_left_out)
    labels = labels_for(runs, metric, convention)
    flags = all_flags(runs, metric, convention)
    flagged = {(f.model, f.nodes) for f in flags
               if f.kind == "best-config-changes" and f.nodes is not None}
    order = list(dict.fromkeys(best["model"]))
    ranked = labels.describe()
    files = plot_heatmap(best, out_dir / "heatmap_best", flagged, labels=labels,
                         stragglers=straggler_cells(runs, best))
    files += plot_scaling(best, out_dir / "scaling", labels)
    files += plot_failures(runs, order, out_dir / "failures", labels)
    files += plot_distribution(runs, best, out_dir / "mfu_distribution", labels)
    files += write_best_tables(best, out_dir, f"Best configuration per model and node count"
                               f"{labels.on()}, ranked by {ranked}.", labels)
    counts = outcome_counts(runs)
    files += write_failure_tables(counts, out_dir)
    flags_md = out_dir / "flags.md"
    flags_md.write_text(_flags_markdown(flags), encoding="utf-8")
    files.append(flags_md)
    if search is not None:
        search_md = out_dir / "search.md"
        search_md.write_text(to_markdown(search) + "\n", encoding="utf-8")
        files.append(search_md)
    index = out_dir / "index.html"
    index.write_text(_index_html(runs, best, counts, flags, labels, notes, search),
                     encoding="utf-8")
    files.append(index)
    return Report(out_dir, files, flags, best, convention, notes, attempts=len(runs), labels=labels)


def _flags_markdown(flags: list[Flag]) -> str:
    if not flags:
        return "No flags: every number passed the checks.\n"
    lines = []
    for flag in flags:
        where = flag.model + (f", {flag.nodes} nodes" if flag.nodes is not None else "")
        lines.append(f"- **{flag.kind}** ({where}): {flag.message}")
    return "\n".join(lines) + "\n"


_TEMPLATE = jinja2.Environment(autoescape=True).from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>
body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222;
overflow-wrap:anywhere}
img{max-width:100%;height:auto;border:1px solid #eee}
nav a{margin-right:1em}
.scroll{max-width:100%;overflow-x:auto}
table{border-collapse:collapse;font-size:0.85em;margin:0.5em 0}
th,td{padding:0.25em 0.6em;border-bottom:1px solid #ddd;text-align:right;overflow-wrap:normal}
th{vertical-align:bottom}
th:first-child,td:first-child{text-align:left}
td:last-child{overflow-wrap:anywhere}
.flag{margin:0.4em 0}.kind{font-weight:bold}.muted{color:#666;font-size:0.9em}
</style></head><body>
<h1>{{ title }}</h1>
<nav>{% for id, name in sections %}<a href="#{{ id }}">{{ name }}</a>{% endfor %}</nav>
<p>{{ summary }}</p>
{% if peak_note %}<p class="peak"><strong>{{ peak_note }}</strong></p>{% endif %}
{% for note in notes %}<p class="muted">{{ note }}</p>{% endfor %}
<h2 id="best">Best configuration per cell</h2>
<img src="heatmap_best.png" alt="Heatmap of the best configuration per model and node count, by {{ ranked }}">
<p class="muted">Also as <a href="heatmap_best.pdf">PDF</a> and <a href="heatmap_best.svg">SVG</a>.</p>
<div class="scroll">{{ best_table }}</div>
{% for note in footnotes %}<p class="muted">{{ note }}</p>{% endfor %}
<p class="muted">Tables: <a href="best_configs.csv">CSV (full precision)</a>,
<a href="best_configs_detail.csv">CSV with provenance</a>, <a href="best_configs.md">Markdown</a>,
<a href="best_configs.tex">LaTeX (booktabs)</a>.</p>
<h2 id="flags">Flags</h2>
<p class="muted">Also as <a href="flags.md">Markdown</a>.</p>
{% if flags %}{% for flag in flags %}<div class="flag"><span class="kind">{{ flag.kind }}</span>
({{ flag.model }}{% if flag.nodes is not none %}, {{ flag.nodes }} nodes{% endif %}): {{ flag.message }}</div>
{% endfor %}{% else %}<p>No flags: every number passed the checks.</p>{% endif %}
<h2 id="scaling">Scaling</h2>
<img src="scaling.png" alt="MFU and {{ per_unit }} of each cell's best run against nodes">
<h2 id="failures">Failures</h2>
<img src="failures.png" alt="Attempts per cell by outcome class">
<div class="scroll">{{ failure_table }}</div>
<p class="muted">Also as <a href="failures.csv">CSV</a>, <a href="failures.md">Markdown</a> and
<a href="failures.tex">LaTeX</a>.</p>
{% if search_table %}<h2 id="search">Search</h2>
<p class="muted">The search strategy launched these runs per cell and skipped the rest, for the
reasons in the <code>skipped:</code> columns (every candidate's fate: search_runs.csv in the sweep
folder).</p>
<div class="scroll">{{ search_table }}</div>{% endif %}
<h2 id="distribution">Distribution per cell: {{ ranked }}</h2>
<img src="mfu_distribution.png" alt="{{ ranked }} of every completed run per cell">
</body></html>
""")


def _index_html(runs: pd.DataFrame, best: pd.DataFrame, counts: pd.DataFrame, flags: list[Flag],
                labels: Labels, notes: list[str], search: pd.DataFrame | None = None) -> str:
    outcomes = runs["outcome"].value_counts()  # whole-column operations: 4,000 rows stay cheap
    sources = ", ".join(sorted(runs["source"].dropna().unique()))
    sweeps = ", ".join(sorted(runs["sweep"].dropna().unique())) or "sweep"
    ranked = labels.describe()
    peaks = ", ".join(sorted(runs["peak_flops_source"].dropna().unique())) or "none known"
    summary = (f"{len(runs)} attempts ({', '.join(f'{n} {k}' for k, n in outcomes.items())}) "
               f"from {sources}{labels.on()}. Cells ranked by {ranked}. MFU divides by the peak "
               f"FLOP/s per {labels.unit}: {peaks} (catalog = the dense peak of the GPU and dtype; "
               "measured = a matmul on this CPU).")
    failure_table = counts.reset_index().rename(columns={"model_label": "model"})
    sections = [("best", "Best configuration"), ("flags", "Flags"), ("scaling", "Scaling"),
                ("failures", "Failures"), *([("search", "Search")] if search is not None else []),
                ("distribution", "Distribution")]
    return _TEMPLATE.render(
        title=f"llm-sweep report: {sweeps}", summary=summary, notes=notes, flags=flags,
        ranked=ranked, footnotes=check_footnotes(best), sections=sections,
        peak_note=labels.peak_note(), per_unit=f"tokens/s per {labels.unit}",
        best_table=Markup(best_display(best, labels).to_html(index=False, border=0)),  # pandas escapes
        failure_table=Markup(failure_table.to_html(index=False, border=0)),
        search_table=None if search is None else Markup(_breakable(search).to_html(index=False,
                                                                                   border=0)))


def _breakable(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with a line break allowed after each "_" and ":" of its headers
    (best_tokens_per_s_per_gpu, skipped:<rule>), so a wide table fits a laptop's page."""
    return frame.rename(columns=lambda c: str(c).replace("_", "_\u200b").replace(":", ":\u200b"))


def markdown_summary(report: Report) -> str:
    """A short Markdown digest (for a terminal or a pull request)."""
    table = to_markdown(best_display(report.best, report.labels), check_footnotes(report.best))
    return table + "\n" + html.unescape(_flags_markdown(report.flags))
