"""FLOPs per token under each named convention, checked against published runs."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from sweep.core.catalog import get_gpu, get_model
from sweep.core.layout import RECOMPUTE_MODES
from sweep.core.model import ModelShape
from sweep.models.flops import (
    CONVENTIONS,
    core_attention_flops_per_token,
    flops_per_token,
    flops_per_token_all,
    hardware_flops_per_token,
    hfu,
    layer_flops_per_token,
    mfu,
)
from sweep.validation.memory_reference import gpt_shape

PLAYBOOK_PEAK = 989.5e12  # the playbook's H100 SXM dense BF16 peak


def test_catalog_peak_is_the_dense_one() -> None:
    assert get_gpu("h100-sxm").dense_peak("bf16") == PLAYBOOK_PEAK
    assert get_gpu("H100").dense_peak("bf16") * 2 == 1979e12  # the datasheet's sparse figure


@pytest.mark.parametrize("label, model", [("1B", "playbook-1b"), ("8B", "playbook-8b")])
def test_full_attention_reproduces_the_playbook_pp1_runs(refdata, label: str, model: str) -> None:
    runs = pd.read_csv(refdata / "playbook_runs_1B_8B.csv")
    runs = runs[(runs.model_label == label) & (runs.pp == 1) & (runs.status == "success")
                & (runs.tokens_per_sec_per_gpu > 0)]
    assert len(runs) > 50
    implied = runs.mfu_pct / 100 * PLAYBOOK_PEAK / runs.tokens_per_sec_per_gpu
    ours = flops_per_token(get_model(model), 4096, "full_attention")
    rel = (implied / ours - 1).abs()
    assert rel.max() < 0.005, f"worst run off by {rel.max():.4%}"


def test_playbook_pp2_runs_of_tied_models_count_the_vocabulary_twice(refdata) -> None:
    """The refdata README's finding, reproduced: +6·V·h per token for PP>1 (tied 1B)."""
    runs = pd.read_csv(refdata / "playbook_runs_1B_8B.csv")
    runs = runs[(runs.model_label == "1B") & (runs.pp > 1) & (runs.status == "success")
                & (runs.tokens_per_sec_per_gpu > 0)]
    shape = get_model("playbook-1b")
    implied = (runs.mfu_pct / 100 * PLAYBOOK_PEAK / runs.tokens_per_sec_per_gpu).median()
    doubled = flops_per_token(shape, 4096, "full_attention") + 6 * shape.vocab_size * shape.hidden_size
    assert abs(implied / doubled - 1) < 0.005


def test_megatron_counts_causal_attention_at_half() -> None:
    shape = get_model("llama-3.1-8b")
    seq = 8192
    attention_full = 12 * shape.num_layers * shape.q_dim * seq
    full, megatron = flops_per_token(shape, seq, "full_attention"), flops_per_token(shape, seq, "megatron")
    # megatron drops half the attention term and the input-embedding lookup (not a matmul)
    embedding = shape.vocab_size * shape.hidden_size
    assert full - megatron == pytest.approx(attention_full / 2 + 6 * embedding)


def test_megatron_formula_matches_the_published_closed_form() -> None:
    """Megatron's 2024 closed form counts attention fully; ours halves it (2025-03 fix)."""
    shape = get_model("llama-3.1-70b")
    L, h, s, V = shape.num_layers, shape.hidden_size, 4096, shape.vocab_size
    kv_ratio, ffn_ratio = shape.num_kv_heads / shape.num_attention_heads, shape.ffn_hidden_size / h
    old = 12 * s * L * h * h * ((1 + kv_ratio + s / h) + ffn_ratio * 1.5 + V / (2 * L * h)) / s
    norms = 0  # norms are elementwise: neither formula counts them
    new = flops_per_token(shape, s, "megatron")
    assert new + 6 * s * L * h == pytest.approx(old + norms, rel=1e-3)


def test_moe_counts_active_experts_only() -> None:
    mixtral = get_model("mixtral-8x7b")
    assert flops_per_token(mixtral, 4096, "6N") == pytest.approx(6 * 12.8799e9, rel=1e-4)


def test_every_convention_is_named_and_unknown_ones_fail() -> None:
    assert set(flops_per_token_all(get_model("tiny-4l"), 256)) == set(CONVENTIONS)
    with pytest.raises(ValueError, match="unknown FLOPs convention"):
        flops_per_token(get_model("tiny-4l"), 256, "hfu")


