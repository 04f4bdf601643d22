"""`sweep replay` and `sweep calibrate`: real files in, figures and coefficient files out."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sweep.cli import main

SPEC = """\
name: replay-test
framework: nanotron
gpu: h100-sxm
gpus_per_node: 8
models: [playbook-1b, playbook-8b]
nodes: [1, 2, 4, 8, 16, 32, 64]
seq_len: 4096
global_batch: {sequences: 256}
run: {steps: 20, warmup_steps: 5}
"""


@pytest.fixture()
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return path


@pytest.fixture()
def small_runs(refdata, tmp_path: Path) -> Path:
    """The playbook's 1-2 node runs: a real published table, small enough to replay quickly."""
    runs = pd.read_csv(refdata / "playbook_runs_1B_8B.csv")
    path = tmp_path / "runs_small.csv"
    runs[runs.nodes <= 2].to_csv(path, index=False)
    return path


def replay(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from sweep.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "replay", *args],
                          capture_output=True, text=True, timeout=300)


def test_json_report_of_an_adaptive_replay(small_runs: Path, spec: Path) -> None:
    done = replay(str(small_runs), "--spec", str(spec), "--strategy", "adaptive", "--json",
                  "--min-cell-runs", "16")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["cells_total"] == 4 and len(report["cells"]) == 4
    assert report["published_runs"] == len(pd.read_csv(small_runs))
    assert 0 < report["runs_launched_frac"] < 1 and 0 < report["gpu_hours_frac"] < 1
    assert report["cells_within_2pct"] == sum(c["within"] for c in report["cells"])
    assert report["params"]["min_cell_runs"] == 16
    assert sum(report["skipped"].values()) + report["runs_launched"] == sum(
        c["candidates"] for c in report["cells"])


def test_exhaustive_text_report_ends_with_the_headline(small_runs: Path, spec: Path) -> None:
    done = replay(str(small_runs), "--spec", str(spec))
    assert done.returncode == 0, done.stderr
    last = dict(pair.split("=") for pair in done.stdout.strip().splitlines()[-1].split())
    assert float(last["cells_within_2pct"]) == float(last["cells_total"]) == 4
    # Exhaustive runs every distinct configuration once: only published repeats are not re-run.
    runs = pd.read_csv(small_runs)
    distinct = len(runs.drop_duplicates(["model_label", "nodes", "dp", "tp", "pp", "mbs",
                                         "grad_acc", "zero_stage"]))
    assert float(last["runs_launched"]) == distinct < len(runs)
    assert 0.9 < float(last["gpu_hours_frac"]) < 1.0
    assert "playbook-8b|2" in done.stdout


def test_bad_input_exits_2_with_one_line(tmp_path: Path, spec: Path, capsys) -> None:
    assert main(["replay", str(tmp_path / "missing.csv"), "--spec", str(spec)]) == 2
    assert "missing.csv: no such file" in capsys.readouterr().err
    junk = tmp_path / "junk.csv"
    junk.write_text("a,b\n1,2\n")
    assert main(["replay", str(junk), "--spec", str(spec)]) == 2
    assert "junk.csv: not a playbook table nor a runs table" in capsys.readouterr().err


