"""torchtitan's capability table: what it prunes, and that each rule says why and where."""

from __future__ import annotations

import numpy as np
import pytest

from sweep.core.catalog import get_model
from sweep.frameworks import get_adapter
from sweep.frameworks.base import CapabilityContext
from sweep.frameworks.capability_check import capability_failures
from sweep.frameworks.torchtitan.capabilities import RULES
from sweep.frameworks.torchtitan.flavors import flavor_for, template_table

ADAPTER = get_adapter("torchtitan")


def catalog(name: str):
    return get_model(name)


def columns(**values) -> dict[str, np.ndarray]:
    """One candidate per entry; unspecified columns take the plainest value."""
    n = max(len(v) for v in values.values())
    base = {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "mbs": 1, "grad_acc": 8,
            "zero_stage": 2, "vpp": 1, "nodes": 1, "gpus": 8, "sp": True,
            "recompute": "none", "pp_schedule": "1f1b"}
    out = {}
    for key, default in base.items():
        value = values.get(key, [default] * n)
        out[key] = np.asarray(value if len(value) == n else value * n)
    return out


def ctx(model: str = "llama-3.1-8b", dtype: str = "bf16", seq_len: int = 4096,
        version: str = "v0.2", expert_tp: int | str | None = None) -> CapabilityContext:
    return CapabilityContext(model=catalog(model), dtype=dtype, seq_len=seq_len, gpus_per_node=8,
                             global_batch_sequences=64, framework_version=version,
                             expert_tensor_parallel=expert_tp)


def first_rule(cols, context) -> list[str | None]:
    _, index = capability_failures(ADAPTER, cols, context)
    return [RULES[i].name if i >= 0 else None for i in index]


def test_every_rule_names_its_source() -> None:
    for rule in RULES:
        assert rule.name.startswith("torchtitan_") and rule.reason and rule.source
        assert "torchtitan" in rule.source or "torch/" in rule.source


@pytest.mark.parametrize("name, flavor", [("llama-3.1-8b", "8B"), ("llama-3.1-70b", "70B"),
                                          ("llama-3.1-405b", "405B"), ("llama-3.2-1b", None),
                                          ("llama-3.2-3b", None), ("playbook-8b", None),
                                          ("mixtral-8x7b", None), ("tiny-4l", None)])
def test_only_identical_shapes_have_a_flavor(name: str, flavor: str | None) -> None:
    found = flavor_for(catalog(name))
    assert (found.name if found else None) == flavor


def test_the_templates_flavor_table_is_ours(repo_root) -> None:
    text = (repo_root / "templates" / "launch" / "torchtitan.toml.j2").read_text()
    for key, name in template_table().items():
        assert f'"{key}": "{name}"' in text


def test_models_without_a_flavor_are_pruned_whole() -> None:
    assert first_rule(columns(dp=[8]), ctx("llama-3.2-1b")) == ["torchtitan_no_model_definition"]
    assert first_rule(columns(dp=[8]), ctx("playbook-8b")) == ["torchtitan_no_model_definition"]
    assert first_rule(columns(dp=[8]), ctx()) == [None]


@pytest.mark.parametrize("dtype, pruned", [("bf16", False), ("fp8", False), ("fp32", False),
                                           ("tf32", True), ("fp16", True)])
def test_dtypes(dtype: str, pruned: bool) -> None:
    assert first_rule(columns(dp=[8]), ctx(dtype=dtype)) == (["torchtitan_dtype"] if pruned else [None])


def test_zero0_is_ddp_and_only_pure_data_parallel() -> None:
    cols = columns(dp=[8, 2, 2, 2, 1], tp=[1, 4, 1, 1, 8], pp=[1, 1, 4, 1, 1],
                   cp=[1, 1, 1, 4, 1], zero_stage=[0])
    assert first_rule(cols, ctx()) == [None, "torchtitan_ddp_nd", "torchtitan_ddp_nd",
                                       "torchtitan_cp_shards", "torchtitan_mixed_precision_off"]
    # in fp32 nothing is lost by running without mixed precision
    assert first_rule(cols, ctx(dtype="fp32"))[4] is None


def test_tp_or_pp_without_fsdp_loses_mixed_precision() -> None:
    cols = columns(dp=[1, 1, 2, 1], tp=[8, 1, 4, 4], pp=[1, 8, 1, 1], cp=[1, 1, 1, 2],
                   zero_stage=[2, 3, 2, 3], grad_acc=[8, 8, 8, 8])
    assert first_rule(cols, ctx()) == ["torchtitan_mixed_precision_off"] * 2 + [None, None]
    assert first_rule(cols, ctx(dtype="fp8"))[:2] == ["torchtitan_mixed_precision_off"] * 2


def test_ep_tp_without_sp_and_seq_len() -> None:
    cols = columns(dp=[4, 4, 2], ep=[2, 1, 1], tp=[1, 2, 4], sp=[True, False, True])
    assert first_rule(cols, ctx()) == ["torchtitan_ep_dense", "torchtitan_tp_is_sp", None]
    assert first_rule(cols, ctx(seq_len=4100))[2] == "torchtitan_seq_len_divisor"


def test_pipeline_schedules() -> None:
    cols = columns(dp=[2] * 5, pp=[4] * 5, grad_acc=[3, 4, 3, 8, 8],
                   pp_schedule=["1f1b", "1f1b", "gpipe", "interleaved_1f1b", "interleaved_1f1b"],
                   vpp=[1, 1, 1, 2, 4])
    assert first_rule(cols, ctx()) == ["torchtitan_1f1b_microbatches", None, None, None,
                                       "torchtitan_interleaved_stages"]
    rounds = columns(dp=[2], pp=[4], grad_acc=[11], pp_schedule=["interleaved_1f1b"], vpp=[2])
    assert first_rule(rounds, ctx()) == ["torchtitan_interleaved_rounds"]


