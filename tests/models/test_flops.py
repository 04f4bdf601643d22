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
