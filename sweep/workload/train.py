"""The training loop: build the layout, run the steps, write metrics.jsonl on rank 0.

One code path for CPU (gloo) and CUDA (NCCL). Works standalone (one process, no torchrun) and
under torchrun (env://). `train` expects the process group to be up (see `init_distributed`), so
that tests can run several layouts in one process group.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sweep.core.catalog import gpu_mismatch
from sweep.core.runconfig import RunConfig
from sweep.core.state import METRICS_FILE, atomic_write_json
from sweep.job.early_stop import EarlyStop, Window, last_window, steady_window
from sweep.workload import metrics
from sweep.workload.cpu_wait import thread_waits, waited_s
from sweep.workload.data import Batch, global_batch, local_slice
from sweep.workload.memory_tracking import MemoryProbe, tracked_peak
from sweep.workload.model import Transformer, build, cross_entropy
from sweep.workload.node_times import gather, node_name, simulated_slowdown, straggle
from sweep.workload.parallel import (
    DataParallel,
    apply_context_parallel,
    apply_recompute,
    apply_tensor_parallel,
    build_mesh,
    build_optimizer,
    import_layout_modules,
)
from sweep.workload.peak import catalog_peak, cpu_threads_per_rank, ensure_cpu_peak

MEMTRACK_FILE = "memtrack.json"
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
SUPPORTED_DTYPES = ("fp32", "tf32", "bf16", "fp16")


class WorkloadError(ValueError):
    """The run.json asks for something the workload cannot do; the message names field and fix."""


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    memtrack: list[dict[str, int]] | None = None  # per rank: peak bytes by category
    metrics_write_s: float = 0.0
    loop_started_at: float = 0.0  # unix time the first step began (start-up ends here)
    loop_s: float = 0.0  # wall time of the timed steps
    build_s: float = 0.0  # mesh, model, wrappers, optimizer
    peak_s: float = 0.0  # dense-peak measurement (CPU)


def device_for(cfg: RunConfig) -> torch.device:
    if cfg.gpu.lower() == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise WorkloadError(f"run.json gpu: {cfg.gpu!r} needs CUDA, but torch.cuda.is_available() is "
                            f"False (torch {torch.__version__}); use gpu 'cpu' to run on CPU")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    mismatch = gpu_mismatch(cfg.gpu, [torch.cuda.get_device_name(device)])
    if mismatch:  # MFU divides by the catalog peak of cfg.gpu: refuse rather than misreport
        raise WorkloadError(f"run.json {mismatch}")
    return device


def init_distributed(device: torch.device, timeout_s: float) -> None:
    """env:// under torchrun; a private one-rank store when started as a plain process."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=timeout_s)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend, timeout=timeout)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)


def config_problems(cfg: RunConfig, world_size: int) -> list[str]:
    """Why this rank cannot run `cfg`, as `field: fix` sentences (empty when it can)."""
    layout, shape = cfg.layout, cfg.model
    problems = []
    if layout.world_size != world_size:
        problems.append(f"layout: needs {layout.world_size} ranks ({layout.label()}) but WORLD_SIZE is "
                        f"{world_size}; launch it with --nproc-per-node {layout.world_size} "
                        f"(or torchrun --nproc-per-node {layout.world_size})")
    if layout.ep != 1:
        problems.append(f"layout.ep: {layout.ep}; the built-in workload has no expert parallelism (use 1)")
    if cfg.global_batch_sequences != layout.sequences_per_step:
        problems.append(f"global_batch_sequences: {cfg.global_batch_sequences} != dp·mbs·grad_acc = "
                        f"{layout.sequences_per_step}; fix the layout or the batch")
    if cfg.dtype not in SUPPORTED_DTYPES:
        problems.append(f"dtype: {cfg.dtype!r} is not supported by the built-in workload; "
                        f"use one of {', '.join(SUPPORTED_DTYPES)}")
    if shape.num_kv_heads % layout.tp:
        problems.append(f"layout.tp: {layout.tp} must divide num_kv_heads ({shape.num_kv_heads})")
    if shape.ffn_hidden_size % layout.tp or shape.vocab_size % layout.tp:
        problems.append(f"layout.tp: {layout.tp} must divide ffn_hidden_size and vocab_size")
    if layout.sp and layout.tp == 1:
        problems.append("layout.sp: sequence parallelism needs tp > 1; set sp false")
    if cfg.seq_len % (layout.cp * (layout.tp if layout.sp else 1)):
        problems.append(f"seq_len: {cfg.seq_len} must be divisible by cp (×tp with sp)")
    if layout.zero_stage == 1 and layout.tp > 1 and layout.dp * layout.cp > 1:
        problems.append("layout.zero_stage: 1 with tp > 1 is not supported by the built-in workload "
                        "(ZeroRedundancyOptimizer cannot shard DTensor parameters); use 2 or 3")
    if layout.zero_stage not in (0, 1, 2, 3):
        problems.append(f"layout.zero_stage: {layout.zero_stage}; use 0, 1, 2 or 3")
    if layout.pp == 1 and layout.vpp != 1:
        problems.append("layout.vpp: virtual stages need pp > 1; set vpp 1")
    if layout.pp > 1:  # torch.distributed.pipelining costs seconds to import: only when used
        from sweep.workload.pipeline import pipeline_problems

        problems += pipeline_problems(layout, shape.num_layers, shape.tie_word_embeddings)
    return problems


