"""Flags for numbers a reader should not trust blindly, each with the reason.

- `check_flags`: completed runs left out of the ranking because their numbers failed a check
  (analysis.checks), each named with every check it failed.
- `basis_flags`: the reported MFU is not on one FLOPs basis within a model (implied FLOPs per token
  = MFU × peak / tokens/s/GPU differ), and which configuration column explains it.
- `selection_flags`: cells whose best configuration changes with the FLOPs convention or the
  metric, and the cause: the convention (conventions disagree among themselves) or what differs
  between the runs (the peak FLOP/s or FLOPs per token; conventions agree, tokens/s does not).
- `coverage_flags`: completed runs that cannot compete (no value for the ranking column), with
  each run's own reason.
- `collect_issue_flags`: every collect issue of every attempt, per cell and run.
- `value_flags`: MFU above 1, failed runs that carry throughput, a reported MFU that does not
  match its stated convention, cells that mix global batch sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.best import CONVENTIONS, best_configs, describe, ranking_column
from analysis.checks import MFU_COLUMNS, check_failures, issues_of, run_name
from sweep.collect.schema import CONVENTIONS as SCHEMA_CONVENTIONS

BASIS_TOLERANCE = 0.005  # implied FLOPs/token within 0.5 % count as one basis
EXPLAINING_COLUMNS = ("pp", "tp", "dp", "zero_stage", "mbs", "grad_acc", "cp", "nodes")
THROUGHPUT = describe("tokens_per_sec_per_gpu", "reported")  # the metric's name in the flags


@dataclass(frozen=True)
class Flag:
    kind: str  # basis, best-config-changes, mfu-above-1, failed-with-throughput, …
    model: str
    nodes: int | None
    message: str


def _clusters(values: pd.Series) -> list[float]:
    """Distinct values up to BASIS_TOLERANCE, ascending."""
    centres: list[float] = []
    for value in sorted(values.dropna()):
        if not centres or value > centres[-1] * (1 + BASIS_TOLERANCE):
            centres.append(value)
    return centres


def _cluster_of(value: float, centres: list[float]) -> int:
    return min(range(len(centres)), key=lambda i: abs(centres[i] - value))


def basis_flags(runs: pd.DataFrame) -> list[Flag]:
    flags = []
    for _model, group in runs.dropna(subset=["flops_per_token_reported"]).groupby("model"):
        centres = _clusters(group["flops_per_token_reported"])
        if len(centres) < 2:
            continue
        label = str(group["model_label"].iloc[0])
        which = group["flops_per_token_reported"].map(
            lambda v, centres=centres: _cluster_of(v, centres))
        message = (f"the reported MFU of {label} is on {len(centres)} FLOPs bases: "
                   + ", ".join(f"{c / 1e9:.4g} GFLOP/token" for c in centres)
                   + f" (+{100 * (centres[-1] / centres[0] - 1):.1f} %)")
        for column in EXPLAINING_COLUMNS:
            by_value = which.groupby(group[column]).nunique()
            if (by_value == 1).all() and which.groupby(group[column]).first().nunique() > 1:
                per_basis = group.groupby(which)[column].unique()
                parts = [f"{column} ∈ {{{', '.join(str(v) for v in sorted(vals))}}} → "
                         f"{centres[i] / 1e9:.4g} G" for i, vals in per_basis.items()]
                message += f"; it follows {column}: " + "; ".join(parts)
                break
        extra = centres[-1] - centres[0]
        shape = group.iloc[0]
        head = 6.0 * shape["vocab_size"] * shape["hidden_size"]
        if bool(shape["tie_word_embeddings"]) and abs(extra - head) < 0.02 * head:
            message += (f". The difference ({extra / 1e9:.4g} G) is ≈ 6·V·h = {head / 1e9:.4g} G: "
                        "the tied vocabulary matrix is counted a second time")
        flags.append(Flag("basis", label, None, message + ". Rank on tokens/s per GPU or a "
                          "recomputed convention (--convention full_attention) for one basis."))
    return flags


Key = tuple[str, int]


def _key(cell: pd.Series) -> Key | None:
    return None if pd.isna(cell.get("run_id")) else (str(cell["run_id"]), int(cell["attempt"]))


def _gflops(value: float) -> str:
    return f"{value / 1e9:.4g}"


def _differ(a: Any, b: Any) -> bool:
    """Both known and more than BASIS_TOLERANCE apart."""
    return bool(pd.notna(a) and pd.notna(b)
                and abs(float(a) - float(b)) > BASIS_TOLERANCE * min(abs(float(a)), abs(float(b))))


def _convention_cause(a: pd.Series, b: pd.Series, a_names: list[str], b_names: list[str]) -> str:
    """Why two conventions pick different runs: the reported figures are on another FLOPs basis,
    or the conventions weigh the two runs' FLOPs per token differently."""
    fa, fb = a.get("flops_per_token_reported"), b.get("flops_per_token_reported")
    reported = describe("mfu", "reported")
    if reported in a_names + b_names and _differ(fa, fb):
        text = (f"Cause: the FLOPs convention. The reported MFU counts {_gflops(fa)} GFLOP/token for "
                f"{a['layout_label']} and {_gflops(fb)} for {b['layout_label']} "
                f"({100 * (fa / fb - 1):+.1f} %): the reported figures are not on one basis")
        slower, faster = (a, b) if reported in a_names else (b, a)
        if slower["tokens_per_sec_per_gpu"] < faster["tokens_per_sec_per_gpu"]:
            text += ", so the faster run loses on reported MFU"
        return text + "."
    counts = [f"{c}: {_gflops(a[f'flops_per_token_{c}'])} vs {_gflops(b[f'flops_per_token_{c}'])}"
              for c in SCHEMA_CONVENTIONS if pd.notna(a[f"flops_per_token_{c}"])]
    return ("Cause: the FLOPs convention. The conventions weigh the two runs' FLOPs per token "
            f"differently (GFLOP/token, {a['layout_label']} vs {b['layout_label']}: "
            + "; ".join(counts) + ").")


