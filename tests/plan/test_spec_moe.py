"""`run.moe`: the mixture-of-experts settings a spec can set, checked when the spec loads, kept
out of run.json and the spec hash when unset, and seen by the capability rules."""

from __future__ import annotations

import pytest

from sweep.plan import space
from sweep.plan.spec import SpecError, parse_spec
from tests.specs import MINIMAL_SPEC

MOE_SPEC = """
name: moe
framework: torchtitan
models: [mixtral-8x7b]
nodes: [2]
gpus_per_node: 8
seq_len: 4096
global_batch: {sequences: 64}
gpu_memory_gb: 1000  # no layout pruned by memory: the test is about the expert-TP rule
axes: {ep: [1, 2, 4], tp: [1, 2], zero_stage: [3]}
"""


def test_unset_moe_settings_change_neither_run_json_nor_the_hash() -> None:
    plain = parse_spec(MINIMAL_SPEC)
    assert plain.run.moe is None
    assert "moe" not in plain.run.model_dump(mode="json")
    defaults = parse_spec(MINIMAL_SPEC + "run: {moe: {}}\n")
    assert defaults.run.moe is not None and defaults.spec_hash() != plain.spec_hash()


def test_the_settings_and_their_defaults() -> None:
    spec = parse_spec(MOE_SPEC + "run: {moe: {load_balance_coeff: null, force_load_balance: true,"
                                 " expert_tensor_parallel: tp}}\n")
    assert spec.run.moe.load_balance_coeff is None and spec.run.moe.force_load_balance
    assert spec.run.moe.expert_tensor_parallel == "tp"
    default = parse_spec(MOE_SPEC + "run: {moe: {expert_tensor_parallel: 1}}\n").run.moe
    assert (default.load_balance_coeff, default.force_load_balance) == (1e-3, False)


@pytest.mark.parametrize("setting, fragment", [
    ("{expert_tensor_parallel: 2}", "expert_tensor_parallel"),
    ("{load_balance_coeff: -0.1}", "load_balance_coeff"),
    ("{aux_loss: 0.01}", "aux_loss"),
])
def test_bad_settings_name_the_field(setting: str, fragment: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(MOE_SPEC + f"run: {{moe: {setting}}}\n", "moe.yaml")
    message = str(caught.value)
    assert "moe.yaml" in message and fragment in message


def test_expert_tp_prunes_the_layouts_torchtitan_0_3_runs_the_other_way() -> None:
    def kept(extra: str) -> set[tuple[int, int]]:
        plan = space.plan(parse_spec(MOE_SPEC + extra))
        rows = plan[plan["status"] == space.KEPT]
        return set(zip(rows["tp"], rows["ep"], strict=True))

    free = kept("")
    assert {(1, 2), (2, 1), (2, 2)} <= free
    tp = kept("run: {moe: {expert_tensor_parallel: tp}}\n")
    one = kept("run: {moe: {expert_tensor_parallel: 1}}\n")
    assert (2, 1) in tp and (2, 2) not in tp
    assert (2, 2) in one and (2, 1) not in one
    at_tp1 = {pair for pair in free if pair[0] == 1}
    assert at_tp1 and at_tp1 <= tp and at_tp1 <= one  # at tp = 1 both labels are the same run
