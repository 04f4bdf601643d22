"""nanotron's YAML config, as its strict loader reads it: our own schema and validator, per version.

nanotron cannot be installed here (PyPI has only a broken 0.4 of 2024; the code needs CUDA and
flash-attn), so its config dataclasses are described below as data, field for field, from

- ``main-2025-03-26+``: huggingface/nanotron @2411b022a75fb7f7561a1bb4166706da5e1b76de
  (2026-04-07; its src/ is that of 7bc99232, 2025-06-23): src/nanotron/config/config.py,
  parallelism_config.py, models_config.py, utils_config.py;
- ``playbook-e24d2483``: the same files @e24d2483a4e508e1298ed91b5f5abffa473dc647 (2025-02-19,
  the Ultra-Scale Playbook's commit).

nanotron loads the YAML with ``dacite.from_dict(Config, d, Config(strict=True, cast=[Path],
type_hooks={torch.dtype: cast_str_to_torch_dtype, PipelineEngine: cast_str_to_pipeline_engine,
TensorParallelLinearMode: lambda x: TensorParallelLinearMode[x.upper()], ...}))``
(config.py `get_config_from_dict`). So: a key the dataclass lacks is an error (strict), a field
without a default must be present, a value must be an instance of the declared type (dacite
checks types after building; `Optional[X]` takes null), a Union takes the first member that
builds, a `Path` takes a string, and the enum-like fields go through the hooks (their accepted
strings are the `Choice`s below). `check_types` replays that, naming the key path of every
problem; the ``__post_init__`` checks and model-building asserts that decide whether a layout
runs, and `validate`, are in sweep.frameworks.nanotron.config_checks.

Where we differ from dacite, we are stricter, on purpose: a bool is not accepted as an int
(dacite's `isinstance(True, int)` would take it); `model.model_config` must be a LlamaConfig, or at
main a Qwen2Config (the model of MoE runs), tried in that order as dacite tries nanotron's
`Union[LlamaConfig, Starcoder2Config, Qwen2Config, Any]` (we render no Starcoder2Config; at main a
dict that builds no dataclass falls to `Any`, and `ModelArgs.__post_init__` then calls
`Qwen2Config(**d)`, which leaves a nested `moe_config` a plain dict and fails on it, so we refuse
such a dict outright); sections we always write as null (`lighteval`, `data_stages[].data.dataset`)
are not mirrored and must be null.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

MAIN: Final = "main-2025-03-26+"
PLAYBOOK: Final = "playbook-e24d2483"
MAIN_COMMIT: Final = "2411b022a75fb7f7561a1bb4166706da5e1b76de"
PLAYBOOK_COMMIT: Final = "e24d2483a4e508e1298ed91b5f5abffa473dc647"


# The type algebra -------------------------------------------------------------------------

@dataclass(frozen=True)
class Scalar:
    """int, float, bool or str, checked with isinstance as dacite does (a bool is no int here)."""

    kind: type


@dataclass(frozen=True)
class PathLike:
    """A `Path` field: dacite's `cast=[Path]` turns a string into a Path."""


@dataclass(frozen=True)
class Opaque:
    """A plain `dict`, `list` or `Any` annotation: any value of that Python type."""

    kind: type | None  # None: Any


@dataclass(frozen=True)
class Choice:
    """A field read through a type hook: the strings the hook accepts. `upper`: the hook
    upper-cases the value first (TensorParallelLinearMode[x.upper()])."""

    values: tuple[Any, ...]
    upper: bool = False


@dataclass(frozen=True)
class Optional_:
    inner: Type_


@dataclass(frozen=True)
class Union_:
    members: tuple[Type_, ...]


@dataclass(frozen=True)
class ListOf:
    item: Type_


@dataclass(frozen=True)
class NotMirrored:
    """A dataclass we do not mirror (we always write null there): only null passes."""

    name: str


@dataclass(frozen=True)
class Field:
    name: str
    type: Type_
    required: bool = False  # no default in the dataclass


