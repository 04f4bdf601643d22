"""BLOOM-176B's topology sweep as a memory check that no constant was fitted to.

Before training BLOOM, BigScience benchmarked some 150 layouts of 176-206B models on up to 48
nodes of 8 A100 80 GB (Megatron-DeepSpeed with DeepSpeed ZeRO-1, sequence 2048, vocabulary
250,880, full recomputation) and wrote down, per run, the GPU memory `nvidia-smi` showed on the
first node (the stage that holds the embedding) or that it ran out of memory
(`bloom_tr11_176b_topology_sweep.csv`, from bigscience train/tr11-176B-ml/chronicles-prequel.md).
Another framework, another GPU, another PyTorch and models 20 times the playbook's: what the
memory model predicts there, with constants fitted on nanotron's H100 runs, is a test of its
mechanism, not of its fit.

What the table leaves unsaid is read from the chronicle's text beside each table:
- shapes: hidden size and layers from the table's context (or the column); where only the hidden
  size is given, the layers that give the stated size by the chronicle's own formula
  l·(12h² + 13h) + V·h; the 02-17 runs are the 20B (8 layers) and 200B (80 layers) of hidden 14400
  with 32 and 96 heads that the text names, and a later "200B" of hidden 14400 is that model
  again. Rows whose hidden size is not published (the 02-20 topology tables) are skipped and
  counted;
- heads: the column, else 64 ("all NHEADS=64 (above too)");
- ZeRO: the column, else stage 1. From 02-28 the runs use Megatron-DeepSpeed's BF16 optimizer
  ("accumulate gradients in fp32 ... additional memory usage is 4 bytes x params and it's not
  sharded") and the pipeline partition method 'type:transformer|embedding' (the embeddings count
  as a layer each: `sweep.models.pipeline_stages.split_stages` "embedding_blocks"); before,
  DeepSpeed's 'type:transformer' (the layers alone, "even");
- the measured peak: `nvidia-smi`'s MiB read as GB, 1000 MiB to the GB (the 18B run showed "80GB",
  more than an A100 80 GB can show in GiB), compared with the predicted total of the most loaded
  stage (reserved peak, CUDA context and NCCL buffers); the peak was read on the first node (the
  02-17 runs: "max memory used by the first (last) nodes").

Pure apart from `read_sweep`, which reads the CSV.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from sweep.core.catalog import get_gpu
from sweep.core.layout import PLAYBOOK_LAYOUT_COLUMNS
from sweep.core.units import MiB
from sweep.models.memory import estimate_columns, reserved_interval
from sweep.models.memory_profiles import MEGATRON_DEEPSPEED, Allocator, MemoryProfile
from sweep.validation.memory_reference import gpt_shape

FILE: Final = "bloom_tr11_176b_topology_sweep.csv"
GPU: Final = "a100-80gb"
SEQ_LEN: Final = 2048
VOCAB: Final = 250_880  # --pad-vocab-size-to 250880
GLOBAL_BATCH: Final = 2048
DEFAULT_HEADS: Final = 64
BF16_OPTIMIZER_FROM: Final = "02-28"  # the date the chronicle switched optimizer and partition
MEASURED_GB: Final = 1000 * MiB
# The 02-17 tables (chronicle lines 387 and 425): the text names these shapes.
FIRST_DAY_SHAPES: Final = {"20B": (14400, 8, 32), "200B": (14400, 80, 96)}


@dataclass(frozen=True)
class BloomRuns:
    """The usable rows (one per run, with the layout and what happened) and the skipped ones,
    counted by reason."""

    frame: pd.DataFrame
    skipped: dict[str, int]


def _size_layers(size_b: float, hidden: int) -> int | None:
    """The layers that give `size_b` billion parameters at this hidden size by the chronicle's
    formula l·(12h² + 13h) + V·h, or None where no whole number of layers comes within 1 %."""
    per_layer = 12 * hidden**2 + 13 * hidden
    layers = round((size_b * 1e9 - VOCAB * hidden) / per_layer)
    size = layers * per_layer + VOCAB * hidden
    return layers if layers > 0 and abs(size / (size_b * 1e9) - 1.0) <= 0.01 else None


def _shape(row: pd.Series) -> tuple[int, int, int] | str:
    """(hidden, layers, heads) of a row, or why it has none."""
    size = str(row["Size"])
    if row["section"].startswith("Best TFLOPs"):
        return FIRST_DAY_SHAPES[size]
    context = row["context"] if isinstance(row["context"], str) else ""
    hidden_match = re.search(r"HIDDEN=(\d+)", context)
    layers_match = re.search(r"NLAYERS=(\d+)", context)
    hidden = (int(hidden_match.group(1)) if hidden_match
              else int(row["NHIDDEN"]) if pd.notna(row["NHIDDEN"]) else None)
    if hidden is None:
        return "hidden size not published"
    named = FIRST_DAY_SHAPES.get(size)  # "compare with 14400 (200B)": the 02-17 model again
    layers = (int(row["Layers"]) if pd.notna(row["Layers"])
              else named[1] if named is not None and named[0] == hidden
              else int(layers_match.group(1)) if layers_match
              else _size_layers(float(size.rstrip("B")), hidden))
    if layers is None:
        return "layers not published and not implied by the size"
    heads = int(row["NHEADS"]) if pd.notna(row["NHEADS"]) else DEFAULT_HEADS
    return hidden, layers, heads


def _outcome(row: pd.Series) -> str | None:
    if str(row["Mem"]).strip() == "OOM":
        return "oom"
    tflops = pd.to_numeric(pd.Series([row["TFLOPs"]]), errors="coerce").iloc[0]
    return "success" if pd.notna(tflops) else None


def _measured_bytes(mem: object) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)GB", str(mem).strip())
    return float(match.group(1)) * MEASURED_GB if match else np.nan


def read_sweep(path: str | Path) -> BloomRuns:
    """The table's runs with a shape, a layout and an outcome; the others are counted by reason."""
    raw = pd.read_csv(path)
    rows: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}
    for _, row in raw.iterrows():
        shape = _shape(row)
        outcome = _outcome(row)
        reason = shape if isinstance(shape, str) else None if outcome else "no outcome published"
        if reason is not None:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        assert not isinstance(shape, str) and outcome is not None
        hidden, layers, heads = shape
        dp = int(row["DP"]) if pd.notna(row["DP"]) else 1
        mbs = int(row["MBS"])
        batch = int(row["GBS"]) if pd.notna(row["GBS"]) else GLOBAL_BATCH
        date = str(row["Notes"])[:5]
        rows.append({
            "source_line": int(row["source_line"]), "date": date, "hidden": hidden,
            "layers": layers, "heads": heads, "dp": dp, "tp": int(row["TP"]), "pp": int(row["PP"]),
            "mbs": mbs, "grad_acc": batch // (dp * mbs),
            "zero_stage": int(row["ZS"]) if pd.notna(row["ZS"]) else 1,
            "dtype": "fp16" if "fp16" in str(row["section"]) else "bf16",
            "bf16_optimizer": date >= BF16_OPTIMIZER_FROM, "outcome": outcome,
            "measured_bytes": _measured_bytes(row["Mem"])})
    return BloomRuns(pd.DataFrame(rows), skipped)


