"""The memory model against peaks `torch.cuda` measured on a real GPU (an H200; our own runs of
the built-in workload, tests/fixtures/cuda/README.md says how they were made).

Nothing was fitted to these runs: the built-in profile's activation terms are counted from what
its layers save (tests/workload/test_saved_activations.py), its optimizer step from PyTorch's
AdamW, and the allocator's shares were fitted on nanotron's runs on H100s. So these are models, a
GPU and a PyTorch version the constants never saw, held to issue 17's targets for the reserved
peak. Two checks: the first (Llama-3.2-1B and the playbook's 3B at sequence 4096), and a second
of two models the first never ran (Llama-3.2-3B with grouped-query attention, Llama-3.1-8B, which
runs out of memory at every setting) at sequence 2048.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sweep.catalog import get_gpu, get_model
from sweep.layout import Layout
from sweep.memory import estimate
from sweep.space import memory_over

FIXTURES = Path(__file__).parent / "fixtures" / "cuda"
# file: (completed runs, OOM runs)
CHECKS = {"h200_builtin_runs.csv": (11, 1), "h200_builtin_runs_llama3_seq2048.csv": (6, 5)}
MEDIAN_TARGET, P90_TARGET = 0.07, 0.20  # sweep.fit.TARGETS for the reserved peak


def predictions(check: str) -> pd.DataFrame:
    runs = pd.read_csv(FIXTURES / check)
    rows = []
    for run in runs.itertuples():
        layout = Layout(dp=run.dp, tp=run.tp, pp=run.pp, cp=run.cp, mbs=run.mbs,
                        grad_acc=run.grad_acc, zero_stage=run.zero_stage, recompute=run.recompute)
        est = estimate(get_model(run.model), layout, seq_len=run.seq_len, dtype=run.dtype,
                       profile="builtin")
        rows.append({"allocated": est.allocated_bytes, "reserved": est.reserved_bytes,
                     "total": est.total_bytes, "overhead": est.components["overhead"]})
    return pd.concat([runs, pd.DataFrame(rows, index=runs.index)], axis=1)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("peak", ["allocated", "reserved"])
def test_the_peaks_of_completed_runs_are_predicted_within_the_targets(check: str, peak: str) -> None:
    runs = predictions(check)
    done = runs[runs.outcome == "completed"]
    error = np.abs(done[peak] / done[f"mem_{peak}_bytes"] - 1.0)
    assert len(done) == CHECKS[check][0]
    assert np.median(error) <= MEDIAN_TARGET and np.quantile(error, 0.9) <= P90_TARGET, (
        f"{peak}: median {np.median(error):.3f}, p90 {np.quantile(error, 0.9):.3f}")


@pytest.mark.parametrize("check", CHECKS)
def test_the_planner_keeps_every_run_that_fitted_and_prunes_those_that_ran_out(check: str) -> None:
    runs = predictions(check)
    budget = get_gpu("h200").memory_bytes
    pruned = memory_over({"mem_total_bytes": runs.total, "mem_reserved_bytes": runs.reserved,
                          "mem_overhead_bytes": runs.overhead}, budget)
    assert not pruned[(runs.outcome == "completed").to_numpy()].any()
    oom = (runs.outcome == "oom").to_numpy()
    assert oom.sum() == CHECKS[check][1] and (runs.total[oom] > budget).all()  # pruned, or at most a probe


def test_an_optimizer_step_that_outgrew_the_activation_peak_is_predicted_to_the_byte_scale() -> None:
    """With full recomputation the peak is AdamW's step: weights, gradients and both moments in
    fp32, plus foreach's fp32 sqrt of the second moment (20 bytes per parameter), the same at
    micro-batch 1 and 4. Without that temporary the model was 12 % short (59.9 GiB measured)."""
    runs = predictions("h200_builtin_runs_llama3_seq2048.csv")
    full = runs[(runs.model == "llama-3.2-3b") & (runs.recompute == "full")]
    # the same peak at micro-batch 1 and 4 (within 2 MiB of 60 GiB): not the activations' peak
    assert len(full) == 2 and np.ptp(full.mem_allocated_bytes) < 1e-4 * full.mem_allocated_bytes.min()
    assert np.allclose(full.allocated / full.mem_allocated_bytes, 1.0, atol=0.002)
