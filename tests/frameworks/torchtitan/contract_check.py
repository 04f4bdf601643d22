"""Run inside a subprocess with PYTHONPATH=.contract/torchtitan-<version>: read rendered runs with
torchtitan's own code and report, per run, what it parsed and what it rejects (JSON on stdout).

Usage: python contract_check.py CASES.json  (a list of {"id", "toml", "world_size"}), or
       python contract_check.py --stage-layers PAIRS.json  (a list of [stages, layers]: prints the
       layers torchtitan's split puts on each stage).

What runs on CPU torch 2.13 (torchtitan's own code): torchtitan.config (ConfigManager with tyro,
JobConfig) and torchtitan.distributed.parallel_dims (ParallelDims and its validation). What does
not import here: the package __init__ (it imports the quantization converters, whose MoE kernels
need triton), components.quantization.float8 (triton), distributed.pipeline_parallel and
models.llama3 (torchdata, triton), components.metrics (tensorboard). So the package is entered
without its __init__, and from the files that do not import, this reads with `ast` only: the
converter names their register_model_converter calls register, the llama3 flavor table
(llama3_args), and generate_llm_fqn_per_model_part (executed from its own source). The checks of
parallelize_llama, maybe_enable_amp, train.py's batch arithmetic and pipeline_llm's stage count are
written here after their sources (v0.2.0 29624e37f, v0.2.2 73a0e6979); the schedules' micro-batch
rules are torch's (torch/distributed/pipelining/schedules.py).
"""

from __future__ import annotations

import ast
import json
import sys
import tempfile
import types
from pathlib import Path
from typing import Any


def enter_package() -> Path:
    """Make `torchtitan` importable without running its __init__ (see the module docstring)."""
    root = next(Path(p) / "torchtitan" for p in sys.path if (Path(p) / "torchtitan").is_dir())
    package = types.ModuleType("torchtitan")
    package.__path__ = [str(root)]  # type: ignore[attr-defined]
    sys.modules["torchtitan"] = package
    return root


def registered_converters(root: Path) -> set[str]:
    names = set()
    for path in (root / "components" / "quantization").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "register_model_converter":
                names.add(ast.literal_eval(node.args[1]))
    return names


def llama3_flavors(root: Path) -> dict[str, dict[str, Any]]:
    """llama3_args: flavor -> its TransformerModelArgs keywords, with the class defaults filled in."""
    defaults: dict[str, Any] = {}
    for node in ast.walk(ast.parse((root / "models" / "llama3" / "model" / "args.py").read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "TransformerModelArgs":
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.value, ast.Constant):
                    defaults[item.target.id] = item.value.value  # type: ignore[union-attr]
    flavors = {}
    for node in ast.walk(ast.parse((root / "models" / "llama3" / "__init__.py").read_text())):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "llama3_args":
            for key, call in zip(node.value.keys, node.value.values):  # type: ignore[attr-defined]
                kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
                flavors[ast.literal_eval(key)] = {**defaults, **kwargs}
    return flavors


def fqn_splitter(root: Path) -> Any:
    """torchtitan's own generate_llm_fqn_per_model_part, executed from its source."""
    tree = ast.parse((root / "distributed" / "pipeline_parallel.py").read_text())
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
                and n.name == "generate_llm_fqn_per_model_part")
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=[func], type_ignores=[]), "pipeline_parallel.py", "exec"), namespace)
    return namespace["generate_llm_fqn_per_model_part"]


