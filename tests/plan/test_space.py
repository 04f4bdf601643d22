"""The configuration space: enumeration, the named prune rules in their order, the plan."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sweep.core.catalog import get_model
from sweep.core.layout import Layout
from sweep.core.model import ModelShape
from sweep.core.runconfig import RunConfig
from sweep.core.units import GiB
from sweep.models.memory import reserved_interval
from sweep.plan import space
from sweep.plan.spec import parse_spec

SMALL = """
name: small
framework: builtin
gpu: h100-sxm
gpus_per_node: 8
models: [playbook-1b, playbook-8b]
nodes: [1, 2]
seq_len: 4096
global_batch: {sequences: 64}
axes:
  mbs: [1, 2, 4]
  zero_stage: [0, 1]
  sp: [true, false]
  pp_schedule: [1f1b, interleaved_1f1b]
"""


def spec_from(text: str = SMALL, **replace: str):
    for old, new in replace.items():
        text = text.replace(old, new)
    return parse_spec(text, "test.yaml")


def candidate(**values: object) -> dict[str, np.ndarray]:
    """Columns of candidates, one per value of the longest list given."""
    base: dict[str, object] = dict(dp=1, tp=1, pp=1, cp=1, ep=1, mbs=1, grad_acc=8, zero_stage=0,
                                   vpp=1, sp=True, recompute="none", pp_schedule="1f1b")
    base.update(values)
    n = max(len(v) if isinstance(v, list) else 1 for v in base.values())
    out = {}
    for key, value in base.items():
        column = value if isinstance(value, list) else [value] * n
        out[key] = np.array(column)
    return out


def context(model: str | ModelShape = "playbook-1b", **changes: object) -> space.RuleContext:
    shape = get_model(model) if isinstance(model, str) else model
    fields: dict[str, object] = dict(model=shape, framework="nanotron",
                                     gpus_per_node=8, seq_len=4096, global_batch_sequences=256,
                                     max_tp=8, memory_budget_bytes=None)
    fields.update(changes)
    return space.RuleContext(**fields)  # type: ignore[arg-type]


def first_rule(columns: Mapping[str, np.ndarray], ctx: space.RuleContext) -> list[str]:
    code, _ = space.evaluate(columns, ctx)
    return [space.KEPT if c < 0 else space.RULE_NAMES[c] for c in code]


# Enumeration --------------------------------------------------------------------------------

def test_factorizations_are_every_product_equal_to_the_gpu_count() -> None:
    spec = spec_from(SMALL.replace("mbs: [1, 2, 4]", "mbs: [1]\n  cp: auto\n  ep: auto"))
    found = space.factorizations(spec, 16)
    rows = set(zip(*(found[k].tolist() for k in ("dp", "tp", "pp", "cp", "ep"))))
    divisors = [1, 2, 4, 8, 16]
    expected = {c for c in itertools.product(divisors, repeat=5) if np.prod(c) == 16}
    assert rows == expected


def test_candidates_meet_the_global_batch_and_are_unique() -> None:
    spec = spec_from()
    columns = space.enumerate_candidates(spec, 2)
    valid = columns["grad_acc"] > 0
    product = columns["dp"] * columns["ep"] * columns["mbs"] * columns["grad_acc"]
    assert (product[valid] == 64).all()
    assert (64 % (columns["dp"] * columns["mbs"])[~valid] != 0).all()
    frame = pd.DataFrame(columns)
    assert not frame.duplicated().any()
    assert (frame["dp"] * frame["tp"] * frame["pp"] * frame["cp"] * frame["ep"] == 16).all()


def test_axes_that_change_nothing_do_not_duplicate_runs() -> None:
    frame = pd.DataFrame(space.enumerate_candidates(spec_from(), 1))
    assert set(frame.loc[frame.tp == 1, "sp"]) == {False}  # SP needs TP: one run, sp off
    assert set(frame.loc[frame.tp > 1, "sp"]) == {True, False}
    assert set(frame.loc[frame.pp == 1, "pp_schedule"]) == {"1f1b"}
    interleaved = frame.pp_schedule == "interleaved_1f1b"
    assert (frame.loc[interleaved, "vpp"] == space.INTERLEAVED_VPP).all()
    assert (frame.loc[~interleaved, "vpp"] == 1).all()


def test_auto_micro_batches_are_powers_of_two_up_to_max_mbs() -> None:
    spec = spec_from(SMALL.replace("mbs: [1, 2, 4]", "mbs: auto"))
    assert space.micro_batch_sizes(spec).tolist() == [1, 2, 4, 8, 16, 32, 64]


# Rules --------------------------------------------------------------------------------------

def test_tp_must_divide_heads_and_kv_heads() -> None:
    ctx = context("tiny-gqa-4l", framework="builtin")  # 4 heads, 2 KV heads
    assert first_rule(candidate(tp=[1, 2, 4]), ctx) == ["kept", "kept", "tp_heads"]


def test_builtin_workload_needs_tp_to_divide_ffn_and_vocabulary() -> None:
    odd = ModelShape(name="odd", num_layers=4, hidden_size=256, num_attention_heads=4,
                     num_kv_heads=4, ffn_hidden_size=770, vocab_size=1000,
                     tie_word_embeddings=False)  # 770 = 2 · 385: tp 2 divides it, 4 does not
    assert first_rule(candidate(tp=[2, 4]), context(odd, framework="builtin")) == \
        ["kept", "tp_width"]
    assert first_rule(candidate(tp=[2, 4]), context(odd, framework="megatron")) == \
        ["kept", "kept"]  # Megatron pads the vocabulary and shards the FFN as it comes


def test_nanotron_counts_embedding_norm_and_head_as_pipeline_blocks() -> None:
    # 1B: 16 layers + 5 blocks, but the cost-balanced split leaves the 16th stage empty;
    # 8B: 32 layers at pp=32 still gives every stage a block; pp=64 cannot.
    assert first_rule(candidate(pp=[8, 16], grad_acc=64), context("playbook-1b")) == \
        ["kept", "pp_layers"]
    assert first_rule(candidate(pp=[32, 64], grad_acc=64), context("playbook-8b")) == \
        ["kept", "pp_layers"]


def test_pipeline_placement_follows_each_framework() -> None:
    llama405 = get_model("llama-3.1-405b")  # 126 layers
    assert space.pipeline_fits(llama405, 16, "megatron")  # (126 + 2) % 16: embedding and loss
    assert not space.pipeline_fits(llama405, 5, "megatron")
    assert space.pipeline_fits(llama405, 128, "torchtitan")  # embedding and output weigh one
    assert not space.pipeline_fits(llama405, 129, "torchtitan")
    assert space.pipeline_fits(llama405, 126, "builtin")
    assert not space.pipeline_fits(llama405, 127, "builtin")


def test_one_f_one_b_needs_pp_minus_one_micro_batches() -> None:
    ctx = context("playbook-8b")
    columns = candidate(pp=[4, 4, 4], grad_acc=[2, 3, 4])
    assert first_rule(columns, ctx) == ["pp_grad_acc", "kept", "kept"]
    # torch.distributed.pipelining (the built-in workload) wants at least pp micro-batches
    builtin = context("llama-3.1-8b", framework="builtin")
    assert first_rule(columns, builtin) == ["pp_grad_acc", "pp_grad_acc", "kept"]
    interleaved = candidate(pp=[4, 4], grad_acc=[6, 8], vpp=2, pp_schedule="interleaved_1f1b")
    assert first_rule(interleaved, context("playbook-8b", framework="builtin")) == \
        ["pp_grad_acc", "kept"]


def test_context_parallel_needs_two_chunks_per_rank() -> None:
    ctx = context(seq_len=4096 + 8, framework="megatron")  # 4104 = 8 · 513 (nanotron has no CP)
    assert first_rule(candidate(cp=[2, 4, 8], sp=False), ctx) == ["kept", "kept", "cp_seq"]
    # sequence parallelism splits each CP chunk over tp as well: 4104 / (2·16) is not whole
    sp = candidate(cp=2, tp=[4, 16], sp=True)
    assert first_rule(sp, ctx) == ["kept", "cp_seq"]


def test_expert_parallel_needs_experts_it_divides() -> None:
    dense = context("playbook-8b", framework="megatron")
    moe = context("mixtral-8x7b", framework="megatron")
    assert first_rule(candidate(ep=[1, 2]), dense) == ["kept", "ep_experts"]
    assert first_rule(candidate(ep=[2, 8, 16]), moe) == ["kept", "kept", "ep_experts"]
    builtin = context("mixtral-8x7b", framework="builtin")  # no expert parallelism there
    assert first_rule(candidate(ep=[1, 2]), builtin) == ["kept", "ep_experts"]


def test_tp_across_nodes_only_when_allowed() -> None:
    columns = candidate(tp=[8, 16], grad_acc=8)
    assert first_rule(columns, context(max_tp=64)) == ["kept", "tp_across_nodes"]
    assert first_rule(columns, context(max_tp=64, allow_tp_across_nodes=True)) == ["kept", "kept"]


def test_constraints_cap_tp_pp_and_micro_batch() -> None:
    ctx = context("playbook-8b", max_tp=4, max_pp=2, max_mbs=8)
    columns = candidate(tp=[8, 4, 1, 1], pp=[1, 1, 4, 1], mbs=[1, 1, 1, 16], grad_acc=8)
    assert first_rule(columns, ctx) == ["max_tp", "kept", "max_pp", "max_mbs"]


def test_global_batch_must_split_into_whole_micro_batches() -> None:
    columns = candidate(dp=[4, 3], mbs=2, grad_acc=[32, 0])
    assert first_rule(columns, context()) == ["kept", "batch"]


def test_memory_over_budget_is_pruned_and_the_first_failing_rule_wins() -> None:
    ctx = context("playbook-8b", memory_budget_bytes=40 * GiB)
    columns = candidate(tp=[8, 1, 3], mbs=[1, 1, 64], grad_acc=[256, 256, 4])
    code, mem = space.evaluate(columns, ctx)
    assert [space.RULE_NAMES[c] if c >= 0 else "kept" for c in code] == \
        ["kept", "memory", "tp_heads"]
    assert mem["mem_total_bytes"][0] <= 40 * GiB < mem["mem_total_bytes"][1]
    assert mem["mem_total_bytes"][2] == -1  # not estimated: pruned before the memory rule


def test_prune_rules_are_documented_once_each() -> None:
    assert len(set(space.RULE_NAMES)) == len(space.RULE_NAMES)
    assert all(rule.why for rule in space.PRUNE_RULES)
    assert space.STATUSES == ("kept", *(f"pruned:{r}" for r in space.RULE_NAMES))


# The plan -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_plan() -> pd.DataFrame:
    return space.plan(spec_from())


def test_every_candidate_stays_with_its_status(small_plan: pd.DataFrame) -> None:
    for column in ("model", "nodes", "gpus", "dp", "tp", "pp", "cp", "ep", "mbs", "grad_acc",
                   "zero_stage", "recompute", "sp", "pp_schedule", "vpp", "status",
                   "prune_rule", "run_id", "mem_total_bytes", "mem_weights_bytes"):
        assert column in small_plan.columns
    kept = small_plan.status == "kept"
    assert kept.any() and (~kept).any()
    pruned = small_plan[~kept]
    assert (pruned.status.astype(str) == "pruned:" + pruned.prune_rule.astype(str)).all()
    assert small_plan.loc[kept, "prune_rule"].isna().all()
    counts = small_plan.groupby(["nodes", "model"], observed=True).size().unstack("model")
    assert (counts.nunique(axis=1) == 1).all()  # every model sees the same candidates


def test_kept_rows_fit_the_gpu_or_are_probes_the_band_says_may_fit(
        small_plan: pd.DataFrame) -> None:
    budget = spec_from().gpu_spec.memory_bytes
    kept = small_plan[small_plan.status == "kept"]
    sure = kept[~kept.probe]
    assert (sure.mem_total_bytes <= budget).all()
    probes = kept[kept.probe]
    assert len(probes) and (probes.mem_total_bytes > budget).all()
    low, _ = reserved_interval(probes.mem_reserved_bytes.to_numpy(float),
                               fixed_bytes=probes.mem_overhead_bytes.to_numpy(float))
    assert (low <= budget).all()
    over = small_plan[small_plan.status == "pruned:memory"]
    low, _ = reserved_interval(over.mem_reserved_bytes.to_numpy(float),
                               fixed_bytes=over.mem_overhead_bytes.to_numpy(float))
    assert len(over) and (low > budget).all()
    assert not small_plan.loc[small_plan.status != "kept", "probe"].any()


def test_memory_probes_off_prunes_on_the_point_estimate() -> None:
    plan = space.plan(spec_from(SMALL + "constraints: {memory_probes: false}\n"))
    budget = spec_from().gpu_spec.memory_bytes
    assert not plan.probe.any()
    assert (plan.loc[plan.status == "kept", "mem_total_bytes"] <= budget).all()
    with_probes = space.plan(spec_from())
    assert (with_probes.status == "kept").sum() == \
        (plan.status == "kept").sum() + with_probes.probe.sum()


def test_the_specs_allocator_constants_decide_the_reserve_the_plan_prunes_on() -> None:
    """`constraints.allocator` (what `sweep memory-check --write-constants` fits on a cluster's
    own runs) replaces the fitted shares in every estimate the plan makes: with every share and
    the floor at zero the reserve beyond live tensors is nothing, so no more is pruned than with
    the fitted ones, and with larger shares no less."""
    def plan_with(constants: str) -> pd.DataFrame:
        return space.plan(spec_from(SMALL + f"constraints: {{allocator: {constants}}}\n"))

    shipped = space.plan(spec_from())
    none = plan_with("{sequential: 0, pipelined: 0, logits: 0, floor_mib: 0}")
    more = plan_with("{sequential: 0.5, pipelined: 1.0, logits: 1.0, floor_mib: 2048}")
    estimated = none.mem_total_bytes >= 0
    assert (none.loc[estimated, "mem_fragmentation_bytes"] == 0).all()
    assert (none.loc[estimated, "mem_reserved_bytes"]
            == none.loc[estimated, "mem_allocated_bytes"]).all()
    kept = {name: int((p.status == "kept").sum()) for name, p in
            (("none", none), ("shipped", shipped), ("more", more))}
    assert kept["none"] >= kept["shipped"] >= kept["more"] and kept["none"] > kept["more"]
    # the same candidates either way: only the memory verdicts move
    assert (none.status == "kept").sum() + (none.prune_rule == "memory").sum() == \
        (more.status == "kept").sum() + (more.prune_rule == "memory").sum()


def test_the_memory_rule_prunes_only_what_its_band_puts_over_the_limit() -> None:
    """Band −32 % .. +16 % of the prediction: a reserved peak predicted at 1.1 GiB may measure
    0.95 GiB (fits 1 GiB), one at 1.3 GiB no less than 1.125 GiB."""
    mem = {"mem_reserved_bytes": np.array([0.9, 1.1, 1.3]) * GiB,
           "mem_overhead_bytes": np.zeros(3)}
    mem["mem_total_bytes"] = mem["mem_reserved_bytes"]
    assert space.memory_over(mem, GiB).tolist() == [False, False, True]
    assert space.memory_over(mem, GiB, probes=False).tolist() == [False, True, True]
    with_overhead = {**mem, "mem_overhead_bytes": np.full(3, 0.1 * GiB),
                     "mem_total_bytes": mem["mem_reserved_bytes"] + 0.1 * GiB}
    assert space.memory_over(with_overhead, GiB).tolist() == [False, True, True]


def test_a_spec_that_measured_its_own_band_probes_by_it() -> None:
    """`constraints.allocator.band` (the left-out error of the spec's own constants) replaces the
    shipped band: a band that reaches no lower than the point estimate leaves nothing to probe,
    a wider one probes more, and the candidates the memory rule judges are the same."""
    constants = "{sequential: 0.2, pipelined: 0.5, logits: 0.25, floor_mib: 256"

    def plan_with(band: str) -> pd.DataFrame:
        return space.plan(spec_from(SMALL + f"constraints: {{allocator: {constants}{band}}}}}\n"))

    own_none = plan_with("")
    exact = plan_with(", band: [0.0, 0.0]")
    wide = plan_with(", band: [-0.6, 0.3]")
    assert not exact.probe.any()
    assert wide.probe.sum() > own_none.probe.sum() > 0
    judged = [int(((p.status == "kept") | (p.prune_rule == "memory")).sum())
              for p in (own_none, exact, wide)]
    assert judged[0] == judged[1] == judged[2]
    assert spec_from(SMALL + f"constraints: {{allocator: {constants}, band: [-0.6, 0.3]}}}}\n"
                     ).reserved_band == (-0.6, 0.3)


def test_run_ids_are_those_of_run_config(small_plan: pd.DataFrame) -> None:
    kept = small_plan[small_plan.status == "kept"]
    assert kept.run_id.notna().all() and kept.run_id.is_unique
    assert small_plan.loc[small_plan.status != "kept", "run_id"].isna().all()
    spec = spec_from()
    row = kept.iloc[len(kept) // 2]
    expected = RunConfig(
        sweep="small", framework="builtin", model=get_model(str(row.model)),
        layout=Layout(dp=int(row.dp), tp=int(row.tp), pp=int(row.pp), cp=int(row.cp),
                      ep=int(row.ep), mbs=int(row.mbs), grad_acc=int(row.grad_acc),
                      zero_stage=int(row.zero_stage), recompute=str(row.recompute),
                      sp=bool(row.sp), pp_schedule=str(row.pp_schedule), vpp=int(row.vpp)),
        nodes=int(row.nodes), gpus_per_node=8, gpu=spec.gpu, dtype="bf16", seq_len=4096,
        global_batch_sequences=64).run_id
    assert row.run_id == expected
    assert list(kept.run_id) == space.run_ids(spec, kept)  # one RunConfig per row


def test_fast_run_ids_fall_back_to_run_config_if_its_identity_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def changed(self: RunConfig) -> str:
        return f"{self.model.name}-{self.layout.dp}-{self.layout.tp}-{self.layout.mbs}"

    monkeypatch.setattr(RunConfig, "run_id", property(changed))
    spec = spec_from()
    columns = space.enumerate_candidates(spec, 1)
    ids = space.chunk_run_ids(spec, get_model("playbook-1b"), 1, columns)
    assert ids == [f"playbook-1b-{dp}-{tp}-{mbs}" for dp, tp, mbs in
                   zip(columns["dp"], columns["tp"], columns["mbs"])]


def test_an_impossible_node_count_is_a_plan_error() -> None:
    spec = spec_from(SMALL.replace("mbs: [1, 2, 4]", "mbs: [1]\n  tp: [16]\n  pp: [1]"))
    with pytest.raises(space.PlanError, match="nodes: 1 node"):
        space.plan(spec)


def test_a_global_batch_no_layout_meets_is_a_plan_error() -> None:
    spec = spec_from(SMALL.replace("mbs: [1, 2, 4]", "mbs: [2]\n  dp: [16]")
                     .replace("nodes: [1, 2]", "nodes: [2]").replace("64}", "8}"))
    with pytest.raises(space.PlanError, match="global_batch: 8 sequences"):
        space.plan(spec)


# Coverage of the published playbook sweep -------------------------------------------------------

def test_playbook_plan_contains_every_published_run(refdata: Path, repo_root: Path) -> None:
    """Every run of playbook_runs_1B_8B.csv is a candidate on the axes the playbook varied
    (nodes, dp, tp, pp, mbs, ZeRO stage; grad_acc follows from the global batch).

    20 published rows (9 successes) ran with dp·mbs·grad_acc ≠ 256 sequences (16 to 4,096;
    the refdata README says 26, which these 1B/8B files do not bear out): the sweep's global
    batch was not held for them, and the playbook published them as they ran. The plan holds
    each of those layouts at grad_acc = 256 / (dp·mbs); for every other row grad_acc matches.
    """
    from sweep.plan.spec import load_spec

    runs = pd.read_csv(refdata / "playbook_runs_1B_8B.csv")
    runs["model"] = runs.model_label.map({"1B": "playbook-1b", "8B": "playbook-8b"})
    # With one replica (dp = 1) ZeRO-1 shards nothing: the playbook ran it as a separate
    # configuration, the plan holds it once, as ZeRO-0.
    runs["zero_stage"] = runs.zero_stage.where(runs.dp > 1, 0)
    planned = space.plan(load_spec(repo_root / "examples" / "playbook.yaml"))
    planned = planned.astype({"model": str})
    keys = ["model", "nodes", "dp", "tp", "pp", "mbs", "zero_stage"]
    merged = runs.merge(planned[keys + ["grad_acc", "status"]], on=keys, how="left",
                        suffixes=("", "_plan"), validate="many_to_one")
    assert merged.grad_acc_plan.notna().all(), merged[merged.grad_acc_plan.isna()][keys]
    other_batch = runs.dp * runs.mbs * runs.grad_acc != 256
    assert other_batch.sum() == 20
    assert (merged.grad_acc[~other_batch] == merged.grad_acc_plan[~other_batch]).all()
    assert (merged.grad_acc_plan * runs.dp * runs.mbs == 256).all()


def test_a_space_too_large_to_hold_is_refused_before_it_is_built() -> None:
    # 2^23 GPUs: 17,550 factorisations × 11 mbs × 4 ZeRO × 3 recompute × 2 sp × 3 schedules
    spec = spec_from(SMALL.replace("nodes: [1, 2]", "nodes: [1048576]")
                     .replace("mbs: [1, 2, 4]", "mbs: auto\n  cp: auto\n  ep: auto")
                     .replace("zero_stage: [0, 1]", "zero_stage: [0, 1, 2, 3]\n"
                              "  recompute: [none, selective, full]")
                     .replace("[1f1b, interleaved_1f1b]", "[1f1b, gpipe, interleaved_1f1b]")
                     .replace("64}", "65536}\nconstraints: {max_mbs: 1024}"))
    with pytest.raises(space.PlanError, match=r"axes: 1048576 node\(s\) would give"):
        space.enumerate_candidates(spec, 1048576)


# Published layouts ----------------------------------------------------------------------------

def gpt_shape(row: pd.Series) -> ModelShape:
    """Megatron's GPT shapes of the published tables: MHA, 4h FFN, untied (vocab as given)."""
    h, heads = int(row.hidden_size), int(row.attention_heads)
    return ModelShape(name=str(row.model_size_label), num_layers=int(row.num_layers),
                      hidden_size=h, num_attention_heads=heads, num_kv_heads=heads,
                      ffn_hidden_size=4 * h, vocab_size=int(row.vocab_size),
                      tie_word_embeddings=False)


def structural_verdict(model: ModelShape, seq_len: int, gbs: int, **layout: object) -> str:
    ctx = context(model, framework="megatron", seq_len=seq_len, global_batch_sequences=gbs)
    code, _ = space.evaluate(candidate(**layout), ctx, skip=frozenset({"memory"}))
    return space.KEPT if code[0] < 0 else space.RULE_NAMES[code[0]]


def test_published_megatron_layouts_pass_every_structural_rule(refdata: Path) -> None:
    table = pd.read_csv(refdata / "megatron_narayanan2021_table1.csv")
    for _, row in table.iterrows():
        per_virtual = [int(f) for f in str(row.extra_flags_in_repro_script).split()
                       if f.isdigit()]
        pp, dp, mbs = int(row.pipeline_parallel), int(row.data_parallel_derived), \
            int(row.micro_batch_size)
        vpp = row.num_layers // (pp * per_virtual[0]) if per_virtual else 1
        layout = dict(dp=dp, tp=int(row.tensor_parallel), pp=pp, mbs=mbs, vpp=vpp,
                      grad_acc=int(row.global_batch_size) // (dp * mbs), recompute="full",
                      pp_schedule="interleaved_1f1b" if vpp > 1 else "1f1b")
        verdict = structural_verdict(gpt_shape(row), int(row.seq_len),
                                     int(row.global_batch_size), **layout)
        assert verdict == "kept", row.model_size_label
    core = pd.read_csv(refdata / "megatron_core_h100_weak_scaling.csv")
    for _, row in core.iterrows():
        dp = int(row.data_parallel)
        layout = dict(dp=dp, tp=int(row.tensor_parallel), pp=int(row.pipeline_parallel),
                      grad_acc=int(row.global_batch_size) // dp)
        assert structural_verdict(gpt_shape(row), int(row.seq_len), int(row.global_batch_size),
                                  **layout) == "kept", row.model_size_label


def test_llama3_405b_layouts_pass_every_structural_rule(refdata: Path) -> None:
    table = pd.read_csv(refdata / "llama3_table4_405b_parallelism.csv")
    model = get_model("llama-3.1-405b")  # 126 layers over 16 stages: embedding and loss count
    for _, row in table.iterrows():
        dp = int(row.dp_implied_by_gpus)
        gbs = dp * int(row.batch_size_per_dp)
        layout = dict(dp=dp, tp=int(row.tp), cp=int(row.cp), pp=int(row.pp),
                      grad_acc=int(row.batch_size_per_dp))
        assert structural_verdict(model, int(row.seq_len), gbs, **layout) == "kept", row.stage_row


def test_zero_stages_of_a_single_replica_are_one_run() -> None:
    """dp·ep·cp = 1 leaves ZeRO nothing to shard: four stages would be four identical runs."""
    columns = space.enumerate_candidates(spec_from(SMALL.replace(
        "zero_stage: [0, 1]", "zero_stage: [0, 1, 2, 3]")), 1)
    single = columns["dp"] * columns["ep"] * columns["cp"] == 1
    assert single.any() and (~single).any()
    assert set(columns["zero_stage"][single].tolist()) == {0}
    assert set(columns["zero_stage"][~single].tolist()) == {0, 1, 2, 3}


# The memory profile of the framework's version ------------------------------------------------

TITAN = """
name: titan
framework: torchtitan
gpu: h100-sxm
gpus_per_node: 8
models: [llama-3.1-8b]
nodes: [1]
seq_len: 8192
global_batch: {sequences: 64}
axes:
  tp: [1]
  pp: [1]
  mbs: [1, 2, 4, 8]
  zero_stage: [3]
  recompute: [full]
run: {framework_version: VERSION}
constraints: {memory_probes: false}
"""


def test_a_torchtitan_plan_estimates_memory_with_the_profile_of_the_version_it_renders_for() -> None:
    """0.3's chunked loss holds one eighth of the logits: at seq 8192 an 8B model's micro-batch
    of 4 sequences fits an H100 for torchtitan 0.3 and not for 0.2, whose whole fp32 logits
    (40 GiB) do not; each plan's figures are its version's profile's, nothing else changes."""
    from sweep.core.layout import LAYOUT_COLUMNS
    from sweep.models.memory import estimate_columns
    from sweep.models.memory_profiles import profile_for

    plans = {v: space.plan(spec_from(TITAN, VERSION=v)) for v in ("v0.2", "v0.3")}
    for version, plan in plans.items():
        estimated = plan[plan.mem_total_bytes >= 0]
        assert len(estimated) == len(plan)
        columns = {k: estimated[k].to_numpy() for k in LAYOUT_COLUMNS}
        expected = estimate_columns(get_model("llama-3.1-8b"), columns, seq_len=8192,
                                    profile=profile_for("torchtitan", version))
        assert (estimated.mem_total_bytes.to_numpy() == expected["mem_total_bytes"]).all(), version
    kept = {v: set(p.loc[p.status == "kept", "mbs"]) for v, p in plans.items()}
    assert kept["v0.2"] < kept["v0.3"] and 4 in kept["v0.3"] - kept["v0.2"]
    assert (plans["v0.2"].loc[plans["v0.2"].mbs == 4, "status"] == "pruned:memory").all()