# torchtitan 0.3.0 and main (the Python config module) ------------------------------------------

CONFIG_MODULE_VERSIONS = ["v0.3", "main"]


def test_the_default_version_is_0_3() -> None:
    assert ADAPTER.default_version == "v0.3"
    assert {v.key for v in ADAPTER.versions} == {"v0.3", "main", "v0.2", "v0.2.0"}


@pytest.mark.parametrize("version", CONFIG_MODULE_VERSIONS)
def test_on_0_3_every_model_runs_by_its_dimensions(version: str) -> None:
    """No flavor needed: the 1B (tied), the playbook's shapes and Mixtral are kept."""
    for model in ("llama-3.2-1b", "playbook-8b", "mixtral-8x7b"):
        assert first_rule(columns(dp=[8]), ctx(model, version=version)) == [None], model


@pytest.mark.parametrize("version", CONFIG_MODULE_VERSIONS)
def test_on_0_3_a_vocabulary_smaller_than_the_test_tokenizers_is_pruned(version: str) -> None:
    assert get_model("tiny-gqa-4l").vocab_size < 2020
    assert first_rule(columns(dp=[8]), ctx("tiny-gqa-4l", version=version)) == [
        "torchtitan_vocab_below_tokenizer"]


@pytest.mark.parametrize("version", CONFIG_MODULE_VERSIONS)
def test_on_0_3_zero0_is_replicated_fsdp_with_model_parallelism(version: str) -> None:
    """0.3 has no DDP path: ZeRO-0 with TP or PP keeps mixed precision (HSDP, shard degree 1);
    CP still shards the parameters."""
    cols = columns(dp=[2, 2, 2, 1], tp=[4, 1, 1, 8], pp=[1, 4, 1, 1], cp=[1, 1, 4, 1],
                   zero_stage=[0])
    assert first_rule(cols, ctx(version=version)) == [None, None, "torchtitan_cp_shards", None]


@pytest.mark.parametrize("version", CONFIG_MODULE_VERSIONS)
def test_on_0_3_tp_without_sp_is_a_setting(version: str) -> None:
    cols = columns(dp=[4, 2], tp=[2, 4], sp=[False, True])
    assert first_rule(cols, ctx(version=version)) == [None, None]
    # without SP the sequence need not divide by TP, only by 2·cp
    odd = columns(dp=[4, 4, 2], tp=[2, 2, 2], cp=[1, 1, 2], sp=[False, True, False])
    assert first_rule(odd, ctx(seq_len=4097, version=version)) == [
        None, "torchtitan_seq_len_divisor_v03", "torchtitan_seq_len_divisor_v03"]


@pytest.mark.parametrize("version", CONFIG_MODULE_VERSIONS)
def test_on_0_3_a_tied_model_cannot_be_pipelined(version: str) -> None:
    cols = columns(dp=[2, 8], pp=[4, 1])
    assert first_rule(cols, ctx("llama-3.2-1b", version=version)) == [
        "torchtitan_pp_tied_embeddings", None]
    assert first_rule(cols, ctx("llama-3.1-8b", version=version)) == [None, None]


@pytest.mark.parametrize("version", CONFIG_MODULE_VERSIONS)
def test_on_0_3_expert_parallelism_needs_fsdp(version: str) -> None:
    cols = columns(dp=[2, 2], ep=[4, 4], zero_stage=[0, 3])
    assert first_rule(cols, ctx("mixtral-8x7b", version=version)) == [
        "torchtitan_ep_needs_fsdp", None]


@pytest.mark.parametrize("version", CONFIG_MODULE_VERSIONS)
def test_expert_tp_is_pruned_where_0_3_runs_the_other_one(version: str) -> None:
    """etp = tp when ep = 1, etp = 1 when ep > 1; at tp = 1 both labels are the same run."""
    cols = columns(dp=[2, 1, 8, 4], tp=[4, 4, 1, 2], ep=[1, 2, 1, 1])
    assert first_rule(cols, ctx("mixtral-8x7b", version=version)) == [None] * 4
    assert first_rule(cols, ctx("mixtral-8x7b", version=version, expert_tp="tp")) == [
        None, "torchtitan_expert_tp", None, None]
    assert first_rule(cols, ctx("mixtral-8x7b", version=version, expert_tp=1)) == [
        "torchtitan_expert_tp", None, None, "torchtitan_expert_tp"]
    # a dense model has no experts to shard
    assert first_rule(cols, ctx("llama-3.1-8b", version=version, expert_tp=1))[0] is None


def test_the_0_2_rules_do_not_apply_to_0_3_and_back() -> None:
    by_name = {rule.name: rule for rule in RULES}
    only_02 = ("torchtitan_no_model_definition", "torchtitan_ep_dense", "torchtitan_ddp_nd",
               "torchtitan_mixed_precision_off", "torchtitan_tp_is_sp", "torchtitan_seq_len_divisor")
    cols = columns(dp=[2], ep=[2], tp=[4], sp=[False], zero_stage=[0])
    for name in only_02:
        assert not by_name[name].fails(cols, ctx("llama-3.2-1b", version="v0.3", seq_len=4098)).any()
    only_03 = ("torchtitan_pp_tied_embeddings", "torchtitan_ep_needs_fsdp", "torchtitan_expert_tp",
               "torchtitan_seq_len_divisor_v03")
    tied = columns(dp=[2], pp=[4], ep=[2], tp=[2], zero_stage=[0])
    for name in only_03:
        assert not by_name[name].fails(tied, ctx("llama-3.2-1b", version="v0.2", expert_tp=1,
                                                 seq_len=4098)).any()