@dataclass(frozen=True)
class Struct:
    """One nanotron config dataclass."""

    name: str
    fields: tuple[Field, ...]

    def with_fields(self, *extra: Field) -> Struct:
        return Struct(self.name, self.fields + extra)

    def without(self, *names: str) -> Struct:
        return Struct(self.name, tuple(f for f in self.fields if f.name not in names))

    def replacing(self, *new: Field) -> Struct:
        by_name = {f.name: f for f in new}
        return Struct(self.name, tuple(by_name.get(f.name, f) for f in self.fields))


Type_ = Scalar | PathLike | Opaque | Choice | Optional_ | Union_ | ListOf | NotMirrored | Struct

INT, FLOAT, BOOL, STR = Scalar(int), Scalar(float), Scalar(bool), Scalar(str)


def opt(inner: Type_) -> Optional_:
    return Optional_(inner)


def req(name: str, type_: Type_) -> Field:
    return Field(name, type_, required=True)


# The schemas ------------------------------------------------------------------------------

# utils_config.py: str_to_dtype (the torch.dtype hook), cast_str_to_pipeline_engine, the enums.
DTYPES: Final = ("float32", "float64", "complex64", "complex128", "float16", "bfloat16", "uint8",
                 "int8", "int16", "int32", "int64", "bool")
PP_ENGINES: Final = ("afab", "1f1b")
TP_MODES: Final = ("ALL_REDUCE", "REDUCE_SCATTER")  # parallel/tensor_parallel/enum.py
INIT_SCALING: Final = ("NONE", "NUM_LAYERS", "LAYER_INDEX", "MODEL_SCALE")  # main only
LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical", "passive")
# nn/attention.py ALL_ATTENTION_FUNCTIONS (main; LlamaConfig._attn_implementation is its Literal)
ATTENTION: Final = ("flash_attention_2", "flex_attention", "sdpa", "ring_flash_triton", "ring",
                    "llama3_ring_attention")

_PARALLELISM_OLD = Struct("ParallelismArgs", (
    req("dp", INT), req("pp", INT), req("tp", INT),
    Field("pp_engine", opt(Choice(PP_ENGINES))),
    Field("tp_mode", opt(Choice(TP_MODES, upper=True))),
    Field("tp_linear_async_communication", opt(BOOL)),
    Field("recompute_layer", BOOL),
    Field("tp_recompute_allgather", BOOL),
    Field("expert_parallel_size", INT),
))
_RANDOM_INIT_OLD = Struct("RandomInit", (req("std", FLOAT),))
_INIT_METHODS_OLD = (_RANDOM_INIT_OLD, Struct("SpectralMupInit", (req("use_mup", BOOL),)),
                     Struct("ExistingCheckpointInit", (req("path", PathLike()),)))
