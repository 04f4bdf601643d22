"""nanotron's capability table prunes what nanotron cannot run as labelled, at each version, and
the planner reports the rule with nanotron's reason."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sweep.core.catalog import get_model
from sweep.core.model import ModelShape
from sweep.frameworks import get_adapter
from sweep.frameworks.base import CapabilityContext
from sweep.frameworks.capability_check import capability_failures
from sweep.frameworks.nanotron.config_schema import MAIN, PLAYBOOK
from sweep.plan import space
from sweep.plan.spec import parse_spec

ADAPTER = get_adapter("nanotron")
DENSE = get_model("llama-3.1-8b")


def columns(**overrides: object) -> dict[str, np.ndarray]:
    """Two candidates: the first as given, the second a plain dense run that always passes."""
    base = {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "mbs": 1, "grad_acc": 8,
            "zero_stage": 0, "vpp": 1, "nodes": 1, "gpus": 8, "sp": False,
            "recompute": "none", "pp_schedule": "1f1b"}
    out = {}
    for key, value in base.items():
        first = overrides.get(key, value)
        out[key] = np.array([first, value], dtype=object if isinstance(value, str) else None)
    return out


def context(version: str = MAIN, dtype: str = "bf16", model: ModelShape = DENSE) -> CapabilityContext:
    return CapabilityContext(model=model, dtype=dtype, seq_len=4096, gpus_per_node=8,
                             global_batch_sequences=64, framework_version=version)


def failing(cols: dict[str, np.ndarray], ctx: CapabilityContext) -> list[str | None]:
    failed, index = capability_failures(ADAPTER, cols, ctx)
    return [ADAPTER.capabilities[i].name if f else None for f, i in zip(failed, index)]


@pytest.mark.parametrize("version", [MAIN, PLAYBOOK])
@pytest.mark.parametrize(("overrides", "rule"), [
    ({"cp": 2}, "context_parallel"),
    ({"ep": 2}, "expert_parallel"),
    ({"pp": 2, "vpp": 2, "pp_schedule": "interleaved_1f1b"}, "interleaved_1f1b"),
    ({"recompute": "selective"}, "selective_recompute"),
    ({"pp": 2, "pp_schedule": "gpipe"}, None),
    ({"recompute": "full", "tp": 8, "sp": True, "zero_stage": 1}, None),
])
def test_layout_rules(version: str, overrides: dict[str, object], rule: str | None) -> None:
    assert failing(columns(**overrides), context(version)) == [rule, None]


@pytest.mark.parametrize("version", [MAIN, PLAYBOOK])
def test_the_reasons_differ_by_version(version: str) -> None:
    failed, index = capability_failures(ADAPTER, columns(cp=2), context(version))
    detail = ADAPTER.capabilities[index[0]].detail()
    assert ("not supported yet" in detail) == (version == MAIN)
    assert ("e24d2483" in detail) == (version == PLAYBOOK)


@pytest.mark.parametrize(("dtype", "rule"), [("fp8", "fp8"), ("fp32", "fp32"), ("tf32", "fp32"),
                                            ("bf16", None), ("fp16", None)])
def test_dtype_rules(dtype: str, rule: str | None) -> None:
    assert failing(columns(), context(dtype=dtype)) == [rule, rule]


MOE = get_model("mixtral-8x7b")


def test_the_playbook_commit_has_no_moe_at_all() -> None:
    assert failing(columns(), context(PLAYBOOK, model=MOE)) == ["moe_model", "moe_model"]


@pytest.mark.parametrize(("overrides", "dtype", "rule"), [
    ({}, "bf16", None),
    ({"tp": 8, "sp": True, "recompute": "full", "zero_stage": 1}, "bf16", None),
    ({"tp": 8, "sp": False}, "bf16", None),
    ({"pp": 2}, "bf16", "moe_pipeline"),
    ({"pp": 2, "pp_schedule": "gpipe"}, "bf16", "moe_pipeline"),
    ({"ep": 2}, "bf16", "expert_parallel"),
    ({"ep": 8}, "bf16", "expert_parallel"),
])
def test_main_runs_moe_without_pipeline_or_expert_parallelism(
        overrides: dict[str, object], dtype: str, rule: str | None) -> None:
    assert failing(columns(**overrides), context(MAIN, dtype, MOE)) == [rule, None]


def test_main_s_experts_take_bfloat16_only() -> None:
    assert failing(columns(), context(MAIN, "fp16", MOE)) == ["moe_fp16", "moe_fp16"]
    assert failing(columns(), context(MAIN, "fp16", DENSE)) == [None, None]


def test_the_ffn_width_must_split_over_tp() -> None:
    odd = replace(DENSE, ffn_hidden_size=14336 + 4)
    assert failing(columns(tp=8), context(model=odd)) == ["ffn_over_tp", None]


def test_main_s_experts_are_not_split_over_tp_so_their_width_need_not_divide() -> None:
    odd = replace(MOE, ffn_hidden_size=14336 + 4, moe_ffn_hidden_size=14336 + 4)
    assert failing(columns(tp=8), context(MAIN, model=odd)) == [None, None]


@pytest.mark.parametrize("version", [MAIN, PLAYBOOK])
def test_a_head_width_nanotron_cannot_express_is_pruned(version: str) -> None:
    """nanotron's attention takes hidden_size // heads: 256-wide heads on Llama-3.1-8B's 4096
    hidden size and 32 heads would run as 128-wide ones."""
    wide = replace(DENSE, head_dim=256)
    assert failing(columns(), context(version, model=wide)) == ["head_dim", "head_dim"]


def test_the_planner_prunes_with_nanotron_s_reason() -> None:
    spec = parse_spec("""
name: nanotron-caps
framework: nanotron
gpus_per_node: 8
models: [tiny-4l]
nodes: [1]
seq_len: 1024
global_batch: {sequences: 16}
axes: {recompute: [none, selective], pp_schedule: [1f1b, interleaved_1f1b], cp: [1, 2]}
""")
    plan = space.plan(spec)
    pruned = plan[plan["status"] == "pruned:framework"]
    kept = plan[plan["status"] == space.KEPT]
    assert len(kept) and len(pruned)
    assert set(kept["recompute"]) == {"none"} and set(kept["pp_schedule"]) == {"1f1b"}
    assert set(kept["cp"]) == {1}
    details = " ".join(map(str, pruned["prune_detail"]))
    for name in ("selective_recompute", "interleaved_1f1b", "context_parallel"):
        assert name in details
