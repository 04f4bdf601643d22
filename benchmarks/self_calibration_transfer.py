"""Self-calibration on a model the memory constants were not fitted on: what a first round of N
attempts does to the memory rule's verdicts on the rest of that model's runs.

For each model M of the playbook's full 1B/8B table, the allocator constants are fitted without
M (the leave-one-model-out fold of `sweep memory-check --cv model`, llm-foundry must-fit
included). A "first round" of N of M's attempts (their outcomes and measured reserved peaks) then
sets the factor k of `sweep.calibration.memory_self_calibration.fit_correction`, and the rest of M's runs are
scored with it: successful runs kept, OOM runs pruned (the point estimate's verdict: k × reserved
+ overhead against the budget, on the most loaded stage), and the |relative error| of rank 0's
reserved peak. Two draws of the first round: `random` (uniform over M's runs), and `smallest`
(what the prior keeps, the smallest micro-batch of every layout first, as the `pruned` strategy
orders a round). Each figure is the mean over seeds.

Self-calibration is for a cluster, framework or allocator the constants do not describe; the
held-out model ran on the cluster they were fitted on. So the prior is also taken wrong on
purpose: the fold's allocator constants (shares and floor) × 0 (no fragmentation at all) and × 2.

A second study runs one sweep of both models: a first round drawn from both, and each model
scored under one factor fitted on the whole round (as shipped) or under a factor of its own.

Three rules for the factor are compared: the committed one (the geometric mean of measured /
predicted over the completed attempts), the same moved into the bounds of every outcome (every
completed attempt predicted to fit, every OOM not: the rule until this release, which now binds
only where no peak was measured), and the largest ratio in those bounds (the rule before that,
which covers every peak the round saw).

    SWEEP_REFDATA=DIR .venv/bin/python benchmarks/self_calibration_transfer.py [--seeds 8]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd

from sweep.calibration.memory_self_calibration import (
    MemoryCorrection,
    fit_correction,
    geometric_mean,
    into_bounds,
)
from sweep.plan.spec import load_spec
from sweep.validation import memory_check, memory_fit, memory_reference
from sweep.validation.refdata import refdata_dir

REPO = Path(__file__).resolve().parents[1]
TABLE = "playbook_bench_full_1B_8B.csv"
SIZES = (8, 16, 64)
TARGETS: dict[str, Callable[[np.ndarray], float]] = {"geometric mean": geometric_mean,
                                                      "largest": lambda r: float(np.max(r))}
BOUNDED: Final = "geometric mean, bounded by the outcomes"
LARGEST: Final = "largest ratio, bounded by the outcomes"
KEYS: Final = {"none (prior)": "prior", "geometric mean": "gmean", BOUNDED: "bounded",
               LARGEST: "largest"}


def bounded(correction: MemoryCorrection) -> float:
    """The target moved into the outcomes' bounds as little as it takes (the rule before)."""
    return into_bounds(correction.target, correction.lower, correction.upper)