class Trainer:
    """The model chunks of this rank, their wrappers, the optimizer and (with PP) the schedule."""

    def __init__(self, cfg: RunConfig, device: torch.device) -> None:
        self.cfg, self.layout, self.device = cfg, cfg.layout, device
        self.seed = int(cfg.settings.get("seed", 1234))
        self.mesh = build_mesh(self.layout, device.type)
        self.autocast = AUTOCAST.get(cfg.dtype)
        if device.type == "cuda" and cfg.dtype == "tf32":
            torch.backends.cuda.matmul.allow_tf32 = True
        self.stages = [0]
        if self.layout.pp > 1:
            from sweep.workload.pipeline import stage_indices

            self.stages = stage_indices(self.layout, self.mesh.rank("pp"))
        num_stages = self.layout.pp * self.layout.vpp
        chunks = [build(cfg.model, self.seed, device, stage=s, num_stages=num_stages)
                  for s in self.stages]
        self.wrappers = [self._wrap(chunk) for chunk in chunks]
        self.modules = [w.module for w in self.wrappers]
        self.optimizer = build_optimizer(self.modules, self.layout.zero_stage, self.mesh.dp_cp)
        self.schedule = None
        if self.layout.pp > 1:
            from sweep.workload.pipeline import build_schedule

            self.schedule = build_schedule(self.modules, self.stages, self.layout, self.mesh.mesh["pp"],
                                           device, cross_entropy)
        self.has_first = 0 in self.stages
        self.has_last = (num_stages - 1) in self.stages
        # Exactly one rank per (dp, cp) replica reports the loss: a last-stage rank with tp rank 0.
        self.reports_loss = self.has_last and self.mesh.rank("tp") == 0
        # Each step's own time on this rank, to the step's closing all-reduce (node_times).
        self.node = node_name()
        self.slowdown = simulated_slowdown(self.node)
        self.own_times: list[float] = []

    def _wrap(self, chunk: Transformer) -> DataParallel:
        if self.layout.tp > 1:
            apply_tensor_parallel(chunk, self.mesh.mesh["tp"], self.layout.sp)
        if self.layout.cp > 1:
            apply_context_parallel(chunk, self.mesh.mesh["cp"])
        apply_recompute(chunk, self.layout.recompute)
        return DataParallel(chunk, self.layout.zero_stage, self.mesh.dp_cp, tensor_parallel=self.layout.tp > 1,
                            pipeline=self.layout.pp > 1, device=self.device)

    def _autocast(self) -> Any:
        return torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None)

    def _micro(self, batch: Batch, micro: int) -> Batch:
        part = local_slice(batch, dp_rank=self.mesh.rank("dp"), dp=self.layout.dp, micro=micro,
                           grad_acc=self.layout.grad_acc, cp_rank=self.mesh.rank("cp"), cp=self.layout.cp)
        return Batch(part.inputs.to(self.device), part.labels.to(self.device))

    def step(self, step: int, next_micro_batch: Callable[[], None] | None = None) -> torch.Tensor:
        """One optimizer step; returns this rank's mean loss (0 where it computes none).

        `next_micro_batch`, if given, is called between micro-batches (`tracked_peak` resets its
        per-module statistics there); the pipeline schedule runs its micro-batches itself."""
        begun = _now(self.device)
        batch = global_batch(self.seed, step, self.cfg.global_batch_sequences, self.cfg.seq_len,
                             self.cfg.model.vocab_size)
        if self.schedule is not None:
            loss = self._pipeline_step(batch)
        else:
            loss = self._plain_step(batch, next_micro_batch)
        for wrapper in self.wrappers:
            wrapper.finish_gradients()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        straggle(self.slowdown, _now(self.device) - begun)  # SWEEP_TEST_STRAGGLER only
        self.own_times.append(_now(self.device) - begun)
        return loss

    def _plain_step(self, batch: Batch, next_micro_batch: Callable[[], None] | None = None) -> torch.Tensor:
        grad_acc = self.layout.grad_acc
        wrapper = self.wrappers[0]
        total = torch.zeros((), device=self.device)
        for micro in range(grad_acc):
            part = self._micro(batch, micro)
            with wrapper.accumulate(sync=micro == grad_acc - 1):
                with self._autocast():
                    loss = cross_entropy(wrapper.module(part.inputs), part.labels)
                (loss / grad_acc).backward()
            total += loss.detach().float()
            if next_micro_batch is not None and micro < grad_acc - 1:
                next_micro_batch()
        return total / grad_acc

    def _pipeline_step(self, batch: Batch) -> torch.Tensor:
        parts = [self._micro(batch, m) for m in range(self.layout.grad_acc)]
        inputs = torch.cat([p.inputs for p in parts])
        labels = torch.cat([p.labels for p in parts])
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.has_first else ()
        kwargs: dict[str, Any] = {"target": labels, "losses": losses} if self.has_last else {}
        with self._autocast():
            self.schedule.step(*args, **kwargs)  # type: ignore[union-attr]
        if not losses:
            return torch.zeros((), device=self.device)
        return torch.stack([loss.detach().float() for loss in losses]).mean()


