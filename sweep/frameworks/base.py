"""What a framework adapter is: everything llm-sweep knows about one training framework.

An adapter is one folder, `sweep/frameworks/<name>/`, whose `__init__.py` exports `ADAPTER`, a
`FrameworkAdapter`. It names, in one place a person can read:

- the launch templates (`templates/launch/<name>.*.j2`, overridable by the user file by file);
- the log parser (`parser.py`), which reads the framework's own step and memory lines;
- the memory profile (`sweep.models.memory_profiles.PROFILES[<name>]`) and the FLOPs convention it logs;
- the capability table (`capabilities.py`): each configuration the framework cannot run as
  labelled, as a vectorised rule with the framework's own reason and where in its source it is;
- the versions it renders for, and how a job finds the version it is about to run;
- how its runs report (log lines, or the built-in workload's metrics.jsonl), which kernels it
  runs (fused, or PyTorch's eager operators) and the byte width of its gradient reduction.

The planner prunes what a capability rule rejects (`pruned:framework`, with the rule and the
reason in `prune_detail`), so no run is ever rendered as something other than its label.

Pure: no I/O. (Finding the installed version reads files; that is `sweep.frameworks.versions`.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from sweep.core.model import ModelShape
from sweep.frameworks.log_parser import LogParser
from sweep.models.memory_profiles import PROFILES, MemoryProfile

# numpy is imported where the rules run, not here: the watchdog reads the built-in adapter inside
# the job's memory cgroup, where the 11 MiB numpy costs can decide which process the kernel kills
if TYPE_CHECKING:
    import numpy as np

Columns = Mapping[str, "np.ndarray"]


@dataclass(frozen=True)
class CapabilityContext:
    """What a capability rule may look at besides the candidate columns.

    The columns are those of `sweep.plan.space`: dp, tp, pp, cp, ep, mbs, grad_acc, zero_stage,
    vpp, nodes, gpus (int64), sp (bool), recompute ("none" | "selective" | "full") and
    pp_schedule ("1f1b" | "gpipe" | "interleaved_1f1b"), one entry per candidate.
    """

    model: ModelShape
    dtype: str
    seq_len: int
    gpus_per_node: int
    global_batch_sequences: int
    framework_version: str  # a key of the adapter's `versions`
    overlap_communication: bool = True  # run.overlap_communication (sweep/plan/spec.py)
    tp_comm_overlap: bool = False  # run.tp_comm_overlap
    gpu: str = ""  # the catalog GPU name (sweep/core/catalog/gpus.yaml), "cpu" for CPU runs
    # run.moe.expert_tensor_parallel (sweep/plan/spec.py): "tp", 1, or None (the framework's own)
    expert_tensor_parallel: int | str | None = None


@dataclass(frozen=True)
class CapabilityRule:
    """One thing the framework cannot run as labelled.

    `fails(columns, ctx)` is a boolean mask over the candidates: True where the framework would
    reject the configuration, or run something other than what its row says. `reason` quotes or
    paraphrases the framework and `source` says where (file and commit), so a user can check it.
    """

    name: str
    reason: str
    source: str
    fails: Callable[[Columns, CapabilityContext], np.ndarray]

    def detail(self) -> str:
        return f"{self.name}: {self.reason} ({self.source})"


@dataclass(frozen=True)
class Requirement:
    """A Python module that a version imports on every run although its own package does not
    install it: the preflight and the job's version check look for it before anything starts,
    so a missing one costs a clear message, not an allocation that dies at import."""

    module: str
    why: str  # what imports it, and when
    install: str  # the command that installs it


@dataclass(frozen=True)
class SupportedVersion:
    """A version of the framework that we render for and test against.

    `key` is what a spec's `run.framework_version` names. `description` says which releases or
    commits it covers; `tested_with` lists the exact versions the contract tests use.
    """

    key: str
    description: str
    tested_with: tuple[str, ...] = ()
    requires: tuple[Requirement, ...] = ()


@dataclass(frozen=True)
class FrameworkAdapter:
    name: str
    description: str
    parser: Callable[[], LogParser]
    versions: tuple[SupportedVersion, ...]
    default_version: str
    capabilities: tuple[CapabilityRule, ...] = ()
    zero_stages: tuple[int, ...] = (0, 1)
    # The command a job runs to find the framework's version: see sweep.frameworks.versions.
    entry_point: str = ""  # the file in a checkout that the launcher runs (checked by preflight)
    checkout_env: str = ""  # the environment variable that points the launcher at a checkout
    notes: tuple[str, ...] = field(default=())
    # How the framework places a model on `stages` pipeline stages: whether every stage gets a
    # block (sweep.plan.space's pp_layers rule asks; each adapter answers from its framework's code).
    pipeline_fits: Callable[[ModelShape, int], bool] = field(default=lambda model, stages: True)
    expert_parallel: bool = True  # implements ep > 1 for mixture-of-experts models
    shards_need_divisibility: bool = False  # tp must divide the FFN and the vocabulary (no padding)
    # 1F1B needs at least pp - offset micro-batches per step (Megatron and nanotron: pp - 1).
    one_f_one_b_microbatch_offset: int = 1
    # True: the run writes its own step records and summary (sweep.core.state.METRICS_FILE) and stops
    # itself after `run.steps` or early (sweep.workload); the watchdog and collect read that file.
    # False: its log lines are the record (`parser`), and the watchdog ends it early
    # (sweep.job.early_stop) when `run.early_stop` says so.
    writes_metrics_file: bool = False
    bundled: bool = False  # the framework is this llm-sweep installation: its version is ours
    package: str = ""  # its Python distribution, when installed as one (sweep.job.provenance.PACKAGES)
    # Which of sweep.models.traffic's byte counts its element-wise kernels move: the frameworks' fused
    # kernels, or PyTorch's eager operators (counted on the built-in workload).
    kernels: Literal["fused", "eager"] = "fused"
    # Bytes of one gradient element in the data-parallel reduction, by the framework's default
    # (sweep.models.throughput's gradient traffic).
    grad_reduce_bytes: int = 4

    @property
    def memory_profile(self) -> MemoryProfile:
        """The memory model's profile of this framework (sweep.models.memory_profiles)."""
        return PROFILES[self.name]

    def version(self, key: str | None) -> SupportedVersion:
        wanted = key or self.default_version
        for version in self.versions:
            if version.key == wanted:
                return version
        known = ", ".join(v.key for v in self.versions)
        raise ValueError(f"{self.name} has no supported version {wanted!r}; supported: {known}")


NO_RULE: Final = -1
