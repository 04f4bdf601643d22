"""The checks nanotron makes after its strict loader has built the config: the __post_init__
asserts and the model-building asserts that decide whether a layout runs, replayed on the loaded
dict (each `Check` names the file and commit it is read from), and `validate`, which runs the
loader (sweep.frameworks.nanotron.config_schema) and then these.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from sweep.frameworks.nanotron.config_schema import (
    LLAMA_MAIN,
    LOG_LEVELS,
    MAIN,
    PLAYBOOK,
    SCHEMAS,
    ConfigError,
    check_types,
)


@dataclass(frozen=True)
class Check:
    """One assert nanotron makes after loading (where: file @commit), on the loaded dict."""

    where: str
    problem: Callable[[Mapping[str, Any], int | None], str | None]
    versions: tuple[str, ...] = (MAIN, PLAYBOOK)


def _get(d: Mapping[str, Any], path: str, default: Any = None) -> Any:
    for key in path.split("."):
        if not isinstance(d, Mapping) or key not in d:
            return default
        d = d[key]
    return d


def _world(d: Mapping[str, Any], with_cp: bool, with_ep: bool) -> int:
    p = d["parallelism"]
    return (p["dp"] * p["tp"] * p["pp"] * (p.get("context_parallel_size", 1) if with_cp else 1)
            * (p.get("expert_parallel_size", 1) if with_ep else 1))


def _world_size_main(d: Mapping[str, Any], world: int | None) -> str | None:
    product = _world(d, with_cp=True, with_ep=False)
    return None if world is None or product == world else (
        f"parallelism: TP*CP*DP*PP = {product} != WORLD_SIZE={world} (expert_parallel_size is "
        "not part of nanotron's product)")


def _world_size_old(d: Mapping[str, Any], world: int | None) -> str | None:
    product = _world(d, with_cp=False, with_ep=True)
    return None if world is None or product == world else (
        f"parallelism: TP*PP*EP*DP = {product} != WORLD_SIZE={world}")


def _log_levels(d: Mapping[str, Any], world: int | None) -> str | None:
    bad = [k for k in ("log_level", "log_level_replica")
           if _get(d, f"logging.{k}") not in (None, *LOG_LEVELS)]
    return f"logging.{bad[0]}: must be one of {list(LOG_LEVELS)}" if bad else None


def _lr_styles(d: Mapping[str, Any], world: int | None) -> str | None:
    sched = _get(d, "optimizer.learning_rate_scheduler")
    if sched is None:
        return None
    if sched.get("lr_warmup_style") not in ("linear", "constant"):  # checked before its default
        return "optimizer.learning_rate_scheduler.lr_warmup_style: must be 'linear' or 'constant'"
    if sched.get("lr_decay_style") not in (None, "linear", "cosine", "1-sqrt"):
        return "optimizer.learning_rate_scheduler.lr_decay_style: must be linear, cosine or 1-sqrt"
    return None


def _data_stages(d: Mapping[str, Any], world: int | None) -> str | None:
    stages = d.get("data_stages")
    if stages is None:
        return None
    starts = [s["start_training_step"] for s in stages]
    names = [s["name"] for s in stages]
    if any(s < 0 for s in starts):
        return "data_stages[].start_training_step: must be >= 0"
    if 1 not in starts:
        return "data_stages: you must have a training stage starting at 1"
    if len(set(names)) != len(names) or len(set(starts)) != len(starts):
        return "data_stages: stage names and starting steps must be unique"
    return None


def _heads(d: Mapping[str, Any], world: int | None, kv_at_least_tp: bool) -> str | None:
    llama, tp = d["model"]["model_config"], d["parallelism"]["tp"]
    heads = llama.get("num_attention_heads", 32)
    kv = llama.get("num_key_value_heads") or heads
    if heads % tp:
        return f"model.model_config.num_attention_heads ({heads}) must be divisible by tp ({tp})"
    if heads % kv:
        return f"model.model_config.num_attention_heads ({heads}) must be divisible by num_key_value_heads ({kv})"
    if kv % tp or (kv_at_least_tp and kv < tp):
        return f"model.model_config.num_key_value_heads ({kv}) must be divisible by tp ({tp})"
    return None


def _is_qwen2(d: Mapping[str, Any]) -> bool:
    """Whether `model.model_config` loads as a Qwen2Config: dacite tries LlamaConfig first, and
    the schema has passed, so a dict that is no LlamaConfig is a Qwen2Config (main only)."""
    return bool(check_types(LLAMA_MAIN, d["model"]["model_config"], "model_config"))


def _moe_config(d: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Qwen2Config's `moe_config`, or None (a LlamaConfig, or a Qwen2 model without experts)."""
    return d["model"]["model_config"].get("moe_config") if _is_qwen2(d) else None