def test_mfu_is_a_fraction_of_the_dense_peak() -> None:
    assert mfu(1000.0, 1e12, 1e15) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        mfu(1.0, 1.0, 0.0)


# ------------------------------------------------------------------ hardware FLOPs (HFU)

SHAPES = ["tiny-4l", "playbook-1b", "llama-3.1-8b", "mixtral-8x7b"]  # tied, untied, GQA, MoE


@pytest.mark.parametrize("model", SHAPES)
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_without_recomputation_hardware_flops_are_mfus_count(model: str, convention: str) -> None:
    shape = get_model(model)
    assert hardware_flops_per_token(shape, 4096, "none", convention) == flops_per_token(shape, 4096, convention)


@pytest.mark.parametrize("model", SHAPES)
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_full_recomputation_runs_every_layer_forward_once_more(model: str, convention: str) -> None:
    """Layers 4/3, LM head and embedding once: 4/3 × the model FLOPs less a third of the rest."""
    shape, seq = get_model(model), 4096
    model_flops = flops_per_token(shape, seq, convention)
    full = hardware_flops_per_token(shape, seq, "full", convention)
    # the layers' share, derived independently: what a shape with no layers does not count
    outside = flops_per_token(replace(shape, num_layers=0), seq, convention)
    assert layer_flops_per_token(shape, seq, convention) == pytest.approx(model_flops - outside, rel=1e-12)
    assert full - model_flops == pytest.approx((model_flops - outside) / 3, rel=1e-12)
    assert 4 / 3 * model_flops - full == pytest.approx(outside / 3, rel=1e-12)
    assert outside > 0


@pytest.mark.parametrize("convention, forward", [("full_attention", 4), ("megatron", 2), ("6N", 0)])
def test_selective_recomputation_adds_exactly_one_forward_of_the_core_attention(
        convention: str, forward: int) -> None:
    """QK^T and attention·V: 2·s·Q FLOPs each per token and layer (megatron: the causal half)."""
    shape, seq = get_model("llama-3.1-8b"), 8192  # GQA: the scores use the query width Q
    extra = (hardware_flops_per_token(shape, seq, "selective", convention)
             - flops_per_token(shape, seq, convention))
    assert extra == pytest.approx(forward * shape.num_layers * shape.q_dim * seq, rel=1e-12)
    assert extra == pytest.approx(core_attention_flops_per_token(shape, seq, convention) / 3, rel=1e-12)


def test_hardware_flops_by_hand_for_a_small_untied_shape() -> None:
    L, h, F, V, s = 2, 64, 128, 100, 32
    shape = ModelShape(name="hand", num_layers=L, hidden_size=h, num_attention_heads=4, num_kv_heads=4,
                       ffn_hidden_size=F, vocab_size=V, tie_word_embeddings=False)
    per_layer = 4 * h * h + 3 * h * F + 2 * h  # q k v o, gate up down, two norms
    model = 6 * (2 * V * h + L * per_layer + h) + 12 * L * h * s  # full_attention
    layers = 6 * L * per_layer + 12 * L * h * s
    assert flops_per_token(shape, s) == model
    assert hardware_flops_per_token(shape, s, "full") == pytest.approx(model + layers / 3, rel=1e-15)
    assert hardware_flops_per_token(shape, s, "selective") == pytest.approx(model + 4 * L * h * s, rel=1e-15)


def test_recomputation_only_adds() -> None:
    shape = get_model("llama-3.1-8b")
    for convention in ("megatron", "full_attention"):
        none, selective, full = (hardware_flops_per_token(shape, 4096, r, convention)
                                 for r in ("none", "selective", "full"))
        assert none < selective < full < 4 / 3 * none


def test_a_gelu_shape_counts_two_mlp_matrices_and_gives_megatrons_closed_form() -> None:
    """Narayanan et al. 2021 eq. 3 for a GPT layer, model FLOPs per token: 72·l·h²·(1 + s/6h) + 6·V·h
    (attention full, no biases, no position embedding); ours adds the LayerNorm weights only."""
    L, h, V, s = 24, 2048, 50304, 2048
    gpt = gpt_shape("gpt-1b", L, h, 16, V)
    swiglu = ModelShape(**{f: getattr(gpt, f) for f in ModelShape.__dataclass_fields__})
    for convention in CONVENTIONS:
        gap = flops_per_token(swiglu, s, convention) - flops_per_token(gpt, s, convention)
        assert gap == 6 * L * h * 4 * h  # the third matrix ModelShape assumes
    norms = 6 * (2 * h * L + h)
    closed_form = 72 * L * h * h * (1 + s / (6 * h)) + 6 * V * h
    assert flops_per_token(gpt, s, "full_attention") == pytest.approx(closed_form + norms, rel=1e-12)
    hardware = 96 * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))  # eq. 3, per token
    assert hardware_flops_per_token(gpt, s, "full") == pytest.approx(hardware + norms + 2 * h * L * 2, rel=1e-12)
    with pytest.raises(ValueError, match="mlp must be 'swiglu' or 'gelu'"):
        flops_per_token(replace(gpt, mlp="relu2"), s)