class HeldOutModel:
    """One model's judged runs (every rule but memory passes) under constants fitted without it."""

    def __init__(self, whole: memory_fit.Basis, model: str, frame: pd.DataFrame,
                 fold: memory_fit.Allocator, scale: float) -> None:
        mask = ((whole.model == model) & whole.rules_ok & whole.estimated
                & np.isin(whole.outcome, ["success", "oom"]))
        self.b = whole.subset(mask)
        self.frame = frame[mask].reset_index(drop=True)
        self.prior = scale * np.array([fold.sequential, fold.pipelined, fold.logits,
                                       fold.floor_bytes], dtype=np.float64)
        self.budget = float(whole.budget)
        self.overhead = self.b.total0 - self.b.alloc  # (2, n): outside the allocator
        self.ok = self.b.outcome == "success"
        m = self.b.measured_reserved
        self.scored = self.ok & np.isfinite(m) & (m > 0)

    def reserved(self, rows: np.ndarray) -> np.ndarray:
        """(2, r): the prior's reserved peak of both end stages."""
        p = self.prior
        return (self.b.alloc[:, rows] + np.einsum("k,skr->sr", p[:3], self.b.frag[:, :, rows])
                + p[3])

    def edge(self, rows: np.ndarray) -> np.ndarray:
        """The factor at which each run just fits, on the stages the memory rule looks at."""
        e = (self.budget - self.overhead[:, rows]) / self.reserved(rows)
        return np.where(self.b.single[rows], e[0], np.minimum(e[0], e[1]))

    def correction(self, rows: np.ndarray,
                   target_of: Callable[[np.ndarray], float]) -> MemoryCorrection:
        """fit_correction on these attempts, as a sweep's runs.parquet would give them: rank
        0's measured peak (what the table has) against rank 0's prediction, each attempt
        judged at the limit where its most loaded stage just fits."""
        return fit_correction(self.evidence(rows), target_of)

    def evidence(self, rows: np.ndarray) -> pd.DataFrame:
        """These attempts as `sweep.calibration.memory_self_calibration.evidence` rows."""
        r0, o0 = self.reserved(rows)[0], self.overhead[0, rows]
        return pd.DataFrame({
            "run_id": [f"{self.b.model[0]}-{r}" for r in rows], "attempt": 1,
            "model": self.b.model[0], "outcome": np.where(self.ok[rows], "completed", "oom"),
            "measured_reserved": np.where(self.scored[rows], self.b.measured_reserved[rows],
                                          np.nan),
            "pred_reserved": r0, "pred_overhead": o0, "limit": self.edge(rows) * r0 + o0})

    def score(self, rows: np.ndarray, k: float) -> dict[str, float]:
        kept = self.edge(rows) >= k
        ok = self.ok[rows]
        scored = rows[self.scored[rows]]
        err = np.abs(k * self.reserved(scored)[0] / self.b.measured_reserved[scored] - 1.0)
        return {"kept": float(kept[ok].mean()),
                "oom_pruned": float((~kept[~ok]).mean()) if (~ok).any() else float("nan"),
                "median": float(np.median(err)), "p90": float(np.quantile(err, 0.9))}

    def first_round(self, n: int, rng: np.random.Generator, draw: str) -> np.ndarray:
        rows = np.arange(len(self.frame))
        if draw == "random":
            return rng.choice(rows, size=min(n, len(rows)), replace=False)
        kept = rows[self.edge(rows) >= 1.0]
        f = self.frame.iloc[kept].assign(row=kept, tie=rng.random(len(kept)))
        layout = f.groupby(["nodes", "dp", "tp", "pp", "zero_stage"]).ngroup().to_numpy()
        f["layout_order"] = rng.permutation(layout.max() + 1)[layout]
        f["mbs_rank"] = f.groupby(layout)["mbs"].rank(method="first")
        return f.sort_values(["mbs_rank", "layout_order", "tie"])["row"].to_numpy()[:n]


def first_rounds(held: HeldOutModel, seeds: int) -> list[dict[str, object]]:
    """Per draw, size and seed: the rest of the model's runs scored under the prior and under
    the factor each target gives."""
    records: list[dict[str, object]] = []
    for draw in ("random", "smallest"):
        for n in SIZES:
            for seed in range(seeds):
                rows = held.first_round(n, np.random.default_rng(1000 * seed + n), draw)
                rest = np.setdiff1d(np.arange(len(held.frame)), rows)
                common = {"draw": draw, "N": n}
                records.append({**common, "target": "none (prior)", "k": 1.0,
                                **held.score(rest, 1.0)})
                for name, target_of in TARGETS.items():
                    correction = held.correction(rows, target_of)
                    factors = ({name: correction.factor, BOUNDED: bounded(correction)}
                               if name == "geometric mean" else {LARGEST: bounded(correction)})
                    for rule, k in factors.items():
                        records.append({**common, "target": rule, "k": k, **held.score(rest, k)})
    return records


