"""A table of runs to fit the throughput model on or replay: runs.parquet or a published CSV.

`sweep calibrate` fits on one, `sweep plan --calibrate-from` calibrates on the sweep's own, and
`sweep replay` replays one. Reading it (with errors that name the file) and taking from it the
completed runs of each of a spec's models, less what the fit leaves out, is one job shared by
those commands, so it lives here rather than in one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from sweep.calibrate import model_names_for, without_fit_exclusions, workloads_for
from sweep.errors import UserError
from sweep.replay_tables import normalise_runs
from sweep.spec import Spec
from sweep.throughput import Workload


def read_runs_frame(path: Path) -> pd.DataFrame:
    """A runs table from parquet or CSV, or a UserError that names the file."""
    if not path.is_file():
        raise UserError(f"{path}: no such file; give runs.parquet or a runs CSV")
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path, comment=None)
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: cannot read it as {path.suffix.lstrip('.') or 'CSV'}: "
                        f"{error}") from None


def completed_groups(path: Path, spec: Spec, on_left_out: Callable[[str], None] | None = None
                     ) -> list[tuple[str, pd.DataFrame, Workload]]:
    """(model name, completed runs, workload) per spec model that has runs in the table.
    `on_left_out` is told, one line per reason, how many runs the fit leaves out
    (`sweep.calibrate.without_fit_exclusions`), as soon as they are counted."""
    workloads = workloads_for(spec)
    table = read_runs_frame(path)
    table, left_out = without_fit_exclusions(table)  # the charts table flags neither
    for reason, count in left_out.items():
        if on_left_out is not None:
            on_left_out(f"left out {count} {reason}")
    try:
        rows = normalise_runs(table, str(path), workloads)
    except ValueError as error:
        raise UserError(str(error)) from None
    names = model_names_for(spec, sorted(set(rows.model.astype(str))))
    if not names:
        raise UserError(f"{path}: none of its models ({', '.join(sorted(set(rows.model)))}) is "
                        f"a model of {spec.name}; list them under `models:` in the spec")
    rows = rows.assign(model=rows.model.astype(str).map(names))
    rows = rows[rows.model.notna() & (rows.status == "completed")
                & (rows.tokens_per_s_per_gpu > 0)]
    return [(name, group, workloads[name]) for name, group in rows.groupby("model")]
