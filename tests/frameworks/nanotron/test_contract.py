"""Every rendered nanotron YAML loads strictly into nanotron's config, at each supported version.

nanotron itself cannot be installed here (PyPI has only a broken 0.4; its code needs CUDA and
flash-attn), so the check is our own mirror of its dataclasses and of dacite's strict loader,
read from nanotron's source at each pinned commit: sweep/frameworks/nanotron/config_schema.py
(the commits are in its docstring). A representative family goes through the real planner and
renderer: dp/tp/pp, ZeRO 0 and 1, no and full recompute, sequence parallelism on and off, the
1f1b and afab (gpipe) engines, tied and untied, MHA and GQA models, bf16, at both versions. The
negative tests show the validator can fail: a misspelt key, a wrong type, a missing field, and
the context-parallel key at the playbook's commit.

MoE models render at main as a Qwen2Config with `moe_config` (nn/moe.py's experts): a family of
MoE shapes over dp/tp/sp, ZeRO 0 and 1, recompute, with pp and ep axes that nanotron cannot run,
loads strictly where kept, and what the capability table prunes is exactly what the mirror
rejects. Negative tests: a misspelt MoE key, top_k above the expert count, ep > 1, pp > 1, fp16
experts, and the MoE config at the playbook's commit.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweep.core.runconfig import RunConfig
from sweep.frameworks.nanotron import config_checks, config_schema
from sweep.frameworks.nanotron.config_schema import MAIN, PLAYBOOK
from sweep.plan import render, space
from sweep.plan.spec import Spec, parse_spec

pytestmark = pytest.mark.contract

VERSIONS = (MAIN, PLAYBOOK)
FAMILY = """
name: nanotron-contract
framework: nanotron
gpu: h100-sxm
gpus_per_node: 8
dtype: bf16
models: [tiny-4l, tiny-gqa-4l, llama-3.2-1b, llama-3.1-8b]
nodes: [1, 2]
seq_len: 4096
global_batch: {{sequences: 64}}
axes:
  mbs: [1, 2]
  zero_stage: [0, 1]
  recompute: [none, full]
  sp: [true, false]
  pp_schedule: [1f1b, gpipe]
run: {{framework_version: {version}}}
"""
# One run per combination of these (deterministic: the plan's first kept row of each group).
VARIETY = ["model", "nodes", "zero_stage", "recompute", "sp", "pp_schedule", "tp", "pp"]


def family(version: str) -> Spec:
    return parse_spec(FAMILY.format(version=version))


@pytest.fixture(scope="module", params=VERSIONS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[tuple[RunConfig, dict[str, Any]]]]:
    """(version, [(run config, loaded YAML)]) for a spread of the family's kept runs."""
    version = request.param
    spec = family(version)
    plan = space.plan(spec)
    kept = plan[plan["status"] == space.KEPT]
    sample = kept.groupby(VARIETY, observed=True).head(1)
    env = render.make_environment()
    names = render.launch_templates(env, "nanotron")
    runs = []
    for row in render.kept_rows(sample):
        config = render.resolve_run(spec, row)
        files = render.render_files(env, config, Path("/sweep/runs") / config.run_id, names)
        runs.append((config, yaml.safe_load(files["launch/nanotron.yaml"])))
    return version, runs


def test_the_family_covers_what_nanotron_can_run(rendered: tuple[str, list]) -> None:
    _, runs = rendered
    layouts = [config.layout for config, _ in runs]
    assert len(runs) >= 40
    assert {lay.zero_stage for lay in layouts} == {0, 1}
    assert {lay.recompute for lay in layouts} == {"none", "full"}
    assert {lay.sp for lay in layouts} == {True, False}
    assert {lay.pp_schedule for lay in layouts} == {"1f1b", "gpipe"}
    assert max(lay.tp for lay in layouts) > 1 and max(lay.pp for lay in layouts) > 1
    assert max(lay.dp for lay in layouts) > 1
    assert {config.model.tie_word_embeddings for config, _ in runs} == {True, False}


def test_every_rendered_yaml_loads_strictly(rendered: tuple[str, list]) -> None:
    version, runs = rendered
    for config, loaded in runs:
        world = config.nodes * config.gpus_per_node
        assert config_checks.problems(loaded, version, world) == [], config.run_id


