"""The sweep spec: a YAML file, validated with pydantic.

Errors name the file, the line when the YAML has one, the field, and what is allowed
(`SpecError`). Every string that can reach a shell script or a file name is checked against a
strict pattern here, so that no spec value can become a command.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core.core_schema import SerializerFunctionWrapHandler

from sweep.core import catalog
from sweep.core.errors import SpecError
from sweep.core.hardware import GpuSpec
from sweep.core.layout import DTYPES, FRAMEWORKS, PP_SCHEDULES, RECOMPUTE_MODES, ROW_KEY
from sweep.core.model import ModelShape, shape_problems
from sweep.core.units import GiB, MiB
from sweep.core.yaml_locate import field_path, first_duplicate_key, line_of
from sweep.frameworks import get_adapter
from sweep.job.early_stop import EarlyStop
from sweep.models.memory_profiles import RESERVED_BAND, Allocator, MemoryProfile, profile_with

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# Slurm option values: partition names, accounts, QoS, feature expressions, node lists.
SLURM_VALUE_PATTERN = r"^[A-Za-z0-9._,:=@%+/\[\]-]{1,256}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
TIME_PATTERN = re.compile(r"^(?:(\d+)-)?(\d{1,2}):(\d{2}):(\d{2})$|^(\d+)$")

Name = Annotated[str, Field(pattern=NAME_PATTERN)]
SlurmValue = Annotated[str, Field(pattern=SLURM_VALUE_PATTERN)]
PositiveInt = Annotated[int, Field(gt=0)]


def _slurm_time(value: str) -> str:
    if not TIME_PATTERN.match(value):
        raise ValueError("use Slurm's format: minutes, HH:MM:SS or D-HH:MM:SS")
    return value


SlurmTime = Annotated[str, AfterValidator(_slurm_time)]  # a --time value
Auto = Literal["auto"]
NOT_HASHED = {"driver", "max_gpu_hours", "export"}  # Spec fields that do not change any run
# The plan columns an override's `where` may name: a plan row's key but vpp, which the planner
# derives from pp_schedule.
OVERRIDE_COLUMNS = tuple(c for c in ROW_KEY if c != "vpp")


def _catalog_model(name: str) -> str:
    try:
        catalog.get_model(name)
    except catalog.CatalogError as error:
        raise ValueError(str(error)) from None
    return name


ModelRef = Annotated[Name, AfterValidator(_catalog_model)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InlineModel(_Strict):
    """A model given by its shape instead of a catalog name."""

    name: Name
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    num_kv_heads: PositiveInt | None = None
    ffn_hidden_size: PositiveInt
    vocab_size: PositiveInt
    tie_word_embeddings: bool = False
    head_dim: PositiveInt | None = None
    num_experts: Annotated[int, Field(ge=0)] = 0
    experts_per_token: Annotated[int, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _buildable(self) -> InlineModel:
        self.to_shape()
        return self

    def to_shape(self) -> ModelShape:
        shape = ModelShape(
            name=self.name, num_layers=self.num_layers, hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            num_kv_heads=self.num_kv_heads or self.num_attention_heads,
            ffn_hidden_size=self.ffn_hidden_size, vocab_size=self.vocab_size,
            tie_word_embeddings=self.tie_word_embeddings, head_dim=self.head_dim or 0,
            num_experts=self.num_experts, experts_per_token=self.experts_per_token,
            source="inline in spec")
        problems = shape_problems(shape)
        if problems:
            raise ValueError("; ".join(problems))
        return shape


ModelEntry = Annotated[
    Annotated[ModelRef, Tag("catalog")] | Annotated[InlineModel, Tag("inline")],
    Discriminator(lambda value: "catalog" if isinstance(value, str) else "inline"),
]


class GlobalBatch(_Strict):
    sequences: PositiveInt | None = None
    tokens: PositiveInt | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> GlobalBatch:
        if (self.sequences is None) == (self.tokens is None):
            raise ValueError("give exactly one of `sequences` or `tokens`")
        return self


IntAxis = Auto | list[PositiveInt]


class Axes(_Strict):
    """The axes to sweep. `auto` derives the values from the GPU count and the model."""

    dp: IntAxis = "auto"
    tp: IntAxis = "auto"
    pp: IntAxis = "auto"
    cp: IntAxis = [1]
    ep: IntAxis = [1]
    mbs: IntAxis = "auto"
    zero_stage: Auto | list[Literal[0, 1, 2, 3]] = "auto"
    recompute: list[Literal["none", "selective", "full"]] = ["none"]
    sp: list[bool] = [True]
    pp_schedule: list[Literal["1f1b", "gpipe", "interleaved_1f1b"]] = ["1f1b"]

    @field_validator("dp", "tp", "pp", "cp", "ep", "mbs", "zero_stage", "recompute", "sp",
                     "pp_schedule")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("must list at least one value (or be `auto` where allowed)")
        return sorted(set(value)) if isinstance(value, list) else value


def _without_unset(data: dict[str, Any], key: str) -> dict[str, Any]:
    """A dumped model without an optional field that is unset (None): a field added to the spec
    later must not change the hash, or the run.json, of a spec that does not use it."""
    if data.get(key) is None:
        data.pop(key, None)
    return data


ALLOCATOR_SHARE_MAX = 4.0  # a share of 4 reserves four times the bytes it follows: past any fit
FLOOR_MIB_MAX = 64 * 1024  # a floor of 64 GiB beyond live tensors: past any GPU's stack
BAND_HIGH_MAX = 4.0  # predicted five times the measured peak: no model worth planning with


class AllocatorConstants(_Strict):
    """The memory model's allocator constants (`sweep.models.memory_profiles.Allocator`) for this sweep,
    in place of the ones fitted on the playbook's nanotron runs: what `sweep memory-check RUNS
    --write-constants` fits on a cluster's own runs, so that the next sweep there plans with them."""

    sequential: Annotated[float, Field(ge=0.0, le=ALLOCATOR_SHARE_MAX)]
    pipelined: Annotated[float, Field(ge=0.0, le=ALLOCATOR_SHARE_MAX)]
    logits: Annotated[float, Field(ge=0.0, le=ALLOCATOR_SHARE_MAX)]
    floor_mib: Annotated[int, Field(ge=0, le=FLOOR_MIB_MAX)]
    # How far off these constants are on a model they were not fitted on: the 5th and 95th
    # percentiles of predicted / measured - 1 of the reserved peak, leave one model out (`sweep
    # memory-check --write-constants --cv model` writes it). The memory rule's probes use it
    # (sweep.plan.space.memory_over); None: the shipped constants' band, measured on other runs.
    band: tuple[float, float] | None = None

    @field_validator("band", mode="before")
    @classmethod
    def _band_has_two_ends(cls, band: object) -> object:
        if isinstance(band, (list, tuple)) and len(band) != 2:
            raise ValueError(f"band {list(band)} must be two numbers, [low, high]: the 5th and "
                             "95th percentiles of predicted / measured - 1")
        return band

    @field_validator("band")
    @classmethod
    def _band_is_an_interval(cls, band: tuple[float, float] | None) -> tuple[float, float] | None:
        if band is not None and not (-1.0 < band[0] <= band[1] <= BAND_HIGH_MAX):
            raise ValueError(f"band {list(band)} must be [low, high] with -1 < low <= high <= "
                             f"{BAND_HIGH_MAX:g}: the 5th and 95th percentiles of predicted / "
                             "measured - 1 (`sweep memory-check --write-constants --cv model` "
                             "writes them)")
        return band

    @model_serializer(mode="wrap")
    def _omit_band_when_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_unset(handler(self), "band")

    def to_allocator(self) -> Allocator:
        return Allocator(self.sequential, self.pipelined, self.logits, self.floor_mib * MiB)


