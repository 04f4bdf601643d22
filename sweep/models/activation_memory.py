"""Activation memory of one rank of a pipeline stage: what the forward keeps for the backward, per
recomputation mode, for the micro-batches the schedule keeps in flight, and the logits and the loss.

- Per layer and token (`layer_activations`): with no recomputation, everything the backward reads
  (the norms, the linears' inputs, q/k/v, the attention output, the MLP's intermediates, and without
  flash attention the s x s scores, Korthikanti et al. 2022); full recomputation keeps the layer's
  input alone; selective keeps what the profile's policy saves. A backward that recomputes one layer
  at a time holds that one layer's full activations beside the kept ones. TP shards the head- and
  FFN-wide tensors, SP (over the TP ranks) the hidden-wide ones, CP the sequence.
- Micro-batches in flight: 1F1B holds pp on the first stage (capped by grad_acc) and 1 on the last,
  GPipe all of them, interleaved 1F1B as Megatron counts it; so under 1F1B the first stage holds
  the most layer activations, and the last the LM head's inputs and the logits.
- The logits and the loss's tensors over them, by the profile's bytes per element; a chunked loss
  holds one chunk's, beside the whole hidden states (and the LM head's whole gradient where FSDP
  reduces it before the step's last micro-batch).

The persistent state, the buffers and the allocator's share are sweep.models.memory's, which adds
these up with them (`StageActivations` is what it reads).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from sweep.core.model import ModelShape, mlp_kind
from sweep.models.memory_config import Layouts, MemoryConfig, fsdp_reduction_deferred
from sweep.models.memory_profiles import MemoryProfile

__all__ = ["LayerActivations", "StageActivations", "first_stage_activations", "last_stage_activations",
           "layer_activations", "logits_at_forward_end", "one_layer_at_a_time"]


def one_layer_at_a_time(masks: Mapping[str, np.ndarray], prof: MemoryProfile) -> np.ndarray:
    """Rows whose layers are recomputed in backward, one layer at a time: full recomputation, and
    selective where the profile's selective policy recomputes more than the attention scores."""
    return masks["full"] | (masks["selective"] & bool(prof.selective_saves))


def _attention_scores_per_token(cfg: MemoryConfig) -> float | np.ndarray:
    """Without flash attention the core attention saves its softmax and the dropout's output, two
    s x s tensors per head (Korthikanti et al. 2022, Sec. 4.1), unless it is recomputed; a
    recomputing backward holds them for the one layer (or core attention) it recomputes."""
    if cfg.prof.flash_attention:
        return 0.0
    lay = cfg.layouts
    return cfg.activation_bytes * 2 * cfg.model.num_attention_heads * (cfg.seq_len / lay.cp) / lay.tp


def _mlp_width(model: ModelShape) -> tuple[float, float]:
    """(experts per token, FFN width of each): a dense MLP is one expert."""
    if model.is_moe:
        return float(model.experts_per_token), float(model.moe_ffn_hidden_size)
    return 1.0, float(model.ffn_hidden_size)


def _saved_per_token(cfg: MemoryConfig) -> np.ndarray:
    """Bytes a layer saves for backward per token when nothing is recomputed: 2 norms, the
    linears' normed inputs (h each), q, k, v, the attention output, the MLP, and (no flash
    attention) the s x s scores."""
    prof, model, lay, a = cfg.prof, cfg.model, cfg.layouts, cfg.activation_bytes
    h, q, kv = float(model.hidden_size), float(model.q_dim), float(model.kv_dim)
    experts, ffn = _mlp_width(model)
    ffn_saved = 2.0 if mlp_kind(model) == "gelu" else 4.0  # GELU: fc1 out, fc2 in; SwiGLU: gate, up, silu, product
    norm = (2.0 if prof.norm_saves_output else 1.0) * cfg.residual_bytes  # per norm
    # a profile whose linears read their input through autocast's casts (one per linear) saves
    # one per norm without it: the linears after a norm share its output
    copies = 2 if prof.autocast_weight_bytes and cfg.full_precision else prof.linear_input_copies
    kv_saved = q if prof.kv_saved_at_query_width else kv
    per_token = ((2 * norm + copies * a) * h / cfg.sequence_shards
                 + a * (2 * q + 2 * kv_saved) / lay.tp + a * ffn_saved * experts * ffn / cfg.mlp_shards
                 + (a * 2 * h * experts / cfg.sequence_shards if model.is_moe else 0.0))  # MoE: permuted tokens
    return per_token + np.where(lay.modes["none"], _attention_scores_per_token(cfg), 0.0)


