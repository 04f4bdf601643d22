"""launch/nanotron.yaml loads strictly into nanotron's config dataclasses, and says what the run is.

nanotron reads its YAML with `dacite.from_dict(Config, ..., strict=True)`: an unknown key, a
missing required field or a wrongly typed value is an error. nanotron itself (CUDA, flash-attn)
is not installable here, so its dataclasses are mirrored below, field for field, from
huggingface/nanotron src/nanotron/config/config.py @00708b80 (the layout with `data_stages` and
`optimizer_factory`), parallelism_config.py @19f88fbe and models_config.py @025f3141. Strings
that nanotron casts through type hooks (dtype, pp_engine, tp_mode) are mirrored as the Literal
of the values those hooks accept. The loader is dacite's strict mode, re-implemented in a few
lines (dacite is not a dependency); the negative tests show it is strict.
"""

from __future__ import annotations

import types
import typing
from dataclasses import MISSING, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

import pytest
import yaml

from sweep import render, space
from sweep.spec import load_spec


# Mirror of nanotron's config dataclasses -------------------------------------------------

@dataclass
class GeneralArgs:
    project: str
    run: Optional[str] = None
    seed: Optional[int] = None
    step: Optional[int] = None
    consumed_train_samples: Optional[int] = None
    benchmark_csv_path: Optional[str] = None
    ignore_sanity_checks: bool = True


@dataclass
class ParallelismArgs:
    dp: int
    pp: int
    tp: int
    pp_engine: Optional[Literal["1f1b", "afab"]] = None
    tp_mode: Optional[Literal["ALL_REDUCE", "REDUCE_SCATTER"]] = None
    tp_linear_async_communication: Optional[bool] = None
    recompute_layer: bool = False
    moe_layer_recompute: bool = False
    tp_recompute_allgather: bool = True
    expert_parallel_size: int = 1
    context_parallel_size: int = 1


@dataclass
class RandomInit:
    std: float
    scaling_method: Optional[str] = None


@dataclass
class LlamaConfig:
    bos_token_id: int = 1
    eos_token_id: int = 2
    hidden_act: str = "silu"
    hidden_size: int = 4096
    initializer_range: float = 0.02
    intermediate_size: int = 11008
    is_llama_config: bool = True
    max_position_embeddings: int = 2048
    num_attention_heads: int = 32
    num_hidden_layers: int = 32
    attention_bias: bool = False
    num_key_value_heads: Optional[int] = None
    pad_token_id: Optional[int] = None
    pretraining_tp: int = 1
    rms_norm_eps: float = 1e-6
    rope_scaling: Optional[dict] = None
    rope_theta: float = 10000.0
    rope_interleaved: bool = False
    tie_word_embeddings: bool = False
    use_cache: bool = True
    vocab_size: int = 32000
    _attn_implementation: Optional[str] = "flash_attention_2"
    z_loss_enabled: bool = False
    z_loss_coefficient: float = 0.0001


@dataclass
class ModelArgs:
    model_config: LlamaConfig
    init_method: RandomInit
    dtype: Optional[Literal["float32", "float16", "bfloat16"]] = None
    make_vocab_size_divisible_by: int = 1
    ddp_bucket_cap_mb: int = 25


@dataclass
class TokenizerArgs:
    tokenizer_name_or_path: Optional[str] = None
    tokenizer_revision: Optional[str] = None
    tokenizer_max_length: Optional[int] = None


@dataclass
class CheckpointsArgs:
    checkpoints_path: str
    checkpoint_interval: int
    save_initial_state: Optional[bool] = False
    save_final_state: Optional[bool] = False
    resume_checkpoint_path: Optional[str] = None
    load_lr_scheduler: Optional[bool] = True
    load_optimizer: Optional[bool] = True
    checkpoints_path_is_shared_file_system: Optional[bool] = False


@dataclass
class LoggingArgs:
    log_level: Optional[Literal["debug", "info", "warning", "error", "critical", "passive"]] = None
    log_level_replica: Optional[Literal["debug", "info", "warning", "error", "critical",
                                        "passive"]] = None
    iteration_step_info_interval: Optional[int] = 1