def shared_or_per_model(helds: list[HeldOutModel], seeds: int) -> list[dict[str, object]]:
    """A sweep of every model at once: a first round of N attempts drawn at random from all
    their runs, and each model's other runs scored under one factor fitted on the whole round
    (shared, as shipped) or under its own (fitted on its attempts alone; the shared one where
    it measured no peak)."""
    records: list[dict[str, object]] = []
    sizes = [len(held.frame) for held in helds]
    owner = np.repeat(np.arange(len(helds)), sizes)
    index = np.concatenate([np.arange(n) for n in sizes])
    for n in SIZES:
        for seed in range(seeds):
            pick = np.random.default_rng(1000 * seed + n).choice(len(owner), n, replace=False)
            rows = [np.sort(index[pick[owner[pick] == i]]) for i in range(len(helds))]
            shared = fit_correction(pd.concat(
                [held.evidence(r) for held, r in zip(helds, rows, strict=True)],
                ignore_index=True)).factor
            for held, r in zip(helds, rows, strict=True):
                own = fit_correction(held.evidence(r))
                rest = np.setdiff1d(np.arange(len(held.frame)), r)
                for rule, k in (("shared", shared),
                                ("per model", own.factor if own.n_measured else shared)):
                    records.append({"model": held.b.model[0], "N": n, "factor": rule,
                                    **held.score(rest, k)})
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0, 0.0, 2.0],
                        help="the fold's allocator constants times these (1: as fitted)")
    args = parser.parse_args()
    data = refdata_dir()
    spec = load_spec(REPO / "examples" / "playbook.yaml")
    runs = memory_check.read_memory_runs(data / TABLE, spec)
    whole = memory_fit.basis(runs, spec)
    must_fit = memory_reference.llmfoundry_basis(data / "llmfoundry_mpt_benchmarks.csv")
    records, sweeps = [], []
    folds = {model: memory_fit.fit_basis(whole.subset(whole.model != model), memory_fit.GRID, must_fit).allocator
             for model in sorted(set(whole.model))}
    for scale in args.scales:
        helds = [HeldOutModel(whole, model, runs.frame, fold, scale)
                 for model, fold in folds.items()]
        for held in helds:
            common = {"prior": f"fold x {scale:g}", "model": held.b.model[0]}
            records += [{**common, **record} for record in first_rounds(held, args.seeds)]
        sweeps += [{"prior": f"fold x {scale:g}", **record}
                   for record in shared_or_per_model(helds, args.seeds)]
    table = pd.DataFrame(records)
    summary = table.groupby(["prior", "model", "draw", "N", "target"],
                            sort=False).mean(numeric_only=True)
    pd.set_option("display.width", 160)
    print(f"first round of N attempts of a model left out; {args.seeds} seeds; scored on the "
          "rest of its runs (point-estimate verdicts)")
    print(summary.round(3).to_string())
    overall = table.groupby(["prior", "target"], sort=False).mean(numeric_only=True)
    print("\nmean over models, draws and N:")
    print(overall[["kept", "oom_pruned", "median", "p90"]].round(4).to_string())
    both = pd.DataFrame(sweeps).groupby(["prior", "factor"], sort=False).mean(numeric_only=True)
    print("\none sweep of both models (first round drawn from both; each model under its own "
          "fold's constants), mean over models and N:")
    print(both[["kept", "oom_pruned", "median", "p90"]].round(4).to_string())
    figures = []
    for (prior, name), row in both.iterrows():
        figures.append(f"{prior.split()[-1]}x_{name.replace(' ', '_')}_median={row['median']:.4f}")
    for (prior, name), row in overall.iterrows():
        key = f"{prior.split()[-1]}x_" + KEYS[name]
        figures += [f"{key}_kept={row['kept']:.4f}", f"{key}_oom_pruned={row['oom_pruned']:.4f}",
                    f"{key}_median={row['median']:.4f}"]
    print(" ".join(figures))


if __name__ == "__main__":
    main()