def test_the_yaml_says_what_the_run_is(rendered: tuple[str, list]) -> None:
    version, runs = rendered
    for config, loaded in runs:
        layout, model, par = config.layout, config.model, loaded["parallelism"]
        assert (par["dp"], par["tp"], par["pp"]) == (layout.dp, layout.tp, layout.pp)
        assert ("context_parallel_size" in par) == (version == MAIN)
        assert par["expert_parallel_size"] == 1
        assert par["tp_mode"] == ("REDUCE_SCATTER" if layout.sp else "ALL_REDUCE")
        assert par["tp_linear_async_communication"] == (layout.sp and layout.tp > 1)
        assert par["pp_engine"] == {"1f1b": "1f1b", "gpipe": "afab"}[layout.pp_schedule]
        assert par["recompute_layer"] == (layout.recompute == "full")
        assert loaded["optimizer"]["zero_stage"] == layout.zero_stage
        tokens = loaded["tokens"]
        assert (tokens["micro_batch_size"], tokens["batch_accumulation_per_replica"],
                tokens["sequence_length"]) == (layout.mbs, layout.grad_acc, 4096)
        assert tokens["micro_batch_size"] * tokens["batch_accumulation_per_replica"] * par["dp"] == 64
        llama = loaded["model"]["model_config"]
        assert (llama["num_hidden_layers"], llama["hidden_size"], llama["intermediate_size"],
                llama["num_attention_heads"], llama["num_key_value_heads"], llama["vocab_size"],
                llama["tie_word_embeddings"]) == (
            model.num_layers, model.hidden_size, model.ffn_hidden_size, model.num_attention_heads,
            model.num_kv_heads, model.vocab_size, model.tie_word_embeddings)
        assert loaded["model"]["dtype"] == "bfloat16"
        assert loaded["checkpoints"]["save_final_state"] is False  # main's default is True


def _first(version: str) -> dict[str, Any]:
    spec = family(version)
    plan = space.plan(spec)
    row = render.kept_rows(plan[plan["status"] == space.KEPT].head(1))[0]
    config = render.resolve_run(spec, row)
    env = render.make_environment()
    files = render.render_files(env, config, Path("/r") / config.run_id,
                                render.launch_templates(env, "nanotron"))
    return yaml.safe_load(files["launch/nanotron.yaml"])


@pytest.fixture(scope="module")
def main_yaml() -> dict[str, Any]:
    return _first(MAIN)