def _layer_input_per_token(cfg: MemoryConfig) -> np.ndarray:
    """What full recomputation keeps of a layer per token: its input, the residual stream."""
    return cfg.residual_bytes * float(cfg.model.hidden_size) / cfg.sequence_shards


def _kept_per_token(cfg: MemoryConfig) -> np.ndarray:
    """What a layer recomputed one at a time keeps per token: its input, and under the profile's
    selective policy the outputs of its `selective_saves` linears (in a MoE layer its
    `moe_selective_saves`, and the tokens EP's all-to-all moved where it keeps them) and the
    attention output (wo and w2 end in a reduction: hidden-wide)."""
    model, lay, prof = cfg.model, cfg.layouts, cfg.prof
    h, q, kv = float(model.hidden_size), float(model.q_dim), float(model.kv_dim)
    experts, ffn = _mlp_width(model)
    output_width = {"wq": q / lay.tp, "wk": kv / lay.tp, "wv": kv / lay.tp,
                    "wo": h / cfg.sequence_shards, "w1": experts * ffn / cfg.mlp_shards,
                    "w3": experts * ffn / cfg.mlp_shards, "w2": h / cfg.sequence_shards}
    saves = prof.moe_selective_saves if model.is_moe and prof.moe_selective_saves is not None \
        else prof.selective_saves
    kept = _layer_input_per_token(cfg) + cfg.activation_bytes * (
        q / lay.tp + sum(output_width[name] for name in saves))
    if model.is_moe and prof.selective_keeps_dispatch:  # dispatched and combined, k per token
        kept = kept + np.where(lay.ep > 1, cfg.activation_bytes * 2 * h * experts / cfg.mlp_shards,
                               0.0)
    return kept


@dataclass(frozen=True, eq=False)
class LayerActivations:
    """Activation bytes of one micro-batch on one rank."""

    stored: np.ndarray  # what each layer keeps until its backward, by recomputation mode
    working: np.ndarray  # what a recomputing backward holds beside them: the one layer's
    head_inputs: np.ndarray  # the final norm's and the LM head's inputs


def layer_activations(cfg: MemoryConfig) -> LayerActivations:
    """One micro-batch's activations of a layer on one rank, by each row's recomputation mode."""
    modes, tokens = cfg.layouts.modes, cfg.tokens
    saved = _saved_per_token(cfg)
    one_at_a_time = one_layer_at_a_time(modes, cfg.prof)
    stored = np.where(modes["full"], _layer_input_per_token(cfg),
                      np.where(one_at_a_time, _kept_per_token(cfg), saved))
    working = (np.where(one_at_a_time, saved * tokens, 0.0)
               + np.where(modes["none"], 0.0, _attention_scores_per_token(cfg) * tokens))
    head_inputs = ((cfg.residual_bytes + cfg.activation_bytes) * float(cfg.model.hidden_size)
                   / cfg.sequence_shards * tokens)
    return LayerActivations(stored * tokens, working, head_inputs)


# Micro-batches in flight: 1F1B holds pp on the first stage (capped by grad_acc) and 1 on the
# last; GPipe holds all; interleaved 1F1B follows Megatron: pp * (1 + (pp-1)/(pp*vpp)) on the
# first.