def _throughput_cause(a: pd.Series, b: pd.Series, convention: str, conventions_agree: bool) -> str:
    """Why MFU (under `convention`) picks `a` while tokens/s per GPU picks `b`. MFU is tokens/s ×
    FLOPs per token ÷ peak (on CPU over the on-core time), so within a cell only a different
    peak, a different share of time waiting for a core, or a different FLOPs count per token can
    reorder the runs: name the one that differs."""
    agree = "every FLOPs convention picks the same run, " if conventions_agree else ""
    if _differ(a["peak_flops"], b["peak_flops"]):
        return ("Cause: the peak FLOP/s, not the FLOPs convention: " + agree + "but the runs divide "
                f"by different peaks ({a['layout_label']}: {a['peak_flops'] / 1e12:.4g} TFLOP/s, "
                f"{a['peak_flops_source']}; {b['layout_label']}: {b['peak_flops'] / 1e12:.4g} "
                f"TFLOP/s, {b['peak_flops_source']}), so the higher MFU is not the faster run; "
                "tokens/s per GPU compares them on one footing.")
    wait_a, wait_b = _wait_share(a), _wait_share(b)
    if wait_a is not None and wait_b is not None and _differ(wait_a, wait_b):
        return ("Cause: the wait for a core, not the FLOPs convention: " + agree + "but on CPU MFU "
                "counts each step's time less what its ranks waited for a core another process "
                f"held, and {a['layout_label']} waited {100 * wait_a:.3g} % of its step time, "
                f"{b['layout_label']} {100 * wait_b:.3g} %; MFU compares how they used the cores "
                "they had, tokens/s per rank their wall-clock speed.")
    column = f"flops_per_token_{convention}"
    if _differ(a.get(column), b.get(column)):
        return (f"Cause: the FLOPs per token: under {convention} the first counts "
                f"{_gflops(a[column])} GFLOP/token and the second {_gflops(b[column])} (another "
                "model shape or sequence length within the cell).")
    return ("Cause not found in runs.parquet: the two runs have the same peak FLOP/s and FLOPs "
            "per token, yet MFU and tokens/s rank them apart.")


