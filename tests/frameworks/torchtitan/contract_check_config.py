"""Run inside a subprocess with torchtitan 0.3.0 (or a main checkout) first on PYTHONPATH: read
rendered config modules (launch/torchtitan.config.py) with torchtitan's own code, as the job does,
and report per run what it parsed and what it rejects (JSON on the last line of stdout).

Usage: python contract_check_config.py CASES.json   (a list of {"id", "module", "world_size"})

For each run, in the order torchtitan's trainer takes them (torchtitan/trainer.py Trainer.__init__,
0.3.0 wheel and main b5bcd76c6):
1. `ConfigManager().parse_args(["--module", M, "--config", "llm_sweep_config", "--hf_assets_path",
   ..., "--dump_folder", ...])`, the launcher's own command line: the module is imported by name,
   its config function called, tyro applied, then Trainer.Config.__post_init__ (pipeline
   micro-batches, CUDA graphs) and ConfigManager._validate_config run;
2. `ParallelDims.from_config(config.parallelism, world_size)` (the mesh's degrees; main also checks
   that ep divides dp_shard·cp·tp);
3. the sequence (0.3.0) or micro-batch tokens (main) against TP (with SP) x 2·CP, and the global
   batch against the local batch x the data-parallel degree: written here after Trainer.__init__;
4. the model config's own `update_from_config(config=...)` (weight tying under PP, TP against the
   heads and KV heads, the RoPE length, the sharding of dense and MoE layers);
5. the model built on the meta device (`model_config.build()`, `verify_module_protocol()`) and
   `get_nparams_and_flops`: the parameter count of what torchtitan would train, once per model;
6. with PP: torchtitan's `_get_pipeline_metadata` and `_generate_llm_fqn_per_model_part`
   (torchtitan/distributed/pipeline_parallel.py), and torch's schedule rules on the micro-batch
   count (torch/distributed/pipelining/schedules.py: Schedule1F1B needs at least as many
   micro-batches as stages, ScheduleInterleaved1F1B a multiple of the rounds).

Nothing runs on a device; no process group is made (ParallelDims validates without building its
mesh). The CUDA-only kernels (triton) are imported, never launched. Float8's converter asks the
device for compute capability 8.9 or later before it converts a model; here, on CPU, that question
is answered as on the GPU the family is planned for (an H100, 9.0: `on_the_planned_gpu`).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any


def batch_errors(cfg: Any, dims: Any, main: bool) -> tuple[list[str], dict[str, Any]]:
    """Trainer.__init__'s token and batch arithmetic, and what it makes of this run."""
    training, par, errors = cfg.training, cfg.parallelism, []
    divisor = (dims.tp if par.enable_sequence_parallel else 1) * (2 * dims.cp if dims.cp > 1 else 1)
    degree = dims.dp_replicate * dims.dp_shard
    if main:
        tokens = training.num_tokens_per_microbatch_per_dp_rank
        micro = par.num_pp_microbatches if dims.pp > 1 else 1
        per_step = training.num_tokens_per_train_step
        if tokens % divisor:
            errors.append(f"micro-batch tokens {tokens} not divisible by {divisor}")
        if per_step % (tokens * micro * degree):
            errors.append("tokens per step not divisible by tokens per accumulation step")
        seq_len = training.max_context_length
        facts = {"seq_len": seq_len, "mbs": tokens // seq_len, "pp_microbatches": micro,
                 "global_batch": per_step // seq_len,
                 "grad_accumulation": per_step // (tokens * micro * degree)}
        return errors, facts
    local, global_ = training.local_batch_size, training.global_batch_size
    if training.seq_len % divisor:
        errors.append(f"seq_len {training.seq_len} not divisible by {divisor}")
    if global_ % (local * degree):
        errors.append("global batch not divisible by local batch x data-parallel degree")
    micro_size = par.pipeline_parallel_microbatch_size if dims.pp > 1 else local
    facts = {"seq_len": training.seq_len, "mbs": micro_size, "pp_microbatches": local // micro_size,
             "global_batch": global_, "grad_accumulation": global_ // (local * degree)}
    return errors, facts


def pipeline_errors(cfg: Any, dims: Any, model_config: Any, micro: int) -> list[str]:
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.distributed import pipeline_parallel as pp_module

    errors: list[str] = []
    try:
        stages, layers, first, last = pp_module._get_pipeline_metadata(
            dims, cfg.parallelism, model_config)
        parts = pp_module._generate_llm_fqn_per_model_part(stages, layers, first, last)
    except ValueError as error:
        return [f"pipeline split: {error}"]
    placed = [m for part in parts for m in part if m.startswith("layers.")]
    if len(placed) != layers or any(not part for part in parts):
        errors.append(f"stage split leaves layers out or a stage empty: {parts}")
    schedule = get_schedule_class(cfg.parallelism.pipeline_parallel_schedule).__name__
    if schedule == "Schedule1F1B" and micro < dims.pp:
        errors.append(f"Schedule1F1B: {micro} microbatches < {dims.pp} stages")
    if schedule == "ScheduleInterleaved1F1B" and micro % max(1, micro // dims.pp):
        errors.append(f"ScheduleInterleaved1F1B: {micro} microbatches not a multiple of rounds")
    return errors


def model_facts(model_config: Any) -> dict[str, Any]:
    """The model's dimensions as torchtitan's config holds them."""
    first = model_config.layers[0]
    attention = first.attention
    facts: dict[str, Any] = {
        "layers": len(model_config.layers), "dim": model_config.dim,
        "vocab": model_config.vocab_size, "tied": model_config.enable_weight_tying,
        "heads": attention.n_heads, "kv_heads": attention.n_kv_heads,
        "head_dim": attention.head_dim, "qk_norm": attention.qk_norm is not None,
        "attention": type(attention.inner_attention).__qualname__,
    }
    moe = getattr(first, "moe", None)
    if moe is not None:
        facts.update(experts=moe.num_experts, top_k=moe.router.top_k,
                     expert_hidden=moe.routed_experts.inner_experts.hidden_dim,
                     score_func=moe.router.score_func, route_norm=moe.router.route_norm,
                     load_balance_coeff=moe.load_balance_coeff)
    else:
        facts["ffn_hidden"] = first.feed_forward.w1.out_features
    facts["float8"] = "Float8" in repr(model_config)
    return facts


def built(model_config: Any, cfg: Any, cache: dict[str, Any], key: str) -> tuple[int, list[str]]:
    """The parameter count of the model built on the meta device (once per key)."""
    import torch
    from torchtitan.tools import utils

    if key not in cache:
        try:
            with torch.device("meta"), utils.set_default_dtype(torch.float32):
                model = model_config.build()
            model.verify_module_protocol()
            seq_len = getattr(cfg.training, "seq_len", None) or cfg.training.max_context_length
            cache[key] = (model_config.get_nparams_and_flops(model, seq_len)[0], [])
        except Exception as error:  # noqa: BLE001 - any failure to build is the finding
            cache[key] = (0, [f"model build: {error!r}"])
    return cache[key]


def on_the_planned_gpu() -> None:
    """Float8LinearConverter's device check (has_cuda_capability(8, 9)) as on an H100."""
    from torchtitan.components.quantization import float8

    float8.has_cuda_capability = lambda major, minor: (9, 0) >= (major, minor)


def check(case: dict[str, Any], scratch: Path, cache: dict[str, Any], index: int) -> dict[str, Any]:
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    name = f"llm_sweep_run_{index}"  # the launcher's module, once per case (imports are cached)
    shutil.copyfile(case["module"], scratch / f"{name}.py")
    try:
        cfg = ConfigManager().parse_args([
            "--module", name, "--config", "llm_sweep_config",
            "--hf_assets_path", str(scratch), "--dump_folder", str(scratch / "dump")])
    except BaseException as error:  # noqa: BLE001 - tyro exits with SystemExit on a bad field
        return {"id": case["id"], "errors": [f"ConfigManager: {error!r}"]}
    main = hasattr(cfg.training, "num_tokens_per_microbatch_per_dp_rank")
    try:
        dims = ParallelDims.from_config(cfg.parallelism, case["world_size"])
    except (AssertionError, ValueError) as error:
        return {"id": case["id"], "errors": [f"ParallelDims: {error}"]}
    errors, facts = batch_errors(cfg, dims, main)
    if (dims.dp_shard * dims.cp * dims.tp) % dims.ep:
        errors.append("expert_parallel_degree must divide dp_shard * cp * tp")
    model_config = cfg.model_spec.model
    try:
        model_config.update_from_config(config=cfg)
        cfg._validate_cuda_graphs()
    except (ValueError, NotImplementedError, AssertionError) as error:
        errors.append(f"update_from_config: {error}")
    nparams, build_errors = built(model_config, cfg, cache, case.get("model_key", case["id"]))
    errors.extend(build_errors)
    if dims.pp > 1:
        errors.extend(pipeline_errors(cfg, dims, model_config, facts["pp_microbatches"]))
    par, ac = cfg.parallelism, cfg.activation_checkpoint
    return {
        "id": case["id"], "errors": errors,
        "parsed": {
            **facts, **model_facts(model_config), "nparams": nparams, "main": main,
            "dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "tp": dims.tp,
            "pp": dims.pp, "cp": dims.cp, "ep": dims.ep, "sp": par.enable_sequence_parallel,
            "reshard": par.fsdp_reshard_after_forward,
            "schedule": par.pipeline_parallel_schedule if dims.pp > 1 else None,
            "ac": type(ac).__qualname__.split(".")[0] if ac is not None else None,
            "compile": cfg.compile.enable, "steps": cfg.training.steps, "seed": cfg.debug.seed,
            "force_load_balance": cfg.debug.moe_force_load_balance,
            "mixed_precision_param": cfg.training.mixed_precision_param,
            "dtype": cfg.training.dtype, "log_freq": cfg.metrics.log_freq,
            "checkpoint": cfg.checkpoint.enable, "loss": type(cfg.loss).__qualname__,
            "cuda_graphs": not cfg.training.disable_cuda_graphs,
        },
    }


def main() -> int:
    cases = json.loads(Path(sys.argv[1]).read_text())
    import torchtitan

    on_the_planned_gpu()
    with tempfile.TemporaryDirectory() as scratch:
        sys.path.insert(0, scratch)
        cache: dict[str, Any] = {}
        results = [check(case, Path(scratch), cache, i) for i, case in enumerate(cases)]
    print(json.dumps({"torchtitan": str(Path(torchtitan.__file__).parent), "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
