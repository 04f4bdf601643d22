"""References files: a good sweep's figures, kept as the baseline of `sweep compare`.

One row per configuration (the columns of analysis.compare.MATCH_KEY: the cell, the work per
step and the layout; cp, ep, recompute, sp, pp_schedule and vpp may be left empty, as runs tables
that do not record them leave them) or per cell (`model` and `nodes` only: the cell's best configuration), each
with a metric, its reference value and relative tolerances in the ReFrame convention: the value
may range over [value·(1+lower), value·(1+upper)], `lower` ≤ 0 ≤ `upper`, null (an empty CSV
field) = unbounded on that side. `std` and `n` (the steps' sample standard deviation and count)
are optional; with them, and the metric `step_time_mean_s`, the comparison also runs Welch's
t-test. The file is YAML (a `references:` list of mappings) or CSV (one header row), chosen by
its suffix; docs/compare.md shows both.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Final

import pandas as pd
import yaml

from analysis.compare import (
    EXPECTED_COLUMNS,
    HIGHER_IS_BETTER,
    MATCH_KEY,
    STEP_TIME,
    expected_from_runs,
)
from sweep.core.errors import UserError
from sweep.core.layout import CELL, LAYOUT_INT_COLUMNS, PLAYBOOK_LAYOUT_COLUMNS

FORMAT_VERSION: Final = 1
SUFFIXES: Final = (".yaml", ".yml", ".csv")
FILE_COLUMNS: Final = (*MATCH_KEY, "run_id", "layout_label", "metric", "value", "lower", "upper",
                       "std", "n")
_RUN_ONLY: Final = tuple(c for c in MATCH_KEY if c not in CELL)
# What a configuration's reference must give; the other layout columns may be null, as in runs
# tables that do not record them (the playbook's), and then match a null.
_RUN_REQUIRED: Final = ("seq_len", "global_batch_sequences", *PLAYBOOK_LAYOUT_COLUMNS)
_INTEGERS: Final = ("nodes", "seq_len", "global_batch_sequences", *LAYOUT_INT_COLUMNS)
_FIX: Final = "see docs/compare.md, \"References files\""


def is_references_file(path: Path) -> bool:
    """Whether `path` names a references file (by its suffix, so a missing one is said so)."""
    return path.suffix.lower() in SUFFIXES


def write_references(runs: pd.DataFrame, path: Path, tolerance: float | None = None,
                     source: str = "") -> int:
    """Write the completed configurations of `runs` (each one's latest completed attempt) as a
    references file at `path`, YAML or CSV by its suffix; the number of rows written."""
    _check_suffix(path)
    expected = expected_from_runs(runs, tolerance)
    rows = expected[expected["value"].notna()][list(FILE_COLUMNS)]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".csv":
        rows.to_csv(path, index=False)
    else:
        records = [{k: _plain(v) for k, v in record.items()} for record in rows.to_dict("records")]
        header = (f"# llm-sweep references (sweep compare BASELINE CURRENT), from {source}\n"
                  if source else "")
        path.write_text(header + yaml.safe_dump({"version": FORMAT_VERSION, "references": records},
                                                sort_keys=False), encoding="utf-8")
    return len(rows)


def read_references(path: Path) -> pd.DataFrame:
    """A references file as expectations (analysis.compare.EXPECTED_COLUMNS); a UserError that
    names the file, the row, the field and the fix when it is malformed."""
    _check_suffix(path)
    if path.suffix.lower() == ".csv":
        try:
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        except (OSError, ValueError) as error:
            raise UserError(f"{path}: not a readable CSV references file ({error}); {_FIX}") from None
        records = [{k: (None if v == "" else v) for k, v in r.items()}
                   for r in frame.to_dict("records")]
        where = [f"row {i + 2}" for i in range(len(records))]  # line 1 is the header
    else:
        records = _yaml_records(path)
        where = [f"references[{i}]" for i in range(len(records))]
    if not records:
        raise UserError(f"{path}: no references in the file; write one with "
                        "`sweep compare --write-references FILE RUNS`")
    rows = [_validated(path, place, record) for place, record in zip(where, records)]
    return pd.DataFrame(rows, columns=list(EXPECTED_COLUMNS))


def _check_suffix(path: Path) -> None:
    if path.suffix.lower() not in SUFFIXES:
        raise UserError(f"{path}: a references file is YAML or CSV; name it *.yaml or *.csv")


def _yaml_records(path: Path) -> list[Any]:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise UserError(f"{path}: not a readable YAML references file ({error}); {_FIX}") from None
    records = document.get("references") if isinstance(document, dict) else None
    if not isinstance(records, list):
        raise UserError(f"{path}: field `references`: expected a list of references (mappings); "
                        f"{_FIX}")
    return records


def _validated(path: Path, place: str, record: Any) -> dict[str, Any]:
    """One reference as an expectation row, or the UserError that says what is wrong."""
    def fail(field: str, problem: str) -> UserError:
        return UserError(f"{path}: {place}, field `{field}`: {problem}; {_FIX}")

    if not isinstance(record, dict):
        raise fail("references", "expected a mapping of fields to values")
    unknown = sorted(set(record) - set(FILE_COLUMNS))
    if unknown:
        raise fail(unknown[0], f"not a field of a reference (the fields: {', '.join(FILE_COLUMNS)})")
    row: dict[str, Any] = {c: record.get(c) for c in FILE_COLUMNS}
    for field in CELL:
        if row[field] in (None, ""):
            raise fail(field, "missing: every reference names its model and node count")
    given = [c for c in _RUN_ONLY if row[c] not in (None, "")]
    absent = [c for c in _RUN_REQUIRED if c not in given]
    if given and absent:
        raise fail(absent[0], "missing: a configuration's reference gives every one of "
                   f"{', '.join(_RUN_REQUIRED)} (a cell's reference gives none of the layout)")
    for field in _INTEGERS:
        if row.get(field) not in (None, ""):
            row[field] = _integer(row[field], lambda problem, f=field: fail(f, problem))
    if row["sp"] not in (None, ""):
        row["sp"] = _boolean(row["sp"], lambda problem: fail("sp", problem))
    metric = row["metric"] or STEP_TIME
    if metric not in HIGHER_IS_BETTER:
        raise fail("metric", f"{metric!r} is not one of {', '.join(HIGHER_IS_BETTER)}")
    value = _number(row["value"], lambda problem: fail("value", problem), required=True)
    if value is None or value <= 0:
        raise fail("value", f"{value} is not a positive {metric}")
    lower = _number(row["lower"], lambda problem: fail("lower", problem))
    upper = _number(row["upper"], lambda problem: fail("upper", problem))
    if lower is not None and lower > 0:
        raise fail("lower", f"{lower} is above 0: a relative lower tolerance is ≤ 0 (e.g. -0.05) "
                   "or null for unbounded")
    if upper is not None and upper < 0:
        raise fail("upper", f"{upper} is below 0: a relative upper tolerance is ≥ 0 (e.g. 0.05) "
                   "or null for unbounded")
    std = _number(row["std"], lambda problem: fail("std", problem))
    n = _number(row["n"], lambda problem: fail("n", problem))
    if (std is None) != (n is None):
        raise fail("std" if std is None else "n", "give both `std` and `n` (the steps' spread and "
                   "count) or neither")
    return {"level": "run" if given else "cell", **{c: row[c] for c in MATCH_KEY},
            "run_id": row["run_id"], "layout_label": row["layout_label"], "attempt": None,
            "outcome": "completed", "metric": metric, "value": value,
            "lower": math.nan if lower is None else lower,
            "upper": math.nan if upper is None else upper,
            "std": math.nan if std is None else std, "n": math.nan if n is None else n}


def _number(value: Any, fail: Any, required: bool = False) -> float | None:
    if value in (None, "", "null"):
        if required:
            raise fail("missing: a reference needs its value")
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise fail(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise fail(f"{value!r} is not a finite number")
    return number


def _integer(value: Any, fail: Any) -> int:
    number = _number(value, fail)
    if number is None or number != int(number):
        raise fail(f"{value!r} is not a whole number")
    return int(number)


def _boolean(value: Any, fail: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    raise fail(f"{value!r} is not true or false")


def _plain(value: Any) -> Any:
    """A value YAML can write: numpy scalars as Python ones, NaN as null."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if hasattr(value, "item"):
        value = value.item()
        return None if isinstance(value, float) and math.isnan(value) else value
    if value is pd.NA:
        return None
    return value