def profile_for(bf16_optimizer: bool) -> MemoryProfile:
    """MEGATRON_DEEPSPEED; with the BF16 optimizer, its unsharded fp32 gradient accumulation and
    the partition that counts the embeddings as layers."""
    if not bf16_optimizer:
        return MEGATRON_DEEPSPEED
    return replace(MEGATRON_DEEPSPEED, fp32_grad_bytes=4.0, stage_split="embedding_blocks")


def judge(runs: BloomRuns, allocator: Allocator | None = None) -> pd.DataFrame:
    """Each run with its predicted total (most loaded stage), the band's interval of it
    (`sweep.models.memory.reserved_interval`) and the verdict on the A100's memory.
    `allocator`: constants to use instead of the committed ones."""
    capacity = get_gpu(GPU).memory_bytes
    assert capacity is not None  # the catalog states the A100's memory
    out = runs.frame.copy()
    for name in ("pred_total_bytes", "low_bytes", "high_bytes"):
        out[name] = np.nan
    keys = ["hidden", "layers", "heads", "dtype", "bf16_optimizer"]
    for (hidden, layers, heads, dtype, bf16_optimizer), group in out.groupby(keys):
        shape = gpt_shape(f"bloom-{hidden}x{layers}", int(layers), int(hidden), int(heads), VOCAB)
        profile = profile_for(bool(bf16_optimizer))
        if allocator is not None:
            profile = allocator.apply(profile)
        n = len(group)
        columns = {name: group[name].to_numpy() for name in PLAYBOOK_LAYOUT_COLUMNS}
        columns.update({"cp": np.ones(n, int), "ep": np.ones(n, int), "vpp": np.ones(n, int),
                        "sp": np.zeros(n, bool), "recompute": np.full(n, "full", dtype=object),
                        "pp_schedule": np.full(n, "1f1b", dtype=object)})
        estimate = estimate_columns(shape, columns, seq_len=SEQ_LEN, dtype=str(dtype),
                                    profile=profile, stage="most_loaded")
        low, high = reserved_interval(estimate["mem_reserved_bytes"],
                                      fixed_bytes=estimate["mem_overhead_bytes"])
        out.loc[group.index, "pred_total_bytes"] = estimate["mem_total_bytes"].astype(float)
        out.loc[group.index, "low_bytes"] = low
        out.loc[group.index, "high_bytes"] = high
    out["kept"] = out["pred_total_bytes"] <= capacity
    out["could_run_out"] = out["high_bytes"] > capacity
    return out


