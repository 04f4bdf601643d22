"""Figures that say what they show (issue 37, item 6), on real reports drawn from runs tables:
the unit and the convention named are the ones computed; a CPU sweep says CPU and ranks, and
when MFU divides by a measured CPU peak; an empty cell says why (the budget, no success with the
outcomes, not run); a figure with no value has no scale; and no two texts of a figure overlap,
measured with matplotlib's renderer on the figures the report saves."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

import analysis.figures
import analysis.heatmap
from analysis.report import write_report
from analysis.sweep_report import report_sweep
from sweep.collect.attempts import RUNS_FILE, write_runs
from sweep.collect.schema import to_table
from sweep.core.state import BUDGET_LEFT_OUT_FILE
from sweep.plan.plan_file import PLAN_FILE

STEMS = ("heatmap_best", "scaling", "failures", "mfu_distribution")


@pytest.fixture
def all_words(svg_words) -> Callable[[Path], dict[str, str]]:
    """The text of each of a report's figures."""
    return lambda out: {stem: svg_words(out / f"{stem}.svg") for stem in STEMS}


class Drawn(list[Figure]):
    """The figures a report saved, in order, and the overlapping texts of each, measured as it
    was saved."""

    def __init__(self) -> None:
        super().__init__()
        self.overlaps: list[list[tuple[str, str]]] = []

    def assert_no_overlap(self) -> None:
        assert self, "no figure was drawn"
        for fig, pairs in zip(self, self.overlaps):
            assert pairs == [], fig.get_suptitle() or fig.axes[0].get_title()


@pytest.fixture
def figures(monkeypatch) -> Iterator[Drawn]:
    """The figures the report saves, measured with the renderer just before they are written."""
    drawn = Drawn()
    for module in (analysis.heatmap, analysis.figures):
        real = module.save

        def keep(fig: Figure, stem: Path, real: Callable[..., Any] = real) -> list[Path]:
            fig.canvas.draw()
            drawn.append(fig)
            drawn.overlaps.append(overlaps(fig))
            return real(fig, stem)

        monkeypatch.setattr(module, "save", keep)
    yield drawn


def drawn_texts(fig: Figure) -> list[Text]:
    """Every text `fig` draws: titles, axis labels, the tick labels inside the view, cell texts
    and annotations, legends, figure texts."""
    texts: list[Text] = [*fig.texts, *([fig._suptitle] if fig._suptitle else [])]
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        texts += [ax.title, ax._left_title, ax._right_title, *ax.texts]
        for axis in (ax.xaxis, ax.yaxis):
            texts.append(axis.label)
            for tick in axis._update_ticks():  # the ticks drawn (inside the view)
                texts += [tick.label1, tick.label2]
        legend = ax.get_legend()
        if legend:
            texts += [legend.get_title(), *legend.get_texts()]
    for legend in fig.legends:
        texts += [legend.get_title(), *legend.get_texts()]
    return [t for t in texts if t.get_visible() and t.get_text().strip()]


def overlaps(fig: Figure) -> list[tuple[str, str]]:
    """The pairs of texts `fig` draws whose boxes intersect (renderer units)."""
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in dict.fromkeys(drawn_texts(fig))]
    return [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
            if box_a.overlaps(box_b)]


def gpu_rows(run_row) -> list[dict[str, Any]]:
    """Two models on H100s, catalog peak, one cell that never succeeded."""
    gpu = {"gpu": "h100-sxm", "peak_flops_source": "catalog:h100-sxm:bf16", "gpus_per_node": 8,
           "peak": 9.895e14}
    rows = []
    for model, params in (("1B", 1.3e9), ("8B", 8.0e9)):
        for nodes in (1, 2, 4):
            extra = {**gpu, "model_params": params, "world_size": 8 * nodes}
            rows.append(run_row(f"{model}-{nodes}", 3.0e6 / nodes ** 0.1, model=model,
                                nodes=nodes, **extra))
    rows.append(run_row("8B-8", None, model="8B", nodes=8, outcome="oom", **gpu,
                        model_params=8.0e9, world_size=64))
    for row in rows:
        row["dp"], row["grad_acc"] = row["world_size"], 1
    return rows


