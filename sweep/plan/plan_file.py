"""The plan `sweep plan` leaves in a sweep folder, and what the rest of a sweep reads back from it.

A planned sweep folder holds plan.parquet (every candidate with its status) and spec.yaml (the
spec as planned, headed by its hash). `sweep plan` and `sweep render` write them; render, submit,
resume, the search driver and the round-by-round re-plan read them, and the spec copy is where
a sweep folder's GPU-hour cap and driver settings come from once the spec file itself is gone
or edited. Kept out of the commands so that none of those readers imports a command.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final

from sweep.core.errors import UserError
from sweep.core.state import atomic_write_text, atomic_write_with

if TYPE_CHECKING:
    import pandas as pd

    from sweep.plan.spec import DriverSettings, Spec

PLAN_FILE: Final = "plan.parquet"
SPEC_COPY: Final = "spec.yaml"


def write_plan(out: Path, spec: Spec, spec_path: Path, frame: pd.DataFrame) -> None:
    """plan.parquet and spec.yaml, each written whole or not at all."""
    previous = planned_hash(out / SPEC_COPY)
    if previous not in (None, spec.spec_hash()) and (out / "runs").exists():
        raise UserError(f"{out} holds runs of another spec (hash {previous}); give --out a new "
                        "directory, or remove the old sweep first")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_with(out / PLAN_FILE, lambda tmp: frame.to_parquet(tmp, index=False))
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


def planned_spec(folder: Path) -> Spec | None:
    """The spec the sweep was planned from (its spec.yaml copy); None for a hand-made folder."""
    from sweep.plan.spec import SpecError, load_spec

    if not (folder / SPEC_COPY).is_file():
        return None
    try:
        return load_spec(folder / SPEC_COPY)
    except SpecError as error:
        raise UserError(str(error)) from None


def budget_cap(folder: Path, given: float | None) -> float | None:
    """The sweep's GPU-hour cap: the one given (--max-gpu-hours), else the spec's max_gpu_hours
    (from the sweep's spec.yaml), else none."""
    if given is not None:
        return given
    spec = planned_spec(folder)
    return spec.max_gpu_hours if spec is not None else None


def driver_settings(folder: Path) -> DriverSettings:
    """The Slurm settings of the sweep's driver and report jobs: the planned spec's `driver:`,
    else the defaults."""
    from sweep.plan.spec import DriverSettings

    spec = planned_spec(folder)
    return spec.driver if spec is not None else DriverSettings()
