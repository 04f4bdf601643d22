"""nanotron's pipeline placement, checked against what really ran: a layout whose cost-balanced
split leaves a stage without a block is pruned (pp_layers), and the playbook's runs say why."""

from __future__ import annotations

from pathlib import Path

from sweep.frameworks.nanotron import pipeline_fits
from sweep.models.pipeline_stages import stage_block_counts
from sweep.plan.spec import load_spec
from sweep.validation import memory_check

PLAYBOOK_SPEC = Path(__file__).resolve().parents[3] / "examples" / "playbook.yaml"


def test_the_rule_prunes_exactly_the_layouts_with_an_empty_stage() -> None:
    spec = load_spec(PLAYBOOK_SPEC)
    for model in spec.model_shapes:
        for stages in (1, 2, 4, 8, 16, 32, 64):
            empty = min(stage_block_counts(model, stages, "nanotron")) == 0
            assert pipeline_fits(model, stages) == (not empty), (model.name, stages)


def test_layouts_with_an_empty_stage_almost_never_ran(refdata: Path) -> None:
    """The evidence the rule stands on (it is not a proof: nanotron's assignment loop does not
    refuse an empty rank): of the 124 playbook runs with one, one completed."""
    spec = load_spec(PLAYBOOK_SPEC)
    runs = memory_check.read_memory_runs(refdata / "playbook_bench_full_1B_8B.csv", spec).frame
    shapes = {model.name: model for model in spec.model_shapes}
    unfit = [not pipeline_fits(shapes[m], int(p)) for m, p in zip(runs["model"], runs["pp"],
                                                                  strict=True)]
    outcomes = runs.loc[unfit, "outcome"].value_counts().to_dict()
    assert outcomes == {"other": 117, "oom": 6, "success": 1}, outcomes
    fitting = runs.loc[[not u for u in unfit], "outcome"]
    assert (fitting == "success").mean() > 0.6  # the layouts the rule keeps mostly ran
