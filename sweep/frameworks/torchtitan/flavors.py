"""Which of our model shapes torchtitan 0.2 has a definition for: its llama3 flavors.

torchtitan 0.2 builds a model from a (name, flavor) pair; its command line cannot describe a model
by its dimensions (0.3.0 and main can: launch/torchtitan.config.py builds any model). A run of a model is therefore only renderable when one of its flavors has
exactly the model's shape; every other model is pruned (`capabilities.no_flavor`), never run as
some other model under its name.

The flavors are `llama3_args` in torchtitan/models/llama3/__init__.py (identical at v0.2.0
29624e37f, v0.2.1 81af8833d and v0.2.2 73a0e6979 for these three): dim, n_layers, n_heads,
n_kv_heads, ffn_dim_multiplier, multiple_of, rope_theta=500000, vocab_size=128256 (the default of
TransformerModelArgs, model/args.py) and llama 3.1 RoPE scaling (RoPEScalingArgs: factor 8,
low 1, high 4, original 8192). The feed-forward width follows FeedForward.__init__
(model/model.py): hidden = 4·dim, then int(2·hidden/3), times ffn_dim_multiplier, rounded up to
multiple_of. Heads are dim // n_heads wide; the output projection is its own weight (untied).
The contract test recomputes this table from the installed torchtitan sources.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sweep.core.model import ModelShape

MODEL_NAME: Final = "llama3"  # torchtitan's --model.name of every flavor below
LLAMA3_VOCAB: Final = 128256  # TransformerModelArgs.vocab_size default


@dataclass(frozen=True)
class Flavor:
    """One llama3 flavor as torchtitan defines it (the arguments of its TransformerModelArgs)."""

    name: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim_multiplier: float
    multiple_of: int
    vocab_size: int = LLAMA3_VOCAB

    @property
    def ffn_hidden_size(self) -> int:
        """FeedForward's hidden width, computed as torchtitan computes it."""
        hidden = int(2 * (4 * self.dim) / 3)
        hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def shape_key(self) -> tuple[int, ...]:
        return (self.n_layers, self.dim, self.n_heads, self.n_kv_heads, self.head_dim,
                self.ffn_hidden_size, self.vocab_size)


# The three full-size flavors with dense softmax attention (sdpa). The *_flex / *_varlen variants
# of 8B change only the attention kernel and masking (block-causal over documents), which is not
# what a plain causal run of the model is; debugmodel is a 6-layer test model.
LLAMA3_FLAVORS: Final[tuple[Flavor, ...]] = (
    Flavor("8B", dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.3,
           multiple_of=1024),
    Flavor("70B", dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim_multiplier=1.3,
           multiple_of=4096),
    Flavor("405B", dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, ffn_dim_multiplier=1.2,
           multiple_of=4096),
)


def model_key(model: ModelShape) -> tuple[int, ...]:
    """The dimensions a flavor must match (the same order as Flavor.shape_key)."""
    return (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_kv_heads,
            model.head_dim, model.ffn_hidden_size, model.vocab_size)


def flavor_for(model: ModelShape) -> Flavor | None:
    """The llama3 flavor with exactly this model's shape, or None (no torchtitan definition).

    A tied-embedding or mixture-of-experts model never matches: llama3's output projection is
    untied and its feed-forward is dense.
    """
    if model.tie_word_embeddings or model.num_experts:
        return None
    key = model_key(model)
    return next((flavor for flavor in LLAMA3_FLAVORS if flavor.shape_key() == key), None)


def template_table() -> dict[str, str]:
    """shape key ("32x4096x...") -> flavor name, as the launch template spells the lookup."""
    return {"x".join(map(str, flavor.shape_key())): flavor.name for flavor in LLAMA3_FLAVORS}
