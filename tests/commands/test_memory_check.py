"""`sweep memory-check --write-constants`: allocator constants fitted on a cluster's own runs,
written as the spec lines that make the next sweep plan with them.

The runs are our own H200 measurements of the built-in workload (tests/fixtures/cuda/README.md),
given the `mem_source` a sweep's runs.parquet records for them (`cuda`: torch.cuda's peaks, the
largest over the ranks), so no reference data is needed. What the playbook's tables give is in
tests/validation/test_memory_check.py and tests/validation/test_memory_fit.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sweep.cli import main
from sweep.plan.spec import load_spec

FIXTURES = Path(__file__).parents[1] / "fixtures" / "cuda"
SPEC = """\
name: h200-check
framework: builtin
gpu: h200
gpus_per_node: 1
dtype: bf16
models: [llama-3.2-1b, playbook-3b]
nodes: [1]
seq_len: 4096
global_batch: {sequences: 4}
axes:
  mbs: [1, 4]
  recompute: [none, selective, full]
"""


@pytest.fixture
def measured(tmp_path: Path) -> tuple[Path, Path]:
    """The first H200 check's attempts as a sweep's runs table, and the spec they were run from."""
    runs = pd.read_csv(FIXTURES / "h200_builtin_runs.csv").assign(mem_source="cuda")
    runs.to_csv(tmp_path / "runs.csv", index=False)
    (tmp_path / "spec.yaml").write_text(SPEC)
    return tmp_path / "runs.csv", tmp_path / "spec.yaml"


def figures(capsys: pytest.CaptureFixture[str], runs: Path, spec: Path) -> dict[str, float]:
    assert main(["memory-check", str(runs), "--spec", str(spec), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_written_constants_pasted_into_the_spec_score_as_their_header_says(
        measured: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs, spec = measured
    out = tmp_path / "constants.yaml"
    assert main(["memory-check", str(runs), "--spec", str(spec), "--write-constants", str(out)]) == 0
    text = out.read_text()
    assert "sweep format" in text and "11 successful run(s) with a measured reserved peak" in text
    assert re.search(r"sha256 [0-9a-f]{64}", text) and "framework builtin, GPU h200" in text
    allocator = yaml.safe_load(text)["constraints"]["allocator"]
    assert set(allocator) == {"sequential", "pipelined", "logits", "floor_mib"}
    assert "# no band: the probes use the shipped constants' left-out band" in text

    own = tmp_path / "own.yaml"
    own.write_text(SPEC + text)  # the spec has no `constraints:` of its own: paste as written
    assert load_spec(own).constraints.allocator is not None
    capsys.readouterr()
    scored = figures(capsys, runs, own)
    header = re.search(r"successes kept ([\d.]+), OOMs pruned ([\d.]+), reserved peak median / "
                       r"p90 \|error\| ([\d.]+) / ([\d.]+)", text)
    assert header is not None
    assert [float(v) for v in header.groups()] == pytest.approx(
        [scored["success_kept_frac"], scored["oom_pruned_frac"],
         scored["reserved_median_abs_rel_err"], scored["reserved_p90_abs_rel_err"]], abs=5e-5)
    assert "met: yes" in text  # keep 99 % of the successes, prune 90 % of the OOMs
    # this GPU's stack holds a larger floor than the playbook's grid reaches (1 GiB): the fit
    # widened that axis until its point was inside, and the header says so
    assert allocator["floor_mib"] > 1024 and "at the grid's largest value" not in text
    assert re.search(r"sweep.validation.memory_fit.GRID widened where the fit reached its largest value: "
                     r"floor_mib to \d+ \(\d widenings?\)", text)


def test_runs_that_measured_no_gpu_peak_write_nothing_and_say_why(
        measured: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs, spec = measured
    pd.read_csv(runs).assign(mem_source="cpu-rss-anon").to_csv(runs, index=False)
    out = tmp_path / "constants.yaml"
    assert main(["memory-check", str(runs), "--spec", str(spec), "--write-constants", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no successful run" in err and "measured their reserved peak on a GPU" in err
    assert not out.exists()


def test_with_cv_the_header_says_how_such_constants_hold_on_a_model_left_out(
        measured: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Eleven runs of two models pin the constants down for those models, not for a third: the
    same fit, each model scored by constants fitted on the other, is the figure to plan on."""
    runs, spec = measured
    out = tmp_path / "constants.yaml"
    assert main(["memory-check", str(runs), "--spec", str(spec), "--write-constants", str(out),
                 "--cv", "model"]) == 0
    line = next(x for x in out.read_text().splitlines() if x.startswith("# left out"))
    median, p90 = map(float, re.findall(r"\|error\| ([\d.]+) / ([\d.]+)", line)[0])
    in_sample = re.findall(r"in-sample: .*\|error\| ([\d.]+) / ([\d.]+)", out.read_text())[0]
    assert median > float(in_sample[0]) and p90 > float(in_sample[1])


def test_with_cv_the_constants_carry_their_left_out_band_and_the_plan_probes_by_it(
        measured: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The band is the held-out error of the same fit (5th..95th percentile of predicted /
    measured - 1, each model's runs scored by constants fitted on the other model's): the
    interval a sweep planned with these constants probes inside, instead of the shipped
    constants' band, which was measured on other runs."""
    runs, spec = measured
    out = tmp_path / "constants.yaml"
    assert main(["memory-check", str(runs), "--spec", str(spec), "--write-constants", str(out),
                 "--cv", "model"]) == 0
    text = out.read_text()
    low, high = yaml.safe_load(text)["constraints"]["allocator"]["band"]
    assert -1 < low <= high
    header = re.search(r"band \(predicted / measured - 1, 5%..95% percentile\): ([-+.\d]+) .. "
                       r"([-+.\d]+), for the memory rule's probes", text)
    assert header is not None
    assert [float(v) for v in header.groups()] == pytest.approx([low, high], abs=5e-5)

    own = tmp_path / "own.yaml"
    own.write_text(SPEC + text)
    assert load_spec(own).reserved_band == (low, high)
    capsys.readouterr()
    assert main(["plan", str(own), "--out", str(tmp_path / "plan")]) == 0
    assert f"their band {low:+.1%} .. {high:+.1%} (left out)" in capsys.readouterr().out


def test_cv_on_runs_of_one_model_is_refused_before_anything_is_written(
        measured: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs, spec = measured
    frame = pd.read_csv(runs)
    frame[frame["model"] == "llama-3.2-1b"].to_csv(runs, index=False)
    out = tmp_path / "constants.yaml"
    assert main(["memory-check", str(runs), "--spec", str(spec), "--write-constants", str(out),
                 "--cv", "model"]) == 2
    err = capsys.readouterr().err
    assert "needs runs of two models or more; these are all of llama-3.2-1b" in err
    assert "without --cv model, --write-constants writes constants with no band" in err
    assert not out.exists()
