"""The memory model's activations for the built-in workload are what its layers really save.

PyTorch's MemTracker counts, after the forward pass, the bytes each layer keeps for backward
(bf16 autocast on CPU: the same ops and saved tensors as on CUDA; and fp32, without autocast). The per-layer slope (three
layers against one) must equal the `builtin` profile's stored bytes per layer, for each
recomputation mode. Autocast keeps its bf16 weight casts cached until the forward's autocast
region ends, so they are in the count and are taken out here (the model counts them as buffers,
held until backward only where the layer is not recomputed).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sweep.core.catalog import get_model
from sweep.core.layout import Layout
from sweep.core.model import ModelShape, count_parameters
from sweep.models.memory import estimate
from sweep.workload.memory_tracking import tracked_peak
from sweep.workload.model import build, cross_entropy
from sweep.workload.parallel import apply_recompute

MBS, SEQ = 2, 128
SHAPES = {
    "gqa": dataclasses.replace(get_model("tiny-gqa-4l"), tie_word_embeddings=False, ffn_hidden_size=1024),
    "wide-mlp": dataclasses.replace(get_model("tiny-4l"), ffn_hidden_size=2048),
}


def held_after_forward(shape: ModelShape, recompute: str, dtype: str) -> int:
    model = build(shape, 1)
    apply_recompute(model, recompute)
    optimizer = torch.optim.AdamW(model.parameters())
    tokens = torch.randint(0, shape.vocab_size, (MBS, SEQ), generator=torch.Generator().manual_seed(0))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = cross_entropy(model(tokens), tokens)
        loss.backward()

    return tracked_peak(lambda _: step(), [model], optimizer)["activations_after_forward"]


def predicted(shape: ModelShape, recompute: str, dtype: str = "bf16") -> float:
    layout = Layout(dp=1, tp=1, pp=1, mbs=MBS, recompute=recompute)
    return float(estimate(shape, layout, seq_len=SEQ, dtype=dtype,
                          profile="builtin").components["activations"])


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_bytes_saved_per_layer_match_the_builtin_profile(name: str, recompute: str, dtype: str) -> None:
    one, three = (dataclasses.replace(SHAPES[name], num_layers=n) for n in (1, 3))
    # bf16 weight casts, cached by autocast until it exits; fp32 runs without autocast
    weight_casts = 2 * count_parameters(one).per_layer if dtype == "bf16" else 0
    measured = (held_after_forward(three, recompute, dtype)
                - held_after_forward(one, recompute, dtype)) / 2
    model = (predicted(three, recompute, dtype) - predicted(one, recompute, dtype)) / 2
    assert measured - weight_casts == pytest.approx(model, rel=0.01), (
        f"measured {measured - weight_casts:.0f} B per layer, the builtin profile says {model:.0f}")


def test_selective_recomputation_keeps_less_than_none_and_more_than_full() -> None:
    """The built-in workload's selective policy (keep matmul and attention outputs) saves memory
    even with flash attention, unlike Megatron's, which only drops the s² attention scores."""
    shape = get_model("llama-3.2-1b")
    act = {profile: {r: estimate(shape, Layout(dp=1, tp=1, pp=1, mbs=4, recompute=r), seq_len=4096,
                                 profile=profile).components["activations"]
                     for r in ("none", "selective", "full")} for profile in ("builtin", "megatron")}
    assert act["builtin"]["full"] < act["builtin"]["selective"] < 0.6 * act["builtin"]["none"]
    assert act["megatron"]["selective"] == act["megatron"]["none"]
