"""Flags for numbers a reader should not trust blindly, each with the reason.

- `basis_flags`: the reported MFU is not on one FLOPs basis within a model (implied FLOPs per token
  = MFU × peak / tokens/s/GPU differ), and which configuration column explains it.
- `selection_flags`: cells whose best configuration changes with the FLOPs convention or the
  metric, and why.
- `coverage_flags`: completed runs that cannot compete (no value for the ranking column).
- `value_flags`: MFU above 1, failed runs that carry throughput, a reported MFU that does not
  match its stated convention, cells that mix global batch sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from analysis.best import CONVENTIONS, best_configs, describe, ranking_column

BASIS_TOLERANCE = 0.005  # implied FLOPs/token within 0.5 % count as one basis
EXPLAINING_COLUMNS = ("pp", "tp", "dp", "zero_stage", "mbs", "grad_acc", "cp", "nodes")


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
    for model, group in runs.dropna(subset=["flops_per_token_reported"]).groupby("model"):
        centres = _clusters(group["flops_per_token_reported"])
        if len(centres) < 2:
            continue
        label = str(group["model_label"].iloc[0])
        which = group["flops_per_token_reported"].map(lambda v: _cluster_of(v, centres))
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


def _explain_change(a: pd.Series, b: pd.Series, primary: str, others: list[str]) -> str:
    text = (f"{primary} picks {a['layout_label']}; {', '.join(others)} "
            f"pick{'s' if len(others) == 1 else ''} {b['layout_label']}. Tokens/s/GPU: "
            f"{a['tokens_per_sec_per_gpu']:.6g} vs {b['tokens_per_sec_per_gpu']:.6g}")
    fa, fb = a.get("flops_per_token_reported"), b.get("flops_per_token_reported")
    if pd.notna(fa) and pd.notna(fb) and abs(fa - fb) > BASIS_TOLERANCE * min(fa, fb):
        text += (f". The reported MFU counts {fa / 1e9:.4g} GFLOP/token for the first and "
                 f"{fb / 1e9:.4g} for the second ({100 * (fa / fb - 1):+.1f} %): the reported "
                 "figures are not on one basis")
        if a["tokens_per_sec_per_gpu"] < b["tokens_per_sec_per_gpu"]:
            text += ", so the faster run loses on reported MFU"
    elif a["tokens_per_sec_per_gpu"] < b["tokens_per_sec_per_gpu"]:
        text += (". The first does more FLOPs per token under its convention (another model "
                 "shape, sequence length or GPU within the cell)")
    return text + "."


def selection_flags(runs: pd.DataFrame, metric: str, convention: str) -> list[Flag]:
    primary = best_configs(runs, metric, convention)
    primary_name = describe(metric, convention)
    alternatives = [("mfu", c) for c in CONVENTIONS] + [("tokens_per_sec_per_gpu", convention)]
    by_key = runs.set_index(["run_id", "attempt"]).sort_index()
    picks: dict[int, dict[tuple[str, int], list[str]]] = {}
    for alt_metric, alt_convention in alternatives:
        if (alt_metric, alt_convention) == (metric, convention) or \
                (alt_metric == metric == "tokens_per_sec_per_gpu"):
            continue
        other = best_configs(runs, alt_metric, alt_convention)
        for index, (a_id, a_att, b_id, b_att) in enumerate(zip(
                primary["run_id"], primary["attempt"], other["run_id"], other["attempt"])):
            if pd.isna(a_id) or pd.isna(b_id) or (a_id, a_att) == (b_id, b_att):
                continue
            picks.setdefault(index, {}).setdefault((b_id, int(b_att)), []).append(
                describe(alt_metric, alt_convention))
    flags = []
    for index, alternatives_by_pick in picks.items():
        cell = primary.iloc[index]
        a = by_key.loc[(cell["run_id"], int(cell["attempt"]))]
        reasons = [_explain_change(a, by_key.loc[key], primary_name, names)
                   for key, names in alternatives_by_pick.items()]
        flags.append(Flag("best-config-changes", str(cell["model"]), int(cell["nodes"]),
                          " ".join(reasons)))
    return flags


def value_flags(runs: pd.DataFrame) -> list[Flag]:
    flags = []
    mfu_columns = [c for c in runs.columns if c.startswith("mfu_") and c != "mfu_reported_convention"]
    for column in mfu_columns:
        high = runs[runs[column] > 1.0]
        for (label, nodes), cell in high.groupby(["model_label", "nodes"]):
            worst = cell.loc[cell[column].idxmax()]
            flags.append(Flag("mfu-above-1", str(label), int(nodes),
                              f"{len(cell)} attempt(s) with {column} > 1 (up to {worst[column]:.4g}, "
                              f"{worst['run_id']}#{worst['attempt']}): impossible; check the peak "
                              "FLOP/s (dense, not sparse) and the tokens/s (global vs per GPU)"))
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
    for (label, nodes), count in batches[batches > 1].items():
        sizes = runs[(runs["model_label"] == label) & (runs["nodes"] == nodes)][
            "global_batch_sequences"].value_counts()
        text = ", ".join(f"{int(size)} ({n}×)" for size, n in sizes.items())
        flags.append(Flag("mixed-global-batch", str(label), int(nodes),
                          f"the cell mixes global batch sizes, in sequences: {text}"))
    return flags


def coverage_flags(runs: pd.DataFrame, metric: str, convention: str) -> list[Flag]:
    """Completed attempts that cannot compete: the ranking column is empty for them."""
    column = ranking_column(metric, convention)
    missing = runs[(runs["outcome"] == "completed") & runs[column].isna()]
    if missing.empty:
        return []
    hint = (" (their framework logs no MFU); --convention full_attention recomputes one for every run"
            if column == "mfu_reported" else " (no throughput was measured)")
    return [Flag("not-ranked", "*", None, f"{len(missing)} completed attempt(s) have no {column} and "
                 f"are left out of the ranking{hint}.")]


def all_flags(runs: pd.DataFrame, metric: str, convention: str) -> list[Flag]:
    return (basis_flags(runs) + selection_flags(runs, metric, convention) + value_flags(runs)
            + coverage_flags(runs, metric, convention))
