"""FLOPs per token under named conventions, MFU against the dense peak, and the hardware FLOPs
that activation recomputation adds (HFU).

Every published MFU figure rests on a convention; mixing them silently is how sweeps misreport.
Conventions (all count a multiply-add as 2 FLOPs and training as forward + 2 × backward = 3×):

- ``megatron``: Megatron-LM's current ``num_floating_point_operations`` (since commit 8873b55d6a,
  2025-03): 6 × (matmul parameters, LM head once, active experts only) + 6·s·L·Q for the core
  attention, which counts the causal mask at half. It counts the router's h × E matmul and the
  norms' weights too, which Megatron's formula leaves out (6·(L·(h·E + 2h) + h) per token, 1e-4
  of a Mixtral-8x7B's count).
- ``full_attention``: 6·N + 12·L·Q·s, with N all parameters (a tied embedding once; active
  experts only). The Ultra-Scale Playbook, picotron and nanotron's benchmark numbers use it;
  torchtitan uses the same attention term (its own count leaves out the input embedding:
  6·V·h per token less, tests/models/test_flops.py). For MHA, Q = hidden size, giving
  6N + 12·L·h·s.
- ``6N``: 6·N, attention ignored (Kaplan et al.).

Model FLOPs (MFU) are what the model needs, whatever the implementation. Hardware FLOPs (HFU) add
what activation recomputation executes again; see `hardware_flops_per_token`.

A shape may carry ``mlp = "gelu"`` (GPT, BLOOM, MPT: two MLP matrices, not SwiGLU's three;
`sweep.core.model.mlp_kind`); `count_parameters` counts three, so the surplus matrix is taken off here,
as `sweep.models.memory` does.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

from sweep.core.layout import RECOMPUTE_MODES
from sweep.core.model import ModelShape, count_parameters, mlp_kind

CONVENTIONS: Final = ("megatron", "full_attention", "6N")
DEFAULT_CONVENTION: Final = "full_attention"


def _surplus_mlp_params(shape: ModelShape) -> int:
    """Parameters `count_parameters` counts that a two-matrix GELU MLP lacks (0 for SwiGLU)."""
    if mlp_kind(shape) == "swiglu":
        return 0
    return shape.num_layers * shape.hidden_size * shape.ffn_hidden_size


def _check_convention(convention: str) -> None:
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown FLOPs convention {convention!r}; use one of {', '.join(CONVENTIONS)}")


def flops_per_token(shape: ModelShape, seq_len: int, convention: str = DEFAULT_CONVENTION) -> float:
    """Training FLOPs (forward and backward) per token of a sequence of `seq_len` tokens."""
    _check_convention(convention)
    params = count_parameters(shape)
    surplus = _surplus_mlp_params(shape)
    attention_full = 12.0 * shape.num_layers * shape.q_dim * seq_len
    if convention == "megatron":
        return 6.0 * (params.matmul_active - surplus) + attention_full / 2.0
    if convention == "full_attention":
        return 6.0 * (params.active - surplus) + attention_full
    return 6.0 * (params.active - surplus)


def flops_per_token_all(shape: ModelShape, seq_len: int) -> dict[str, float]:
    return {name: flops_per_token(shape, seq_len, name) for name in CONVENTIONS}


def core_attention_flops_per_token(shape: ModelShape, seq_len: int,
                                   convention: str = DEFAULT_CONVENTION) -> float:
    """The convention's training FLOPs per token of QK^T and attention·V alone (forward + backward).

    One forward of them is a third: 4·L·Q·s under ``full_attention``, 2·L·Q·s under ``megatron``
    (the causal half), nothing under ``6N``.
    """
    _check_convention(convention)
    attention_full = 12.0 * shape.num_layers * shape.q_dim * seq_len
    return {"megatron": attention_full / 2.0, "full_attention": attention_full, "6N": 0.0}[convention]


def layer_flops_per_token(shape: ModelShape, seq_len: int, convention: str = DEFAULT_CONVENTION) -> float:
    """The convention's training FLOPs per token of the transformer layers alone: everything
    `flops_per_token` counts except the LM head, the input embedding and the final norm."""
    _check_convention(convention)
    params = count_parameters(shape)
    per_layer = params.attention_per_layer + params.mlp_active_per_layer + params.norms_per_layer
    matmul = 6.0 * (shape.num_layers * per_layer - _surplus_mlp_params(shape))
    return matmul + core_attention_flops_per_token(shape, seq_len, convention)


def hardware_flops_per_token(shape: ModelShape, seq_len: int, recompute: str,
                             convention: str = DEFAULT_CONVENTION) -> float:
    """FLOPs per token the hardware executes when activations are recomputed (the HFU count).

    - ``none``: the model FLOPs, `flops_per_token` (MFU's count).
    - ``full``: one more forward of every transformer layer, i.e. the model FLOPs plus a third of
      `layer_flops_per_token`: each layer 4×, the LM head 3×. Full recomputation checkpoints layer
      by layer (Megatron-LM ``--recompute-granularity full``, DeepSpeed, FSDP/torchtitan, nanotron,
      HF ``gradient_checkpointing``); the LM head and the embedding lookup sit outside and are not
      recomputed. This is Narayanan et al. 2021, eq. 3, 96·B·s·l·h²·(1 + s/6h + V/16lh): layers
      4×, logits 6·B·s·h·V = 3×; Megatron-DeepSpeed's ``throughput_calculator`` (BLOOM-176B's
      logged TFLOP/s) and MT-NLG report it. It is less than 4/3 × the model FLOPs by a third of
      the LM head and embedding share; llm-foundry's HFU (4/3 × its MFU) counts those recomputed
      too.
    - ``selective`` (Megatron-LM's ``--recompute-granularity selective``, Korthikanti et al. 2022):
      one more forward of the core attention only, QK^T and attention·V (a third of
      `core_attention_flops_per_token`); softmax and dropout are elementwise, not counted. The
      HFU column of Korthikanti et al. 2022 adds three such forwards instead (its formula has s/3h
      where the model FLOPs have s/6h); tests/models/test_flops_reference.py shows it.

    Recomputation inside a kernel (FlashAttention's backward recomputes QK^T) is not counted; none
    of the published figures above counts it. Each convention counts the repeated work its own way (``megatron``
    the causal half of attention, ``6N`` no attention), so HFU/MFU stays within one convention.
    """
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"unknown recompute mode {recompute!r}; use one of {', '.join(RECOMPUTE_MODES)}")
    model = flops_per_token(shape, seq_len, convention)
    if recompute == "full":
        return model + layer_flops_per_token(shape, seq_len, convention) / 3.0
    if recompute == "selective":
        return model + core_attention_flops_per_token(shape, seq_len, convention) / 3.0
    return model


def mfu(tokens_per_sec_per_gpu: float, flops_per_token_value: float, peak_flops: float) -> float:
    """Model FLOPs utilisation as a fraction (0..1) of the device's DENSE peak."""
    if peak_flops <= 0:
        raise ValueError(f"peak FLOP/s must be positive, got {peak_flops}")
    return tokens_per_sec_per_gpu * flops_per_token_value / peak_flops


def hfu(tokens_per_sec_per_gpu: float, hardware_flops_per_token_value: float, peak_flops: float) -> float:
    """Hardware FLOPs utilisation as a fraction (0..1) of the DENSE peak: `mfu` with the count of
    `hardware_flops_per_token`. Never compare it with an MFU: with full recomputation it is about
    4/3 of it for the same run."""
    return mfu(tokens_per_sec_per_gpu, hardware_flops_per_token_value, peak_flops)
