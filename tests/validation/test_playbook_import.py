"""`sweep import-playbook`: the Ultra-Scale Playbook's published runs in our runs.parquet schema."""

from __future__ import annotations

import collections
import csv
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from sweep.calibration.runs_table import completed_groups
from sweep.cli import main
from sweep.collect.schema import to_table
from sweep.core import catalog
from sweep.core.units import GiB as GIB
from sweep.models import flops
from sweep.models.throughput_inputs import MEASURED_INTER_NODE
from sweep.plan.spec import load_spec
from sweep.validation.playbook_import import PlaybookFormatError, import_playbook


@pytest.fixture(scope="module")
def runs_csv(refdata: Path) -> Path:
    return refdata / "playbook_runs_1B_8B.csv"


@pytest.fixture(scope="module")
def rows(runs_csv: Path) -> list[dict]:
    return import_playbook(runs_csv)


def test_every_published_run_becomes_one_row(rows, runs_csv) -> None:
    with open(runs_csv, newline="") as handle:
        published = list(csv.DictReader(handle))
    assert len(rows) == len(published) == 1643
    outcomes = collections.Counter(r["outcome"] for r in rows)
    assert outcomes == {"completed": sum(p["status"] == "success" for p in published),
                        "failed": sum(p["status"] == "failed" for p in published)}
    assert len({(r["run_id"], r["attempt"]) for r in rows}) == len(rows)
    to_table(rows)  # every row fits the schema


def test_published_numbers_are_kept_exactly(rows, runs_csv) -> None:
    with open(runs_csv, newline="") as handle:
        first = next(csv.DictReader(handle))
    row = rows[0]
    assert (row["model_label"], row["nodes"], row["dp"], row["tp"], row["pp"], row["mbs"],
            row["grad_acc"], row["zero_stage"]) == ("1B", 1, 4, 1, 2, 4, 16, 1)
    assert row["mfu_reported"] * 100 == pytest.approx(float(first["mfu_pct"]), rel=1e-15)
    assert row["tokens_per_sec_per_gpu"] == float(first["tokens_per_sec_per_gpu"])
    assert row["mem_reserved_bytes"] / GIB == float(first["gpu_memory_GB"])
    assert row["attempt_dir"] == "playbook_runs_1B_8B.csv:2"


def test_mfu_is_recomputed_under_each_convention_against_the_dense_peak(rows) -> None:
    shape = catalog.get_model("playbook-8b")
    row = next(r for r in rows if r["model"] == "playbook-8b" and r["outcome"] == "completed")
    assert row["peak_flops"] == 989.5e12
    for convention in flops.CONVENTIONS:
        expected = row["tokens_per_sec_per_gpu"] * flops.flops_per_token(shape, 4096, convention) / 989.5e12
        assert row[f"mfu_{convention}"] == pytest.approx(expected, rel=1e-12)
    # The published 8B MFU is on the full-attention basis (0.1 % off: nanotron's exact count).
    assert row["mfu_reported"] == pytest.approx(row["mfu_full_attention"], rel=2e-3)


def test_the_implied_flops_basis_matches_the_refdata_derivation(rows, runs_csv) -> None:
    """refdata derives MFU × 989.5e12 / tokens/s/GPU to 4 decimals (GFLOP/token); so do we, unrounded."""
    with open(runs_csv, newline="") as handle:
        published = list(csv.DictReader(handle))
    column = "derived_flops_per_token_G_at_989.5TF"
    checked = 0
    for row, source in zip(rows, published):
        if source[column]:
            assert abs(row["flops_per_token_reported"] / 1e9 - float(source[column])) <= 5.001e-5
            checked += 1
    assert checked > 1000
    tied_1b = {(r["pp"] > 1, float(s[column])) for r, s in zip(rows, published)
               if r["model"] == "playbook-1b" and s[column]}
    assert tied_1b == {(False, 9.6555), (True, 11.2763)}  # PP>1 counts the vocabulary twice


def test_failed_runs_that_carry_throughput_say_so(rows) -> None:
    odd = [r for r in rows if r["outcome"] == "failed" and r["tokens_per_sec_per_gpu"] is not None]
    assert odd and all("carries throughput" in r["collect_issues"][0] for r in odd)


def test_the_full_results_table_tells_oom_from_other_failures(refdata: Path) -> None:
    rows = import_playbook(refdata / "playbook_bench_full_1B_8B.csv")
    assert collections.Counter(r["outcome"] for r in rows) == {"completed": 1027, "oom": 372, "failed": 244}
    done = next(r for r in rows if r["outcome"] == "completed")
    assert done["slurm_job_id"] and done["mem_allocated_bytes"] < done["mem_reserved_bytes"]
    assert {r["model_label"] for r in rows} == {"1B", "8B"}


def test_a_throughput_fit_on_the_imported_table_sees_what_it_sees_on_the_table(
        refdata: Path, repo_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The runs a fit must leave out (pre-fix pipeline runs, a sick node's) and the network each
    job measured come along, so `sweep calibrate` on the runs.parquet fits the same rows with the
    same bandwidths as on nanotron's CSV; before, it fitted 1027 runs instead of 751."""
    table = refdata / "playbook_bench_full_1B_8B.csv"
    imported = tmp_path / "runs.parquet"
    assert main(["import-playbook", str(table), "--out", str(imported)]) == 0
    spec = load_spec(repo_root / "examples" / "playbook.yaml")
    groups = {path: completed_groups(path, spec, on_left_out=print) for path in (table, imported)}
    said = capsys.readouterr().out
    assert said.count("left out 771 pipeline runs made before nanotron's pipeline fix") == 2
    assert said.count("left out 10 runs on a node whose NVLink") == 2
    columns = ["nodes", "dp", "tp", "pp", "mbs", "grad_acc", "zero_stage", "tokens_per_s_per_gpu",
               MEASURED_INTER_NODE]
    for (name, from_csv, _), (other, from_parquet, _) in zip(*groups.values(), strict=True):
        assert name == other
        pd.testing.assert_frame_equal(from_csv[columns].reset_index(drop=True),
                                      from_parquet[columns].reset_index(drop=True),
                                      check_dtype=False)
    assert sum(len(g) for _, g, _ in groups[imported]) == 751


def test_a_file_of_another_shape_is_refused_with_the_fix(tmp_path) -> None:
    bad = tmp_path / "other.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(PlaybookFormatError, match=r"other\.csv: neither .*playbook_runs_1B_8B\.csv"):
        import_playbook(bad)
    partial = tmp_path / "partial.csv"
    partial.write_text("model_label,nodes\n1B,1\n")
    with pytest.raises(PlaybookFormatError, match=r"partial\.csv: missing columns dp, tp"):
        import_playbook(partial)


def test_import_playbook_command_writes_parquet(runs_csv, tmp_path, capsys) -> None:
    out = tmp_path / "runs.parquet"
    assert main(["import-playbook", str(runs_csv), "--out", str(out)]) == 0
    assert pq.read_table(out).num_rows == 1643
    assert "1643 run(s)" in capsys.readouterr().out
    assert main(["import-playbook", str(tmp_path / "nope.csv"), "--out", str(out)]) == 2
    assert "nope.csv" in capsys.readouterr().err
