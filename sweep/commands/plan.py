"""`sweep plan SPEC [--out DIR] [--explain RUN_ID]`: enumerate, prune, write plan.parquet.

Writes DIR/plan.parquet (every candidate with its status) and DIR/spec.yaml (the spec as
planned, headed by its hash); DIR defaults to results/<spec name>/. Nothing is written when the
spec is invalid or no plan can be made. `--explain RUN_ID` prints the memory breakdown of one
kept configuration and writes nothing.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from sweep import memory, space
from sweep.cli import UserError
from sweep.spec import Spec, load_spec
from sweep.state import atomic_write_text

PLAN_FILE = "plan.parquet"
SPEC_COPY = "spec.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", type=Path, help="the sweep spec (YAML)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the sweep directory (default: results/<spec name>/)")
    parser.add_argument("--explain", metavar="RUN_ID", default=None,
                        help="print the memory breakdown of this kept configuration; "
                             "writes nothing")


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    try:
        frame = space.plan(spec)
    except space.PlanError as error:
        raise UserError(f"{args.spec}: {error}") from None
    console = Console()
    if not console.is_terminal:  # a pipe or a log file: do not squeeze the table into 80 columns
        console = Console(width=max(console.width, 160))
    if args.explain is not None:
        console.print(explain(spec, frame, args.explain), highlight=False)
        return 0
    out = args.out if args.out is not None else Path("results") / spec.name
    write_plan(out, spec, args.spec, frame)
    console.print(summary_table(frame))
    kept = int((frame["status"] == space.KEPT).sum())
    console.print(f"{len(frame)} candidates, {kept} kept → {out / PLAN_FILE}", highlight=False,
                  soft_wrap=True)
    for warning in unmatched_overrides(spec, frame):
        console.print(f"[yellow]warning:[/] {warning}")
    return 0


def write_plan(out: Path, spec: Spec, spec_path: Path, frame: pd.DataFrame) -> None:
    """plan.parquet and spec.yaml, each written whole or not at all."""
    previous = planned_hash(out / SPEC_COPY)
    if previous not in (None, spec.spec_hash()) and (out / "runs").exists():
        raise UserError(f"{out} holds runs of another spec (hash {previous}); give --out a new "
                        "directory, or remove the old sweep first")
    out.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{PLAN_FILE}.", suffix=".tmp", dir=out)
    os.close(fd)
    try:
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, out / PLAN_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    header = (f"# spec_hash: {spec.spec_hash()}\n"
              f"# planned by `sweep plan` from {spec_path}; the text below is that file's\n")
    atomic_write_text(out / SPEC_COPY, header + spec_path.read_text(encoding="utf-8"))


def planned_hash(path: Path) -> str | None:
    """The spec hash in the header of a sweep folder's spec.yaml (None: not planned)."""
    try:
        first = path.read_text(encoding="utf-8").splitlines()[0]
    except (OSError, IndexError):
        return None
    return first.removeprefix("# spec_hash: ").strip() if first.startswith("# spec_hash:") else None


def summary_table(frame: pd.DataFrame) -> Table:
    """One row per (model, nodes): candidates, kept, and how many each rule pruned."""
    counts = (frame.groupby(["model", "nodes", "status"], observed=True).size()
              .unstack("status", fill_value=0))
    rules = [r for r in space.RULE_NAMES if f"pruned:{r}" in counts.columns]
    table = Table(title="sweep plan: candidates per (model, nodes)")
    for name in ("model", "nodes", "candidates", "kept", *rules):
        table.add_column(name, justify="left" if name == "model" else "right", no_wrap=True)
    for (model, nodes), row in counts.iterrows():
        kept = int(row.get(space.KEPT, 0))
        table.add_row(str(model), str(nodes), str(int(row.sum())), str(kept),
                      *(str(int(row.get(f"pruned:{r}", 0))) for r in rules))
    return table


def explain(spec: Spec, frame: pd.DataFrame, run_id: str) -> str:
    """The memory breakdown of one kept run, with its layout and the GPU's budget."""
    match = frame[frame["run_id"] == run_id]
    if match.empty:
        example = frame["run_id"].dropna().head(1).tolist()
        hint = f" (e.g. {example[0]})" if example else ""
        raise UserError(f"--explain: no kept configuration has run id {run_id!r}; pick one "
                        f"from the run_id column of {PLAN_FILE}{hint}")
    row = match.iloc[0]
    layout = space.layout_of(row)
    model = next(m for m in spec.model_shapes if m.name == str(row["model"]))
    estimate = memory.estimate(model, layout, seq_len=spec.seq_len, dtype=spec.dtype,
                               profile=spec.framework)
    budget = space.RuleContext.from_spec(spec, model).memory_budget_bytes
    lines = [f"{run_id}: {model.name} on {int(row['nodes'])} node(s), {layout.label()}",
             f"framework profile: {spec.framework}, seq {spec.seq_len}, {spec.dtype}", "",
             estimate.explain()]
    if budget is not None:
        lines.append(f"budget: {budget / 2**30:.2f} GiB ({spec.gpu}, headroom "
                     f"{spec.constraints.memory_headroom:.0%}) → fits with "
                     f"{(budget - estimate.total_bytes) / 2**30:.2f} GiB to spare")
    return "\n".join(lines)


def unmatched_overrides(spec: Spec, frame: pd.DataFrame) -> list[str]:
    """Overrides whose `where` selects no kept run: most likely a typo in the spec."""
    kept = frame[frame["status"] == space.KEPT]
    warnings = []
    for index, override in enumerate(spec.overrides):
        mask = pd.Series(True, index=kept.index)
        for column, wanted in override.where.items():
            mask &= kept[column].astype(str) == str(wanted)
        if not mask.any():
            warnings.append(f"overrides[{index}].where {override.where} matches no kept run")
    return warnings
