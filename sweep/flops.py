"""FLOPs per token under named conventions, and MFU against the dense peak.

Every published MFU figure rests on a convention; mixing them silently is how sweeps misreport.
Conventions (all count a multiply-add as 2 FLOPs and training as forward + 2 × backward = 3×):

- ``megatron``: Megatron-LM's current ``num_floating_point_operations`` (since commit 8873b55d6a,
  2025-03): 6 × (matmul parameters, LM head once, active experts only) + 6·s·L·Q for the core
  attention, which counts the causal mask at half.
- ``full_attention``: 6·N + 12·L·Q·s, with N all parameters (a tied embedding once; active
  experts only). The Ultra-Scale Playbook, picotron and nanotron's benchmark numbers use it;
  torchtitan uses the same attention term. For MHA, Q = hidden size, giving 6N + 12·L·h·s.
- ``6N``: 6·N, attention ignored (Kaplan et al.).

Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

from sweep.model import ModelShape, count_parameters

CONVENTIONS: Final = ("megatron", "full_attention", "6N")
DEFAULT_CONVENTION: Final = "full_attention"


def flops_per_token(shape: ModelShape, seq_len: int, convention: str = DEFAULT_CONVENTION) -> float:
    """Training FLOPs (forward and backward) per token of a sequence of `seq_len` tokens."""
    params = count_parameters(shape)
    attention_full = 12.0 * shape.num_layers * shape.q_dim * seq_len
    if convention == "megatron":
        return 6.0 * params.matmul_active + attention_full / 2.0
    if convention == "full_attention":
        return 6.0 * params.active + attention_full
    if convention == "6N":
        return 6.0 * params.active
    raise ValueError(f"unknown FLOPs convention {convention!r}; use one of {', '.join(CONVENTIONS)}")


def flops_per_token_all(shape: ModelShape, seq_len: int) -> dict[str, float]:
    return {name: flops_per_token(shape, seq_len, name) for name in CONVENTIONS}


def mfu(tokens_per_sec_per_gpu: float, flops_per_token_value: float, peak_flops: float) -> float:
    """Model FLOPs utilisation as a fraction (0..1) of the device's DENSE peak."""
    if peak_flops <= 0:
        raise ValueError(f"peak FLOP/s must be positive, got {peak_flops}")
    return tokens_per_sec_per_gpu * flops_per_token_value / peak_flops
