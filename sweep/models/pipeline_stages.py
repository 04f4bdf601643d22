"""How a framework assigns a model's decoder layers (and its embedding and head blocks) to pipeline
stages: layers and blocks per stage, under each framework's split (`STAGE_SPLITS`).

Both performance models read it. The memory model (sweep.models.memory) needs the layers of the first
and the last stage, its most loaded ranks: the first holds the embedding and the most micro-batches
in flight, the last the LM head and the logits. The throughput model (sweep.models.throughput) needs
the stage with the most layers, which paces the step. The framework adapters check the splits a
framework would refuse: nanotron's stage with no block (`stage_block_counts`) and Megatron's uneven
split (`megatron_extra_layers`).

Each split replays the framework's own rule, cited where it is defined; a split that differs from the
framework's puts the memory on the wrong rank. Pure; the splits are cached per model and stage count.
"""

from __future__ import annotations

import functools
from typing import Final

import numpy as np

from sweep.core.model import ModelShape
from sweep.models.memory_profiles import MemoryProfile, get_profile

__all__ = ["STAGE_SPLITS", "first_last_stage_layers", "megatron_extra_layers", "split_stages",
           "stage_block_counts", "stage_layer_counts"]

STAGE_SPLITS: Final = ("even", "cost", "embedding_blocks", "megatron")


def _layer_cost(model: ModelShape) -> tuple[int, int]:
    """nanotron's block costs (LlamaModel.get_block_compute_costs): decoder layer and LM head."""
    h = model.hidden_size
    layer = 4 * model.num_attention_heads * model.head_dim * h + 3 * model.ffn_hidden_size * h
    return layer, model.vocab_size * h


@functools.cache
def _cost_split(model: ModelShape, pp: int) -> tuple[tuple[int, int], ...]:
    """nanotron's balanced split: (decoder layers, all blocks) per stage.

    Blocks in order: embedding, L decoder layers, final norm, LM head, cast-to-fp32, loss; a block goes
    to the current stage, which closes once the cumulative cost reaches its share (cum >= total*(r+1)/pp,
    the rule of the 2025 playbook runs: 1B at pp=2 puts 10 layers on stage 0).
    """
    layer, head = _layer_cost(model)
    costs = [(0, False)] + [(layer, True)] * model.num_layers + [(0, False), (head, False),
                                                                  (0, False), (0, False)]
    total = layer * model.num_layers + head
    layers = [0] * pp
    blocks = [0] * pp
    rank, cum = 0, 0
    for cost, is_layer in costs:
        cum += cost
        layers[rank] += is_layer
        blocks[rank] += 1
        if rank < pp - 1 and cum * pp >= total * (rank + 1):
            rank += 1
    return tuple(zip(layers, blocks))


@functools.cache
def _even_split(layers: int, pp: int, embedding_blocks: int, head_blocks: int
                ) -> tuple[tuple[int, int], ...]:
    """(decoder layers, blocks) per stage when `embedding_blocks` embedding blocks, the L layers and
    `head_blocks` head blocks are dealt out evenly in that order, the first stages taking one more
    where they do not divide."""
    items = [False] * embedding_blocks + [True] * layers + [False] * head_blocks
    base, extra = divmod(len(items), pp)
    out, start = [], 0
    for rank in range(pp):
        size = base + (1 if rank < extra else 0)
        out.append((sum(items[start:start + size]), size))
        start += size
    return tuple(out)


def megatron_extra_layers(layers: int, stages: int) -> int | None:
    """How many of the loss and the embedding Megatron counts as a layer in its even split: the
    fewest of 0, 1 (--account-for-loss-in-pipeline-split) and 2 (and
    --account-for-embedding-in-pipeline-split) that make the layers divide, as
    templates/launch/megatron.args renders them; None where none does (Megatron refuses the
    split, and the adapter's `pipeline_fits` prunes it)."""
    return next((extra for extra in (0, 1, 2) if (layers + extra) % stages == 0), None)


def split_stages(model: ModelShape, pp: int, split: str) -> tuple[tuple[int, int], ...]:
    """(decoder layers, blocks) on each pipeline stage, under a framework's split (`STAGE_SPLITS`):

    - "cost": nanotron's balanced split by compute cost (`_cost_split`);
    - "even": the layers dealt out evenly, the first stages taking one more (the built-in
      workload; DeepSpeed's partition method "type:transformer", with the embedding on stage 0);
    - "embedding_blocks": the embedding and the LM head count as one layer each (torchtitan 0.2's
      `generate_llm_fqn_per_model_part` with its default pipeline_parallel_first/last_stage_less_layers
      of 1, torchtitan/distributed/pipeline_parallel.py, and 0.3.0's `_generate_llm_fqn_per_model_part`,
      the same function renamed, with the same defaults; DeepSpeed's "type:transformer|embedding");
    - "megatron": Megatron-LM's even split, counting the loss and then the embedding as a layer
      where the layers alone do not divide (`megatron_extra_layers`).
    """
    if split == "cost":
        return _cost_split(model, pp)
    if split == "even":
        return _even_split(model.num_layers, pp, 0, 0)
    if split == "embedding_blocks":
        return _even_split(model.num_layers, pp, 1, 1)
    if split == "megatron":
        extra = megatron_extra_layers(model.num_layers, pp) or 0
        return _even_split(model.num_layers, pp, 1 if extra == 2 else 0, 1 if extra >= 1 else 0)
    raise ValueError(f"unknown stage split {split!r}; known: {', '.join(STAGE_SPLITS)}")


def stage_layer_counts(model: ModelShape, pp: int, profile: str | MemoryProfile = "builtin"
                       ) -> tuple[int, ...]:
    """Decoder layers on each pipeline stage, as the profile's framework splits them."""
    return tuple(n for n, _ in split_stages(model, pp, get_profile(profile).stage_split))


def stage_block_counts(model: ModelShape, pp: int, profile: str | MemoryProfile = "builtin"
                       ) -> tuple[int, ...]:
    """Pipeline blocks per stage; a stage with none cannot run. nanotron counts the embedding, the
    final norm, the LM head, the fp32 cast and the loss as blocks too; torchtitan and Megatron
    (where it accounts for them) the embedding and the head; the even split counts layers."""
    return tuple(b for _, b in split_stages(model, pp, get_profile(profile).stage_split))


def first_last_stage_layers(model: ModelShape, pp: np.ndarray, profile: MemoryProfile
                            ) -> tuple[np.ndarray, np.ndarray]:
    """Decoder layers on the first and on the last pipeline stage, per row of stage counts `pp`,
    as the profile's framework splits them: the stages whose ranks the memory model compares."""
    pp = np.asarray(pp, dtype=np.int64)
    if pp.size == 0:
        return np.zeros(0), np.zeros(0)
    first = np.zeros(int(pp.max()) + 1, dtype=np.float64)  # lookup tables indexed by pp (O(n))
    last = np.zeros_like(first)
    for p in np.flatnonzero(np.bincount(pp)):
        counts = stage_layer_counts(model, int(p), profile)
        first[p], last[p] = counts[0], counts[-1]
    return first[pp], last[pp]
