"""`sweep memory-check RUNS --spec SPEC [--cv model] [--json] [--write-constants FILE]`: score the
memory model and the prune rules, and fit the allocator constants on a cluster's own runs.

Reads any runs format of `sweep.validation.memory_check` (the playbook's two CSV tables, a sweep's own
runs.parquet), judges every run as the planner would, and
prints the fields of `sweep.validation.memory_check.FIELDS`; `--json` emits them as one JSON object, with
null where the file's format cannot give a field.

`--cv model` (leave one model out): for each model of the file in turn, refits the allocator
constants (`sweep.validation.memory_fit.fit_basis`, the fit that wrote sweep/models/fitted_memory.py, on its grid and
objective, with the published llm-foundry configurations as a constraint when the reference data
has them) on the other models' runs only, and scores the model left out with them. It prints the
fields of `sweep.validation.memory_check.FIELDS` in-sample (the spec's constants) beside cross-validated, pooled
over every model (each run scored by the fold that left it out, against the issue's targets,
`sweep.validation.memory_fit.TARGETS`) and per fold; the band of the held-out error; and, for each published table
of `sweep.validation.memory_reference.PUBLISHED` in the reference data (configurations that ran, with no memory measured),
the share predicted to fit under the in-sample constants, each fold's, and constants fitted on
this runs file alone (without the llm-foundry constraint: that table held out too).

`--write-constants FILE`: fits the constants on this runs file alone (as that last column) and
writes them as the `constraints.allocator` line of a spec, headed by comments that give the runs'
sha256, the fit and its in-sample figures: a cluster's own constants, for its next sweep to plan
with (`Spec.memory_profile`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from datetime import date
from pathlib import Path
from typing import Final

from sweep.core.errors import UserError
from sweep.core.state import atomic_write_text, file_sha256
from sweep.core.units import MiB
from sweep.models.memory_profiles import Allocator
from sweep.plan.spec import Spec, load_spec
from sweep.validation import bloom_reference, memory_check, memory_fit, memory_reference
from sweep.validation.refdata import refdata_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, help="a runs file: the playbook charts' table, "
                                                "nanotron's full results table (CSV), or a "
                                                "sweep's runs.parquet")
    parser.add_argument("--spec", type=Path, required=True,
                        help="the spec whose models, hardware and rules judge the runs")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--cv", choices=("model",), default=None,
                        help="leave one model out: refit the allocator constants on the other "
                             "models' runs and score the model left out, for each model")
    parser.add_argument("--write-constants", type=Path, default=None, metavar="FILE",
                        help="fit the allocator constants on these runs alone and write them, "
                             "with where they came from, as the `constraints.allocator` lines "
                             "of a spec (YAML), for the next sweep on this cluster to plan with")


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    try:
        runs = memory_check.read_memory_runs(args.runs, spec)
    except memory_check.RunsFileError as error:
        raise UserError(str(error)) from None
    models = sorted(map(str, runs.frame["model"].unique()))
    if args.cv == "model" and len(models) < 2:  # refused before anything is fitted or written
        raise UserError(f"{args.runs}: --cv model leaves one model out at a time and needs runs "
                        f"of two models or more; these are all of {', '.join(models) or 'none'}"
                        + ("; without --cv model, --write-constants writes constants with no band "
                           "of their own" if args.write_constants is not None else ""))
    alone, alone_cv = (_write_constants(args, runs, spec) if args.write_constants is not None
                       else (None, None))
    if args.cv == "model":
        return _cross_validate(args, runs, spec, alone, alone_cv)
    judged = memory_check.judge(runs, spec)
    result = memory_check.score_judged(judged, runs.format, runs.n_skipped).to_dict()
    by_version = memory_check.score_by_version(judged, runs.format)
    if args.json:
        if by_version:
            result["by_framework_version"] = {v: c.to_dict() for v, c in by_version.items()}
        print(json.dumps(result))
        return 0
    print(f"{args.runs} ({runs.format} format) against {args.spec} ({spec.framework}):")
    for name in memory_check.FIELDS:
        print(f"  {name:<28} {_show(result[name])}")
    if by_version:
        print("by framework version (the runs span several: the allocator's reserve may differ "
              "between them)")
        print(f"  {'version':<28} {'successes':>10} {'kept':>8} {'OOMs pruned':>12} "
              f"{'reserved median / p90 error':>28}")
        for version, check in by_version.items():
            errors = f"{_cell(check.reserved_median_abs_rel_err)} / " \
                     f"{_cell(check.reserved_p90_abs_rel_err)}"
            print(f"  {version:<28} {check.n_success:>10} {_cell(check.success_kept_frac):>8} "
                  f"{_cell(check.oom_pruned_frac):>12} {errors:>28}")
    return 0


def _cross_validate(args: argparse.Namespace, runs: memory_check.Runs, spec: Spec,
                    alone_fit: memory_fit.AllocatorFit | None = None,
                    alone_cv: memory_fit.CrossValidation | None = None) -> int:
    """`alone_fit`, `alone_cv`: the constants fitted on this table alone and their folds, if
    `--write-constants` fitted them (without published data to constrain the folds, they are
    these folds: not fitted twice)."""
    published = memory_reference.published_bases(refdata_dir())
    must_fit = published.get(memory_reference.LLMFOUNDRY_FILE)
    try:
        cv = alone_cv if must_fit is None and alone_cv is not None else \
            memory_fit.cross_validate(runs, spec, must_fit=must_fit)
        # the published configurations held out too: constants fitted on this table alone
        alone_fit = alone_fit or memory_fit.fit_allocator(runs, spec)
        alone = alone_fit.allocator
    except ValueError as error:
        raise UserError(f"{args.runs}: {error}") from None
    columns = {"in-sample": cv.in_sample_allocator,
               **{f"without {fold.held_out}": fold.allocator for fold in cv.folds},
               "this table alone": alone}
    published_fit = {name: {column: memory_reference.published_fit_frac(b, a) for column, a in columns.items()}
                     for name, b in published.items()}
    bloom_file = refdata_dir() / bloom_reference.FILE
    bloom = ({column: bloom_reference.check(bloom_file, a) for column, a in columns.items()}
             if bloom_file.is_file() else {})
    targets = {name: {"target": f"{op} {bound}",
                      "met": memory_fit.meets(getattr(cv.cross_validated, name), op, bound)}
               for name, (op, bound) in memory_fit.TARGETS.items()}
    if args.json:
        print(json.dumps({"cv": "model", "objective": memory_fit.OBJECTIVE, **cv.to_dict(),
                          "targets": targets, "allocator_this_table_alone": asdict(alone),
                          "gates_met_this_table_alone": alone_fit.gates_met,
                          "published_fit_frac": published_fit,
                          "bloom": {column: c.to_dict() for column, c in bloom.items()}}))
        return 0
    constraint = "" if must_fit is not None else (
        f" (without the published llm-foundry constraint: no {memory_reference.LLMFOUNDRY_FILE} in "
        f"{refdata_dir()})")
    print(f"{args.runs} ({runs.format} format) against {args.spec} ({spec.framework}), leave one "
          "model out: the allocator constants refitted on the other models' runs, by the objective "
          f"of sweep.validation.memory_fit.OBJECTIVE{constraint}")
    print(f"in-sample: the spec's constants ({_allocator(cv.in_sample_allocator)})")
    _table("every model, each scored by the fold that left it out", cv.in_sample,
           cv.cross_validated, targets)
    for fold in cv.folds:
        _table(f"{fold.held_out} left out (fitted on {', '.join(fold.trained_on)}: "
               f"{_allocator(fold.allocator)})", fold.in_sample, fold.cross_validated, None)
        if not fold.gates_met:
            print(f"  note: no grid point met the fit's gates on {', '.join(fold.trained_on)} "
                  f"(keep {memory_fit.MIN_SUCCESS_KEPT:.0%} of successes, prune "
                  f"{memory_fit.MIN_OOM_PRUNED:.0%} of OOMs, fit every published configuration); "
                  "the closest point was taken")
    lo, hi = cv.band()
    print(f"held-out predicted / measured - 1 of the reserved peak, 5th..95th percentile: "
          f"{lo:+.3f} .. {hi:+.3f}")
    if published_fit:
        print("published configurations predicted to fit (they ran; llm-foundry is the fit's "
              "constraint, except for constants fitted on this table alone: "
              f"{_allocator(alone)})")
        print(f"  {'':<38}" + "".join(f"{column:>22}" for column in columns))
        for name, fracs in published_fit.items():
            print(f"  {name:<38}" + "".join(f"{fracs[column]:>22.4f}" for column in columns))
    if bloom:
        _bloom_table(bloom)
    if not alone_fit.gates_met:
        print(f"note: no grid point met the fit's gates on this table alone; the closest point "
              f"was taken ({_allocator(alone)})")
    return 0


def _write_constants(args: argparse.Namespace, runs: memory_check.Runs, spec: Spec
                     ) -> tuple[memory_fit.AllocatorFit, memory_fit.CrossValidation | None]:
    """Fit the constants on RUNS alone (no published table constrains them: the runs are the
    cluster's own) and write them as spec lines, headed by their provenance and figures; the fit
    and, with `--cv model`, its folds are returned for `--cv model` to report."""
    try:
        fitted = memory_fit.fit_allocator(runs, spec)
    except ValueError as error:
        raise UserError(f"{args.runs}: {error}; --write-constants needs runs that measured "
                        "their reserved peak on a GPU") from None
    left_out = None
    if args.cv == "model":
        # the same procedure, one model left out each time: how such constants hold on a new model
        left_out = memory_fit.cross_validate(runs, spec)
    versions = (sorted(runs.frame["framework_version"].dropna().astype(str).unique())
                if "framework_version" in runs.frame else [])
    text = constants_text(fitted, source=args.runs, sha256=file_sha256(args.runs),
                          runs_format=runs.format, spec=spec, spec_path=args.spec,
                          left_out=left_out, versions=versions)
    try:
        atomic_write_text(args.write_constants, text)
    except OSError as error:
        raise UserError(f"--write-constants {args.write_constants}: {error.strerror}") from None
    print(f"allocator constants fitted on {fitted.rows} successful run(s) of {args.runs} "
          f"({fitted.allocator.describe()}) → {args.write_constants}", file=sys.stderr)
    return fitted, left_out


def constants_text(fitted: memory_fit.AllocatorFit, *, source: Path, sha256: str, runs_format: str,
                   spec: Spec, spec_path: Path, left_out: memory_fit.CrossValidation | None = None,
                   versions: Sequence[str] = ()) -> str:
    """The `constraints.allocator` lines of a spec, headed by comments that say what they were
    fitted on, how, and how well (in-sample, and with `left_out` each model scored by constants
    fitted on the others), so that a spec that carries them says where they came from.

    With `left_out`, the line carries its band too (the held-out error's 5th..95th percentile):
    the probes of a sweep planned with these constants then straddle their own error, not the
    shipped constants'. Without it no band is written: an in-sample spread would be too narrow,
    and a probe band too narrow prunes successes."""
    a = fitted.allocator
    f = fitted.figures
    oom = "n/a (the runs tell no OOM apart)" if f.oom_pruned_frac is None \
        else f"{f.oom_pruned_frac:.4f}"
    gates = "yes" if fitted.gates_met else (
        "no: no grid point met them, the closest was taken; check the figures before planning "
        "with these")
    floor_mib = round(a.floor_bytes / MiB)
    notes = []
    band = ""
    if left_out is not None:
        held = left_out.cross_validated
        low, high = (round(x, 6) for x in left_out.band())
        band = f", band: [{low!r}, {high!r}]"
        notes.append(
            f"# left out (each model scored by constants fitted on the others): successes kept "
            f"{_cell(held.success_kept_frac)}, OOMs pruned {_cell(held.oom_pruned_frac)}, "
            f"reserved peak median / p90 |error| {_cell(held.reserved_median_abs_rel_err)} / "
            f"{_cell(held.reserved_p90_abs_rel_err)}; band (predicted / measured - 1, "
            f"{memory_fit.BAND_QUANTILES[0]:.0%}..{memory_fit.BAND_QUANTILES[1]:.0%} percentile): {low:+.4f} .. "
            f"{high:+.4f}, for the memory rule's probes")
    else:
        notes.append("# no band: the probes use the shipped constants' left-out band; with runs of "
                     "two models or more, `--cv model` measures these constants' own")
    at_edge = [f"{name} {value:g}" for name, value in fitted.at_edge().items()]
    if at_edge:
        notes.append(f"# at the grid's largest value: {', '.join(at_edge)}, after widening it as "
                     "far as a spec allows or sweep.validation.memory_fit.MAX_WIDENINGS times; the best fit may lie "
                     "beyond it, so these constants may still under-predict the reserve")
    if len(versions) > 1:
        notes.append(f"# the runs span framework versions {', '.join(versions)}: the allocator's "
                     "reserve can differ between them (`sweep memory-check` scores each apart)")
    return "\n".join([
        f"# Allocator constants of the memory model, fitted by llm-sweep on {date.today()}:",
        f"#   sweep memory-check {source} --spec {spec_path} --write-constants ...",
        f"# runs: {source} (sha256 {sha256}, {runs_format} format), {fitted.rows} successful "
        f"run(s) with a measured reserved peak; framework {spec.framework}, GPU {spec.gpu}",
        f"# fit: {fitted.points} grid points ({_grid_source(fitted)}), objective "
        "sweep.validation.memory_fit.OBJECTIVE "
        "without the published llm-foundry constraint; gates (keep "
        f"{memory_fit.MIN_SUCCESS_KEPT:.0%} of successes, prune {memory_fit.MIN_OOM_PRUNED:.0%} of OOMs) met: "
        f"{gates}",
        f"# in-sample: successes kept {f.success_kept_frac:.4f}, OOMs pruned {oom}, reserved "
        f"peak median / p90 |error| {f.reserved_median_abs_rel_err:.4f} / "
        f"{f.reserved_p90_abs_rel_err:.4f} (`sweep memory-check --cv model` says how they hold "
        "on a model left out)",
        *notes,
        "# Put the allocator line under `constraints:` in the spec of a sweep on the same cluster",
        "# and framework (beside what is there already: a second `constraints:` is refused). Every",
        "# memory prediction of its plan then uses these instead of the constants fitted on the",
        "# playbook's nanotron runs.",
        "constraints:",
        f"  allocator: {{sequential: {a.sequential!r}, pipelined: {a.pipelined!r}, "
        f"logits: {a.logits!r}, floor_mib: {floor_mib}{band}}}",
        ""])


def _grid_source(fitted: memory_fit.AllocatorFit) -> str:
    """sweep.validation.memory_fit.GRID, and which axes the fit widened because it reached their largest value."""
    if not fitted.widened:
        return "sweep.validation.memory_fit.GRID"
    described = fitted.grid.describe()
    wider = ", ".join(f"{name} to {described[name]['last']:g} ({times} widening"
                      f"{'s' if times > 1 else ''})" for name, times in Counter(fitted.widened).items())
    return f"sweep.validation.memory_fit.GRID widened where the fit reached its largest value: {wider}"


BLOOM_ROWS: Final = (
    ("successes predicted to fit", "success_kept_frac"),
    ("OOMs predicted over the GPU", "oom_over_frac"),
    ("OOMs over, or the band's high end over", "oom_flagged_frac"),
    ("peak vs predicted total, median |error|", "total_median_abs_rel_err"),
    ("peak vs predicted total, p90 |error|", "total_p90_abs_rel_err"),
    ("peak vs predicted total, signed median", "total_median_rel_err"),
    ("measured peaks inside the band", "within_band_frac"),
)


def _bloom_table(bloom: dict[str, bloom_reference.BloomCheck]) -> None:
    """BLOOM-176B's topology sweep (sweep.validation.bloom_reference) under each column's constants."""
    first = next(iter(bloom.values()))
    print(f"BLOOM-176B's topology sweep ({bloom_reference.FILE}: Megatron-DeepSpeed, A100 80 GB; "
          f"{first.n_success} successes, {first.n_measured} with a measured peak, {first.n_oom} "
          f"OOMs, {first.n_skipped} rows skipped), never fitted on")
    print(f"  {'':<42}" + "".join(f"{column:>22}" for column in bloom))
    for label, name in BLOOM_ROWS:
        print(f"  {label:<42}" + "".join(f"{_cell(getattr(c, name)):>22}" for c in bloom.values()))


def _allocator(a: Allocator | None) -> str:
    return "none" if a is None else a.describe()


def _table(title: str, in_sample: memory_check.MemoryCheck, held_out: memory_check.MemoryCheck,
           targets: dict[str, dict[str, str | bool | None]] | None) -> None:
    print(title)
    print(f"  {'':<28} {'in-sample':>10} {'cross-validated':>16}" + ("  target" if targets else ""))
    a, b = in_sample.to_dict(), held_out.to_dict()
    for name in memory_check.FIELDS:
        line = f"  {name:<28} {_cell(a[name]):>10} {_cell(b[name]):>16}"
        if targets and name in targets:
            met = targets[name]["met"]
            line += f"  {targets[name]['target']} ({'n/a' if met is None else 'met' if met else 'NOT met'})"
        print(line)


def _cell(value: object) -> str:
    return "null" if value is None else _show(value)


def _show(value: object) -> str:
    if value is None:
        return "null (this file cannot give it)"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value).lower() if isinstance(value, bool) else str(value)