@dataclass(frozen=True)
class BloomCheck:
    """The memory model scored on BLOOM's sweep."""

    n_success: int
    n_oom: int
    n_skipped: int
    success_kept_frac: float | None  # predicted to fit
    oom_over_frac: float | None  # predicted over the A100's memory
    oom_flagged_frac: float | None  # over, or under with the band's high end over
    n_measured: int  # successes with a measured peak
    total_median_abs_rel_err: float | None
    total_p90_abs_rel_err: float | None
    total_median_rel_err: float | None  # signed: predicted / measured - 1
    within_band_frac: float | None  # measured peaks inside the band's interval

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score(judged: pd.DataFrame, n_skipped: int = 0) -> BloomCheck:
    success = judged[judged["outcome"] == "success"]
    oom = judged[judged["outcome"] == "oom"]
    measured = success[success["measured_bytes"].notna()]
    signed = (measured["pred_total_bytes"] / measured["measured_bytes"] - 1.0).to_numpy()
    inside = ((measured["measured_bytes"] >= measured["low_bytes"])
              & (measured["measured_bytes"] <= measured["high_bytes"]))

    def frac(values: pd.Series) -> float | None:
        return float(values.mean()) if len(values) else None

    def quantile(values: np.ndarray, q: float) -> float | None:
        return float(np.quantile(values, q)) if len(values) else None

    return BloomCheck(
        n_success=len(success), n_oom=len(oom), n_skipped=n_skipped,
        success_kept_frac=frac(success["kept"]), oom_over_frac=frac(~oom["kept"]),
        oom_flagged_frac=frac(~oom["kept"] | oom["could_run_out"]), n_measured=len(measured),
        total_median_abs_rel_err=quantile(np.abs(signed), 0.5),
        total_p90_abs_rel_err=quantile(np.abs(signed), 0.9),
        total_median_rel_err=quantile(signed, 0.5), within_band_frac=frac(inside))


def check(path: str | Path, allocator: Allocator | None = None) -> BloomCheck:
    """Read, judge and score the sweep's table."""
    runs = read_sweep(path)
    return score(judge(runs, allocator), sum(runs.skipped.values()))