def sweep_dir_of(attempt_dir: Path) -> Path:
    """The sweep folder of `<sweep>/runs/<run>/attempts/<n>`; an attempt folder elsewhere (a run
    by hand) keeps its peak to itself."""
    attempt_dir = attempt_dir.resolve()
    parents = attempt_dir.parents
    if len(parents) >= 4 and parents[0].name == "attempts" and parents[2].name == "runs":
        return parents[3]
    return attempt_dir


def _dense_peak(cfg: RunConfig, device: torch.device,
                attempt_dir: Path) -> tuple[float, str]:
    """The catalog's peak on GPUs; on CPU the sweep's stored peak for this host and shape
    (sweep.workload.peak): `sweep run` stored it before the sweep's first run; where none is
    stored yet, rank 0 measures it now, with the run's ranks per node and threads per rank,
    while every rank waits, stores the larger of it and the host record, and every rank uses
    that."""
    if device.type == "cuda":
        return catalog_peak(cfg.gpu, cfg.dtype)
    decided: list[tuple[float, str] | None] = [None]
    if dist.get_rank() == 0:
        decided[0] = ensure_cpu_peak(sweep_dir_of(attempt_dir), cfg.dtype,
                                     int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                                     torch.get_num_threads(),
                                     measured_by=f"run {cfg.run_id}, before its first step")
    dist.broadcast_object_list(decided, src=0)
    assert decided[0] is not None
    return decided[0]