def pipeline_errors(cfg: Any, n_layers: int, split: Any) -> list[str]:
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    par, errors = cfg.parallelism, []
    schedule = get_schedule_class(par.pipeline_parallel_schedule)
    single = issubclass(schedule, PipelineScheduleSingle)
    if par.pipeline_parallel_layers_per_stage is not None:
        errors.append("layers_per_stage is set: its virtual-stage count must divide by pp")
    stages_per_rank = 1 if single else 2  # pipeline_llm without layers_per_stage
    stages = par.pipeline_parallel_degree * stages_per_rank
    try:
        parts = split(stages, n_layers, par.pipeline_parallel_first_stage_less_layers,
                      par.pipeline_parallel_last_stage_less_layers)
        placed = [m for part in parts for m in part if m.startswith("layers.")]
        if len(placed) != n_layers or any(not part for part in parts):
            errors.append(f"stage split leaves layers out or a stage empty: {parts}")
    except ValueError as error:
        errors.append(f"generate_llm_fqn_per_model_part: {error}")
    local, micro = cfg.training.local_batch_size, par.pipeline_parallel_microbatch_size
    if local % micro:
        errors.append(f"local_batch_size {local} not divisible by microbatch size {micro}")
    n_micro = local // micro
    pp = par.pipeline_parallel_degree
    if schedule.__name__ == "Schedule1F1B" and n_micro < pp:
        errors.append(f"Schedule1F1B: {n_micro} microbatches < {pp} stages")
    if schedule.__name__ == "ScheduleInterleaved1F1B" and n_micro % max(1, n_micro // pp):
        errors.append(f"ScheduleInterleaved1F1B: {n_micro} microbatches not a multiple of rounds")
    return errors


def check(case: dict[str, Any], tools: dict[str, Any], scratch: Path) -> dict[str, Any]:
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    errors: list[str] = []
    try:
        cfg = ConfigManager().parse_args([
            "--job.config_file", case["toml"], "--job.dump_folder", str(scratch / "dump"),
            "--model.hf_assets_path", str(scratch), "--training.dataset_path", str(scratch)])
    except BaseException as error:  # noqa: BLE001 - tyro exits with SystemExit on a bad field
        return {"id": case["id"], "errors": [f"ConfigManager: {error!r}"]}
    par, training = cfg.parallelism, cfg.training
    try:
        dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree,
                            dp_shard=par.data_parallel_shard_degree,
                            cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                            pp=par.pipeline_parallel_degree, ep=par.expert_parallel_degree,
                            etp=par.expert_tensor_parallel_degree, world_size=case["world_size"])
    except AssertionError as error:
        return {"id": case["id"], "errors": [f"ParallelDims: {error}"]}
    if training.seq_len % dims.seq_len_divisor:
        errors.append(f"seq_len {training.seq_len} not divisible by {dims.seq_len_divisor}")
    if not dims.fsdp_enabled and dims.dp_replicate_enabled and dims.world_size != dims.dp_replicate:
        errors.append("DDP has not supported > 1D parallelism")
    if not dims.fsdp_enabled and (dims.tp_enabled or dims.pp_enabled) \
            and training.mixed_precision_param != "float32":
        errors.append("mixed precision disabled (TP/PP without FSDP): would compute in fp32")
    batch_degree = dims.dp_replicate * dims.dp_shard
    if training.global_batch_size % (training.local_batch_size * batch_degree):
        errors.append("global batch not divisible by local batch x data-parallel degree")
    unknown = set(cfg.model.converters) - tools["converters"]
    if unknown:
        errors.append(f"unregistered converters {sorted(unknown)}")
    flavor = tools["flavors"].get(cfg.model.flavor)
    if flavor is None:
        errors.append(f"no llama3 flavor {cfg.model.flavor!r}")
    elif dims.pp_enabled:
        errors.extend(pipeline_errors(cfg, flavor["n_layers"], tools["split"]))
    seed = cfg.debug.seed if hasattr(cfg, "debug") else cfg.training.seed
    return {
        "id": case["id"], "errors": errors,
        "parsed": {
            "model": [cfg.model.name, cfg.model.flavor], "converters": list(cfg.model.converters),
            "float8_filter": list(cfg.quantize.linear.float8.filter_fqns),
            "dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "tp": dims.tp,
            "pp": dims.pp, "cp": dims.cp, "ep": dims.ep,
            "reshard": par.fsdp_reshard_after_forward, "schedule": par.pipeline_parallel_schedule,
            "microbatch": par.pipeline_parallel_microbatch_size,
            "local_batch": training.local_batch_size, "global_batch": training.global_batch_size,
            "grad_accumulation": training.global_batch_size // (training.local_batch_size * batch_degree),
            "seq_len": training.seq_len, "steps": training.steps, "seed": seed,
            "mixed_precision_param": training.mixed_precision_param, "dtype": training.dtype,
            "ac_mode": cfg.activation_checkpoint.mode,
            "ac_option": cfg.activation_checkpoint.selective_ac_option,
            "compile": cfg.compile.enable, "dataset": training.dataset,
            "log_freq": cfg.metrics.log_freq, "fsdp": dims.fsdp_enabled,
        },
    }


def stage_layers(pairs: list[list[int]], split: Any) -> list[list[int]]:
    """Per (stages, layers): the layers torchtitan's split puts on each stage, with the first and
    last stages' `less_layers` at their JobConfig defaults."""
    from torchtitan.config.job_config import Parallelism

    defaults = Parallelism()
    first, last = (defaults.pipeline_parallel_first_stage_less_layers,
                   defaults.pipeline_parallel_last_stage_less_layers)
    return [[sum(m.startswith("layers.") for m in part) for part in split(stages, layers, first, last)]
            for stages, layers in pairs]


def main() -> int:
    root = enter_package()
    if sys.argv[1] == "--stage-layers":  # PAIRS.json: a list of [stages, layers]
        pairs = json.loads(Path(sys.argv[2]).read_text())
        print(json.dumps(stage_layers(pairs, fqn_splitter(root))))
        return 0
    cases = json.loads(Path(sys.argv[1]).read_text())
    tools = {"converters": registered_converters(root), "flavors": llama3_flavors(root),
             "split": fqn_splitter(root)}
    with tempfile.TemporaryDirectory() as scratch:
        results = [check(case, tools, Path(scratch)) for case in cases]
    print(json.dumps({"flavors": tools["flavors"], "converters": sorted(tools["converters"]),
                      "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
