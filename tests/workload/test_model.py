"""The decoder: exact parameter counts, causality, RoPE, GQA, tied embeddings, deterministic init,
and a pipeline stage built alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sweep.core.catalog import get_model
from sweep.core.model import count_parameters
from sweep.workload.model import Transformer, apply_rope, build, cross_entropy, rope_tables


def built(name: str, seed: int = 0, **stage: int) -> Transformer:
    return build(get_model(name), seed, **stage)


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


def test_a_stage_built_alone_holds_only_its_part_with_the_whole_models_values() -> None:
    """Each rank builds only its pipeline stage, and draws each parameter from a generator seeded
    by the parameter's global name, so every layout starts from the same weights."""
    whole = dict(built("tiny-4l", 7).named_parameters())
    first = dict(built("tiny-4l", 7, stage=0, num_stages=2).named_parameters())
    last = dict(built("tiny-4l", 7, stage=1, num_stages=2).named_parameters())
    assert {n.split(".")[1] for n in first if n.startswith("layers.")} == {"0", "1"}
    assert {n.split(".")[1] for n in last if n.startswith("layers.")} == {"2", "3"}
    assert "tok_embeddings.weight" in first and "output.weight" not in first
    assert "output.weight" in last and "tok_embeddings.weight" not in last
    assert set(first) | set(last) == set(whole) and not set(first) & set(last)
    for name, value in (first | last).items():
        assert torch.equal(value, whole[name]), name


def test_the_build_keeps_a_tied_embedding_tied_and_the_init_scale() -> None:
    tied = built("tiny-gqa-4l")
    assert tied.output.weight is tied.tok_embeddings.weight
    std = tied.layers["0"].attention.wq.weight.std().item()
    assert std == pytest.approx(0.02, rel=0.05)
    assert not any(p.is_meta for p in tied.parameters())


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