def _wait_share(run: pd.Series) -> float | None:
    """The share of a CPU run's step time its ranks waited for a core (None: not measured)."""
    wait, step = run.get("cpu_wait_mean_s"), run.get("step_time_mean_s")
    if wait is None or step is None or pd.isna(wait) or pd.isna(step) or not step:
        return None
    return float(wait) / float(step)


def _explain_cell(own: Key, picks: dict[str, Key], primary: str, convention: str,
                  by_key: pd.DataFrame) -> str:
    """The picks of a cell and the real cause of each disagreement.

    Conventions that disagree among themselves blame the convention; conventions that agree with
    one another but not with tokens/s per GPU blame what differs between the runs (the peak each
    divides by, or their FLOPs per token)."""
    groups: dict[Key, list[str]] = {}
    for name, key in picks.items():
        groups.setdefault(key, []).append(name)
    run = {key: by_key.loc[key] for key in {own, *groups}}
    agreeing = [primary, *(name for name in groups.get(own, []) if name != primary)]
    others = [(key, names) for key, names in groups.items() if key != own]
    text = "; ".join(f"{', '.join(names)} pick{'s' if len(names) == 1 else ''} "
                     f"{run[key]['layout_label']}" for key, names in [(own, agreeing), *others])
    text += ". Tokens/s/GPU: " + " vs ".join(
        f"{run[key]['tokens_per_sec_per_gpu']:.6g}" for key in [own, *(k for k, _ in others)])
    causes = []
    by_convention = {c: picks[describe("mfu", c)] for c in CONVENTIONS if describe("mfu", c) in picks}
    anchor = by_convention.get(convention) or next(iter(by_convention.values()), own)
    anchor_names = groups.get(anchor, [primary])
    for key, names in groups.items():
        if key != anchor and any(name != THROUGHPUT for name in names):
            causes.append(_convention_cause(run[anchor], run[key], anchor_names, names))
    throughput = picks.get(THROUGHPUT)
    if throughput is not None and by_convention and throughput not in by_convention.values():
        causes.append(_throughput_cause(run[anchor], run[throughput], convention,
                                        len(set(by_convention.values())) == 1))
    return text + ". " + " ".join(causes)


def selection_flags(runs: pd.DataFrame, metric: str, convention: str) -> list[Flag]:
    """Cells whose winner changes with the FLOPs convention or the metric, with the cause.

    Every convention and tokens/s per GPU rank each cell (one best_configs per ranking column)."""
    winners: dict[str, pd.DataFrame] = {}
    picks_of: dict[str, str] = {}
    for name, (alt_metric, alt_convention) in {
            **{describe("mfu", c): ("mfu", c) for c in CONVENTIONS},
            THROUGHPUT: ("tokens_per_sec_per_gpu", convention)}.items():
        column = ranking_column(alt_metric, alt_convention)
        if column not in winners:
            winners[column] = best_configs(runs, alt_metric, alt_convention)
        picks_of[name] = column
    primary = winners[ranking_column(metric, convention)]
    by_key = runs.set_index(["run_id", "attempt"]).sort_index()
    flags = []
    for index, cell in primary.iterrows():
        own = _key(cell)
        if own is None:
            continue
        picks = {name: key for name, column in picks_of.items()
                 if (key := _key(winners[column].iloc[index])) is not None}
        if all(key == own for key in picks.values()):
            continue
        flags.append(Flag("best-config-changes", str(cell["model"]), int(cell["nodes"]),
                          _explain_cell(own, picks, describe(metric, convention), convention, by_key)))
    return flags