_LLAMA_OLD = Struct("LlamaConfig", (
    Field("bos_token_id", INT), Field("eos_token_id", INT), Field("hidden_act", STR),
    Field("hidden_size", INT), Field("initializer_range", FLOAT), Field("intermediate_size", INT),
    Field("is_llama_config", BOOL), Field("max_position_embeddings", INT),
    Field("num_attention_heads", INT), Field("num_hidden_layers", INT),
    Field("num_key_value_heads", opt(INT)), Field("pad_token_id", opt(INT)),
    Field("pretraining_tp", INT), Field("rms_norm_eps", FLOAT),
    Field("rope_scaling", opt(Opaque(dict))), Field("rope_theta", FLOAT),
    Field("rope_interleaved", BOOL), Field("tie_word_embeddings", BOOL), Field("use_cache", BOOL),
    Field("vocab_size", INT),
))
_GENERAL_OLD = Struct("GeneralArgs", (
    req("project", STR), Field("run", opt(STR)), Field("seed", opt(INT)), Field("step", opt(INT)),
    Field("consumed_train_samples", opt(INT)), Field("benchmark_csv_path", opt(PathLike())),
    Field("ignore_sanity_checks", BOOL),
))
_TOKENIZER = Struct("TokenizerArgs", (
    Field("tokenizer_name_or_path", opt(STR)), Field("tokenizer_revision", opt(STR)),
    Field("tokenizer_max_length", opt(INT)),
))
_CHECKPOINTS = Struct("CheckpointsArgs", (
    req("checkpoints_path", PathLike()), req("checkpoint_interval", INT),
    Field("save_initial_state", opt(BOOL)), Field("save_final_state", opt(BOOL)),
    Field("resume_checkpoint_path", opt(PathLike())), Field("load_lr_scheduler", opt(BOOL)),
    Field("load_optimizer", opt(BOOL)), Field("checkpoints_path_is_shared_file_system", opt(BOOL)),
))
_LOGGING = Struct("LoggingArgs", (
    Field("log_level", opt(STR)), Field("log_level_replica", opt(STR)),
    Field("iteration_step_info_interval", opt(INT)),
))
_TOKENS = Struct("TokensArgs", (
    req("sequence_length", INT), req("train_steps", INT), req("micro_batch_size", INT),
    req("batch_accumulation_per_replica", INT), Field("val_check_interval", opt(INT)),
    Field("limit_val_batches", opt(INT)), Field("limit_test_batches", opt(INT)),
))
# LRSchedulerArgs declares `lr_warmup_style: str = None` (and the same for lr_decay_style and
# min_decay_lr): not Optional, so dacite rejects an explicit null although the default is None.
_LR_SCHEDULER = Struct("LRSchedulerArgs", (
    req("learning_rate", FLOAT), Field("lr_warmup_steps", INT), Field("lr_warmup_style", STR),
    Field("lr_decay_style", STR), Field("lr_decay_steps", opt(INT)),
    Field("lr_decay_starting_step", opt(INT)), Field("min_decay_lr", FLOAT),
))
_OPTIMIZER_FACTORIES = (
    Struct("SGDOptimizerArgs", (Field("name", STR),)),
    Struct("AdamWOptimizerArgs", (req("adam_eps", FLOAT), req("adam_beta1", FLOAT),
                                  req("adam_beta2", FLOAT), req("torch_adam_is_fused", BOOL),
                                  Field("name", STR))),
)
_OPTIMIZER_OLD = Struct("OptimizerArgs", (
    req("optimizer_factory", Union_(_OPTIMIZER_FACTORIES)), req("zero_stage", INT),
    req("weight_decay", FLOAT), req("clip_grad", opt(FLOAT)), req("accumulate_grad_in_fp32", BOOL),
    req("learning_rate_scheduler", _LR_SCHEDULER),
))
_DATA = Struct("DataArgs", (
    req("dataset", opt(NotMirrored("PretrainDatasetsArgs | NanosetDatasetsArgs (| SFTDatasetsArgs)"))),
    req("seed", opt(INT)), Field("num_loading_workers", opt(INT)),
))
_STAGE_OLD = Struct("DatasetStageArgs", (req("name", STR), req("start_training_step", INT),
                                          req("data", _DATA)))
_PROFILER_OLD = Struct("ProfilerArgs", (req("profiler_export_path", opt(PathLike())),))
_S3_UPLOAD = Struct("S3UploadArgs", (
    req("upload_s3_path", PathLike()), req("remove_after_upload", BOOL),
    req("s5cmd_numworkers", opt(INT)), req("s5cmd_concurrency", opt(INT)),
    req("s5cmd_path", opt(PathLike())),
))
_LIGHTEVAL = NotMirrored("LightEvalConfig")


def _model(model_config: Type_, init_methods: tuple[Struct, ...]) -> Struct:
    return Struct("ModelArgs", (
        req("model_config", model_config), req("init_method", Union_(init_methods)),
        Field("dtype", opt(Choice(DTYPES))), Field("make_vocab_size_divisible_by", INT),
        Field("ddp_bucket_cap_mb", INT),
    ))


