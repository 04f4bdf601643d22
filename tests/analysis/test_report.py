"""write_report and `sweep report`: every figure in three formats, tables, flags, index.html."""

from __future__ import annotations

import html
import html.parser
from pathlib import Path

import pandas as pd
import pytest

from analysis.report import write_report
from sweep.cli import main
from sweep.collect.attempts import write_runs
from sweep.collect.schema import to_table
from sweep.validation.playbook_import import import_playbook

FIGURES = ("heatmap_best", "scaling", "failures", "mfu_distribution")


@pytest.fixture(scope="module")
def runs_parquet(refdata: Path, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("playbook") / "runs.parquet"
    write_runs(to_table(import_playbook(refdata / "playbook_runs_1B_8B.csv")), path)
    return path


@pytest.fixture(scope="module")
def report(runs_parquet: Path, tmp_path_factory):
    return write_report(pd.read_parquet(runs_parquet), tmp_path_factory.mktemp("report"))


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.targets.append(value)


def test_every_figure_is_written_as_png_300dpi_pdf_and_svg(report) -> None:
    from PIL import Image

    for stem in FIGURES:
        png = report.out_dir / f"{stem}.png"
        with Image.open(png) as image:
            assert round(image.info["dpi"][0]) == 300
            assert image.width > 1500  # a 300-dpi figure several inches wide
        assert (report.out_dir / f"{stem}.pdf").read_bytes().startswith(b"%PDF")
        assert b"<svg" in (report.out_dir / f"{stem}.svg").read_bytes()[:2000]


def test_svg_keeps_the_annotations_as_text(report) -> None:
    svg = (report.out_dir / "heatmap_best.svg").read_text()
    assert "44.32% †" in svg and "DP4 TP1 PP2" in svg and "41.76 GiB" in svg


def test_index_html_links_every_figure_and_table_that_exists(report) -> None:
    parser = _Links()
    parser.feed((report.out_dir / "index.html").read_text())
    for stem in FIGURES:
        assert f"{stem}.png" in parser.targets
    for name in ("best_configs.csv", "best_configs.md", "best_configs.tex"):
        assert name in parser.targets
    page = (report.out_dir / "index.html").read_text()
    for target in parser.targets:
        if target.startswith("#"):  # a section of the page itself
            assert f'id="{target[1:]}"' in page, target
        else:
            assert (report.out_dir / target).is_file(), target


def test_the_report_says_why_the_pp2_cells_change(report) -> None:
    text = (report.out_dir / "flags.md").read_text()
    assert "it follows pp" in text and "tied vocabulary matrix is counted a second time" in text
    changes = [f for f in report.flags if f.kind == "best-config-changes"]
    assert {(f.model, f.nodes) for f in changes} == {("1B", 1), ("1B", 2), ("1B", 4), ("1B", 8)}
    assert "not on one basis" in (report.out_dir / "index.html").read_text()


def test_tables_come_in_markdown_latex_and_full_precision_csv(report) -> None:
    tex = (report.out_dir / "best_configs.tex").read_text()
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex
    assert "MFU (\\%)" in tex and "44.32" in tex
    markdown = (report.out_dir / "best_configs.md").read_text().splitlines()
    assert markdown[0].startswith("| Model | Nodes |") and len(markdown) == 2 + 14
    csv = pd.read_csv(report.out_dir / "best_configs.csv")
    assert csv.loc[0, "mfu_pct"] == 44.32406064372896
    failures = pd.read_csv(report.out_dir / "failures.csv")
    assert failures[["completed", "failed"]].to_numpy().sum() == 1643


def test_sweep_report_command(runs_parquet: Path, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["report", str(runs_parquet), "--out", str(out), "--metric", "tokens_per_sec_per_gpu",
                 "--convention", "full_attention"]) == 0
    assert (out / "index.html").is_file() and (out / "heatmap_best.svg").is_file()
    assert "14/14 cells" in capsys.readouterr().out
    heatmap = (out / "heatmap_best.svg").read_text()  # --metric decides what the cells show
    assert "40,150 tok/s" in heatmap and "Tokens/s per GPU" in heatmap and "44.32%" not in heatmap
    assert "| Tokens/s/GPU (ranked) |" in (out / "best_configs.md").read_text()
    first = pd.read_csv(out / "best_configs.csv").iloc[0]  # fastest 1B run on one node: PP=1
    assert (first["model"], first["nodes"], first["pp"], first["dp"]) == ("1B", 1, 1, 8)
    assert first["mfu_pct"] == pytest.approx(100 * 40149.94 * 9664081920.0 / 989.5e12, rel=1e-12)
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.parquet"
    pd.DataFrame({"run_id": ["x"]}).to_parquet(bad)
    assert main(["report", str(bad), "--out", str(tmp_path / "o2")]) == 2
    assert "missing columns" in capsys.readouterr().err


def test_the_cpu_demo_issue_impossible_mfu_never_shows_and_every_issue_is_listed(
        cpu_runs, tmp_path, svg_words) -> None:
    report = write_report(cpu_runs, tmp_path / "r")
    out = report.out_dir
    assert "463.9" not in (out / "heatmap_best.svg").read_text()  # the impossible run's MFU
    assert (out / "best_configs.csv").read_text().count("\n") == 3  # header + 2 cells
    assert pd.read_csv(out / "best_configs.csv")["mfu_pct"].max() <= 100
    flags_md = (out / "flags.md").read_text()
    index = html.unescape((out / "index.html").read_text())
    assert "No flags" not in flags_md and "No flags" not in index
    for text in ("failed-check", "impossible#1 is left out of every ranking", "disputed#1",
                 "two-node#1 (completed): metrics.jsonl: 1 unreadable line(s) skipped",
                 "! tiny-4l, 1 node(s): 2 completed run(s) left out of the ranking"):
        assert text in index, text
    for issues in cpu_runs["collect_issues"]:
        for issue in issues:
            assert issue in flags_md and issue in index
    assert "! tiny-4l, 1 node(s)" in (out / "best_configs.md").read_text()
    for stem, title in (("heatmap_best", "Best configuration per cell on CPU, ranked by MFU "
                                         "(as reported: full_attention)"),
                        ("scaling", "Best configuration per cell against nodes on CPU"),
                        ("failures", "Attempts per cell by outcome class on CPU"),
                        ("mfu_distribution", "MFU (as reported: full_attention) of every "
                                             "completed run per cell on CPU")):
        assert title in svg_words(out / f"{stem}.svg"), stem


def test_a_sweep_whose_every_run_is_left_out_still_gets_its_report(cpu_runs, tmp_path) -> None:
    """The end of a detached sweep stopped early (a budget, one run with an impossible MFU):
    nothing can be ranked, and the report says so instead of failing."""
    impossible = cpu_runs[cpu_runs["run_id"].astype(str).str.contains("impossible")]
    report = write_report(impossible, tmp_path / "r")
    index = html.unescape((report.out_dir / "index.html").read_text())
    assert "impossible#1 is left out of every ranking" in index
    assert (report.out_dir / "heatmap_best.svg").is_file()


def test_a_sweep_in_which_no_run_completed_still_gets_its_report(cpu_runs, tmp_path) -> None:
    """A first round on a new cluster where everything ran out of memory (seen on an H200: a
    one-run sweep capped below its peak): the report draws empty cells and counts the failure,
    it does not stop at the distribution figure."""
    failed_only = cpu_runs[cpu_runs["outcome"] == "oom"]
    assert len(failed_only) == 1
    report = write_report(failed_only, tmp_path / "r")
    assert (report.out_dir / "mfu_distribution.svg").is_file()
    assert "oom" in (report.out_dir / "failures.md").read_text()