class Constraints(_Strict):
    max_tp: PositiveInt | None = None  # default: GPUs per node
    allow_tp_across_nodes: bool = False
    max_pp: PositiveInt | None = None
    max_mbs: PositiveInt = 64
    memory_headroom: Annotated[float, Field(ge=0.0, lt=0.5)] = 0.0  # fraction of GPU memory kept free
    # Keep (as a probe) a candidate the memory model's point estimate puts over the limit when its
    # left-out error band reaches under it (sweep.plan.space.memory_over); false: the point estimate
    # decides alone.
    memory_probes: bool = True
    allocator: AllocatorConstants | None = None  # None: the framework profile's fitted constants

    @model_serializer(mode="wrap")
    def _omit_allocator_when_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_unset(handler(self), "allocator")


class MoeSettings(_Strict):
    """How a mixture-of-experts model routes and shards its experts (`run.moe`, docs/spec.md).
    Read by torchtitan 0.3 and main (launch/torchtitan.config.py.j2); a run of a dense model
    ignores it."""

    # The router's auxiliary-loss-free load balancing: the speed of the per-expert bias update
    # (torchtitan MoE.Config.load_balance_coeff, default 1e-3); null turns it off.
    load_balance_coeff: Annotated[float, Field(gt=0.0)] | None = 1e-3
    # Route every token round-robin so each expert gets the same count (debug.moe_force_load_balance):
    # a benchmark of the layout, not of a trained router's imbalance.
    force_load_balance: bool = False
    # Expert tensor parallelism: "tp" (experts sharded over the TP ranks) or 1 (not); None:
    # whatever the framework does. torchtitan 0.3 has no setting for it (etp = tp when ep = 1,
    # 1 when ep > 1), so a plan prunes the layouts that would run the other way.
    expert_tensor_parallel: Literal[1, "tp"] | None = None


