"""The reference fit: the published configurations that ran (they must be predicted to fit), and
the fit on the playbook's results table that writes the committed constants
(sweep/models/fitted_memory.py, through scripts/fit_memory.py). The fitting itself is `sweep.validation.memory_fit`; this
module reads the reference data's files for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from sweep.core.model import ModelShape
from sweep.core.state import file_sha256
from sweep.core.units import MiB
from sweep.models.memory_profiles import LLMFOUNDRY, MemoryProfile, get_profile
from sweep.plan.spec import Spec
from sweep.validation import memory_check
from sweep.validation.memory_fit import (
    BAND_QUANTILES,
    GRID,
    OBJECTIVE,
    Allocator,
    AllocatorFit,
    Basis,
    basis,
    cross_validate,
    fit_basis,
    kept_mask,
    stage_terms,
)

# Published configurations that ran: they must fit ----------------------------------------------
#
# Each table's rows ran on a real cluster, so each must be predicted to fit. The mappings are those
# of tests/models/test_memory_reference.py, which states what each table leaves unsaid. llm-foundry is the fit's
# constraint (it bounds the sequential share); the Megatron tables are never fitted on, so every
# set of constants is out of sample for them.

LLMFOUNDRY_FILE: Final = "llmfoundry_mpt_benchmarks.csv"
MEGATRON_CORE_FILE: Final = "megatron_core_h100_weak_scaling.csv"
NARAYANAN_FILE: Final = "megatron_narayanan2021_table1.csv"
LLMFOUNDRY_GPUS: Final = {"h100_80gb": "h100-sxm", "a100_80gb": "a100-80gb"}
MPT_SHAPES: Final = {  # d_model, n_heads, n_layers (llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml)
    "125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24), "1b": (2048, 16, 24),
    "3b": (2560, 20, 32), "7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 56, 48),
    "70b": (8192, 64, 80)}
MPT_VOCAB: Final = 50368


@dataclass(frozen=True)
class GeluShape(ModelShape):
    """GPT/MPT: a two-matrix GELU MLP (`sweep.models.memory` reads `mlp`)."""

    mlp: str = "gelu"


def gpt_shape(name: str, layers: int, hidden: int, heads: int, vocab: int) -> GeluShape:
    """A GPT/MPT shape: tied embeddings, full multi-head attention, a 4× GELU MLP."""
    return GeluShape(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     num_kv_heads=heads, ffn_hidden_size=4 * hidden, vocab_size=vocab,
                     tie_word_embeddings=True)


@dataclass(frozen=True)
class Published:
    """One published configuration that ran: what the memory model needs to judge it."""

    model: ModelShape
    layout: dict[str, Any]  # dp tp pp mbs grad_acc zero_stage, and optionally cp ep vpp sp
    seq_len: int  # recompute pp_schedule
    profile: MemoryProfile
    gpu: str
    dtype: str = "bf16"
    extra_bytes: float = 0.0  # state the model shape cannot say, charged on top


def _published_basis(entries: list[Published]) -> Basis:
    from sweep.core.catalog import get_gpu

    n = len(entries)
    alloc, total0, frag = np.zeros((2, n)), np.zeros((2, n)), np.zeros((2, 3, n))
    budget = np.zeros(n)
    for j, e in enumerate(entries):
        row = {"cp": 1, "ep": 1, "vpp": 1, "sp": False, "recompute": "none",
               "pp_schedule": "1f1b", **e.layout}
        columns = {k: np.array([v]) for k, v in row.items()}
        a, t, f = stage_terms(e.model, columns, e.profile, e.seq_len, e.dtype)
        alloc[:, j], total0[:, j], frag[:, :, j] = a[:, 0], t[:, 0], f[:, :, 0]
        capacity = get_gpu(e.gpu).memory_bytes
        assert capacity is not None  # the catalog's data-centre GPUs state their memory
        budget[j] = capacity - e.extra_bytes
    single = np.array([e.layout["pp"] == 1 for e in entries], bool)
    return Basis(np.ones(n, bool), np.ones(n, bool), single, alloc, total0, frag, budget,
                 np.full(n, "success", object), np.full(n, np.nan),
                 np.array([e.model.name for e in entries], object))


def llmfoundry_basis(path: str | Path) -> Basis:
    """The H100 and A100-80GB rows of the LLM Foundry MPT benchmarks under the LLMFOUNDRY profile:
    FSDP FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2, activation checkpointing = full recomputation,
    data parallel over every GPU; the learnt position embedding (seq x hidden, which ModelShape
    lacks) is charged on top as FSDP holds it (16 B/param sharded plus the gathered bf16 copy)."""
    frame = pd.read_csv(path)
    frame = frame[frame["GPU"].isin(list(LLMFOUNDRY_GPUS))]
    entries = []
    for _, r in frame.iterrows():
        hidden, heads, layers = MPT_SHAPES[str(r["Model"])]
        seq, gpus = int(r["SeqLen (T)"]), int(r["# GPUs"])
        entries.append(Published(
            gpt_shape(f"mpt-{r['Model']}", layers, hidden, heads, MPT_VOCAB),
            {"dp": gpus, "tp": 1, "pp": 1, "mbs": int(r["MicroBatchSize"]),
             "grad_acc": int(r["GradAccum"]),
             "zero_stage": 3 if r["Sharding Strategy"] == "FULL_SHARD" else 2,
             "recompute": "full" if r["Activation Checkpointing"] else "none"},
            seq, LLMFOUNDRY, LLMFOUNDRY_GPUS[str(r["GPU"])],
            extra_bytes=seq * hidden * (16 / gpus + 2)))
    return _published_basis(entries)


def megatron_core_basis(path: str | Path) -> Basis:
    """Megatron-Core's H100 weak scaling (MEGATRON profile). Assumed, as tests/models/test_memory_reference.py
    does (the table does not say): micro-batch 1, distributed optimizer, sequence parallelism,
    selective recomputation, 1F1B; DP and GBS as published."""
    entries = [Published(
        gpt_shape(str(r.model_size_label), int(r.num_layers), int(r.hidden_size),
             int(r.attention_heads), int(r.vocab_size)),
        {"dp": int(r.data_parallel), "tp": int(r.tensor_parallel), "pp": int(r.pipeline_parallel),
         "mbs": 1, "grad_acc": int(r.global_batch_size) // int(r.data_parallel), "zero_stage": 1,
         "recompute": "selective", "sp": int(r.tensor_parallel) > 1},
        int(r.seq_len), get_profile("megatron"), "h100-sxm")
        for r in pd.read_csv(path).itertuples()]
    return _published_basis(entries)


def narayanan_basis(path: str | Path) -> Basis:
    """Narayanan et al. 2021 Table 1 on A100 80 GB (MEGATRON profile): fp16, no distributed
    optimizer and no SP, full recomputation (--checkpoint-activations), interleaved 1F1B where
    --num-layers-per-virtual-pipeline-stage is given (as tests/models/test_memory_reference.py)."""
    entries = []
    for r in pd.read_csv(path).itertuples():
        flags = str(r.extra_flags_in_repro_script).split()
        vpp, schedule = 1, "1f1b"
        if "--num-layers-per-virtual-pipeline-stage" in flags:
            per_chunk = int(flags[flags.index("--num-layers-per-virtual-pipeline-stage") + 1])
            vpp = int(r.num_layers) // int(r.pipeline_parallel) // per_chunk
            schedule = "interleaved_1f1b"
        dp, mbs = int(r.data_parallel_derived), int(r.micro_batch_size)
        entries.append(Published(
            gpt_shape(str(r.model_size_label), int(r.num_layers), int(r.hidden_size),
                 int(r.attention_heads), int(r.vocab_size)),
            {"dp": dp, "tp": int(r.tensor_parallel), "pp": int(r.pipeline_parallel), "mbs": mbs,
             "grad_acc": int(r.global_batch_size) // (dp * mbs), "zero_stage": 0,
             "recompute": "full", "pp_schedule": schedule, "vpp": vpp},
            int(r.seq_len), get_profile("megatron"), "a100-80gb", dtype="fp16"))
    return _published_basis(entries)


PUBLISHED: Final = {LLMFOUNDRY_FILE: llmfoundry_basis, MEGATRON_CORE_FILE: megatron_core_basis,
                    NARAYANAN_FILE: narayanan_basis}


def published_bases(refdata: str | Path) -> dict[str, Basis]:
    """Every published table of `PUBLISHED` the reference data holds, by file name."""
    return {name: build(Path(refdata) / name) for name, build in PUBLISHED.items()
            if (Path(refdata) / name).is_file()}


def published_fit_frac(must_fit: Basis, allocator: Allocator) -> float:
    """The share of the published configurations predicted to fit under these constants."""
    point = np.array([[allocator.sequential, allocator.pipelined, allocator.logits,
                       float(allocator.floor_bytes)]])
    return float(kept_mask(must_fit, point)[0].mean())


# The committed constants --------------------------------------------------------------------------

RUNS_FILE: Final = "playbook_bench_full_1B_8B.csv"  # nanotron's results table: it tells OOMs apart
SPEC_FILE: Final = "examples/playbook.yaml"
CONSTANTS_MODULE: Final = "sweep/models/fitted_memory.py"


@dataclass(frozen=True)
class ReferenceFit:
    """What `sweep/models/fitted_memory.py` commits: the constants, the band, and their provenance
    (without the date, which `scripts/fit_memory.py` adds)."""

    fit: AllocatorFit
    band: tuple[float, float]
    provenance: dict[str, Any]


def fit_reference(refdata: str | Path, spec: Spec) -> ReferenceFit:
    """Fit on the reference data's playbook table under the playbook spec; cross-validate by
    model to measure the band that `sweep.models.memory.reserved_interval` reports."""
    refdata = Path(refdata)
    runs = memory_check.read_memory_runs(refdata / RUNS_FILE, spec)
    must_fit = llmfoundry_basis(refdata / LLMFOUNDRY_FILE)
    whole = basis(runs, spec)
    result = fit_basis(whole, GRID, must_fit)
    cv = cross_validate(runs, spec, GRID, must_fit, in_sample=result.allocator)
    band = cv.band()
    provenance = {
        "script": "scripts/fit_memory.py",
        "function": "sweep.validation.memory_reference.fit_reference",
        "objective": OBJECTIVE,
        "data": {RUNS_FILE: file_sha256(refdata / RUNS_FILE),
                 LLMFOUNDRY_FILE: file_sha256(refdata / LLMFOUNDRY_FILE)},
        "spec": SPEC_FILE,
        "grid": GRID.describe(),
        **result.to_dict(),
        "band": {"quantiles": list(BAND_QUANTILES), "signed_rel_err": [round(x, 6) for x in band],
                 "from": f"leave-one-model-out on {RUNS_FILE}: held-out predicted / measured - 1 "
                         f"of rank 0's reserved peak, {len(cv.signed_errors)} successful runs"},
    }
    return ReferenceFit(result, (round(band[0], 6), round(band[1], 6)), provenance)


def render_constants(ref: ReferenceFit, date: str) -> str:
    """The text of sweep/models/fitted_memory.py."""
    import pprint

    a = ref.fit.allocator
    provenance = {**ref.provenance, "date": date}
    return (
        '"""The memory model\'s fitted allocator constants. Generated by scripts/fit_memory.py '
        "from the\nreference data named in PROVENANCE (sha256, grid, objective, date): do not edit "
        'by hand; rerun\nthe script. sweep.models.memory_profiles reads them; tests/validation/test_memory_fit.py checks '
        'that the fit reproduces them.\n"""\n\n'
        "from typing import Any, Final\n\n"
        f"FRAG_SEQUENTIAL: Final = {a.sequential!r}\n"
        f"FRAG_PIPELINED: Final = {a.pipelined!r}\n"
        f"FRAG_LOGITS: Final = {a.logits!r}\n"
        f"RESERVED_FLOOR_BYTES: Final = {a.floor_bytes!r}  # {a.floor_bytes / MiB:g} MiB\n"
        "# leave-one-model-out predicted / measured - 1 of the reserved peak: 5th and 95th percentiles\n"
        f"RESERVED_BAND: Final = {ref.band!r}\n\n"
        f"PROVENANCE: Final[dict[str, Any]] = "
        f"{pprint.pformat(provenance, width=96, sort_dicts=False)}\n")