def train(cfg: RunConfig, attempt_dir: Path, *, memtrack: bool = False) -> TrainResult:
    """Run `cfg` on this rank of an initialised process group; rank 0 writes metrics.jsonl."""
    device = device_for(cfg)
    world, rank = dist.get_world_size(), dist.get_rank()
    problems = config_problems(cfg, world)
    if problems:
        raise WorkloadError("run.json: " + "; ".join(problems))
    if memtrack and cfg.layout.pp > 1:
        raise WorkloadError("--memtrack: MemTracker cannot measure pipeline-parallel runs (pp > 1)")
    try:
        rule = EarlyStop.from_settings(cfg.settings)
    except ValueError as error:
        raise WorkloadError(f"run.json {error}") from None
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads_per_rank(int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    import_layout_modules(cfg.layout)
    probe = MemoryProbe(device)
    result = TrainResult()
    began = time.perf_counter()
    trainer = Trainer(cfg, device)
    result.build_s = time.perf_counter() - began
    peak, peak_source = _dense_peak(cfg, device, attempt_dir)
    result.peak_s = time.perf_counter() - began - result.build_s
    # The cap counts from the probe's baseline (the model is inside it) but is set only now:
    # building imports shared libraries lazily, and an address-space limit would fail those.
    probe.cap(cfg.settings.get("rank_memory_limit_mb"))
    facts = metrics.RunFacts(shape=cfg.model, seq_len=cfg.seq_len,
                             tokens_per_step=cfg.global_batch_sequences * cfg.seq_len,
                             world_size=world, peak_flops=peak, peak_flops_source=peak_source,
                             mem_source=probe.source)
    writer = metrics.MetricsWriter(attempt_dir / METRICS_FILE) if rank == 0 else None
    steps = int(cfg.settings.get("steps", 10))
    warmup = int(cfg.settings.get("warmup_steps", 0))
    steady: Window | None = None
    ended_by = "step_budget"
    dist.barrier()
    result.loop_started_at, loop_start = time.time(), time.perf_counter()
    on_cpu = device.type == "cpu"
    for step in range(1, steps + 1):
        waits_before = thread_waits() if on_cpu else None
        start = _now(device)
        loss = trainer.step(step)
        stats = torch.zeros(2 + _MEMORY_FIELDS * world + world, dtype=torch.float64, device=device)
        if trainer.reports_loss:
            stats[0], stats[1] = loss.double(), 1.0
        stats[_memory_slots(rank)] = torch.tensor(_memory_fields(probe.sample()), dtype=torch.float64)
        waited = waited_s(waits_before, thread_waits() if on_cpu else None)
        stats[_wait_slot(rank, world)] = _NOT_MEASURED if waited is None else waited
        dist.all_reduce(stats)  # also the step's end: every rank has finished it
        values = stats.tolist()
        step_time = _now(device) - start
        mean_loss = values[0] / values[1]
        per_rank = [_memory_sample(values[_memory_slots(r)]) for r in range(world)]
        rank_waits = [values[_wait_slot(r, world)] for r in range(world)]
        cpu_wait = None if min(rank_waits) < 0 else max(rank_waits)
        result.losses.append(mean_loss)
        if writer is not None:
            record = metrics.step_record(facts, step, step_time, mean_loss, per_rank,
                                         cpu_wait_s=cpu_wait)
            writer.write(record)
            result.records.append(record)
        if rule is not None and step < steps:
            window = steady_window(_timed(result.records[-rule.window:]), rule, warmup) \
                if writer is not None else None
            if _rank0_says(window is not None, device):
                steady, ended_by = window, "steady_state"
                break
    result.loop_s = time.perf_counter() - loop_start
    own_times = gather(trainer.own_times[:len(result.losses)], warmup, trainer.node, trainer.slowdown)
    if writer is not None:
        summary = metrics.summary_record(
            facts, result.records, warmup, ended_by=ended_by, device=device.type,
            torch_version=torch.__version__,
            early_stop=None if rule is None else _early_stop_record(rule, steady, result.records, warmup))
        summary.update(own_times)  # each rank's own step time and node (sweep.workload.node_times)
        writer.write(summary)
        writer.close()
        result.records.append(summary)
        result.metrics_write_s = writer.seconds
    if memtrack:
        result.memtrack = _memtrack(trainer, steps + 1, attempt_dir, rank)
    return result


def _timed(records: list[dict[str, Any]]) -> list[tuple[int, float]]:
    return [(r["step"], r["step_time_s"]) for r in records]


def _rank0_says(flag: bool, device: torch.device) -> bool:
    """Rank 0's flag on every rank: only rank 0 holds the step times, and a rank that stopped
    alone would leave the others waiting in the next step's collectives. Called after the step's
    time is taken, so the broadcast is in no step time."""
    tensor = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.broadcast(tensor, src=0)
    return bool(tensor.item())


def _early_stop_record(rule: EarlyStop, steady: Window | None, records: list[dict[str, Any]],
                       warmup: int) -> dict[str, Any]:
    """The rule and its last window (the one that ended the run, if it did): why it stopped or not."""
    window = steady or last_window(_timed(records[-rule.window:]), rule, warmup)
    measured = window.to_json() if window else {"cv": None, "first_step": None, "last_step": None}
    return {**rule.model_dump(), **measured}


def _memtrack(trainer: Trainer, step: int, attempt_dir: Path, rank: int) -> list[dict[str, int]]:
    """One extra, untimed step under MemTracker; rank 0 writes every rank's peak to memtrack.json."""
    peak = tracked_peak(lambda next_micro_batch: trainer.step(step, next_micro_batch), trainer.modules,
                        trainer.optimizer)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, peak)
    if rank == 0:
        atomic_write_json(attempt_dir / MEMTRACK_FILE, {"step": step, "peak_bytes_per_rank": gathered})
    return gathered


# per rank in a step's stats tensor: allocated, reserved, outside the allocator, allocator retries
_MEMORY_FIELDS = 4
_NOT_MEASURED = -1.0


def _memory_slots(rank: int) -> slice:
    """Where rank `rank`'s memory fields sit in a step's stats tensor (after loss and count)."""
    return slice(2 + _MEMORY_FIELDS * rank, 2 + _MEMORY_FIELDS * (rank + 1))


def _wait_slot(rank: int, world: int) -> int:
    """Where rank `rank`'s CPU run-queue wait sits in a step's stats tensor (after the memory)."""
    return 2 + _MEMORY_FIELDS * world + rank


def _memory_fields(sample: metrics.MemorySample) -> list[float]:
    outside, retries = sample.outside_allocator_bytes, sample.alloc_retries
    return [float(sample.allocated_bytes), float(sample.reserved_bytes),
            _NOT_MEASURED if outside is None else float(outside),
            _NOT_MEASURED if retries is None else float(retries)]


def _memory_sample(fields: list[float]) -> metrics.MemorySample:
    """The inverse of `_memory_fields`, after the all-reduce (each rank filled only its slots)."""
    allocated, reserved, outside, retries = fields
    return metrics.MemorySample(int(allocated), int(reserved), None if outside < 0 else int(outside),
                                None if retries < 0 else int(retries))


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