def test_unknown_recompute_modes_fail_naming_the_allowed_ones() -> None:
    assert RECOMPUTE_MODES == ("none", "selective", "full")
    with pytest.raises(ValueError, match="unknown recompute mode 'partial'; use one of none, selective, full"):
        hardware_flops_per_token(get_model("tiny-4l"), 256, "partial")
    with pytest.raises(ValueError, match="unknown FLOPs convention"):
        hardware_flops_per_token(get_model("tiny-4l"), 256, "full", "hfu")


def test_hfu_mirrors_mfu() -> None:
    shape, tps = get_model("llama-3.1-8b"), 3000.0
    hardware = hardware_flops_per_token(shape, 4096, "full")
    assert hfu(tps, hardware, PLAYBOOK_PEAK) == pytest.approx(tps * hardware / PLAYBOOK_PEAK)
    assert hfu(tps, hardware, PLAYBOOK_PEAK) > mfu(tps, flops_per_token(shape, 4096), PLAYBOOK_PEAK)
    with pytest.raises(ValueError):
        hfu(1.0, 1.0, 0.0)


# ------------------------------------------------------------------ MoE: active parameters, by hand

# Mixtral-8x7B from its config.json (mistralai/Mixtral-8x7B-v0.1), written out here rather than
# read from the catalog, so that the counts below are a hand computation independent of
# sweep.core.model.count_parameters.
MIX_L, MIX_H, MIX_HEADS, MIX_KV_HEADS, MIX_HEAD_DIM = 32, 4096, 32, 8, 128
MIX_FFN, MIX_VOCAB, MIX_EXPERTS, MIX_TOP_K = 14336, 32000, 8, 2


def _mixtral_by_hand() -> dict[str, int]:
    q, kv = MIX_HEADS * MIX_HEAD_DIM, MIX_KV_HEADS * MIX_HEAD_DIM
    attention = MIX_H * q + 2 * MIX_H * kv + q * MIX_H  # wq, wk, wv, wo
    expert = 3 * MIX_H * MIX_FFN  # w1, w3, w2 (SwiGLU)
    router, norms = MIX_H * MIX_EXPERTS, 2 * MIX_H
    embedding = head = MIX_VOCAB * MIX_H  # untied
    per_layer_active = attention + MIX_TOP_K * expert + router + norms
    per_layer_total = attention + MIX_EXPERTS * expert + router + norms
    return {"q": q, "kv": kv, "attention": attention, "expert": expert, "router": router,
            "norms": norms, "embedding": embedding, "head": head,
            "active": embedding + head + MIX_L * per_layer_active + MIX_H,
            "total": embedding + head + MIX_L * per_layer_total + MIX_H}


def test_the_catalogs_mixtral_is_the_shape_counted_by_hand() -> None:
    shape = get_model("mixtral-8x7b")
    assert (shape.num_layers, shape.hidden_size, shape.num_attention_heads, shape.num_kv_heads,
            shape.head_dim, shape.moe_ffn_hidden_size, shape.vocab_size, shape.num_experts,
            shape.experts_per_token, shape.tie_word_embeddings) == (
        MIX_L, MIX_H, MIX_HEADS, MIX_KV_HEADS, MIX_HEAD_DIM, MIX_FFN, MIX_VOCAB, MIX_EXPERTS,
        MIX_TOP_K, False)
    n = _mixtral_by_hand()
    assert 12.87e9 < n["active"] < 12.89e9 and 46.6e9 < n["total"] < 46.8e9  # "12.9B active of 46.7B"


