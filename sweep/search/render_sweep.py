"""A spec's sweep folder made ready to run: its plan, and a run folder for every kept run.

The plan comes from a given plan.parquet, else from the sweep folder's own when `sweep plan` wrote
it for this very spec (spec.yaml carries the spec hash), else the spec is planned now and the plan
written as `sweep plan` would, so that a sweep folder always holds the plan its runs came from.
`sweep render`, `sweep run` and `sweep submit SPEC` all start with this step; `sweep.plan.render`
renders the run folders of a plan it is given (templates, run.json, job.sbatch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sweep.core.errors import UserError
from sweep.plan.spec import Spec


@dataclass(frozen=True)
class Rendered:
    spec: Spec
    out: Path  # the sweep folder
    plan: pd.DataFrame
    run_dirs: list[Path]  # one per kept plan row, in plan order
    plan_source: str  # where the plan came from, for messages

    @property
    def counts(self) -> str:
        """'N run(s)', and how many of them are memory probes (`sweep.plan.space.memory_over`)."""
        probes = int(self.plan["probe"].sum()) if "probe" in self.plan else 0
        return f"{len(self.run_dirs)} run(s)" + (
            f" ({probes} memory probe(s): kept because the memory band reaches under the "
            "limit; each run decides)" if probes else "")


def sweep_dir_of(spec_path: Path, out: Path | None = None) -> Path:
    """The sweep folder a spec is rendered into (`sweep render`/`sweep submit SPEC`, and
    `sweep status SPEC`): `out`, else results/<the spec's name>."""
    from sweep.plan.spec import load_spec

    return out or Path("results") / load_spec(spec_path).name


def render_sweep(spec_path: Path, out: Path | None = None, plan_file: Path | None = None
                 ) -> Rendered:
    """Plan (or reuse the sweep folder's current plan) and render every kept run."""
    from sweep.calibration.throughput_coefficients import sweep_coefficients
    from sweep.plan import space
    from sweep.plan.plan_file import PLAN_FILE, SPEC_COPY, planned_hash, write_plan
    from sweep.plan.predictions import with_predictions
    from sweep.plan.render import render_runs
    from sweep.plan.spec import load_spec

    spec = load_spec(spec_path)
    out = out or Path("results") / spec.name
    if plan_file is None and planned_hash(out / SPEC_COPY) == spec.spec_hash() \
            and (out / PLAN_FILE).is_file():
        plan_file = out / PLAN_FILE
    if plan_file is not None:
        try:
            plan = pd.read_parquet(plan_file)
        except (OSError, ValueError) as error:
            raise UserError(f"--plan: cannot read {plan_file}: {error}") from None
    else:
        try:
            plan = space.plan(spec)
        except space.PlanError as error:
            raise UserError(f"{spec_path}: {error}") from None
        # as `sweep plan` writes it: with the predictions (and pred_rank) of the sweep's
        # coefficients, the order the shortlist runs in
        plan = with_predictions(plan, spec, sweep_coefficients(out, spec))
        write_plan(out, spec, spec_path, plan)
    run_dirs = render_runs(spec, plan, out, spec_dir=spec_path.resolve().parent)
    source = f"plan {plan_file}" if plan_file else f"a new plan ({out / PLAN_FILE})"
    return Rendered(spec, out, plan, run_dirs, source)