def value_flags(runs: pd.DataFrame) -> list[Flag]:
    flags = []
    above = runs[list(MFU_COLUMNS)].gt(1.0)
    high = runs[above.any(axis=1)]
    for (label, nodes), cell in high.groupby(["model_label", "nodes"]):
        worst_column = cell[list(MFU_COLUMNS)].max().idxmax()
        worst = cell.loc[cell[worst_column].idxmax()]
        columns = [c for c in MFU_COLUMNS if above.loc[cell.index, c].any()]
        flags.append(Flag("mfu-above-1", str(label), int(nodes),
                          f"{len(cell)} attempt(s) with MFU > 1 under {', '.join(columns)} (up to "
                          f"{worst[worst_column]:.4g} in {worst_column}, {run_name(worst)}): "
                          "impossible, so never ranked; check the peak FLOP/s (dense, not sparse; "
                          "on CPU, the measured one) and the tokens/s (global vs per GPU)"))
    failed = runs[(runs["outcome"] != "completed")
                  & (runs["tokens_per_sec_per_gpu"].notna() | runs["mfu_reported"].notna())]
    if not failed.empty:
        flags.append(Flag("failed-with-throughput", "*", None,
                          f"{len(failed)} attempt(s) that did not complete carry throughput "
                          "figures; they are left out of every ranking"))
    for convention in ("megatron", "full_attention", "6N"):
        claimed = runs[(runs["mfu_reported_convention"] == convention)
                       & runs["mfu_reported"].notna() & runs[f"mfu_{convention}"].notna()]
        off = claimed[(claimed["mfu_reported"] - claimed[f"mfu_{convention}"]).abs()
                      > 0.01 * claimed[f"mfu_{convention}"].abs()]
        if not off.empty:
            flags.append(Flag("convention-mismatch", "*", None,
                              f"{len(off)} attempt(s) report MFU as {convention}, yet it differs by "
                              f"more than 1 % from tokens/s/GPU × flops_per_token_{convention} / peak "
                              "(another peak or FLOPs formula?)"))
    batches = runs.groupby(["model_label", "nodes"])["global_batch_sequences"].nunique()
    for (label, nodes), _count in batches[batches > 1].items():
        sizes = runs[(runs["model_label"] == label) & (runs["nodes"] == nodes)][
            "global_batch_sequences"].value_counts()
        text = ", ".join(f"{int(size)} ({n}×)" for size, n in sizes.items())
        flags.append(Flag("mixed-global-batch", str(label), int(nodes),
                          f"the cell mixes global batch sizes, in sequences: {text}"))
    return flags


def _where(row: pd.Series) -> tuple[str, int | None]:
    """The cell a flag about one run names: its model label and nodes ("*" when run.json was
    missing and the row has no configuration)."""
    label = row.get("model_label")
    label = label if isinstance(label, str) and label else row.get("model")
    nodes = row.get("nodes")
    return (str(label) if isinstance(label, str) and label else "*",
            int(nodes) if pd.notna(nodes) else None)


def check_flags(runs: pd.DataFrame) -> list[Flag]:
    """One `failed-check` flag per completed attempt left out of the ranking (analysis.checks),
    naming the run and every check it failed."""
    failures = check_failures(runs)
    flags = []
    for position in np.flatnonzero((runs["outcome"] == "completed") & failures.map(bool)):
        row = runs.iloc[position]
        reasons = "; ".join(failures.iloc[position])
        flags.append(Flag("failed-check", *_where(row), f"{run_name(row)} is left out of every "
                          f"ranking: {reasons}{'' if reasons.endswith(('.', '?')) else '.'}"))
    return flags


def collect_issue_flags(runs: pd.DataFrame) -> list[Flag]:
    """Every collect issue of every attempt, one `collect-issues` flag per cell, run by run.

    Nothing is summarised away: a reader must be able to see that the winning run's files had
    a problem, whatever the problem."""
    rows = runs[runs["collect_issues"].map(lambda v: bool(issues_of(v)))]
    by_cell: dict[tuple[str, int | None], list[str]] = {}
    for _, row in rows.iterrows():
        by_cell.setdefault(_where(row), []).append(
            f"{run_name(row)} ({row['outcome']}): " + "; ".join(issues_of(row["collect_issues"])))
    return [Flag("collect-issues", model, nodes, f"{len(lines)} attempt(s) with collect issues: "
                 + " | ".join(lines)) for (model, nodes), lines in by_cell.items()]