def _broken(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy with `path` (dotted) set to `value`, or deleted when value is ...."""
    data = copy.deepcopy(data)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return data


@pytest.mark.parametrize(("path", "value", "message"), [
    ("parallelism.sequence_parallel", True, r"config\.parallelism\.sequence_parallel: unknown key"),
    ("model.model_config.num_kv_heads", 8, r"config\.model\.model_config\.num_kv_heads: unknown key"),
    ("tokens.micro_batch_size", "2", r"config\.tokens\.micro_batch_size: expected int"),
    ("optimizer.learning_rate_scheduler.min_decay_lr", "1e-5",  # YAML 1.1 reads 1e-5 as a string
     r"config\.optimizer\.learning_rate_scheduler\.min_decay_lr: expected float"),
    ("optimizer.learning_rate_scheduler.lr_warmup_style", None, r"lr_warmup_style: expected str"),
    ("parallelism.tp", True, r"config\.parallelism\.tp: expected int"),
    ("tokens.train_steps", ..., r"config\.tokens\.train_steps: missing required field"),
    ("parallelism.pp_engine", "interleaved", r"config\.parallelism\.pp_engine: 'interleaved' is not"),
    ("model.dtype", "fp8", r"config\.model\.dtype: 'fp8' is not"),
    ("data_stages", [], r"a training stage starting at 1"),
    ("parallelism.tp_mode", "ALL_REDUCE", r"not supported for ALL_REDUCE mode"),
])
def test_the_validator_rejects_what_nanotron_would(main_yaml: dict[str, Any], path: str,
                                                   value: Any, message: str) -> None:
    if path == "parallelism.tp_mode":  # async communication stays on
        main_yaml = _broken(main_yaml, "parallelism.tp_linear_async_communication", True)
    with pytest.raises(config_schema.ConfigError, match=message):
        config_checks.validate(_broken(main_yaml, path, value), MAIN)


def test_tp_mode_takes_any_case_as_nanotron_upper_cases_it(main_yaml: dict[str, Any]) -> None:
    config_checks.validate(_broken(main_yaml, "parallelism.tp_mode", "reduce_scatter"), MAIN)


def test_the_context_parallel_key_is_refused_at_the_playbook_commit(main_yaml: dict[str, Any]) -> None:
    assert "context_parallel_size" in main_yaml["parallelism"]
    with pytest.raises(config_schema.ConfigError,
                       match=r"config\.parallelism\.context_parallel_size: unknown key"):
        config_checks.validate(main_yaml, PLAYBOOK)
    playbook = _broken(main_yaml, "parallelism.context_parallel_size", ...)
    config_checks.validate(playbook, PLAYBOOK)
    # ... where the tokenizer section is required, and main's LlamaConfig fields are unknown
    with pytest.raises(config_schema.ConfigError, match=r"config\.tokenizer: missing required"):
        config_checks.validate(_broken(playbook, "tokenizer", ...), PLAYBOOK)
    config_checks.validate(_broken(main_yaml, "tokenizer", ...), MAIN)
    with pytest.raises(config_schema.ConfigError, match=r"model_config\.z_loss_enabled: unknown"):
        config_checks.validate(_broken(playbook, "model.model_config.z_loss_enabled", False),
                               PLAYBOOK)


def test_layout_asserts_replayed(main_yaml: dict[str, Any]) -> None:
    world = main_yaml["parallelism"]["dp"] * main_yaml["parallelism"]["tp"] * main_yaml["parallelism"]["pp"]
    assert config_checks.problems(main_yaml, MAIN, world) == []
    assert "!= WORLD_SIZE" in config_checks.problems(main_yaml, MAIN, world * 2)[0]
    with_cp = _broken(main_yaml, "parallelism.context_parallel_size", 2)
    assert any("Init with Context parallel size > 1 not supported yet" in p
               for p in config_checks.problems(with_cp, MAIN, world * 2))
    with_ep = _broken(main_yaml, "parallelism.expert_parallel_size", 2)
    assert "!= WORLD_SIZE" in config_checks.problems(with_ep, MAIN, world * 2)[0]
    one_f_one_b = _broken(_broken(main_yaml, "parallelism.pp", 4), "parallelism.pp_engine", "1f1b")
    one_f_one_b = _broken(one_f_one_b, "tokens.batch_accumulation_per_replica", 2)
    assert any("at least PP_SIZE-1=3" in p for p in config_checks.problems(one_f_one_b, MAIN))


def test_a_run_the_capability_table_would_prune_does_not_render(rendered: tuple[str, list]) -> None:
    """Rendered anyway (bypassing the planner), an interleaved, selective-recompute or
    wide-head run fails instead of becoming a plain 1F1B, fully recomputed or narrower-headed
    run, and so does a MoE run at the playbook's commit instead of becoming a dense one."""
    version, runs = rendered
    config = runs[0][0]
    env = render.make_environment()
    names = render.launch_templates(env, "nanotron")
    interleaved = replace(config, layout=replace(config.layout, pp_schedule="interleaved_1f1b"))
    moe = replace(config, model=replace(config.model, num_experts=8, experts_per_token=2))
    selective = replace(config, layout=replace(config.layout, recompute="selective"))
    wide_heads = replace(config, model=replace(config.model, head_dim=2 * config.model.head_dim))
    for bad in (interleaved, selective, wide_heads, *((moe,) if version == PLAYBOOK else ())):
        with pytest.raises(render.RenderError):
            render.render_files(env, bad, Path("/r") / bad.run_id, names)
    if version == MAIN:  # a MoE model renders as one: a Qwen2Config with its experts
        files = render.render_files(env, moe, Path("/r") / moe.run_id, names)
        model_config = yaml.safe_load(files["launch/nanotron.yaml"])["model"]["model_config"]
        assert model_config["moe_config"]["num_experts"] == 8


# MoE at main ---------------------------------------------------------------------------------

MOE_FAMILY = """
name: nanotron-moe-contract
framework: nanotron
gpu: h100-sxm
gpus_per_node: 8
dtype: bf16
models:
{models}
nodes: [{nodes}]
seq_len: 4096
global_batch: {{sequences: 64}}
axes:
  pp: [1, 2]
  ep: [1, 2, 4]
  mbs: [1, 2]
  zero_stage: [0, 1]
  recompute: [none, full]
  sp: [true, false]
  pp_schedule: [1f1b, gpipe]
run: {{framework_version: {version}}}
"""
MOE_MODELS = """\
  - {name: moe-4e-4l, num_layers: 4, hidden_size: 256, num_attention_heads: 4, num_kv_heads: 2,
     ffn_hidden_size: 512, vocab_size: 1024, tie_word_embeddings: true, num_experts: 4,
     experts_per_token: 2}
  - {name: moe-8e-8l, num_layers: 8, hidden_size: 1024, num_attention_heads: 8, num_kv_heads: 8,
     ffn_hidden_size: 768, vocab_size: 32000,
     tie_word_embeddings: false, num_experts: 8, experts_per_token: 2}"""
MOE_VARIETY = [*VARIETY, "ep", "mbs"]
# The statuses of the candidates that pass the planner's generic rules: whether nanotron accepts
# them is the capability table's question (the memory rule comes after it).
ASKED = ("kept", "pruned:framework", "pruned:memory")


def moe_family(version: str = MAIN, models: str = MOE_MODELS, nodes: str = "1, 2") -> Spec:
    return parse_spec(MOE_FAMILY.format(models=models, nodes=nodes, version=version))


@pytest.fixture(scope="module")
def moe_runs() -> list[tuple[RunConfig, dict[str, Any], str, str]]:
    """(run config, loaded YAML, status, prune detail) for a spread of the MoE family's
    candidates at main, the pruned ones rendered anyway (bypassing the planner)."""
    spec = moe_family()
    plan = space.plan(spec)
    asked = plan[plan["status"].astype(str).isin(ASKED)]
    sample = asked.groupby(MOE_VARIETY, observed=True).head(1)
    env = render.make_environment()
    names = render.launch_templates(env, "nanotron")
    resolver = render.RunResolver(spec)
    runs = []
    rows = render.kept_rows(sample.drop(columns="status"))
    for row, status in zip(rows, sample["status"].astype(str), strict=True):
        config = resolver(row)
        files = render.render_files(env, config, Path("/sweep/runs") / config.run_id, names)
        runs.append((config, yaml.safe_load(files["launch/nanotron.yaml"]), status,
                     str(row["prune_detail"])))
    return runs


def _world(config: RunConfig) -> int:
    return config.nodes * config.gpus_per_node


def test_the_moe_family_covers_what_nanotron_can_and_cannot_run(moe_runs: list) -> None:
    kept = [config.layout for config, _, status, _ in moe_runs if status == space.KEPT]
    assert len(kept) >= 30
    assert {lay.zero_stage for lay in kept} == {0, 1}
    assert {lay.recompute for lay in kept} == {"none", "full"}
    assert {lay.sp for lay in kept} == {True, False}
    assert max(lay.tp for lay in kept) > 1 and max(lay.dp for lay in kept) > 1
    assert {config.model.tie_word_embeddings for config, _, _, _ in moe_runs} == {True, False}
    pruned = [config.layout for config, _, status, _ in moe_runs if status == "pruned:framework"]
    assert {lay.ep for lay in pruned} == {1, 2, 4} and {lay.pp for lay in pruned} == {1, 2}


def test_every_kept_moe_run_loads_strictly_as_a_qwen2_moe(moe_runs: list) -> None:
    for config, loaded, status, _ in moe_runs:
        if status != space.KEPT:
            continue
        assert config_checks.problems(loaded, MAIN, _world(config)) == [], config.run_id
        layout, model, par = config.layout, config.model, loaded["parallelism"]
        qwen2 = loaded["model"]["model_config"]
        assert qwen2["is_qwen2_config"] is True and "is_llama_config" not in qwen2
        assert qwen2["moe_config"] == {
            "num_experts": model.num_experts, "top_k": model.experts_per_token,
            "moe_intermediate_size": model.moe_ffn_hidden_size, "layers": [-1],
            "enable_shared_expert": False, "token_dispatcher_type": "alltoall"}
        assert (qwen2["num_hidden_layers"], qwen2["hidden_size"], qwen2["num_attention_heads"],
                qwen2["num_key_value_heads"], qwen2["vocab_size"], qwen2["tie_word_embeddings"]
                ) == (model.num_layers, model.hidden_size, model.num_attention_heads,
                      model.num_kv_heads, model.vocab_size, model.tie_word_embeddings)
        assert (par["dp"], par["tp"], par["pp"], par["expert_parallel_size"]) == (
            layout.dp, layout.tp, layout.pp, layout.ep)
        assert par["tp_mode"] == ("REDUCE_SCATTER" if layout.sp else "ALL_REDUCE")
        assert par["recompute_layer"] == (layout.recompute == "full")
        assert loaded["optimizer"]["zero_stage"] == layout.zero_stage
        assert loaded["model"]["dtype"] == "bfloat16"


def test_the_pruned_moe_set_is_exactly_what_nanotron_rejects(moe_runs: list) -> None:
    """Pruned by the capability table if and only if the mirror of nanotron main refuses the
    rendered config, for the reason the rule gives."""
    reasons = {"expert_parallel": "expert_parallel_size", "moe_pipeline": "position_ids.numel()"}
    for config, loaded, status, detail in moe_runs:
        found = config_checks.problems(loaded, MAIN, _world(config))
        assert bool(found) == (status == "pruned:framework"), (config.run_id, found, detail)
        if found:
            rule = detail.split(":")[0]
            assert any(reasons[rule] in problem for problem in found), (detail, found)


def test_mixtral_is_pruned_by_memory_not_by_the_framework() -> None:
    """nanotron main keeps every expert whole on each TP rank and has no EP, so Mixtral-8x7B's
    45 B expert parameters are on every GPU: more than an H100 holds
    (sweep.models.memory_profiles.NANOTRON, experts_shard_over_tp)."""
    plan = space.plan(moe_family(models="  - mixtral-8x7b", nodes="4"))
    one_stage = plan[(plan["pp"] == 1) & (plan["ep"] == 1)]
    assert space.KEPT not in set(plan["status"].astype(str))
    assert "pruned:memory" in set(one_stage["status"].astype(str))
    assert set(one_stage["status"].astype(str)) <= {"pruned:memory", "pruned:tp_heads"}


@pytest.fixture(scope="module")
def moe_yaml(moe_runs: list) -> tuple[dict[str, Any], int]:
    """The first kept MoE run's config and its world size."""
    config, loaded, _, _ = next(run for run in moe_runs if run[2] == space.KEPT)
    return loaded, _world(config)


@pytest.mark.parametrize(("path", "value", "message"), [
    ("model.model_config.moe_config.top_kk", 2,
     r"model_config\.moe_config\.top_kk: unknown key for MoEConfig"),
    ("model.model_config.moe_config.num_experts", "8",
     r"model_config\.moe_config\.num_experts: expected int"),
    ("model.model_config.moe_config.top_k", 16, r"top_k \(16\) cannot be greater than num_experts"),
    ("model.model_config.moe_config.token_dispatcher_type", "deepep",
     r"token_dispatcher_type must be one of"),
    ("model.model_config.is_llama_config", True, r"is_llama_config: unknown key for Qwen2Config"),
    ("model.dtype", "float16", r"grouped_gemm ops\.gmm\) takes bfloat16 only"),
    ("parallelism.pp", 2, r"position_ids\.numel\(\)"),
])
def test_the_validator_rejects_what_nanotron_main_s_moe_would(
        moe_yaml: tuple[dict[str, Any], int], path: str, value: Any, message: str) -> None:
    loaded, _ = moe_yaml
    with pytest.raises(config_schema.ConfigError, match=message):
        config_checks.validate(_broken(loaded, path, value), MAIN)


def test_a_qwen2_config_is_told_by_its_keys_as_dacite_tells_it(
        moe_yaml: tuple[dict[str, Any], int]) -> None:
    """dacite tries LlamaConfig first: without `is_qwen2_config`, `moe_config` alone still makes
    the dict a Qwen2Config, and without both it is a LlamaConfig, whose checks then apply."""
    loaded, world = moe_yaml
    untagged = _broken(loaded, "model.model_config.is_qwen2_config", ...)
    assert config_checks.problems(untagged, MAIN, world) == []
    dense = _broken(untagged, "model.model_config.moe_config", ...)
    dense = _broken(dense, "model.model_config.log_attn_probs", ...)
    assert config_checks.problems(_broken(dense, "parallelism.pp", 2), MAIN) == []


@pytest.mark.parametrize("world_has_ep", [False, True])
def test_expert_parallelism_is_rejected_whatever_the_world_size(
        moe_yaml: tuple[dict[str, Any], int], world_has_ep: bool) -> None:
    """ParallelContext's product leaves ep out, and its (ep, pp, dp, cp, tp) layout counts it."""
    loaded, world = moe_yaml
    with_ep = _broken(loaded, "parallelism.expert_parallel_size", 2)
    found = config_checks.problems(with_ep, MAIN, world * 2 if world_has_ep else world)
    assert any("lays the ranks out as (ep, pp, dp, cp, tp)" in p for p in found), found
    assert any("!= WORLD_SIZE" in p for p in found) == world_has_ep


def test_the_moe_config_is_refused_at_the_playbook_commit(
        moe_yaml: tuple[dict[str, Any], int]) -> None:
    loaded, _ = moe_yaml
    playbook = _broken(loaded, "parallelism.context_parallel_size", ...)
    with pytest.raises(config_schema.ConfigError,
                       match=r"model_config\.is_qwen2_config: unknown key for LlamaConfig"):
        config_checks.validate(playbook, PLAYBOOK)


def test_a_moe_spec_for_the_playbook_commit_plans_nothing_for_nanotron() -> None:
    plan = space.plan(moe_family(PLAYBOOK))
    assert space.KEPT not in set(plan["status"].astype(str))
    framework = plan[plan["status"] == "pruned:framework"]
    assert len(framework) and all(str(d).startswith("moe_model:")
                                  for d in framework["prune_detail"])