@dataclass
class TokensArgs:
    sequence_length: int
    train_steps: int
    micro_batch_size: int
    batch_accumulation_per_replica: int
    val_check_interval: Optional[int] = -1
    limit_val_batches: Optional[int] = 0
    limit_test_batches: Optional[int] = 0


@dataclass
class LRSchedulerArgs:
    learning_rate: float
    lr_warmup_steps: int = 0
    lr_warmup_style: Optional[Literal["linear", "constant"]] = None
    lr_decay_style: Optional[Literal["linear", "cosine", "1-sqrt"]] = None
    lr_decay_steps: Optional[int] = None
    lr_decay_starting_step: Optional[int] = None
    min_decay_lr: Optional[float] = None


@dataclass
class SGDOptimizerArgs:
    name: str = "sgd"


@dataclass
class AdamWOptimizerArgs:
    adam_eps: float
    adam_beta1: float
    adam_beta2: float
    torch_adam_is_fused: bool
    name: str = "adamW"


@dataclass
class OptimizerArgs:
    optimizer_factory: Union[SGDOptimizerArgs, AdamWOptimizerArgs]
    zero_stage: int
    weight_decay: float
    clip_grad: Optional[float]
    accumulate_grad_in_fp32: bool
    learning_rate_scheduler: LRSchedulerArgs
    weight_decay_exclude_named_params: Optional[list[str]] = None


@dataclass
class DataArgs:
    dataset: Optional[dict]  # None: nanotron's dummy infinite data generator
    seed: Optional[int]
    num_loading_workers: Optional[int] = 1


@dataclass
class DatasetStageArgs:
    name: str
    start_training_step: int
    data: DataArgs


@dataclass
class ProfilerArgs:
    profiler_export_path: Optional[str]
    wait: int = 1
    warmup: int = 1
    active: int = 1
    repeat: int = 1
    skip_first: int = 3
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = True
    export_chrome_trace: bool = False


@dataclass
class Config:
    general: GeneralArgs
    parallelism: ParallelismArgs
    model: ModelArgs
    tokenizer: Optional[TokenizerArgs] = None
    checkpoints: Optional[CheckpointsArgs] = None
    logging: Optional[LoggingArgs] = None
    tokens: Optional[TokensArgs] = None
    optimizer: Optional[OptimizerArgs] = None
    data_stages: Optional[list[DatasetStageArgs]] = None
    profiler: Optional[ProfilerArgs] = None
    lighteval: Optional[None] = None  # LightEvalConfig: we always write null
    s3_upload: Optional[None] = None  # S3UploadArgs: we always write null


# dacite's strict mode -----------------------------------------------------------------------

class StrictError(ValueError):
    pass


