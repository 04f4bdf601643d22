"""The CPU peak: measured once per host per sweep and shared by its runs, so MFU of two runs
divides by the same number."""

from __future__ import annotations

from pathlib import Path

from sweep.workload.peak import peak_file, read_stored_peak, store_peak
from sweep.workload.train import sweep_dir_of


def test_the_first_stored_peak_wins_and_every_later_run_reads_it(tmp_path: Path) -> None:
    path = peak_file(tmp_path, "fp32", 2, 1)
    first = store_peak(path, 3.0e10, "measured:cpu-matmul-fp32")
    second = store_peak(path, 7.0e10, "measured:cpu-matmul-fp32")  # a later, noisier measure
    assert first == second == read_stored_peak(path)
    assert first[0] == 3.0e10 and "once per host per sweep" in first[1]
    assert list(path.parent.iterdir()) == [path]  # no temp files left


def test_a_peak_is_kept_per_dtype_and_shape(tmp_path: Path) -> None:
    assert peak_file(tmp_path, "fp32", 2, 1) != peak_file(tmp_path, "bf16", 2, 1)
    assert peak_file(tmp_path, "fp32", 2, 1) != peak_file(tmp_path, "fp32", 1, 2)


def test_the_sweep_folder_is_found_from_an_attempt_folder(tmp_path: Path) -> None:
    attempt = tmp_path / "sweep" / "runs" / "r1" / "attempts" / "3"
    attempt.mkdir(parents=True)
    assert sweep_dir_of(attempt) == (tmp_path / "sweep").resolve()
    elsewhere = tmp_path / "by-hand"
    elsewhere.mkdir()
    assert sweep_dir_of(elsewhere) == elsewhere.resolve()
