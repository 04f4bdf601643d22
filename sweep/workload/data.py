"""Synthetic, deterministic, learnable token data. No downloads.

Each sequence is an arithmetic progression modulo the vocabulary (random start and stride) with
10 % of the tokens replaced by noise: a model can learn to continue it from context, so the loss
falls, and the noise keeps it from reaching zero.

The global batch of a step depends only on (seed, step), never on the layout: every rank builds
the same global batch and takes its own slice. That is what makes the losses of different
layouts comparable to the single process at the same global batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_STRIDE = 8
NOISE = 0.1


@dataclass(frozen=True)
class Batch:
    inputs: torch.Tensor  # (sequences, seq_len) int64
    labels: torch.Tensor  # (sequences, seq_len) int64: inputs shifted by one


def global_batch(seed: int, step: int, sequences: int, seq_len: int, vocab_size: int) -> Batch:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, vocab_size, (sequences, 1), generator=generator)
    stride = torch.randint(1, MAX_STRIDE + 1, (sequences, 1), generator=generator)
    positions = torch.arange(seq_len + 1)[None, :]
    tokens = (start + stride * positions) % vocab_size
    noisy = torch.rand(sequences, seq_len + 1, generator=generator) < NOISE
    tokens = torch.where(noisy, torch.randint(0, vocab_size, tokens.shape, generator=generator), tokens)
    return Batch(inputs=tokens[:, :-1].contiguous(), labels=tokens[:, 1:].contiguous())


def local_slice(batch: Batch, *, dp_rank: int, dp: int, micro: int, grad_acc: int,
                cp_rank: int = 0, cp: int = 1) -> Batch:
    """The sequences of micro-batch `micro` on data-parallel rank `dp_rank`, and this CP rank's chunk.

    The global batch is laid out as (grad_acc, dp, mbs); CP splits each sequence into `cp`
    contiguous chunks.
    """
    sequences = batch.inputs.shape[0]
    if sequences % (dp * grad_acc):
        raise ValueError(f"global batch of {sequences} sequences does not split into "
                         f"dp={dp} x grad_acc={grad_acc} equal micro-batches")
    mbs = sequences // (dp * grad_acc)
    first = (micro * dp + dp_rank) * mbs
    seq_len = batch.inputs.shape[1]
    if seq_len % cp:
        raise ValueError(f"seq_len {seq_len} is not divisible by cp={cp}")
    chunk = seq_len // cp
    cols = slice(cp_rank * chunk, (cp_rank + 1) * chunk)
    return Batch(inputs=batch.inputs[first:first + mbs, cols].contiguous(),
                 labels=batch.labels[first:first + mbs, cols].contiguous())