def test_calibrate_writes_coefficients_that_replay_reads(small_runs: Path, spec: Path,
                                                         tmp_path: Path, capsys) -> None:
    out = tmp_path / "sweep" / "throughput.json"
    assert main(["calibrate", str(small_runs), "--spec", str(spec), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "held out playbook-1b" in printed and "held out playbook-8b" in printed
    stored = json.loads(out.read_text())
    assert stored["rows"] == int((pd.read_csv(small_runs).status == "success").sum())
    provenance = stored["provenance"]
    assert provenance["source_sha256"] == hashlib.sha256(small_runs.read_bytes()).hexdigest()
    assert set(provenance["held_out"]) == {"playbook-1b", "playbook-8b"}
    assert 0 < provenance["held_out"]["playbook-1b"]["median_abs_error"] <= provenance[
        "held_out"]["playbook-1b"]["p90_abs_error"]
    assert stored["coefficients"]["compute"] > 1.0  # no GPU beats its dense peak
    assert main(["replay", str(small_runs), "--spec", str(spec), "--strategy", "adaptive",
                 "--coefficients", str(out), "--json", "--min-cell-runs", "16"]) == 0
    assert json.loads(capsys.readouterr().out)["cells_total"] == 4


def test_calibrate_refuses_a_table_with_none_of_the_specs_models(tmp_path: Path, capsys,
                                                                  small_runs: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(SPEC.replace("[playbook-1b, playbook-8b]", "[llama-3.2-1b]"))
    assert main(["calibrate", str(small_runs), "--spec", str(other)]) == 2
    assert "none of its models" in capsys.readouterr().err


def test_broken_coefficients_file_is_named(small_runs: Path, spec: Path, tmp_path: Path,
                                           capsys) -> None:
    bad = tmp_path / "throughput.json"
    bad.write_text('{"coefficients": {"computee": 2}}')
    assert main(["replay", str(small_runs), "--spec", str(spec), "--strategy", "adaptive",
                 "--coefficients", str(bad)]) == 2
    assert "throughput.json: not a `sweep calibrate` file" in capsys.readouterr().err


def test_runs_parquet_from_import_playbook_calibrates_and_replays(small_runs: Path, spec: Path,
                                                                   tmp_path: Path,
                                                                   capsys) -> None:
    parquet = tmp_path / "runs.parquet"
    assert main(["import-playbook", str(small_runs), "--out", str(parquet)]) == 0
    out = tmp_path / "throughput.json"
    assert main(["calibrate", str(parquet), "--spec", str(spec), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["replay", str(parquet), "--spec", str(spec), "--strategy", "exhaustive",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cells_total"] == report["cells_within_2pct"] == 4
    assert report["published_runs"] == len(pd.read_csv(small_runs))


def test_cv_model_reports_held_out_beside_in_sample(small_runs: Path, spec: Path,
                                                   capsys) -> None:
    """Leave-one-model-out: each model replayed from a fit and settings of the other model."""
    assert main(["replay", str(small_runs), "--spec", str(spec), "--cv", "model", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    modes = [(f["model"], f["mode"]) for f in report["folds"]]
    assert modes == [("playbook-1b", "in-sample"), ("playbook-8b", "in-sample"),
                     ("playbook-1b", "held-out"), ("playbook-8b", "held-out")]
    for fold in report["folds"]:
        economy = fold["economy"]
        assert economy["cells_total"] == 2 and economy["pruned_but_completed"] == 0
        assert economy["launches_forced_by_floor"] + economy["launches_chosen_by_model"] == (
            economy["runs_launched"])
        assert 0 < fold["throughput"]["median_abs_error"] <= fold["throughput"]["p90_abs_error"]
        assert all("regret_bound_at_close" in cell for cell in fold["cells"])
    for key in ("held_out_tput_median", "held_out_tput_p90", "held_out_runs_launched_frac",
                "held_out_cells_within_2pct", "in_sample_tput_median"):
        assert key in report
    assert main(["replay", str(small_runs), "--spec", str(spec), "--cv", "model",
                 "--coefficients", str(small_runs)]) == 2
    assert "leave out --coefficients" in capsys.readouterr().err


def test_text_report_counts_floor_launches_and_proof_skips(small_runs: Path, spec: Path,
                                                           capsys) -> None:
    assert main(["replay", str(small_runs), "--spec", str(spec), "--strategy", "adaptive"]) == 0
    out = capsys.readouterr().out
    assert "floor" in out.splitlines()[0] and "bound" in out.splitlines()[0]
    last = dict(pair.split("=") for pair in out.strip().splitlines()[-1].split())
    assert float(last["launches_forced_by_floor"]) + float(last["launches_chosen_by_model"]) == (
        float(last["runs_launched"]))
    assert float(last["pruned_but_completed"]) == float(last["heuristic_skipped"]) == 0


def test_a_shortlist_replay_runs_top_completed_per_cell(small_runs: Path, spec: Path,
                                                        capsys) -> None:
    assert main(["replay", str(small_runs), "--spec", str(spec), "--strategy", "shortlist",
                 "--top", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["params"]["top"] == 2 and report["cells_total"] == 4
    for cell in report["cells"]:
        assert cell["launched"] >= 2  # two completed, plus any that failed in their place
    assert report["launches_chosen_by_model"] == report["runs_launched"]
    with pytest.raises(SystemExit) as refused:
        main(["replay", str(small_runs), "--spec", str(spec), "--strategy", "shortlist",
              "--top", "0"])
    assert refused.value.code == 2
    assert "--top: '0' is not a positive whole number" in capsys.readouterr().err


def test_cv_model_chooses_the_shortlist_length_on_the_other_model(small_runs: Path, spec: Path,
                                                                  capsys) -> None:
    assert main(["replay", str(small_runs), "--spec", str(spec), "--cv", "model",
                 "--strategy", "shortlist"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[-1] == "top"
    held_out = [line.split() for line in out if " held-out " in line]
    assert len(held_out) == 2 and all(int(line[-1]) >= 1 for line in held_out)
    last = dict(pair.split("=") for pair in out[-1].split())
    assert float(last["held_out_cells_total"]) == 4


def test_top_is_refused_with_a_strategy_it_does_not_change(small_runs: Path, spec: Path,
                                                           capsys) -> None:
    assert main(["replay", str(small_runs), "--spec", str(spec), "--strategy", "adaptive",
                 "--top", "3"]) == 2
    assert "--top applies to --strategy shortlist, not --strategy adaptive" in (
        capsys.readouterr().err)
