"""Model shapes and exact parameter counts.

Pure: no I/O. Shapes come from the catalog (`sweep.core.catalog`) or from a spec's inline shape.
Counts are exact for a Llama-style decoder: RMSNorm (one weight vector per norm, no bias),
no biases in linear layers, GQA attention, SwiGLU MLP (three matrices), and an optional
mixture of experts that replaces the MLP of every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    num_experts: int = 0  # 0: dense MLP
    experts_per_token: int = 0
    moe_ffn_hidden_size: int = 0  # 0: ffn_hidden_size
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_experts and self.moe_ffn_hidden_size == 0:
            object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_dim(self) -> int:
        """Width of the query projection (Q in Megatron's notation)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of one of the K or V projections (K in Megatron's notation)."""
        return self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts by part. `total` counts a tied embedding once."""

    embedding: int  # input embedding (= LM head when tied)
    lm_head: int  # 0 when tied
    attention_per_layer: int
    mlp_per_layer: int  # all experts, plus the router
    mlp_active_per_layer: int  # the experts a token goes through, plus the router
    norms_per_layer: int
    final_norm: int
    num_layers: int

    @property
    def per_layer(self) -> int:
        return self.attention_per_layer + self.mlp_per_layer + self.norms_per_layer

    @property
    def blocks(self) -> int:
        return self.num_layers * self.per_layer

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.blocks + self.final_norm

    @property
    def active(self) -> int:
        """Parameters one token uses: all of them for a dense model, top-k experts for MoE."""
        per_layer = self.attention_per_layer + self.mlp_active_per_layer + self.norms_per_layer
        return self.embedding + self.lm_head + self.num_layers * per_layer + self.final_norm

    @property
    def matmul_total(self) -> int:
        """Parameters that take part in a matmul: the input embedding is a lookup, not a matmul.

        A tied model still multiplies by its embedding matrix once, in the LM head.
        """
        head = self.lm_head if self.lm_head else self.embedding
        return head + self.blocks

    @property
    def matmul_active(self) -> int:
        head = self.lm_head if self.lm_head else self.embedding
        return head + self.active - self.embedding - self.lm_head


def mlp_kind(shape: ModelShape) -> str:
    """"swiglu" (the catalog's Llama-style shapes) or "gelu" (GPT, BLOOM, MPT: two matrices, no
    gate). ModelShape has no such field yet: a shape that carries `mlp = "gelu"`
    (`sweep.validation.memory_reference.GeluShape`) is one; `count_parameters` counts three matrices either way,
    so the memory model and the FLOPs count take the third off for it."""
    kind = getattr(shape, "mlp", "swiglu")
    if kind not in ("swiglu", "gelu"):
        raise ValueError(f"model {shape.name!r}: mlp must be 'swiglu' or 'gelu', got {kind!r}")
    if kind == "gelu" and shape.is_moe:
        raise ValueError(f"model {shape.name!r}: a GELU MLP with experts is not modelled")
    return kind


def count_parameters(shape: ModelShape) -> ParamCount:
    h = shape.hidden_size
    attention = h * shape.q_dim + 2 * h * shape.kv_dim + shape.q_dim * h
    if shape.is_moe:
        expert = 3 * h * shape.moe_ffn_hidden_size
        router = h * shape.num_experts
        mlp = shape.num_experts * expert + router
        mlp_active = shape.experts_per_token * expert + router
    else:
        mlp = mlp_active = 3 * h * shape.ffn_hidden_size
    embedding = shape.vocab_size * h
    return ParamCount(
        embedding=embedding,
        lm_head=0 if shape.tie_word_embeddings else embedding,
        attention_per_layer=attention,
        mlp_per_layer=mlp,
        mlp_active_per_layer=mlp_active,
        norms_per_layer=2 * h,
        final_norm=h,
        num_layers=shape.num_layers,
    )


def shape_problems(shape: ModelShape) -> list[str]:
    """Reasons a shape cannot be built, as `field: fix` sentences (empty when sound)."""
    problems = []
    for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                 "ffn_hidden_size", "vocab_size", "head_dim"):
        if getattr(shape, name) <= 0:
            problems.append(f"{name}: must be a positive integer, got {getattr(shape, name)}")
    if shape.num_attention_heads > 0 and shape.num_kv_heads > 0:
        if shape.num_attention_heads % shape.num_kv_heads:
            problems.append(
                f"num_kv_heads: must divide num_attention_heads ({shape.num_attention_heads}), "
                f"got {shape.num_kv_heads}")
    if shape.num_experts < 0 or shape.experts_per_token < 0:
        problems.append("num_experts/experts_per_token: must be >= 0")
    if shape.num_experts and not 0 < shape.experts_per_token <= shape.num_experts:
        problems.append(
            f"experts_per_token: must be between 1 and num_experts ({shape.num_experts}), "
            f"got {shape.experts_per_token}")
    return problems
