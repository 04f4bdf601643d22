"""The decoder: exact parameter counts, causality, RoPE, GQA, tied embeddings, deterministic init."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sweep.catalog import get_model
from sweep.model import count_parameters
from sweep.workload.model import Transformer, apply_rope, cross_entropy, init_weights, rope_tables


def built(name: str, seed: int = 0) -> Transformer:
    model = Transformer(get_model(name))
    init_weights(model, seed)
    return model


@pytest.mark.parametrize("name", ["tiny-4l", "tiny-gqa-4l"])
def test_parameter_count_matches_the_planner(name: str) -> None:
    model = built(name)
    unique = sum(p.numel() for p in model.parameters())  # a tied weight is one Parameter
    assert unique == count_parameters(get_model(name)).total


def test_tied_embeddings_share_one_tensor_and_untied_do_not() -> None:
    tied, untied = built("tiny-gqa-4l"), built("tiny-4l")
    assert tied.output.weight is tied.tok_embeddings.weight
    assert untied.output.weight is not untied.tok_embeddings.weight


def test_gqa_projections_are_narrower_for_keys_and_values() -> None:
    shape = get_model("tiny-gqa-4l")
    attention = built("tiny-gqa-4l").layers["0"].attention
    assert attention.wq.weight.shape == (shape.q_dim, shape.hidden_size)
    assert attention.wk.weight.shape == (shape.kv_dim, shape.hidden_size) and shape.kv_dim < shape.q_dim


@pytest.mark.parametrize("name", ["tiny-4l", "tiny-gqa-4l"])
def test_the_model_is_causal(name: str) -> None:
    model = built(name).eval()
    tokens = torch.randint(0, 1024, (1, 16), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[0, 10] = (changed[0, 10] + 1) % 1024
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.equal(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_rope_rotates_without_changing_length_and_depends_on_position() -> None:
    x = torch.randn(2, 8, 4, 64)
    cos, sin = rope_tables(64, torch.arange(8))
    rotated = apply_rope(x, cos, sin)
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert torch.allclose(rotated[:, 0], x[:, 0])  # position 0 is the identity
    assert not torch.allclose(rotated[:, 1:], x[:, 1:])


def test_init_is_deterministic_per_seed() -> None:
    a, b, c = built("tiny-4l", 7), built("tiny-4l", 7), built("tiny-4l", 8)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name


def test_the_initial_loss_is_about_log_vocab() -> None:
    model = built("tiny-4l")
    tokens = torch.randint(0, 1024, (2, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        loss = cross_entropy(model(tokens), tokens)
    assert loss.item() == pytest.approx(torch.log(torch.tensor(1024.0)).item(), abs=0.1)


def test_moe_shapes_are_refused_with_the_reason() -> None:
    moe = dataclasses.replace(get_model("tiny-4l"), num_experts=4, experts_per_token=2)
    with pytest.raises(ValueError, match="dense models only"):
        Transformer(moe)
