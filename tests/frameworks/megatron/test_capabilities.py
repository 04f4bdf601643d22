"""Megatron's capability table prunes what Megatron cannot run as labelled, and nothing else."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sweep.core.model import ModelShape
from sweep.frameworks.base import CapabilityContext
from sweep.frameworks.capability_check import capability_failures
from sweep.frameworks.megatron import ADAPTER
from sweep.plan import space

DENSE = ModelShape("dense", num_layers=8, hidden_size=256, num_attention_heads=8, num_kv_heads=4,
                   ffn_hidden_size=704, vocab_size=1024, tie_word_embeddings=True)
MOE = ModelShape("moe", num_layers=8, hidden_size=256, num_attention_heads=8, num_kv_heads=8,
                 ffn_hidden_size=512, vocab_size=1024, tie_word_embeddings=False, num_experts=8,
                 experts_per_token=2)


def context(model: ModelShape = DENSE, dtype: str = "bf16") -> CapabilityContext:
    return CapabilityContext(model=model, dtype=dtype, seq_len=512, gpus_per_node=8,
                             global_batch_sequences=32, framework_version="core_r0.17+")


def columns(**overrides: Any) -> dict[str, np.ndarray]:
    """One candidate per value of the overridden column (others: a plain DP8 layout)."""
    n = max((len(v) for v in overrides.values()), default=1)
    base: dict[str, Any] = {"dp": 8, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "mbs": 1, "grad_acc": 4,
                            "zero_stage": 0, "vpp": 1, "nodes": 1, "gpus": 8, "sp": False,
                            "recompute": "none", "pp_schedule": "1f1b"}
    out = {k: np.array([v] * n) for k, v in base.items()}
    out.update({k: np.array(v) for k, v in overrides.items()})
    return out


def failing_rules(cols: dict[str, np.ndarray], ctx: CapabilityContext) -> list[str | None]:
    failed, first = capability_failures(ADAPTER, cols, ctx)
    return [ADAPTER.capabilities[i].name if ok else None for ok, i in zip(failed, first)]


def test_every_rule_names_its_source_and_version() -> None:
    assert ADAPTER.capabilities
    for rule in ADAPTER.capabilities:
        assert rule.reason and "core_v0.17.1 @266f1c97" in rule.source and ".py" in rule.source


def test_gpipe_is_pruned_only_where_a_pipeline_runs() -> None:
    cols = columns(pp=[2, 2, 2, 1], pp_schedule=["gpipe", "1f1b", "interleaved_1f1b", "gpipe"],
                   dp=[4, 4, 4, 8])
    assert failing_rules(cols, context()) == ["gpipe_schedule", None, None, None]


@pytest.mark.parametrize(("dtype", "rule"), [("tf32", "tf32"), ("fp32", None), ("bf16", None),
                                             ("fp16", None), ("fp8", None)])
def test_tf32_is_pruned_and_every_other_dtype_is_kept(dtype: str, rule: str | None) -> None:
    assert failing_rules(columns(), context(dtype=dtype)) == [rule]


def test_moe_with_tp_needs_sequence_parallelism() -> None:
    cols = columns(tp=[2, 2, 1], sp=[False, True, False], dp=[4, 4, 8])
    assert failing_rules(cols, context(MOE)) == ["moe_tp_without_sp", None, None]
    assert failing_rules(cols, context(DENSE)) == [None, None, None]


def test_tp_comm_overlap_rule_waits_for_the_setting_in_the_context() -> None:
    """CapabilityContext has no tp_comm_overlap yet: the rule fires only when it does."""
    cols = columns(tp=[2, 2], sp=[False, True], dp=[4, 4])
    assert failing_rules(cols, context()) == [None, None]

    class WithSetting:  # what the context would carry once the lead adds the field
        def __init__(self, ctx: CapabilityContext) -> None:
            self.__dict__.update(vars(ctx), tp_comm_overlap=True)

    rule = next(r for r in ADAPTER.capabilities if r.name == "tp_comm_overlap_without_sp")
    assert rule.fails(cols, WithSetting(context())).tolist() == [True, False]  # type: ignore[arg-type]


def test_the_planner_prunes_with_megatrons_reason() -> None:
    from sweep.plan.spec import parse_spec

    spec = parse_spec("""
name: gp
framework: megatron
models: [tiny-4l]
nodes: [1]
gpus_per_node: 4
seq_len: 256
global_batch: {sequences: 16}
axes: {tp: [1], pp: [2], cp: [1], ep: [1], mbs: [1], zero_stage: [0],
       pp_schedule: [1f1b, gpipe]}
""")
    plan = space.plan(spec)
    by_schedule = dict(zip(plan["pp_schedule"], plan["status"], strict=True))
    assert by_schedule == {"1f1b": "kept", "gpipe": "pruned:framework"}
    detail = plan.loc[plan["pp_schedule"] == "gpipe", "prune_detail"].iloc[0]
    assert detail.startswith("gpipe_schedule: Megatron-LM has no GPipe")


def test_tp_comm_overlap_without_sequence_parallelism_is_pruned_when_the_spec_asks_for_it() -> None:
    from sweep.plan import space
    from sweep.plan.spec import parse_spec

    text = """
name: overlap
framework: megatron
models: [playbook-8b]
nodes: [1]
seq_len: 4096
global_batch: {sequences: 64}
axes: {tp: [2], pp: [1], mbs: [1], zero_stage: [1], sp: [true, false]}
run: {tp_comm_overlap: %s}
"""
    asked = space.plan(parse_spec(text % "true"))
    no_sp = asked[~asked["sp"]]
    assert len(no_sp) and (no_sp["status"] == "pruned:framework").all()
    assert no_sp["prune_detail"].str.startswith("tp_comm_overlap_without_sp").all()
    not_asked = space.plan(parse_spec(text % "false"))
    assert (not_asked[~not_asked["sp"]]["status"] != "pruned:framework").all()
