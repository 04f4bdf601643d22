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
strings are the `Choice`s below). `validate` replays that, and the ``__post_init__`` checks and
model-building asserts that decide whether a layout runs (`_semantic_problems`), naming the key
path of every problem.

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

from collections.abc import Callable, Mapping, Sequence
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
_LLAMA_MAIN = _LLAMA_OLD.with_fields(Field("attention_bias", BOOL),
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
        Union_((_LLAMA_MAIN, QWEN2_CONFIG)),
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


def _check(type_: Type_, value: Any, where: str) -> list[str]:
    """The problems of one value against one type (empty: it loads)."""
    match type_:
        case Optional_(inner):
            return [] if value is None else _check(inner, value, where)
        case Union_(members):
            tried = [_check(member, value, where) for member in members]
            if any(not problems for problems in tried):
                return []
            return [f"{where}: matches no member of {_type_name(type_)}: "
                    + " / ".join(p[0] for p in tried)]
        case Struct():
            return _check_struct(type_, value, where)
        case ListOf(item):
            if not isinstance(value, list):
                return [f"{where}: expected a list, got {value!r}"]
            return [p for i, v in enumerate(value) for p in _check(item, v, f"{where}[{i}]")]
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
            problems += _check(f.type, value[f.name], f"{where}.{f.name}")
        elif f.required:
            problems.append(f"{where}.{f.name}: missing required field of {struct.name}")
    return problems


# The __post_init__ and model-building checks ------------------------------------------------

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
    return bool(_check(_LLAMA_MAIN, d["model"]["model_config"], "model_config"))


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
    found = _check(schema, data, "config")
    if found:
        return found  # the semantic checks assume a well-typed dict
    return [f"{message} ({check.where})" for check in CHECKS if version in check.versions
            if (message := check.problem(data, world_size)) is not None]


def validate(data: Any, version: str, world_size: int | None = None) -> None:
    """Raise ConfigError naming every problem `problems` finds."""
    found = problems(data, version, world_size)
    if found:
        raise ConfigError(found)