def _config(*, general: Struct, parallelism: Struct, model: Struct, tokenizer: Field,
            optimizer: Struct, stage: Struct, profiler: Struct,
            extra: tuple[Field, ...] = ()) -> Struct:
    return Struct("Config", (
        req("general", general), req("parallelism", parallelism), req("model", model), tokenizer,
        Field("checkpoints", opt(_CHECKPOINTS)), Field("logging", opt(_LOGGING)), *extra,
        Field("tokens", opt(_TOKENS)), Field("optimizer", opt(optimizer)),
        Field("data_stages", opt(ListOf(stage))), Field("profiler", opt(profiler)),
        Field("lighteval", opt(_LIGHTEVAL)), Field("s3_upload", opt(_S3_UPLOAD)),
    ))


# @e24d2483: Config.tokenizer has no default (required); no context_parallel_size, no
# metrics_logging, a one-field RandomInit and ProfilerArgs, a LlamaConfig without
# attention_bias/_attn_implementation/z_loss_*.
PLAYBOOK_CONFIG: Final = _config(
    general=_GENERAL_OLD, parallelism=_PARALLELISM_OLD,
    model=_model(_LLAMA_OLD, _INIT_METHODS_OLD), tokenizer=req("tokenizer", _TOKENIZER),
    optimizer=_OPTIMIZER_OLD, stage=_STAGE_OLD, profiler=_PROFILER_OLD)

# @2411b022: what main added since (context_parallel_size: b641237d, on main 2025-03-21).
_METRICS_LOGGING = Struct("MetricsLoggingArgs", (Field("log_level", INT),
                                                 Field("log_detail_interval", INT)))
LLAMA_MAIN = _LLAMA_OLD.with_fields(Field("attention_bias", BOOL),
                                     Field("_attn_implementation", opt(Choice(ATTENTION))),
                                     Field("z_loss_enabled", BOOL),
                                     Field("z_loss_coefficient", FLOAT))
# config/models_config.py @2411b022 (MoE: 7bc99232, 2025-06-23). MoEConfig.__post_init__ and
# Qwen2Config.__post_init__ are replayed in CHECKS below.
MOE_CONFIG: Final = Struct("MoEConfig", (
    Field("num_experts", INT), Field("top_k", INT), Field("moe_intermediate_size", INT),
    Field("shared_expert_intermediate_size", INT), Field("router_aux_loss_coef", FLOAT),
    Field("layers", ListOf(INT)), Field("enable_shared_expert", BOOL),
    Field("token_dispatcher_type", STR),
))
QWEN2_CONFIG: Final = Struct("Qwen2Config", (
    Field("bos_token_id", INT), Field("eos_token_id", INT), Field("hidden_act", STR),
    Field("hidden_size", INT), Field("initializer_range", FLOAT), Field("intermediate_size", INT),
    Field("is_qwen2_config", BOOL), Field("max_position_embeddings", INT),
    Field("num_attention_heads", INT), Field("num_hidden_layers", INT),
    Field("num_key_value_heads", opt(INT)), Field("pad_token_id", opt(INT)),
    Field("pretraining_tp", INT), Field("rms_norm_eps", FLOAT),
    Field("rope_scaling", opt(Opaque(dict))), Field("rope_theta", FLOAT),
    Field("rope_interleaved", BOOL), Field("rope_seq_len_interpolation_factor", opt(FLOAT)),
    Field("tie_word_embeddings", BOOL), Field("use_cache", BOOL), Field("vocab_size", INT),
    Field("_attn_implementation", opt(Choice(ATTENTION))), Field("flex_attention_mask", opt(STR)),
    Field("attention_bias", BOOL), Field("sliding_window_size", opt(INT)),
    Field("z_loss_enabled", BOOL), Field("z_loss_coefficient", FLOAT),
    Field("no_rope_layer", opt(INT)), Field("_fused_rotary_emb", BOOL),
    Field("_fused_rms_norm", BOOL), Field("_use_qkv_packed", BOOL), Field("_use_doc_masking", BOOL),
    Field("log_attn_probs", BOOL), Field("ring_attn_heads_k_stride", opt(INT)),
    Field("moe_config", opt(MOE_CONFIG)),
))
MAIN_CONFIG: Final = _config(
    general=_GENERAL_OLD,
    parallelism=_PARALLELISM_OLD.with_fields(Field("context_parallel_size", INT)),
    model=_model(
        Union_((LLAMA_MAIN, QWEN2_CONFIG)),
        (_RANDOM_INIT_OLD.with_fields(Field("scaling_method", Choice(INIT_SCALING, upper=True))),
         *_INIT_METHODS_OLD[1:])),
    tokenizer=Field("tokenizer", opt(_TOKENIZER)),
    optimizer=_OPTIMIZER_OLD.with_fields(Field("weight_decay_exclude_named_params",
                                               opt(ListOf(STR)))),
    stage=_STAGE_OLD.with_fields(Field("sequence_length", opt(INT))),
    profiler=_PROFILER_OLD.with_fields(
        *(Field(n, INT) for n in ("wait", "warmup", "active", "repeat", "skip_first")),
        *(Field(n, BOOL) for n in ("record_shapes", "profile_memory", "with_stack",
                                   "export_chrome_trace"))),
    extra=(Field("metrics_logging", opt(_METRICS_LOGGING)),))

