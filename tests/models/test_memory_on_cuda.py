"""The memory model against peaks `torch.cuda` measured on a real GPU (an H200 and an H100; our own
runs of the built-in workload, tests/fixtures/cuda/README.md says how they were made).

Nothing was fitted to these runs: the built-in profile's activation terms are counted from what
its layers save (tests/workload/test_saved_activations.py), its optimizer step from PyTorch's
AdamW, and the allocator's shares were fitted on nanotron's runs on H100s. So these are models, a
GPU and a PyTorch version the constants never saw, held to issue 17's targets for the reserved
peak. Two checks: the first (Llama-3.2-1B and the playbook's 3B at sequence 4096), and a second
of two models the first never ran (Llama-3.2-3B with grouped-query attention, Llama-3.1-8B, which
runs out of memory at every setting) at sequence 2048. A third on an H100, whose 79.18 GiB the
largest of those runs cross, with the planner's limit lifted so that the card decided: what fits
at the line, and why the model judges by the reserved peak and not the allocated one. A fourth,
on the H200, ran the one configuration the H100 showed the model short on, where it fits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sweep.core.catalog import get_gpu, get_model
from sweep.core.layout import Layout
from sweep.core.units import GiB
from sweep.models.memory import estimate
from sweep.plan.space import memory_over

FIXTURES = Path(__file__).parents[1] / "fixtures" / "cuda"
# file: (completed runs, OOM runs)
CHECKS = {"h200_builtin_runs.csv": (11, 1), "h200_builtin_runs_llama3_seq2048.csv": (6, 5),
          "h100_builtin_runs.csv": (5, 7), "h200_builtin_runs_grad_acc.csv": (2, 0),
          "h100_builtin_runs_llama1b_seq2048.csv": (4, 0)}
MEDIAN_TARGET, P90_TARGET = 0.07, 0.20  # sweep.validation.memory_fit.TARGETS for the reserved peak


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


RESERVE_OVER_AT_MBS_8 = pytest.mark.xfail(strict=True, reason=(
    "Llama-3.2-1B at seq 2048 on the H100, 4 runs: the reserved peak's median error is 7.5 % "
    "(target 7 %); both micro-batch-8 runs are predicted 10 % over, as the same 16k-token "
    "micro-batch at seq 4096 was on the H200 (the allocator's shares are nanotron's)"))
PEAK_CHECKS = [pytest.param(check, peak, marks=RESERVE_OVER_AT_MBS_8)
               if (check, peak) == ("h100_builtin_runs_llama1b_seq2048.csv", "reserved") else (check, peak)
               for check in CHECKS for peak in ("allocated", "reserved")]


@pytest.mark.parametrize(("check", "peak"), PEAK_CHECKS)
def test_the_peaks_of_completed_runs_are_predicted_within_the_targets(check: str, peak: str) -> None:
    runs = predictions(check)
    done = runs[runs.outcome == "completed"]
    error = np.abs(done[peak] / done[f"mem_{peak}_bytes"] - 1.0)
    assert len(done) == CHECKS[check][0]
    assert np.median(error) <= MEDIAN_TARGET and np.quantile(error, 0.9) <= P90_TARGET, (
        f"{peak}: median {np.median(error):.3f}, p90 {np.quantile(error, 0.9):.3f}")


def verdicts(check: str) -> tuple[pd.DataFrame, np.ndarray]:
    """The runs with their predictions, and which ones the memory rule prunes on their GPU."""
    runs = predictions(check)
    (gpu,) = runs.gpu.unique()
    pruned = memory_over({"mem_total_bytes": runs.total, "mem_reserved_bytes": runs.reserved,
                          "mem_overhead_bytes": runs.overhead}, get_gpu(gpu).memory_bytes)
    return runs, pruned


@pytest.mark.parametrize("check", CHECKS)
def test_the_planner_keeps_every_run_that_fitted(check: str) -> None:
    runs, pruned = verdicts(check)
    assert not pruned[(runs.outcome == "completed").to_numpy()].any()


RESERVE_SHORT = pytest.mark.xfail(strict=True, reason=(
    "the playbook's 3B at micro-batch 2 x 2 with full recomputation: its allocated peak is "
    "predicted to 0.1 % (72.7 GiB) but its reserve is not: 76.9 GiB predicted, 81.1 measured on "
    "the H200 (tests/fixtures/cuda/h200_builtin_runs_grad_acc.csv), and on the H100 its 4 GiB "
    "request for the fp32 logits found 9.7 GiB reserved but unallocated that could not be "
    "released; the model's total, 77.4 GiB with the overhead, is under the card's 79.18, so the "
    "planner keeps it"))


@pytest.mark.parametrize("check", [pytest.param(c, marks=RESERVE_SHORT) if c.startswith("h100") else c
                                   for c in CHECKS if CHECKS[c][1]])
def test_every_run_that_ran_out_is_predicted_over_the_gpu(check: str) -> None:
    """Pruned, or at most kept as a probe (a run the band cannot call)."""
    runs, _ = verdicts(check)
    (gpu,) = runs.gpu.unique()
    oom = (runs.outcome == "oom").to_numpy()
    assert oom.sum() == CHECKS[check][1] and (runs.total[oom] > get_gpu(gpu).memory_bytes).all()


def test_expandable_segments_let_the_runs_that_fragmentation_stopped_complete() -> None:
    """The same two runs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: segments grow in
    place instead of being split, so the reserve that could not be released is not there, and
    both complete on the card that stopped them, with the same allocated peaks."""
    plain = pd.read_csv(FIXTURES / "h100_builtin_runs.csv")
    expandable = pd.read_csv(FIXTURES / "h100_builtin_runs_expandable_segments.csv")
    card = get_gpu("h100-sxm").memory_bytes
    for mbs in (2, 4):
        before, after = same_run(plain, "playbook-3b", mbs, "full"), same_run(expandable, "playbook-3b", mbs, "full")
        assert before.outcome == "oom" and after.outcome == "completed"
        assert after.mem_reserved_bytes + after.mem_outside_allocator_bytes < card
        assert abs(after.mem_allocated_bytes / before.mem_allocated_bytes - 1) < 0.01


def test_with_recomputation_the_end_of_the_forward_can_be_the_peak() -> None:
    """torch.autocast caches the bf16 cast of every weight until its region exits, after the
    loss: at the end of the forward every layer's cast is alive, even where layers are recomputed,
    beside the loss's 10 bytes per logit. With gradients already there (a micro-batch after the
    first) that moment outgrows the backward's peak. Without the term the model was 2.8-5.6 %
    short on these runs; the term is counted, not fitted (MemTracker on CPU measures the casts
    after the forward, tests/workload/test_saved_activations.py, and the loss's bytes)."""
    picks = [("h200_builtin_runs_grad_acc.csv", "playbook-3b", 2, "full"),
             ("h200_builtin_runs.csv", "playbook-3b", 1, "selective"),
             ("h100_builtin_runs.csv", "playbook-3b", 1, "selective"),
             ("h100_builtin_runs.csv", "llama-3.2-3b", 4, "selective"),
             ("h200_builtin_runs_llama3_seq2048.csv", "llama-3.2-3b", 4, "selective")]
    for check, model, mbs, recompute in picks:
        run = same_run(predictions(check), model, mbs, recompute)
        assert run.outcome == "completed"
        assert abs(run.allocated / run.mem_allocated_bytes - 1) < 0.005, (check, model, mbs, recompute)


def same_run(frame: pd.DataFrame, model: str, mbs: int, recompute: str) -> pd.Series:
    (row,) = [r for _, r in frame.iterrows()
              if (r.model, r.mbs, r.recompute) == (model, mbs, recompute)]
    return row


def test_a_run_whose_reserve_overflows_the_card_fits_when_the_allocator_can_release_it() -> None:
    """Llama-3.2-3B at micro-batch 4, selective: the H200 reserved 79.2 GiB, over the H100's
    79.18 with the memory outside the allocator. On the H100 the caching allocator released its
    cache once, retried, and the run completed with the same allocated peak and less reserved."""
    h200 = same_run(pd.read_csv(FIXTURES / "h200_builtin_runs_llama3_seq2048.csv"), "llama-3.2-3b", 4, "selective")
    h100 = same_run(pd.read_csv(FIXTURES / "h100_builtin_runs.csv"), "llama-3.2-3b", 4, "selective")
    card = get_gpu("h100-sxm").memory_bytes
    assert h200.mem_reserved_bytes + h100.mem_outside_allocator_bytes > card
    assert h100.outcome == "completed" and h100.mem_alloc_retries >= 1
    assert h100.mem_reserved_bytes < h200.mem_reserved_bytes
    assert abs(h100.mem_allocated_bytes / h200.mem_allocated_bytes - 1) < 0.001


def test_an_allocated_peak_under_the_card_is_not_enough_when_the_reserve_cannot_be_released() -> None:
    """The playbook's 3B at micro-batch 4 with full recomputation allocated 72.4 GiB at most on the
    H200: with the 1.3 GiB outside the allocator, 5 GiB under the H100. It ran out there all the
    same, after two retries: an 8 GiB request for the fp32 logits found 9.7 GiB reserved but
    unallocated that could not be released (blocks split around live tensors). So a verdict from
    the allocated peak alone would keep it; the model judges by the reserved peak (81.3 GiB
    predicted), which puts it over the card."""
    h200 = same_run(pd.read_csv(FIXTURES / "h200_builtin_runs.csv"), "playbook-3b", 4, "full")
    h100 = same_run(pd.read_csv(FIXTURES / "h100_builtin_runs.csv"), "playbook-3b", 4, "full")
    card = get_gpu("h100-sxm").memory_bytes
    assert h200.outcome == "completed" and h100.outcome == "oom" and h100.mem_alloc_retries >= 2
    assert h200.mem_allocated_bytes + h100.mem_outside_allocator_bytes < card - 4 * GiB
    runs = predictions("h100_builtin_runs.csv")
    predicted = runs[(runs.model == "playbook-3b") & (runs.mbs == 4) & (runs.recompute == "full")]
    assert (predicted.reserved > card).all()


def test_an_optimizer_step_that_outgrew_the_activation_peak_is_predicted_to_the_byte_scale() -> None:
    """With full recomputation the peak is AdamW's step: weights, gradients and both moments in
    fp32, plus foreach's fp32 sqrt of the second moment (20 bytes per parameter), the same at
    micro-batch 1 and 4. Without that temporary the model was 12 % short (59.9 GiB measured)."""
    runs = predictions("h200_builtin_runs_llama3_seq2048.csv")
    full = runs[(runs.model == "llama-3.2-3b") & (runs.recompute == "full")]
    # the same peak at micro-batch 1 and 4 (within 2 MiB of 60 GiB): not the activations' peak
    assert len(full) == 2 and np.ptp(full.mem_allocated_bytes) < 1e-4 * full.mem_allocated_bytes.min()
    assert np.allclose(full.allocated / full.mem_allocated_bytes, 1.0, atol=0.002)