def from_dict(cls: type, data: Any, where: str = "config") -> Any:
    if not isinstance(data, dict):
        raise StrictError(f"{where}: expected a mapping for {cls.__name__}, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    extra = sorted(set(data) - known)
    if extra:
        raise StrictError(f"{where}: unknown key(s) {extra} for {cls.__name__}")
    values = {}
    for f in fields(cls):
        if f.name in data:
            values[f.name] = convert(hints[f.name], data[f.name], f"{where}.{f.name}")
        elif f.default is MISSING and f.default_factory is MISSING:
            raise StrictError(f"{where}: missing required field {f.name!r}")
    return cls(**values)


def convert(hint: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if hint is type(None):
        if value is not None:
            raise StrictError(f"{where}: must be null, got {value!r}")
        return None
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = []
        for option in (a for a in args if a is not type(None)):
            try:
                return convert(option, value, where)
            except StrictError as error:
                problems.append(str(error))
        raise StrictError(f"{where}: matches no member of the union: {'; '.join(problems)}")
    if origin is Literal:
        if value not in args:
            raise StrictError(f"{where}: {value!r} is not one of {args}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise StrictError(f"{where}: expected a list, got {value!r}")
        return [convert(args[0], item, f"{where}[{i}]") for i, item in enumerate(value)]
    if is_dataclass(hint):
        return from_dict(hint, value, where)
    expected = {bool: bool, int: int, float: float, str: str, dict: dict}[hint]
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise StrictError(f"{where}: expected {expected.__name__}, got {value!r}")
    return value


# The tests ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def playbook_runs(repo_root: Path) -> list[tuple[Any, dict[str, str]]]:
    """A spread of the playbook's kept runs: every (model, nodes) and both ZeRO stages."""
    spec = load_spec(repo_root / "examples" / "playbook.yaml")
    plan = space.plan(spec)
    kept = plan[plan["status"] == space.KEPT]
    sample = kept.groupby(["model", "nodes", "zero_stage", "pp"], observed=True).head(1)
    env = render.make_environment()
    names = render.launch_templates(env, "nanotron")
    out = []
    for row in render.kept_rows(sample):
        config = render.run_config(spec, row)
        out.append((config, render.render_files(env, config, Path("/sweep/runs") / config.run_id,
                                                names)))
    return out


def test_every_sampled_playbook_yaml_loads_strictly(playbook_runs: list) -> None:
    assert len(playbook_runs) > 20
    for config, files in playbook_runs:
        loaded = from_dict(Config, yaml.safe_load(files["launch/nanotron.yaml"]))
        layout, model = config.layout, config.model
        par = loaded.parallelism
        assert (par.dp, par.tp, par.pp) == (layout.dp, layout.tp, layout.pp)
        assert par.dp * par.tp * par.pp * par.context_parallel_size * par.expert_parallel_size \
            == config.nodes * config.gpus_per_node
        assert par.tp_mode == ("REDUCE_SCATTER" if layout.sp else "ALL_REDUCE")
        assert par.pp_engine == "1f1b"
        assert loaded.optimizer.zero_stage == layout.zero_stage
        assert loaded.optimizer.accumulate_grad_in_fp32 is True
        tokens = loaded.tokens
        assert (tokens.micro_batch_size, tokens.batch_accumulation_per_replica,
                tokens.sequence_length) == (layout.mbs, layout.grad_acc, 4096)
        assert tokens.micro_batch_size * tokens.batch_accumulation_per_replica * par.dp == 256
        llama = loaded.model.model_config
        assert (llama.num_hidden_layers, llama.hidden_size, llama.intermediate_size,
                llama.num_attention_heads, llama.num_key_value_heads, llama.vocab_size,
                llama.tie_word_embeddings) == (
            model.num_layers, model.hidden_size, model.ffn_hidden_size,
            model.num_attention_heads, model.num_kv_heads, model.vocab_size,
            model.tie_word_embeddings)
        assert loaded.model.dtype == "bfloat16"
        assert loaded.general.run == config.run_id
        assert [s.start_training_step for s in loaded.data_stages] == [1]


def test_the_launcher_points_torchrun_at_the_yaml(playbook_runs: list) -> None:
    config, files = playbook_runs[0]
    script = files["launch/nanotron.sh"]
    assert '"$FRAMEWORK_DIR/run_train.py" --config-file "$RUN_DIR/launch/nanotron.yaml"' in script
    assert f"--nproc-per-node={config.gpus_per_node}" in script


def test_the_strict_loader_rejects_what_nanotron_would(playbook_runs: list) -> None:
    data = yaml.safe_load(playbook_runs[0][1]["launch/nanotron.yaml"])
    data["parallelism"]["sequence_parallel"] = True
    with pytest.raises(StrictError, match="unknown key"):
        from_dict(Config, data)
    data = yaml.safe_load(playbook_runs[0][1]["launch/nanotron.yaml"])
    data["optimizer"]["learning_rate_scheduler"]["min_decay_lr"] = "1e-5"  # YAML 1.1: a string
    with pytest.raises(StrictError, match="min_decay_lr"):
        from_dict(Config, data)
    data = yaml.safe_load(playbook_runs[0][1]["launch/nanotron.yaml"])
    del data["tokens"]["train_steps"]
    with pytest.raises(StrictError, match="train_steps"):
        from_dict(Config, data)