def test_a_report_without_a_successful_run_has_no_scale_and_names_no_computed_convention(
        run_row, make_runs, figures: Drawn, all_words, tmp_path) -> None:
    """The issue: a 0.0-1.0 bar labelled "MFU (%)", a title naming full_attention (never
    computed), the axis label over the caption."""
    runs = make_runs([run_row("a", None, outcome="oom"), run_row("b", None, nodes=2, outcome="oom"),
                      run_row("c", None, nodes=2, outcome="timeout")])
    report = write_report(runs, tmp_path / "r")
    assert report.convention == "reported" and not report.notes  # no "recomputed under …"
    words = all_words(report.out_dir)
    heatmap = words["heatmap_best"]
    assert "No successful run on CPU: no cell to rank by MFU (as reported)" in heatmap
    assert "full_attention" not in " ".join(words.values())
    assert "no successful run: 1 oom" in heatmap and "no successful run: 1 oom, 1 timeout" in heatmap
    heatmap_fig = figures[0]
    assert len(heatmap_fig.axes) == 1  # no colour bar: nothing has a colour
    for stem in ("scaling", "mfu_distribution"):
        assert "No " in words[stem] and "0.05" not in words[stem] and "0.8" not in words[stem], stem
    figures.assert_no_overlap()
    assert {len(ax.get_yticks()) for ax in figures[1].axes} == {0}  # scaling: no value ticks


def test_a_cpu_sweep_says_cpu_and_ranks_and_that_its_peak_was_measured(
        cpu_runs, figures: Drawn, all_words, svg_words, tmp_path) -> None:
    report = write_report(cpu_runs, tmp_path / "r", metric="tokens_per_sec_per_gpu")
    words = all_words(report.out_dir)
    assert "Nodes (2 ranks each, CPU)" in words["heatmap_best"]
    assert "Tokens/s per rank" in words["heatmap_best"]  # the colour bar
    assert "Best configuration per cell on CPU, ranked by tokens/s per rank" in words["heatmap_best"]
    assert "Tokens/s per rank" in words["scaling"] and "on CPU" in words["scaling"]
    assert "tokens/s per rank of every completed run per cell on CPU" in words["mfu_distribution"]
    assert "Attempts per cell by outcome class on CPU" in words["failures"]
    for stem, text in words.items():
        assert "GPU" not in text, stem
    table = (report.out_dir / "best_configs.md").read_text()
    assert "| Tokens/s/rank (ranked) |" in table and "GPU" not in table.splitlines()[0]
    assert "Tokens/s/rank" in (report.out_dir / "best_configs.tex").read_text()
    index = (report.out_dir / "index.html").read_text()
    assert "per rank: measured:matmul" in index and "Tokens/s/rank" in index

    mfu = write_report(cpu_runs, tmp_path / "mfu")
    heatmap = svg_words(mfu.out_dir / "heatmap_best.svg")
    note = "MFU divides by a measured CPU peak, not a datasheet figure (measured:matmul)."
    assert note in heatmap
    assert note in (mfu.out_dir / "index.html").read_text()
    figures.assert_no_overlap()


def test_a_gpu_sweep_says_gpus_and_names_the_convention_it_computed(
        run_row, make_runs, figures: Drawn, all_words, svg_words, tmp_path) -> None:
    runs = make_runs(gpu_rows(run_row))
    report = write_report(runs, tmp_path / "r", convention="megatron")
    words = all_words(report.out_dir)
    heatmap = words["heatmap_best"]
    assert "Nodes (8 GPUs each)" in heatmap and "on h100-sxm" in heatmap
    assert "ranked by MFU (megatron)" in heatmap and "MFU (%), megatron" in heatmap
    assert "measured" not in heatmap and "rank " not in heatmap
    assert "no successful run: 1 oom" in heatmap
    # The colour bar's scale is the cells' percent: its top is the highest cell, not 1.0.
    bar = figures[0].axes[1]
    best = report.best.dropna(subset=["run_id"])
    assert max(bar.get_ylim()) == pytest.approx(best["mfu_pct"].max())
    assert f"{best['mfu_pct'].max():.2f}%" in heatmap and best["mfu_pct"].max() > 1
    reported = write_report(runs, tmp_path / "reported")
    assert "MFU (as reported: full_attention)" in svg_words(reported.out_dir / "heatmap_best.svg")
    figures.assert_no_overlap()