def _unranked_reason(row: pd.Series, column: str) -> str:
    """Why a completed attempt has no `column`, from its own record: the first missing input of
    the figure, then collect's issues (a corrupt metrics file says so there)."""
    if pd.isna(row["tokens_per_sec_per_gpu"]):
        source = row.get("metrics_source")
        reason = "no throughput was measured" + (f" (metrics from {source})" if pd.notna(source)
                                                 else " (no metrics were read)")
    elif column == "mfu_reported":
        reason = "its framework logs no MFU; --convention full_attention recomputes one"
    elif pd.isna(row["peak_flops"]):
        reason = f"no peak FLOP/s known for {row.get('gpu')} {row.get('dtype')}"
    else:
        reason = f"no {column.replace('mfu_', 'flops_per_token_')} (model shape unknown)"
    issues = issues_of(row["collect_issues"])
    return reason + ("; collect: " + "; ".join(issues) if issues else "")


def coverage_flags(runs: pd.DataFrame, metric: str, convention: str) -> list[Flag]:
    """Completed attempts that cannot compete: the ranking column is empty for them. The reason
    is each run's own (its collect issues, or what is missing), grouped by reason."""
    column = ranking_column(metric, convention)
    missing = runs[(runs["outcome"] == "completed") & runs[column].isna()]
    if missing.empty:
        return []
    by_reason: dict[str, list[str]] = {}
    for _, row in missing.iterrows():
        by_reason.setdefault(_unranked_reason(row, column), []).append(run_name(row))
    parts = [f"{', '.join(names)}: {reason}" for reason, names in by_reason.items()]
    return [Flag("not-ranked", "*", None, f"{len(missing)} completed attempt(s) have no {column} and "
                 "are left out of the ranking. " + " | ".join(parts))]


def _straggler_runs(runs: pd.DataFrame) -> pd.DataFrame:
    if "straggler_node" not in runs.columns:
        return runs.iloc[0:0]
    return runs[runs["straggler_node"].notna() & (runs["straggler_node"] != "")]


def straggler_flags(runs: pd.DataFrame) -> list[Flag]:
    """One `straggler` flag per cell with runs whose slowest node exceeded their factor × the
    median of the run's nodes (sweep.collect.stragglers), naming each run and node: such a run
    measured the node as much as the configuration."""
    by_cell: dict[tuple[str, int | None], list[str]] = {}
    for _, row in _straggler_runs(runs).iterrows():
        by_cell.setdefault(_where(row), []).append(
            f"{run_name(row)} ({row['layout_label']}, {row['outcome']}): node "
            f"{row['straggler_node']} took {row['straggler_ratio']:.2f}× the median step time of "
            f"the run's nodes (factor {row['straggler_factor']:g})")
    return [Flag("straggler", model, nodes, f"{len(lines)} run(s) with a straggler node: "
                 + " | ".join(lines) + ". Rerun on other nodes before trusting these figures; "
                 "`sweep nodes` lists the node as a suspect.")
            for (model, nodes), lines in by_cell.items()]


def straggler_cells(runs: pd.DataFrame, best: pd.DataFrame) -> dict[tuple[str, int], str]:
    """The cells whose best run is a straggler run, each with its straggler node (the heatmap
    marks them)."""
    slow = {(str(row["run_id"]), int(row["attempt"])): str(row["straggler_node"])
            for _, row in _straggler_runs(runs).iterrows()}
    return {(str(cell["model"]), int(cell["nodes"])): slow[key]
            for _, cell in best.iterrows() if (key := _key(cell)) is not None and key in slow}


def all_flags(runs: pd.DataFrame, metric: str, convention: str) -> list[Flag]:
    return (check_flags(runs) + basis_flags(runs) + selection_flags(runs, metric, convention)
            + value_flags(runs) + coverage_flags(runs, metric, convention)
            + straggler_flags(runs) + collect_issue_flags(runs))