SCHEMAS: Final[Mapping[str, Struct]] = {MAIN: MAIN_CONFIG, PLAYBOOK: PLAYBOOK_CONFIG}


# The loader -------------------------------------------------------------------------------

class ConfigError(ValueError):
    """The config nanotron would refuse; the message lists every problem with its key path."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


def _type_name(type_: Type_) -> str:
    match type_:
        case Scalar(kind) | Opaque(kind) if kind is not None:
            return kind.__name__
        case Opaque():
            return "Any"
        case PathLike():
            return "Path (a string)"
        case Choice(values, upper):
            return f"one of {list(values)}" + (" (any case)" if upper else "")
        case Optional_(inner):
            return f"{_type_name(inner)} or null"
        case Union_(members):
            return " | ".join(_type_name(m) for m in members)
        case ListOf(item):
            return f"list of {_type_name(item)}"
        case NotMirrored(name):
            return f"null (llm-sweep does not mirror {name})"
        case Struct(name):
            return f"a mapping for {name}"
    raise TypeError(type_)


def check_types(type_: Type_, value: Any, where: str) -> list[str]:
    """The problems of one value against one type (empty: it loads)."""
    match type_:
        case Optional_(inner):
            return [] if value is None else check_types(inner, value, where)
        case Union_(members):
            tried = [check_types(member, value, where) for member in members]
            if any(not problems for problems in tried):
                return []
            return [f"{where}: matches no member of {_type_name(type_)}: "
                    + " / ".join(p[0] for p in tried)]
        case Struct():
            return _check_struct(type_, value, where)
        case ListOf(item):
            if not isinstance(value, list):
                return [f"{where}: expected a list, got {value!r}"]
            return [p for i, v in enumerate(value) for p in check_types(item, v, f"{where}[{i}]")]
        case Choice(values, upper):
            key = value.upper() if upper and isinstance(value, str) else value
            ok = isinstance(value, str) and key in values
            return [] if ok else [f"{where}: {value!r} is not {_type_name(type_)}"]
        case Scalar(kind):
            ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
            return [] if ok else [f"{where}: expected {kind.__name__}, got {value!r}"]
        case PathLike():
            return [] if isinstance(value, str) else [f"{where}: expected a path string, got {value!r}"]
        case Opaque(kind):
            return [] if kind is None or isinstance(value, kind) else \
                [f"{where}: expected {kind.__name__}, got {value!r}"]
        case NotMirrored():
            return [] if value is None else [f"{where}: expected {_type_name(type_)}"]
    raise TypeError(type_)


def _check_struct(struct: Struct, value: Any, where: str) -> list[str]:
    if not isinstance(value, Mapping):
        return [f"{where}: expected {_type_name(struct)}, got {value!r}"]
    known = {f.name for f in struct.fields}
    problems = [f"{where}.{key}: unknown key for {struct.name} (nanotron's strict loader rejects it)"
                for key in value if key not in known]
    for f in struct.fields:
        if f.name in value:
            problems += check_types(f.type, value[f.name], f"{where}.{f.name}")
        elif f.required:
            problems.append(f"{where}.{f.name}: missing required field of {struct.name}")
    return problems
