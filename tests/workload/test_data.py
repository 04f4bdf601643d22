"""Synthetic data: deterministic per (seed, step), layout-independent, learnable."""

from __future__ import annotations

import pytest
import torch

from sweep.workload.data import NOISE, global_batch, local_slice


def test_the_same_seed_and_step_give_the_same_batch() -> None:
    a, b = global_batch(1, 3, 8, 32, 1024), global_batch(1, 3, 8, 32, 1024)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.inputs, global_batch(1, 4, 8, 32, 1024).inputs)
    assert not torch.equal(a.inputs, global_batch(2, 3, 8, 32, 1024).inputs)


def test_labels_are_the_next_tokens() -> None:
    batch = global_batch(0, 1, 4, 16, 1024)
    assert batch.inputs.shape == batch.labels.shape == (4, 16)
    assert torch.equal(batch.inputs[:, 1:], batch.labels[:, :-1])
    assert int(batch.inputs.max()) < 1024 and int(batch.inputs.min()) >= 0


def test_most_tokens_continue_the_progression() -> None:
    batch = global_batch(0, 1, 64, 128, 1024)
    t = batch.inputs
    follows = ((t[:, 2:] - t[:, 1:-1]) % 1024 == (t[:, 1:-1] - t[:, :-2]) % 1024).float().mean().item()
    assert follows == pytest.approx((1 - NOISE) ** 3, abs=0.05)  # three clean tokens in a row


@pytest.mark.parametrize(("dp", "grad_acc", "cp"), [(1, 1, 1), (2, 1, 1), (2, 2, 1), (1, 4, 2), (4, 1, 4)])
def test_the_slices_of_all_ranks_and_micro_batches_tile_the_global_batch(dp: int, grad_acc: int, cp: int) -> None:
    batch = global_batch(5, 2, 8, 64, 1024)
    rows = []
    for micro in range(grad_acc):
        for rank in range(dp):
            chunks = [local_slice(batch, dp_rank=rank, dp=dp, micro=micro, grad_acc=grad_acc,
                                  cp_rank=c, cp=cp) for c in range(cp)]
            rows.append(torch.cat([chunk.inputs for chunk in chunks], dim=1))
    assert torch.equal(torch.cat(rows), batch.inputs)


def test_a_batch_that_does_not_split_is_an_error() -> None:
    with pytest.raises(ValueError, match="does not split"):
        local_slice(global_batch(0, 1, 6, 8, 64), dp_rank=0, dp=4, micro=0, grad_acc=1)