def _first_stage_in_flight(lay: Layouts) -> np.ndarray:
    interleaved = lay.modes["interleaved_1f1b"] & (lay.vpp > 1)
    ga, pp, vpp = lay.grad_acc, lay.pp, lay.vpp
    in_flight = np.where(lay.modes["gpipe"], ga, np.where(
        interleaved, np.minimum(ga, pp + (pp - 1) / vpp), np.minimum(ga, pp)))
    return np.where(lay.single_stage, 1.0, in_flight)


def _last_stage_in_flight(lay: Layouts) -> np.ndarray:
    interleaved = lay.modes["interleaved_1f1b"] & (lay.vpp > 1)
    ga, pp, vpp = lay.grad_acc, lay.pp, lay.vpp
    in_flight = np.where(lay.modes["gpipe"], ga, np.where(
        interleaved, np.minimum(ga, ((vpp - 1) * pp + 1) / vpp), 1.0))
    return np.maximum(in_flight, 1.0)


def _logits(cfg: MemoryConfig) -> np.ndarray:
    """The logits and the loss's tensors over them, at the backward's peak: under a chunked loss
    one chunk's (`MemoryProfile.loss_chunks`), beside what that loss holds for its whole loop."""
    prof = cfg.prof
    logits = (cfg.tokens / prof.loss_chunks * cfg.model.vocab_size / cfg.layouts.tp
              * prof.logits_bytes_per_element)
    return logits + _chunked_loss_held(cfg) if prof.loss_chunks > 1 else logits


def _chunked_loss_held(cfg: MemoryConfig) -> np.ndarray:
    """What a chunked loss holds over its loop of chunks: buffers of the whole hidden states
    (replicated over TP, so not sharded by SP), and under FSDP whose reduction is not deferred
    anyway, the LM head's whole gradient."""
    prof, lay = cfg.prof, cfg.layouts
    hidden = prof.loss_hidden_bytes_per_element * cfg.tokens * float(cfg.model.hidden_size)
    syncs_off = (lay.zero_stage >= 2) & ~fsdp_reduction_deferred(prof, lay.zero_stage, lay.pp,
                                                                  lay.grad_acc)
    return hidden + np.where(syncs_off, prof.loss_head_grad_bytes * cfg.vocabulary_matrix, 0.0)


def logits_at_forward_end(cfg: MemoryConfig) -> np.ndarray:
    """What the loss holds at the end of a single stage's forward (beside every weight cast:
    `_autocast_casts`)."""
    lay = cfg.layouts
    return np.where(lay.single_stage, cfg.tokens * float(cfg.model.vocab_size) / lay.tp
                    * cfg.prof.logits_forward_bytes_per_element, 0.0)


@dataclass(frozen=True, eq=False)
class StageActivations:
    """What one rank of a pipeline stage holds for its micro-batches in flight."""

    activations: np.ndarray
    logits: np.ndarray
    in_flight: np.ndarray  # micro-batches


def first_stage_activations(cfg: MemoryConfig, layers: np.ndarray, layer: LayerActivations
                            ) -> StageActivations:
    """The first stage's layers for its micro-batches in flight; with one stage, the head's
    inputs and the logits too."""
    single = cfg.layouts.single_stage
    in_flight = _first_stage_in_flight(cfg.layouts)
    activations = (layer.stored * layers * in_flight + layer.working
                   + np.where(single, layer.head_inputs, 0.0))
    return StageActivations(activations, np.where(single, _logits(cfg), 0.0), in_flight)


def last_stage_activations(cfg: MemoryConfig, layers: np.ndarray, layer: LayerActivations
                           ) -> StageActivations:
    """The last stage's layers for its micro-batches in flight, the head's inputs and the logits."""
    in_flight = _last_stage_in_flight(cfg.layouts)
    activations = layer.stored * layers * in_flight + layer.working + layer.head_inputs
    return StageActivations(activations, _logits(cfg), in_flight)
