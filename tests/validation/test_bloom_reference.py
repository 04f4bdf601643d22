"""The memory model on BLOOM-176B's topology sweep (sweep.validation.bloom_reference): Megatron-DeepSpeed on
A100 80 GB in 2022, models of 18-206B, no constant fitted to any of it.

Reference data ($SWEEP_REFDATA, never edited) comes through conftest's `refdata` fixture; without
it these tests skip.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sweep.core.catalog import get_gpu
from sweep.core.units import GiB, MiB
from sweep.validation import bloom_reference as bloom

A100_BYTES = get_gpu(bloom.GPU).memory_bytes


@pytest.fixture(scope="module")
def runs(refdata: Path) -> bloom.BloomRuns:
    return bloom.read_sweep(refdata / bloom.FILE)


@pytest.fixture(scope="module")
def judged(runs: bloom.BloomRuns) -> pd.DataFrame:
    return bloom.judge(runs)


def _row(frame: pd.DataFrame, **where: object) -> pd.DataFrame:
    mask = np.ones(len(frame), bool)
    for column, value in where.items():
        mask &= (frame[column] == value).to_numpy()
    return frame[mask]


def test_the_table_is_read_as_the_chronicle_describes_it(runs: bloom.BloomRuns) -> None:
    frame = runs.frame
    assert runs.skipped == {"hidden size not published": 28, "no outcome published": 1}
    assert (frame.outcome == "success").sum() == 115 and (frame.outcome == "oom").sum() == 6
    first_day = frame[frame.date == "02-17"]
    assert set(map(tuple, first_day[["hidden", "layers", "heads"]].to_numpy())) == {
        (14400, 8, 32), (14400, 80, 96)}
    # "compare with 14400 (200B)": the 02-17 model; 13824 at "187B" is 80 layers by the formula
    tile = frame[frame.source_line == 580]
    assert set(map(tuple, tile[["hidden", "layers"]].to_numpy())) == {(14400, 80), (13824, 80)}
    assert (frame.bf16_optimizer == (frame.date >= "02-28")).all()
    assert frame.measured_bytes.max() == 80 * 1000 * MiB  # the 18B at 10 layers: "80GB"
    assert frame[frame.outcome == "oom"].measured_bytes.isna().all()


def test_every_run_that_ran_is_predicted_to_fit(judged: pd.DataFrame) -> None:
    success = judged[judged.outcome == "success"]
    assert success.kept.all(), success.loc[~success.kept, ["source_line", "dp", "tp", "pp", "mbs"]]


def test_every_run_that_ran_out_is_predicted_over_or_flagged_by_the_band(judged: pd.DataFrame) -> None:
    """Three of the six OOMs are over the A100's memory by the point estimate; the other three are
    under it, but the band's high end (the measured peak can be up to predicted / 0.657) is over,
    so the planner marks them as runs that could run out."""
    oom = judged[judged.outcome == "oom"]
    assert (~oom.kept | oom.could_run_out).all()
    assert (~oom.kept).sum() >= 3


def test_the_measured_peaks_lie_in_the_band_as_often_as_it_claims(judged: pd.DataFrame) -> None:
    """The band was measured leave-one-model-out on nanotron's H100 runs (90 % of them inside);
    on another framework, GPU and PyTorch it holds as often."""
    check = bloom.score(judged)
    assert check.n_measured == 75
    assert check.within_band_frac is not None and check.within_band_frac >= 0.90


def test_the_bf16_optimizer_s_fp32_gradients_are_why_the_184b_ran_out(judged: pd.DataFrame,
                                                                         runs: bloom.BloomRuns) -> None:
    """On 02-27 a 182B layout (dp 16, tp 4, pp 6, micro-batch 4) ran at 75 GB; on 02-28 the same
    layout of a 184B model ran out of memory even at micro-batch 1. What changed is the BF16
    optimizer's fp32 gradient accumulation, 4 bytes a parameter, unsharded: with it the 184B is
    predicted above the run that ran, without it well below."""
    ran = _row(judged, date="02-27", dp=16, tp=4, pp=6, mbs=4, outcome="success")
    ran_out = _row(judged, date="02-28", dp=16, tp=4, pp=6, mbs=1, outcome="oom")
    assert len(ran) == 1 and len(ran_out) == 1
    assert float(ran_out.pred_total_bytes.iloc[0]) > float(ran.pred_total_bytes.iloc[0])
    without = bloom.BloomRuns(runs.frame.assign(bf16_optimizer=False), {})
    again = bloom.judge(without).loc[ran_out.index]
    assert float(again.pred_total_bytes.iloc[0]) < float(ran.pred_total_bytes.iloc[0]) - 10 * GiB


def test_the_peaks_are_predicted_within_the_issue_s_p90_and_low_by_a_steady_margin(
        judged: pd.DataFrame) -> None:
    """Measured as nvidia-smi shows it (context and NCCL included). The model predicts every
    peak low (a 2022 stack, PyTorch 1.11 and DeepSpeed's own buffers, holds more than the profile
    knows), so the median misses issue 17's 7 %; the tail meets its 20 %."""
    check = bloom.score(judged)
    assert check.total_p90_abs_rel_err is not None and check.total_p90_abs_rel_err <= 0.20
    assert check.total_median_rel_err is not None and check.total_median_rel_err < 0


@pytest.mark.xfail(strict=True, reason="BLOOM's peaks are predicted a median 12.7 % low (p90 "
                   "18.5 %): issue 17's median target of 7 % is not met on this framework")
def test_the_peaks_are_predicted_within_the_issue_s_median(judged: pd.DataFrame) -> None:
    check = bloom.score(judged)
    assert check.total_median_abs_rel_err is not None and check.total_median_abs_rel_err <= 0.07


def test_the_bf16_optimizer_profile_adds_fp32_gradients_and_counts_the_embeddings_as_layers() -> None:
    before, after = bloom.profile_for(False), bloom.profile_for(True)
    assert (before.fp32_grad_bytes, after.fp32_grad_bytes) == (0.0, 4.0)
    assert (before.stage_split, after.stage_split) == ("even", "embedding_blocks")
    assert not before.flash_attention and before.grad_bytes == 2.0
    assert A100_BYTES == 80 * 1024 * MiB