def _moe_layers(d: Mapping[str, Any]) -> set[int]:
    """The layers Qwen2DecoderLayer builds a Qwen2MoELayer for (`layers: [-1]`, the default, is
    every layer: Qwen2Config.__post_init__)."""
    moe = _moe_config(d)
    if moe is None:
        return set()
    layers = moe.get("layers", [-1])
    depth = d["model"]["model_config"].get("num_hidden_layers", 32)
    return set(range(depth)) if layers == [-1] else set(layers)


def _ffn(d: Mapping[str, Any], world: int | None) -> str | None:
    """The TP-sharded MLPs' widths: the dense MLP of every layer that has no experts, and a
    Qwen2 MoE layer's shared expert; the experts themselves are not TP-sharded (nn/moe.py)."""
    config, tp = d["model"]["model_config"], d["parallelism"]["tp"]
    moe = _moe_config(d) or {}
    widths = {}
    if len(_moe_layers(d)) < config.get("num_hidden_layers", 32):
        widths["intermediate_size"] = config.get("intermediate_size", 11008)
    if moe.get("enable_shared_expert", False):
        widths["moe_config.shared_expert_intermediate_size"] = moe.get(
            "shared_expert_intermediate_size", 5632)
    bad = [(key, width) for key, width in widths.items() if width % tp]
    return None if not bad else (
        f"model.model_config.{bad[0][0]} ({bad[0][1]}) must be divisible by tp ({tp})")


def _moe_post_init(d: Mapping[str, Any], world: int | None) -> str | None:
    moe = _moe_config(d)
    if moe is None:
        return None
    top_k, experts = moe.get("top_k", 2), moe.get("num_experts", 8)
    if top_k > experts:
        return (f"model.model_config.moe_config.top_k ({top_k}) cannot be greater than "
                f"num_experts ({experts})")
    dispatcher = moe.get("token_dispatcher_type", "alltoall")
    if dispatcher not in ("alltoall", "allgather"):
        return ("model.model_config.moe_config.token_dispatcher_type must be one of "
                f"['alltoall', 'allgather'], got {dispatcher!r}")
    return None


def _qwen2_post_init(d: Mapping[str, Any], world: int | None) -> str | None:
    if not _is_qwen2(d):
        return None
    config = d["model"]["model_config"]
    attention = config.get("_attn_implementation", "flash_attention_2")
    ring = attention == "llama3_ring_attention"
    if config.get("sliding_window_size") is not None and attention not in (
            "flex_attention", "flash_attention_2", "llama3_ring_attention"):
        return "model.model_config.sliding_window_size: only with flex or flash attention 2"
    if config.get("flex_attention_mask") is not None and attention != "flex_attention":
        return "model.model_config.flex_attention_mask: only with flex_attention"
    no_rope = config.get("no_rope_layer")
    if no_rope is not None and config.get("num_hidden_layers", 32) % no_rope:
        return "model.model_config.no_rope_layer must divide num_hidden_layers"
    if (config.get("ring_attn_heads_k_stride") is None) == ring:
        return ("model.model_config.ring_attn_heads_k_stride: must be set exactly for "
                "llama3_ring_attention")
    return None


def _expert_parallel_main(d: Mapping[str, Any], world: int | None) -> str | None:
    """ep > 1 never starts, whatever the world size: ParallelContext asserts TP*CP*DP*PP ==
    WORLD_SIZE and then reshapes the ranks to (ep, pp, dp, cp, tp)."""
    ep = d["parallelism"].get("expert_parallel_size", 1)
    return None if ep == 1 else (
        f"parallelism.expert_parallel_size ({ep}): ParallelContext asserts TP*CP*DP*PP == "
        "WORLD_SIZE, then lays the ranks out as (ep, pp, dp, cp, tp), which only ep = 1 "
        "satisfies; nor does the MoE layer send tokens to experts on other ranks")


def _qwen2_pipeline(d: Mapping[str, Any], world: int | None) -> str | None:
    pp = d["parallelism"]["pp"]
    return None if pp == 1 or not _is_qwen2(d) else (
        f"parallelism.pp ({pp}): Qwen2Model.forward calls position_ids.numel(), and on every "
        "pipeline rank but the first position_ids is a TensorPointer")


