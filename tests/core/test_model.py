"""Exact parameter counts of the catalog models."""

from __future__ import annotations

import csv

import pytest

from sweep.core.catalog import get_model
from sweep.core.model import ModelShape, count_parameters, shape_problems


@pytest.mark.parametrize("name, billions", [
    ("playbook-1b", "1.34"), ("playbook-3b", "3.57"), ("playbook-8b", "8.86"), ("playbook-80b", "80.0"),
])
def test_playbook_models_have_their_published_sizes(name: str, billions: str) -> None:
    total = count_parameters(get_model(name)).total
    decimals = len(billions.split(".")[1])  # as precise as the published label, no more
    assert f"{total / 1e9:.{decimals}f}" == billions


def test_playbook_shapes_match_the_reference_csv(refdata) -> None:
    """The catalog holds the shapes of model_architectures.csv exactly."""
    rows = {r["model"]: r for r in csv.DictReader(open(refdata / "model_architectures.csv"))}
    for label, name in [("playbook-sweep 1B", "playbook-1b"), ("playbook-sweep 3B", "playbook-3b"),
                        ("playbook-sweep 8B", "playbook-8b"),
                        ("playbook-sweep 80B (70B shape, MHA)", "playbook-80b")]:
        row, shape = rows[label], get_model(name)
        assert shape.num_layers == int(row["num_layers"])
        assert shape.hidden_size == int(row["hidden_size"])
        assert shape.num_attention_heads == int(row["num_attention_heads"])
        assert shape.num_kv_heads == int(row["num_kv_heads"])
        assert shape.head_dim == int(row["head_dim"])
        assert shape.ffn_hidden_size == int(row["ffn_hidden_size"])
        assert shape.vocab_size == int(row["vocab_size"])
        assert shape.tie_word_embeddings == (row["tie_word_embeddings"] == "true")
        # nanotron's estimate leaves out the norms; ours counts them exactly.
        params = count_parameters(shape)
        norms = shape.num_layers * 2 * shape.hidden_size + shape.hidden_size
        assert params.total - norms == int(row["params_total_computed"])


def test_tied_embedding_is_counted_once() -> None:
    tied, untied = get_model("playbook-1b"), get_model("playbook-8b")
    assert count_parameters(tied).lm_head == 0
    assert count_parameters(untied).lm_head == count_parameters(untied).embedding


def test_gqa_shrinks_kv_projections() -> None:
    llama = count_parameters(get_model("llama-3.1-8b"))
    h, kv = 4096, 8 * 128
    assert llama.attention_per_layer == 2 * h * h + 2 * h * kv
    assert abs(llama.total - 8.03e9) / 8.03e9 < 0.005  # Meta's published 8.03 B


def test_llama_405b_and_mixtral_totals() -> None:
    assert abs(count_parameters(get_model("llama-3.1-405b")).total - 405.85e9) < 0.01e9
    mixtral = count_parameters(get_model("mixtral-8x7b"))
    assert abs(mixtral.total - 46.70e9) < 0.01e9  # Mistral AI: 46.7 B total
    assert abs(mixtral.active - 12.88e9) < 0.01e9  # and 12.9 B active (2 of 8 experts)


def test_cpu_test_shape_matches_the_measured_note() -> None:
    assert count_parameters(get_model("tiny-4l")).total == 3_934_464  # notes/torch-cpu.md


def test_unsound_shapes_are_explained() -> None:
    shape = ModelShape(name="x", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=3,
                       ffn_hidden_size=128, vocab_size=100, tie_word_embeddings=False)
    assert any("num_kv_heads" in p for p in shape_problems(shape))