@pytest.mark.parametrize("seq", [4096, 32768])
def test_moe_flops_count_the_active_experts_under_every_convention(seq: int) -> None:
    """Top-2 of 8 experts: each convention counts two experts' matmuls per token, never eight."""
    n, shape = _mixtral_by_hand(), get_model("mixtral-8x7b")
    attention_full = 12 * MIX_L * n["q"] * seq  # QK^T and attention·V, forward and backward
    by_hand = {
        "6N": 6 * n["active"],
        "full_attention": 6 * n["active"] + attention_full,
        # the input embedding is a lookup, not a matmul; the causal mask halves the core attention
        "megatron": 6 * (n["active"] - n["embedding"]) + attention_full / 2,
    }
    for convention, expected in by_hand.items():
        assert flops_per_token(shape, seq, convention) == pytest.approx(expected, rel=1e-12), convention
    # a dense model with every expert's parameters would count 6·(total - active) more
    assert 6 * (n["total"] - n["active"]) == 6 * MIX_L * (MIX_EXPERTS - MIX_TOP_K) * n["expert"]


def test_the_megatron_convention_is_megatrons_formula_plus_the_router_and_the_norms() -> None:
    """Megatron-LM's num_floating_point_operations (megatron/training/training.py as shipped with
    megatron-core 0.19.2, the transformer_flops branch for GQA, BSHD, no MTP, no shared experts),
    transcribed per token: 3 (forward, wgrad, dgrad) x 2 (FMA) x (the routed experts' MLP
    h·ffn·k·3, the QKV and output projections, the causal half of QK^T and attention·V, the
    logits h·padded_vocab). It counts neither the router's h x E matmul nor the norms' weights,
    which the `megatron` convention counts (6 per parameter, 1e-4 of Mixtral's count); Mixtral's
    32000 needs no vocabulary padding at tp 1 (make_vocab_size_divisible_by 128)."""
    n, shape, seq = _mixtral_by_hand(), get_model("mixtral-8x7b"), 4096
    fb, fma = 3, 2
    mlp = fb * fma * MIX_H * (MIX_FFN * MIX_TOP_K * 3) * MIX_L
    self_attn = fb * fma * (MIX_H * (n["q"] + n["kv"] + n["kv"]) + n["q"] * MIX_H) * MIX_L
    core = fb * fma * n["q"] / 2 * 2 * seq * MIX_L
    logits = fb * fma * MIX_H * MIX_VOCAB
    megatrons = mlp + self_attn + core + logits
    ours = flops_per_token(shape, seq, "megatron")
    assert ours - megatrons == pytest.approx(6 * (MIX_L * (n["router"] + n["norms"]) + MIX_H), rel=1e-9)
    assert 0 < ours / megatrons - 1 < 2e-4


def test_torchtitans_own_moe_count_is_full_attention_less_the_input_embedding() -> None:
    """torchtitan 0.3.0's get_moe_model_nparams_and_flops (torchtitan/models/utils.py): 6 x (dense
    parameters less the embedding, the router, the routed experts x top_k / num_experts) + 6·L·
    n_heads·(2·head_dim)·s. Its active count is ours; its attention term is full_attention's; it
    leaves the input embedding out, which full_attention counts: the MFU it logs is below
    llm-sweep's full_attention MFU by 6·V·h per token."""
    n, shape, seq = _mixtral_by_hand(), get_model("mixtral-8x7b"), 4096
    dense = n["embedding"] + n["head"] + MIX_L * (n["attention"] + n["norms"]) + MIX_H
    experts = MIX_L * MIX_EXPERTS * n["expert"]
    sparse_active = MIX_L * n["router"] + experts * MIX_TOP_K // MIX_EXPERTS
    titans = 6 * (dense - n["embedding"] + sparse_active) + 6 * MIX_L * MIX_HEADS * (2 * MIX_HEAD_DIM) * seq
    assert flops_per_token(shape, seq, "full_attention") - titans == 6 * MIX_VOCAB * MIX_H


def test_moe_mfu_divides_the_active_flops_by_the_dense_peak() -> None:
    """1,500 tokens/s per H100 of Mixtral is 11.7 % MFU under 6N by its 12.9B active
    parameters; counted by all 46.7B it would read 42.5 %."""
    n, shape = _mixtral_by_hand(), get_model("mixtral-8x7b")
    peak = get_gpu("h100-sxm").dense_peak("bf16")
    assert peak == 989.5e12
    value = mfu(1500.0, flops_per_token(shape, 4096, "6N"), peak)
    assert value == pytest.approx(1500.0 * 6 * n["active"] / 989.5e12, rel=1e-12)
    assert value == pytest.approx(0.1171, abs=1e-4)
    assert 1500.0 * 6 * n["total"] / peak == pytest.approx(0.4248, abs=1e-4)