def _moe_needs_bfloat16(d: Mapping[str, Any], world: int | None) -> str | None:
    dtype = d["model"].get("dtype") or "bfloat16"
    return None if not _moe_layers(d) or dtype == "bfloat16" else (
        f"model.dtype ({dtype}): the experts' grouped GEMM (grouped_gemm ops.gmm) takes "
        "bfloat16 only")


def _async_needs_reduce_scatter(d: Mapping[str, Any], world: int | None) -> str | None:
    p = d["parallelism"]
    mode = (p.get("tp_mode") or "ALL_REDUCE").upper()
    return ("parallelism.tp_linear_async_communication: async_communication is not supported for "
            "ALL_REDUCE mode" if p.get("tp_linear_async_communication") and mode == "ALL_REDUCE"
            else None)


def _one_f_one_b(d: Mapping[str, Any], world: int | None) -> str | None:
    p, acc = d["parallelism"], _get(d, "tokens.batch_accumulation_per_replica")
    if p.get("pp_engine") != "1f1b" or acc is None or acc >= p["pp"] - 1:
        return None
    return (f"tokens.batch_accumulation_per_replica ({acc}) must be at least PP_SIZE-1="
            f"{p['pp'] - 1} when using the OneForwardOneBackwardPipelineEngine")


def _context_parallel_init(d: Mapping[str, Any], world: int | None) -> str | None:
    """Raised for every init method; only a resumed checkpoint skips it."""
    cp = d["parallelism"].get("context_parallel_size", 1)
    resumed = _get(d, "checkpoints.resume_checkpoint_path") is not None
    return ("parallelism.context_parallel_size: Init with Context parallel size > 1 not supported "
            "yet" if cp > 1 and not resumed else None)


CHECKS: Final[tuple[Check, ...]] = (
    Check("parallel/context.py ParallelContext.__init__ @2411b022", _world_size_main, (MAIN,)),
    Check("parallel/context.py ParallelContext.__init__ @e24d2483", _world_size_old, (PLAYBOOK,)),
    Check("config/config.py LoggingArgs.__post_init__", _log_levels),
    Check("config/config.py LRSchedulerArgs.__post_init__", _lr_styles),
    Check("config/config.py DatasetStageArgs/Config.__post_init__", _data_stages),
    Check("config/config.py Config.__post_init__ and models/llama.py CausalSelfAttention @2411b022",
          lambda d, w: _heads(d, w, kv_at_least_tp=True), (MAIN,)),
    Check("models/llama.py CausalSelfAttention @e24d2483",
          lambda d, w: _heads(d, w, kv_at_least_tp=False), (PLAYBOOK,)),
    Check("parallel/tensor_parallel/nn.py TensorParallelRowLinear (down_proj)", _ffn),
    Check("config/models_config.py MoEConfig.__post_init__ @2411b022", _moe_post_init, (MAIN,)),
    Check("config/models_config.py Qwen2Config.__post_init__ @2411b022", _qwen2_post_init,
          (MAIN,)),
    Check("parallel/context.py ParallelContext, nn/moe.py Qwen2MoELayer @2411b022",
          _expert_parallel_main, (MAIN,)),
    Check("models/qwen.py Qwen2Model.forward, data/dataloader.py dummy_infinite_data_generator "
          "@2411b022", _qwen2_pipeline, (MAIN,)),
    Check("nn/moe.py GroupedMLP @2411b022, grouped_gemm csrc/grouped_gemm.cu GroupedGemm",
          _moe_needs_bfloat16, (MAIN,)),
    Check("parallel/tensor_parallel/nn.py TensorParallelRowLinear", _async_needs_reduce_scatter),
    Check("parallel/pipeline_parallel/engine.py OneForwardOneBackwardPipelineEngine", _one_f_one_b),
    Check("trainer.py DistributedTrainer._load_model_checkpoint @2411b022",
          _context_parallel_init, (MAIN,)),
)


def problems(data: Any, version: str, world_size: int | None = None) -> list[str]:
    """Every reason nanotron at `version` would refuse this config dict (empty: it loads and
    builds). `world_size`: the number of ranks, to replay ParallelContext's product assert."""
    try:
        schema = SCHEMAS[version]
    except KeyError:
        raise ValueError(f"no nanotron config schema for {version!r}; known: {sorted(SCHEMAS)}") from None
    found = check_types(schema, data, "config")
    if found:
        return found  # the semantic checks assume a well-typed dict
    return [f"{message} ({check.where})" for check in CHECKS if version in check.versions
            if (message := check.problem(data, world_size)) is not None]


def validate(data: Any, version: str, world_size: int | None = None) -> None:
    """Raise ConfigError naming every problem `problems` finds."""
    found = problems(data, version, world_size)
    if found:
        raise ConfigError(found)
