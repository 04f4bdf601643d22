"""FLOPs per token under each named convention, checked against published runs."""

from __future__ import annotations

import pandas as pd
import pytest

from sweep.catalog import get_gpu, get_model
from sweep.flops import CONVENTIONS, flops_per_token, flops_per_token_all, mfu

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
