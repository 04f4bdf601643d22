"""write_report(runs, out_dir): every figure and table of a sweep, and one index.html for them.

Input is a runs.parquet table (sweep.collect.schema) and nothing else, so the same report can be drawn
from our own sweeps and from imported published runs.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import pandas as pd
from markupsafe import Markup

from analysis.best import DEFAULT_CONVENTION, DEFAULT_METRIC, best_configs, describe
from analysis.figures import outcome_counts, plot_distribution, plot_failures, plot_scaling
from analysis.flags import Flag, all_flags
from analysis.heatmap import plot_heatmap
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


def resolve_convention(runs: pd.DataFrame, convention: str) -> tuple[str, list[str]]:
    """`reported` falls back to full_attention when no run reported an MFU (e.g. Megatron logs)."""
    if convention == "reported" and runs["mfu_reported"].isna().all():
        return "full_attention", ["No run reported its own MFU: MFU recomputed under "
                                  "full_attention (6N + 12·L·h·s) against the dense peak."]
    return convention, []


def write_report(runs: pd.DataFrame, out_dir: str | Path, metric: str = DEFAULT_METRIC,
                 convention: str = DEFAULT_CONVENTION, plan: pd.DataFrame | None = None,
                 search: pd.DataFrame | None = None) -> Report:
    """Every figure and table of `runs` (runs.parquet) under `out_dir`; `plan` (plan.parquet,
    optional) names why cells that never ran are empty; `search` (a search strategy's per-cell
    progress, optional) shows how many runs each cell launched and skipped, and why."""
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
    best = best_configs(runs, metric, convention, plan)
    flags = all_flags(runs, metric, convention)
    flagged = {(f.model, f.nodes) for f in flags
               if f.kind == "best-config-changes" and f.nodes is not None}
    order = list(dict.fromkeys(best["model"]))
    ranked = describe(metric, convention)
    files = plot_heatmap(best, out_dir / "heatmap_best", flagged)
    files += plot_scaling(best, out_dir / "scaling")
    files += plot_failures(runs, order, out_dir / "failures")
    files += plot_distribution(runs, best, out_dir / "mfu_distribution")
    files += write_best_tables(best, out_dir, f"Best configuration per model and node count, "
                               f"ranked by {ranked}.")
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
    index.write_text(_index_html(runs, best, counts, flags, ranked, convention, notes, search),
                     encoding="utf-8")
    files.append(index)
    return Report(out_dir, files, flags, best, convention, notes, attempts=len(runs))


def _flags_markdown(flags: list[Flag]) -> str:
    if not flags:
        return "No flags: every number passed the checks.\n"
    lines = []
    for flag in flags:
        where = flag.model + (f", {flag.nodes} nodes" if flag.nodes is not None else "")
        lines.append(f"- **{flag.kind}** ({where}): {flag.message}")
    return "\n".join(lines) + "\n"


_TEMPLATE = jinja2.Environment(autoescape=True).from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
<style>
body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
img{max-width:100%;height:auto;border:1px solid #eee}
table{border-collapse:collapse;font-size:0.85em;margin:0.5em 0}
th,td{padding:0.25em 0.6em;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left}
.flag{margin:0.4em 0}.kind{font-weight:bold}.muted{color:#666;font-size:0.9em}
</style></head><body>
<h1>{{ title }}</h1>
<p>{{ summary }}</p>
{% for note in notes %}<p class="muted">{{ note }}</p>{% endfor %}
<h2>Best configuration per cell</h2>
<img src="heatmap_best.png" alt="Heatmap of the best configuration per model and node count, by {{ ranked }}">
<p class="muted">Also as <a href="heatmap_best.pdf">PDF</a> and <a href="heatmap_best.svg">SVG</a>.</p>
{{ best_table }}
{% for note in footnotes %}<p class="muted">{{ note }}</p>{% endfor %}
<p class="muted">Tables: <a href="best_configs.csv">CSV (full precision)</a>,
<a href="best_configs_detail.csv">CSV with provenance</a>, <a href="best_configs.md">Markdown</a>,
<a href="best_configs.tex">LaTeX (booktabs)</a>.</p>
<h2>Flags</h2>
{% if flags %}{% for flag in flags %}<div class="flag"><span class="kind">{{ flag.kind }}</span>
({{ flag.model }}{% if flag.nodes is not none %}, {{ flag.nodes }} nodes{% endif %}): {{ flag.message }}</div>
{% endfor %}{% else %}<p>No flags: every number passed the checks.</p>{% endif %}
<h2>Scaling</h2>
<img src="scaling.png" alt="MFU and tokens/s per GPU of each cell's best run against nodes">
<h2>Failures</h2>
<img src="failures.png" alt="Attempts per cell by outcome class">
{{ failure_table }}
{% if search_table %}<h2>Search</h2>
<p class="muted">The search strategy launched these runs per cell and skipped the rest, for the
reasons in the <code>skipped:</code> columns (every candidate's fate: search_runs.csv in the sweep
folder).</p>
{{ search_table }}{% endif %}
<h2>Distribution per cell: {{ ranked }}</h2>
<img src="mfu_distribution.png" alt="{{ ranked }} of every completed run per cell">
</body></html>
""")


def _index_html(runs: pd.DataFrame, best: pd.DataFrame, counts: pd.DataFrame, flags: list[Flag],
                ranked: str, convention: str, notes: list[str],
                search: pd.DataFrame | None = None) -> str:
    outcomes = runs["outcome"].value_counts()  # whole-column operations: 4,000 rows stay cheap
    sources = ", ".join(sorted(runs["source"].dropna().unique()))
    sweeps = ", ".join(sorted(runs["sweep"].dropna().unique())) or "sweep"
    summary = (f"{len(runs)} attempts ({', '.join(f'{n} {k}' for k, n in outcomes.items())}) "
               f"from {sources}. Cells ranked by {ranked}. MFU divides by the peak FLOP/s per GPU: "
               f"{', '.join(sorted(runs['peak_flops_source'].dropna().unique())) or 'none known'} "
               "(catalog = the dense peak of the GPU and dtype; measured = a matmul on this CPU).")
    failure_table = counts.reset_index().rename(columns={"model_label": "model"})
    return _TEMPLATE.render(
        title=f"llm-sweep report: {sweeps}", summary=summary, notes=notes, flags=flags,
        ranked=ranked, footnotes=check_footnotes(best),
        best_table=Markup(best_display(best).to_html(index=False, border=0)),  # pandas escapes
        failure_table=Markup(failure_table.to_html(index=False, border=0)),
        search_table=None if search is None else Markup(search.to_html(index=False, border=0)))


def markdown_summary(report: Report) -> str:
    """A short Markdown digest (for a terminal or a pull request)."""
    table = to_markdown(best_display(report.best), check_footnotes(report.best))
    return table + "\n" + html.unescape(_flags_markdown(report.flags))