def _budget_folder(run_row, tmp_path: Path) -> Path:
    """A sweep folder whose 2-node cell's runs the GPU-hour cap left out: runs.parquet, the
    plan with run ids, and the left-out list the submitter writes."""
    folder = tmp_path / "sweep"
    folder.mkdir()
    rows = [run_row("n1-a", 1000.0), run_row("n4-a", None, nodes=4, outcome="oom"),
            run_row("n4-b", None, nodes=4, outcome="crashed")]
    write_runs(to_table(rows), folder / RUNS_FILE)
    plan = pd.DataFrame([
        {"model": "tiny-4l", "nodes": n, "run_id": r, "status": "kept", "prune_rule": None}
        for n, r in ((1, "n1-a"), (2, "n2-a"), (2, "n2-b"), (4, "n4-a"), (4, "n4-b"), (4, "n4-c"),
                     (8, "n8-a"))])
    plan.to_parquet(folder / PLAN_FILE, index=False)
    (folder / BUDGET_LEFT_OUT_FILE).write_text("n2-a\nn2-b\nn4-c\n")
    return folder


def test_empty_cells_say_why_left_out_by_the_budget_no_success_or_not_run(
        run_row, figures: Drawn, svg_words, tmp_path) -> None:
    report = report_sweep(_budget_folder(run_row, tmp_path) / RUNS_FILE)
    reasons = dict(zip(report.best["nodes"], report.best["empty_reason"]))
    assert reasons[2] == "left out by the budget: 2 planned run(s) over the GPU-hour cap"
    assert reasons[4] == "no successful run: 1 oom, 1 crashed; 1 more left out by the budget"
    assert reasons[8] == "not run: 1 planned configuration(s) without an attempt"
    heatmap = svg_words(report.out_dir / "heatmap_best.svg")
    for text in ("left out by the budget: 2 planned run(s) over the GPU-hour cap",
                 "no successful run: 1 oom, 1 crashed; 1 more left out by the budget",
                 "not run: 1 planned configuration(s) without an attempt",
                 "Hatched cells: left out by the budget: the sweep's GPU-hour cap kept their runs",
                 "No successful run: every attempt of the cell failed; the outcomes are counted."):
        assert text in heatmap, text
    table = (report.out_dir / "best_configs.md").read_text()
    assert "left out by the budget: 2 planned run(s)" in table
    figures.assert_no_overlap()


def test_the_left_out_file_is_the_one_the_submitter_writes() -> None:
    from sweep.backends.slurm.tracker import LEFT_OUT_FILE

    assert BUDGET_LEFT_OUT_FILE == LEFT_OUT_FILE


def test_the_overlap_check_sees_an_overlap() -> None:
    """The measure the tests rely on: two texts drawn on top of each other are found."""
    fig, ax = plt.subplots()
    ax.set_xlabel("Nodes")
    fig.text(0.5, 0.02, "a caption over the label", ha="center")
    fig.canvas.draw()
    assert [sorted(pair) for pair in overlaps(fig)] == [["Nodes", "a caption over the label"]]
    plt.close(fig)


def test_without_the_plan_the_budget_is_a_note_not_a_guess(cpu_runs) -> None:
    """No plan.parquet (no run ids per cell): the cells keep their reasons, and a note counts
    what the budget left out."""
    from analysis.best import best_configs
    from analysis.cells import budget_reasons, unplaced_note

    best = best_configs(cpu_runs)
    assert budget_reasons(best, None, ["x", "y"]) is best
    assert unplaced_note(None, ["x", "y"]) == [
        "2 planned run(s) were left out by the budget (the GPU-hour cap); without the plan's run "
        "ids the report cannot say which cells they belong to."]
    assert unplaced_note(None, []) == []
