"""nanotron (run_train.py of a checkout, with a rendered YAML config).

Two supported versions, because nanotron's strict YAML loader and its step line both changed in
March 2025 (sweep/frameworks/nanotron/config_schema.py and parser.py say how):

- ``main-2025-03-26+``: nanotron main from 8279c784 (2025-03-26, the merge of PR #310 that renamed
  the step key to `time_per_iteration_ms`) on; `parallelism.context_parallel_size` exists since
  bc921993 (2025-03-21). Tested against 2411b022 (2026-04-07), the newest main commit we read.
- ``playbook-e24d2483``: the commit of the Ultra-Scale Playbook's sweep (2025-02-19): no
  `context_parallel_size` key (the strict loader rejects it), `elapsed_time_per_iteration_ms`.

Dense models render as nanotron's LlamaConfig at both. Mixture-of-experts models render at main
as its Qwen2Config with `moe_config` (models/qwen.py, nn/moe.py @2411b022), whose experts every
TP rank holds whole and which runs without pipeline or expert parallelism (capabilities.py says
why); the playbook's commit has no MoE.
"""

from __future__ import annotations

from sweep.core.model import ModelShape
from sweep.frameworks.base import FrameworkAdapter, Requirement, SupportedVersion
from sweep.frameworks.nanotron import capabilities
from sweep.frameworks.nanotron.config_schema import MAIN, MAIN_COMMIT, PLAYBOOK, PLAYBOOK_COMMIT
from sweep.frameworks.nanotron.parser import NanotronParser
from sweep.models.pipeline_stages import stage_block_counts


def pipeline_fits(model: ModelShape, stages: int) -> bool:
    """nanotron places the token embedding, the L decoder layers, the final norm, the LM head,
    the fp32 cast and the loss as L + 5 pipeline blocks, greedily by compute cost
    (src/nanotron/trainer.py, `_init_model`: each block goes to the current rank, which moves on
    once `cumulative_cost > thresholds[target_pp_rank_idx]`), so a rank may get no block at all.
    sweep.models.pipeline_stages.stage_block_counts replays that assignment (one definition, shared
    with the memory model's per-stage layer count).

    Nothing in that loop stops a rank without a block, so this rule is evidence, not a proof: of
    the playbook's 124 runs with an empty stage (1B at pp >= 16, 8B at pp >= 64;
    playbook_bench_full_1B_8B.csv), 117 failed without an OOM, 6 ran out of memory and one (1B,
    tp 8, pp 16, mbs 1) completed. Such a layout is pruned as one that does not run
    (tests/frameworks/nanotron/test_pipeline.py)."""
    return min(stage_block_counts(model, stages, "nanotron")) > 0


# nanotron main imports it for every run, dense ones too (scaling/parametrization.py imports
# nn/moe.py, which raises without it @2411b022), and does not declare it as a dependency.
GROUPED_GEMM = Requirement(
    "grouped_gemm", "nanotron main imports it for every run, dense models too, through "
    "nn/moe.py", "pip install --no-build-isolation git+https://github.com/fanshiqing/grouped_gemm@main")

ADAPTER = FrameworkAdapter(
    name="nanotron",
    description="nanotron's run_train.py with a rendered YAML config, launched by torchrun",
    parser=NanotronParser,
    versions=(
        SupportedVersion(MAIN, "nanotron main from 2025-03-26 (8279c784) on",
                         tested_with=(MAIN_COMMIT,), requires=(GROUPED_GEMM,)),
        SupportedVersion(PLAYBOOK, "nanotron @e24d2483 (2025-02-19), the Ultra-Scale Playbook's "
                         "commit", tested_with=(PLAYBOOK_COMMIT,)),
    ),
    default_version=MAIN,
    capabilities=capabilities.RULES,
    zero_stages=(0, 1),
    entry_point="run_train.py",
    checkout_env="NANOTRON_DIR",
    package="nanotron",
    pipeline_fits=pipeline_fits,
    grad_reduce_bytes=4,  # accumulates and reduces gradients in fp32
    notes=(
        "nanotron counts the embedding and the LM head as pipeline blocks "
        "(sweep.models.pipeline_stages.stage_block_counts replays its assignment)",
        "only one rank logs the step line (dp 0, tp 0, the last pipeline stage); ' Memory usage' "
        "lines come from rank 0, '[After model building]' lines from every (tp, pp) rank",
        "MoE (main): a Qwen2Config with moe_config; every TP rank holds its experts whole "
        "(nn/moe.py GroupedMLP) and runs them on the tokens it holds; pp = 1, ep = 1, bf16; "
        "softmax top-k routing without renormalisation and no load-balancing loss; the "
        "grouped_gemm package must be installed (nanotron main imports it for every run)",
        "the step line's model_tflops_per_gpu of a MoE run counts one dense MLP of "
        "intermediate_size per layer (Qwen2Model.get_flops_per_sec), not the top-k experts; "
        "llm-sweep's MFU is its own count of active parameters",
    ),
)