class RunSettings(_Strict):
    """How each run executes; `overrides` can change these for a subset of runs."""

    steps: PositiveInt = 10
    warmup_steps: Annotated[int, Field(ge=0)] = 3
    time_limit: SlurmTime = "00:20:00"
    startup_timeout_s: PositiveInt = 600
    hang_timeout_s: PositiveInt = 300
    signal_before_s: PositiveInt = 120
    exclusive: bool = True
    partition: SlurmValue | None = None
    account: SlurmValue | None = None
    qos: SlurmValue | None = None
    constraint: SlurmValue | None = None
    reservation: SlurmValue | None = None
    exclude: list[SlurmValue] = []
    cpus_per_task: PositiveInt | None = None
    mem: SlurmValue | None = None  # Slurm --mem per node, e.g. "64G"; None: from the plan (sweep.plan.resources)
    rank_memory_limit_mb: PositiveInt | None = None  # RLIMIT_AS per rank (CPU OOM demo and tests)
    env: dict[Annotated[str, Field(pattern=ENV_NAME_PATTERN)], str] = {}
    framework_dir: str | None = None  # checkout of Megatron-LM / nanotron / torchtitan
    # The framework version to render for (a key of the adapter's supported versions; default:
    # the adapter's default). The job refuses to start on a version this key does not cover.
    framework_version: str | None = None
    # Throughput settings a practitioner would use for a benchmark (docs/frameworks.md, "Framework options"):
    # Megatron: --overlap-grad-reduce, and --overlap-param-gather with the distributed optimizer.
    overlap_communication: bool = True
    tp_comm_overlap: bool = False  # Megatron + Transformer Engine userbuffers (--tp-comm-overlap)
    compile: bool = False  # torchtitan: torch.compile the model (--compile.enable)
    moe: MoeSettings | None = None  # mixture-of-experts settings (None: the framework's defaults)
    # Cluster environment: shell lines run before launch (module load, source venv/bin/activate),
    # shown verbatim in job.sbatch; and a pyxis/enroot container for the ranks.
    setup: list[str] = []
    container_image: str | None = None
    container_mounts: list[str] = []
    # The interpreter that jobs run llm-sweep and the launchers with. None: the one that renders
    # (`sys.executable`, an absolute path), so jobs use the installation that rendered them even
    # when no virtualenv is activated on the compute node. The preflight checks it there.
    python: str | None = None
    seed: Annotated[int, Field(ge=0)] = 1234
    early_stop: EarlyStop | None = None  # end a run once its step times are steady (sweep.job.early_stop)
    # A run whose slowest node's step time exceeds this × its nodes' median names that node a
    # straggler (sweep.collect.stragglers; None: its DEFAULT_FACTOR, 1.2).
    straggler_factor: Annotated[float, Field(gt=1.0)] | None = None

    @field_validator("early_stop")
    @classmethod
    def _early_stop_reachable(cls, rule: EarlyStop | None, info: ValidationInfo) -> EarlyStop | None:
        steps, warmup = info.data.get("steps"), info.data.get("warmup_steps")
        if rule is not None and steps is not None and warmup is not None \
                and max(warmup + rule.window, rule.min_steps) > steps:
            raise ValueError(
                f"warmup_steps ({warmup}) + window ({rule.window}) and min_steps ({rule.min_steps}) "
                f"must fit in steps ({steps}), or the rule can never end a run; raise steps or "
                f"lower the window")
        return rule

    @model_serializer(mode="wrap")
    def _omit_early_stop_when_off(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_unset(_without_unset(_without_unset(handler(self), "early_stop"),
                                             "straggler_factor"), "moe")

    @field_validator("framework_dir", "python", "container_image")
    @classmethod
    def _safe_path(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9._/+~:#@-]{1,512}", value):
            raise ValueError("paths and image names may use letters, digits and . _ / + ~ : # @ - "
                             "only")
        return value

    @field_validator("container_mounts")
    @classmethod
    def _safe_mounts(cls, value: list[str]) -> list[str]:
        for mount in value:
            if not re.fullmatch(r"[A-Za-z0-9._/+~-]+(:[A-Za-z0-9._/+~-]+)?(:r[ow])?", mount):
                raise ValueError(f"{mount!r}: a mount is SRC[:DST[:ro|rw]] with paths of letters, "
                                 "digits and . _ / + ~ - only")
        return value

    @field_validator("setup")
    @classmethod
    def _one_line_each(cls, value: list[str]) -> list[str]:
        """Setup lines go into job.sbatch verbatim (they are the user's own shell), so each must
        be one line: a newline or NUL inside one would hide a line from the reader."""
        for line in value:
            if "\n" in line or "\r" in line or "\0" in line or not line.strip():
                raise ValueError(f"{line!r}: each setup entry is one non-empty shell line; "
                                 "list several lines as several entries")
        return value

    @model_validator(mode="after")
    def _signal_before_the_limit(self) -> RunSettings:
        if self.signal_before_s >= self.time_limit_s:
            raise ValueError(
                f"signal_before_s ({self.signal_before_s} s) must be shorter than time_limit "
                f"({self.time_limit} = {self.time_limit_s} s), or Slurm signals the job as it "
                "starts (and it may send the signal up to 60 s early); lower signal_before_s or "
                "raise time_limit")
        return self

    @property
    def time_limit_s(self) -> int:
        return time_limit_seconds(self.time_limit)


class DriverSettings(_Strict):
    """The search driver of a detached sweep (`sweep submit --detach`): a small CPU job that runs
    the rounds of a pruned, adaptive or shortlist search, then collect and report. It requeues
    itself at its time limit, so `time_limit` bounds one stint, not the whole search."""

    partition: SlurmValue | None = None  # default: the cluster's default partition
    account: SlurmValue | None = None
    qos: SlurmValue | None = None
    time_limit: SlurmTime = "04:00:00"
    mem: SlurmValue = "2G"
    cpus: PositiveInt = 1
    # Seconds before the time limit that Slurm signals the driver to checkpoint and requeue
    # (Slurm may send it up to 60 s early).
    signal_before_s: PositiveInt = 90

    @property
    def time_limit_s(self) -> int:
        return time_limit_seconds(self.time_limit)

    @property
    def time_limit_min(self) -> int:
        """Whole minutes, rounded up (submitit and Slurm count the driver's time in minutes)."""
        return max(1, -(-self.time_limit_s // 60))

    @model_validator(mode="after")
    def _signal_before_the_limit(self) -> DriverSettings:
        if self.signal_before_s >= self.time_limit_s:
            raise ValueError(
                f"signal_before_s ({self.signal_before_s} s) must be shorter than time_limit "
                f"({self.time_limit} = {self.time_limit_s} s); lower signal_before_s or raise "
                "time_limit")
        return self


def time_limit_seconds(text: str) -> int:
    """Slurm's minutes, HH:MM:SS or D-HH:MM:SS in seconds (already validated)."""
    match = TIME_PATTERN.match(text)
    assert match is not None
    if match.group(5):
        return int(match.group(5)) * 60
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups()[:4])
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


class Override(_Strict):
    """Run settings for the runs whose plan columns equal every value of `where`."""

    where: dict[str, str | int | bool]
    set: dict[str, Any]

    @field_validator("where")
    @classmethod
    def _known_columns(cls, value: dict[str, Any]) -> dict[str, Any]:
        allowed = set(OVERRIDE_COLUMNS)
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise ValueError(f"unknown column(s) {unknown}; allowed: {sorted(allowed)}")
        return value


class ExportSettings(_Strict):
    """Experiment trackers the sweep's attempts go to when it ends (`sweep run`, the detached
    driver), after its report: `mlflow[:URI]` or `wandb[:ENTITY/PROJECT]` (docs/trackers.md).
    An export that fails never fails the sweep; `sweep export DIR` retries it."""

    to: list[str] = Field(min_length=1)

    @field_validator("to")
    @classmethod
    def _trackers(cls, value: list[str]) -> list[str]:
        from sweep.core.trackers import parse_target

        return [str(parse_target(text)) for text in value]


class Spec(_Strict):
    name: Name
    framework: Literal["megatron", "nanotron", "torchtitan", "builtin"] = "builtin"
    models: list[ModelEntry] = Field(min_length=1)
    nodes: list[PositiveInt] = Field(min_length=1)
    gpus_per_node: PositiveInt | None = None  # default: the GPU type's usual node
    gpu: str = "h100-sxm"
    gpu_memory_gb: Annotated[float, Field(gt=0)] | None = None  # override the catalog (GiB)
    dtype: Literal["bf16", "fp16", "fp8", "tf32", "fp32"] = "bf16"
    seq_len: PositiveInt
    global_batch: GlobalBatch
    axes: Axes = Axes()
    constraints: Constraints = Constraints()
    run: RunSettings = RunSettings()
    overrides: list[Override] = []
    templates_dir: str | None = None
    driver: DriverSettings = DriverSettings()
    export: ExportSettings | None = None  # trackers to export to when the sweep ends
    # Cap on the sweep's GPU-hours: spent + in flight (at their time limits) never exceeds it.
    max_gpu_hours: Annotated[float, Field(gt=0)] | None = None

    @field_validator("nodes")
    @classmethod
    def _unique_nodes(cls, value: list[int]) -> list[int]:
        return sorted(set(value))

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        try:
            return catalog.get_gpu(value).name
        except catalog.CatalogError as error:
            raise ValueError(str(error)) from None

    @field_validator("models")
    @classmethod
    def _known_models(cls, value: list[Any]) -> list[Any]:
        names = [e if isinstance(e, str) else e.name for e in value]
        if len(set(names)) != len(names):
            raise ValueError("model names must be unique")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Spec:
        allowed = get_adapter(self.framework).zero_stages
        if self.axes.zero_stage != "auto":
            bad = [z for z in self.axes.zero_stage if z not in allowed]
            if bad:
                raise ValueError(
                    f"axes.zero_stage: {self.framework} supports ZeRO stages {list(allowed)}, "
                    f"not {bad}")
        if self.global_batch.tokens is not None and self.global_batch.tokens % self.seq_len:
            raise ValueError(
                f"global_batch.tokens: {self.global_batch.tokens} is not a multiple of seq_len "
                f"{self.seq_len}; use a multiple, or give global_batch.sequences")
        for index, override in enumerate(self.overrides):
            try:
                RunSettings.model_validate({**self.run.model_dump(), **override.set})
            except ValidationError as error:
                raise ValueError(f"overrides.{index}.set: {_settings_error(error)}") from None
        if self.run.warmup_steps >= self.run.steps:
            raise ValueError(
                f"run.warmup_steps: must be smaller than run.steps ({self.run.steps}) so that "
                "some steps are measured")
        self._check_framework_versions()
        return self

    def _check_framework_versions(self) -> None:
        """run.framework_version (and any override's) must be a version the adapter renders for."""
        from sweep.frameworks import get_adapter

        adapter = get_adapter(self.framework)
        pinned = [("run.framework_version", self.run.framework_version)]
        pinned += [(f"overrides.{i}.set.framework_version", o.set["framework_version"])
                   for i, o in enumerate(self.overrides) if "framework_version" in o.set]
        for where, key in pinned:
            if key is not None and key not in {v.key for v in adapter.versions}:
                known = "; ".join(f"{v.key} ({v.description})" for v in adapter.versions)
                raise ValueError(f"{where}: {self.framework} has no supported version {key!r}; "
                                 f"use one of: {known}")

    # Resolved views -----------------------------------------------------------------------

    @cached_property
    def gpu_spec(self) -> GpuSpec:
        spec = catalog.get_gpu(self.gpu)
        if self.gpu_memory_gb is not None:
            from dataclasses import replace
            spec = replace(spec, memory_bytes=int(self.gpu_memory_gb * GiB))
        return spec

    @property
    def gpus_per_node_resolved(self) -> int:
        return self.gpus_per_node or self.gpu_spec.gpus_per_node

    @cached_property
    def model_shapes(self) -> tuple[ModelShape, ...]:
        return tuple(catalog.get_model(m) if isinstance(m, str) else m.to_shape()
                     for m in self.models)

    @property
    def global_batch_sequences(self) -> int:
        if self.global_batch.sequences is not None:
            return self.global_batch.sequences
        assert self.global_batch.tokens is not None
        return self.global_batch.tokens // self.seq_len

    @property
    def zero_stages(self) -> tuple[int, ...]:
        if self.axes.zero_stage == "auto":
            return get_adapter(self.framework).zero_stages
        return tuple(self.axes.zero_stage)

    @property
    def max_tp(self) -> int:
        return self.constraints.max_tp or self.gpus_per_node_resolved

    @property
    def allocator(self) -> Allocator | None:
        """The spec's own allocator constants (`constraints.allocator`), None: the profile's."""
        constants = self.constraints.allocator
        return constants.to_allocator() if constants is not None else None

    @property
    def memory_profile(self) -> MemoryProfile:
        """The memory profile of the framework at the version the runs are rendered for
        (run.framework_version, else the adapter's default), with the spec's allocator constants
        where it names them: every memory prediction of this sweep uses it."""
        version = get_adapter(self.framework).version(self.run.framework_version).key
        return profile_with(self.framework, self.allocator, version)

    @property
    def reserved_band(self) -> tuple[float, float]:
        """The band of the memory rule's probes: the spec's own (`constraints.allocator.band`),
        else the shipped constants' left-out error."""
        constants = self.constraints.allocator
        return constants.band if constants is not None and constants.band is not None \
            else RESERVED_BAND

    def spec_hash(self) -> str:
        """A stable hash of the validated spec (order of YAML keys does not matter)."""
        # How the sweep is driven and capped does not change a run: left out, so that a new
        # budget or driver partition neither re-plans the sweep nor changes older hashes.
        canonical = json.dumps(self.model_dump(mode="json", exclude=NOT_HASHED), sort_keys=True,
                               separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def run_settings_for(self, columns: dict[str, Any]) -> RunSettings:
        """The run settings of one run: the defaults, then each matching override in order.
        Each override alone was checked at load; two that match one run may still clash."""
        settings = self.run
        matched: list[int] = []
        for index, override in enumerate(self.overrides):
            if all(_same(columns.get(k), v) for k, v in override.where.items()):
                matched.append(index)
                try:
                    settings = RunSettings.model_validate({**settings.model_dump(), **override.set})
                except ValidationError as error:
                    raise SpecError("spec", 0, f"overrides{matched}", (
                        f"together they give runs like {columns.get('model')} on "
                        f"{columns.get('nodes')} node(s) invalid settings: "
                        f"{_settings_error(error)}; make them agree")) from None
        return settings


def _settings_error(error: ValidationError) -> str:
    """The first problem of a run settings check, as `field: message`."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden" and first["loc"]:
        message = _unknown_field(str(first["loc"][-1]), ("run", *first["loc"][:-1]))
    return f"{where}: {message}" if where else message


def _same(actual: Any, wanted: Any) -> bool:
    return actual == wanted or str(actual) == str(wanted)


# Loading ------------------------------------------------------------------------------------

def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file; raises SpecError located at the offending line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SpecError(str(path), 0, "(file)", f"cannot read the spec: {error.strerror}") from None
    return parse_spec(text, str(path))


def parse_spec(text: str, source: str = "<spec>") -> Spec:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = mark.line + 1 if mark else 0
        raise SpecError(source, line, "(yaml)", f"not valid YAML: {getattr(error, 'problem', error)}") from None
    if not isinstance(data, dict):
        raise SpecError(source, 1, "(top level)", "the spec must be a YAML mapping of fields")
    duplicate = first_duplicate_key(root)
    if duplicate is not None:
        repeated, line_before, line_again = duplicate
        raise SpecError(source, line_again, repeated,
                        f"appears twice (lines {line_before} and {line_again}); YAML would keep "
                        "only the second: merge them into one")
    try:
        return Spec.model_validate(data)
    except ValidationError as error:
        errors = error.errors()
        # A misspelt key also makes its correct spelling "missing": name the typo, not the gap.
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc = tuple(first["loc"])
        field = field_path(loc)
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = _unknown_field(str(loc[-1]), loc[:-1])
        elif first["type"] == "literal_error":
            message = f"{message} (got {first.get('input')!r})"
        elif first["type"] == "string_pattern_mismatch":
            message = (f"{first.get('input')!r} has characters that are not allowed here "
                       f"(must match {first['ctx']['pattern']})")
        located = re.match(r"^([a-z_]+(?:\.[a-z_0-9]+)*): (.*)$", message, re.S)
        if not loc and located:  # a cross-field check names its field in the message
            path, message = located.groups()
            loc = tuple(int(part) if part.isdigit() else part for part in path.split("."))
            field = field_path(loc)
        return_line = line_of(root, loc)
        raise SpecError(source, return_line, field, message) from None


def _known_field_names() -> set[str]:
    """Every field name a spec can hold, at any depth (for did-you-mean)."""
    names: set[str] = set()
    for model in (Spec, Axes, Constraints, RunSettings, Override, InlineModel, GlobalBatch,
                  EarlyStop, DriverSettings, AllocatorConstants, ExportSettings):
        names.update(model.model_fields)
    return names


def _sections() -> dict[str, type[BaseModel]]:
    """Each section of a spec, by the path a user writes, and the fields it holds."""
    return {"": Spec, "global_batch": GlobalBatch, "axes": Axes, "constraints": Constraints,
            "constraints.allocator": AllocatorConstants, "run": RunSettings,
            "run.early_stop": EarlyStop, "driver": DriverSettings, "export": ExportSettings,
            "models[i]": InlineModel,
            "overrides[i]": Override}


def _section_of(parent: tuple[Any, ...]) -> str:
    """The section path of a location's parent (list indices as [i]; an override's `set` is
    `run`'s settings)."""
    parts = [str(part) for part in parent if not isinstance(part, int)]
    if len(parts) >= 2 and parts[:2] == ["overrides", "set"]:
        return ".".join(["run", *parts[2:]])
    if parts and isinstance(parent[-1], int):
        parts[-1] += "[i]"
    elif len(parent) >= 2 and isinstance(parent[1], int):
        parts[0] += "[i]"
    return ".".join(parts)


def _unknown_field(key: str, parent: tuple[Any, ...]) -> str:
    """Why `key` is refused where it stands: a field of another section is said to belong
    there; a misspelt one gets the nearest spelling."""
    here = _section_of(parent)
    homes = [section for section, model in _sections().items()
             if key in model.model_fields and section != here]
    if homes:
        where = " or ".join(f"under `{s}:` ({s}.{key})" if s else "at the top level" for s in homes)
        return (f"unknown field {key!r} {'at the top level' if not here else f'in {here}'}: "
                f"it belongs {where}; move it there (docs/spec.md lists every field)")
    close = difflib.get_close_matches(key, sorted(_known_field_names() - {key}), n=1, cutoff=0.75)
    suggestion = f": did you mean {close[0]!r}?" if close else ""
    return (f"unknown field {key!r}{suggestion}; check the spelling against the spec reference "
            "(docs/spec.md)")


__all__ = ["Spec", "SpecError", "load_spec", "parse_spec", "FRAMEWORKS", "PP_SCHEDULES",
           "RECOMPUTE_MODES", "DTYPES"]
