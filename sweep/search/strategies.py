"""Search strategies that find each cell's best configuration without running every candidate.

A *cell* is one (model, nodes) pair; its *candidates* are plan rows. A strategy asks an oracle
for outcomes in rounds and records every candidate it did not run, with the reason:

- ``exhaustive``: everything, in one round.
- ``pruned``: ascending micro-batch per layout, with OOM-monotonic skipping. A skip is either a
  *proof* (``pruned:``) or a *heuristic* (``heuristic:``), and says which. The proof: a candidate
  that differs from an OOMed one only in settings that can only add memory (a larger micro-batch,
  a lower ZeRO stage, less recomputation, no sequence parallelism; same dp, tp, pp, cp, ep and
  schedule) cannot fit either. Comparing *different* layouts through a memory proxy is a
  heuristic, off unless asked for (`Params.heuristic_skips`), as is treating an unclassified
  failure as an OOM. The rules are `sweep.search.oom_rules`.
- ``adaptive``: rounds per open cell of the k − 1 best predicted candidates plus the best of a
  (tp, pp, ZeRO) family not yet run. After each round the predictions are rescaled by the
  median measured/predicted ratio of the candidate's family (else its cell). Each untried
  candidate gets an optimistic throughput: its rescaled prediction times the `quantile` of the
  sweep's own residuals so far around the median it was rescaled by (its family's, or for a
  family not yet run its cell's, which also holds how far one family's bias strays from
  another's; the cell's spread, or the sweep's if larger, at least `min_margin`), so a cell where
  the model is wrong widens its band. The coefficients themselves are the plan's and are not
  refitted between rounds: the runs of the first rounds are the model's own picks, a few
  families per cell, and a refit of every coefficient on them extrapolates to the families not
  yet run (closing cells short of a ZeRO-0 layout it never tried: docs/search.md, "Sweep economy"
  has the replays that showed it). A cell closes when no optimistic throughput beats its best
  measured run by more than ε, once it has measured a floor of min(min_cell_runs,
  min_cell_frac of its candidates, at least 3) completed runs (a launch that failed measured
  nothing for the rescaling and the band to stand on).
  What the search records per cell: the regret bound at closing (1 − best / the highest
  optimistic throughput left untried) and how many launches the floor forced (the band alone
  would have closed the cell). The OOM rules of ``pruned`` apply too.
- ``shortlist``: per cell, the `top` candidates predicted fastest (the plan's own prediction,
  `PLAN_PREDICTION`, where the candidates carry it; else the prior's), and for each of them
  that ran out of memory or failed, the next: rounds go on until every cell has `top`
  completed runs or nothing left to try. No refit and no closing band: it bets on the model's
  *ranking* within a cell, which holds where its absolute error does not. What it costs and what it finds is measured, left out,
  by `sweep replay --cv model --strategy shortlist`; `top` is chosen the same way.

The oracle is a table of outcomes (`sweep replay` of a published sweep) or a callable that runs a
batch and returns its outcomes (a live sweep), so the same code does both. What a search did, per
cell, and how a replay scores: `sweep.search.search_report`. Pure: no I/O of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import pandas as pd

from sweep.models.throughput import (
    Coefficients,
    features,
    predict,
    predict_step,
    tokens_per_step,
)
from sweep.models.throughput_inputs import Workload
from sweep.search.oom_rules import (
    CELL,
    OomRules,
    cell_keys,
    joined_key,
    layout_keys,
    memory_components,
)

STRATEGIES: Final = ("exhaustive", "pruned", "adaptive", "shortlist")
FAMILY: Final = ("tp", "pp", "zero_stage")  # what adaptive exploration spreads over
# The plan's predicted throughput of a candidate (`sweep.plan.predictions.with_predictions`).
PLAN_PREDICTION: Final = "pred_tokens_per_s_per_gpu"


@dataclass(frozen=True)
class Params:
    """Knobs of the strategies. The adaptive floor and band (`min_cell_runs`, `quantile`) and the
    shortlist's `top` are not tuned by hand: they are what
    `sweep.validation.cross_validation.default_settings` picks on the playbook's charts table
    (tests/validation/test_cross_validation.py reproduces them), and `sweep replay --cv model` picks them
    again without the model it reports on."""

    k: int = 4                 # candidates per open cell per round
    epsilon: float = 0.02      # close a cell when nothing can beat its best by more than this
    quantile: float = 0.9      # optimism: this quantile of the cell's log(measured/predicted)
    min_margin: float = 0.05   # ... but never less optimistic than this
    max_rounds: int = 200
    min_cell_runs: int = 8     # completed runs in a cell before it may close ...
    min_cell_frac: float = 0.25  # ... or this share of its candidates, if smaller (at least 3)
    failed_is_oom: bool = False  # heuristic: an unclassified failure skips like an OOM
    heuristic_skips: bool = False  # heuristic: skip layouts the memory proxy says need more
    top: int = 8               # shortlist: completed runs per cell, best predicted first

    @classmethod
    def with_top(cls, top: int | None) -> Params:
        """The defaults, with the shortlist's length where one was asked for (`--top`)."""
        return cls() if top is None else cls(top=top)


@dataclass
class Search:
    """What a strategy did: runs launched (in order), candidates skipped, and per-cell progress."""

    strategy: str
    launched: pd.DataFrame  # candidate, round, model, nodes, status, tokens/s/GPU, gpu_hours
    skipped: pd.DataFrame  # candidate, model, nodes, reason
    coefficients: Coefficients | None = None
    rounds: int = 0
    closed_at: dict[str, int] = field(default_factory=dict)  # adaptive: cell → round it closed
    # adaptive: cell → 1 − best measured / highest optimistic throughput left untried, at closing
    # (0 when the cell ran out of candidates): the most the cell can have missed, per the band.
    regret_bound: dict[str, float] = field(default_factory=dict)
    # adaptive: cell → launches the floor forced (the band alone would have closed the cell).
    forced: dict[str, int] = field(default_factory=dict)
    # The candidates the plan kept at some point of the search (all of them without a `replan`):
    # the ones it held back throughout were never runs of this sweep, and are left out.
    considered: pd.Index = field(default_factory=lambda: pd.Index([], dtype="int64"))


@dataclass(frozen=True)
class Replanned:
    """What a re-plan between rounds decided: the candidates the plan now keeps, and why the
    others (held back until a later re-plan keeps them) are not run."""

    eligible: pd.Index
    reason: str


# Called after every round with the outcomes so far, the round, and the throughput coefficients
# the round's picks were made with (None where the strategy uses no model).
Replan = Callable[[pd.DataFrame, int, Coefficients | None], Replanned]


# Predictions ------------------------------------------------------------------------------------

class Predictor:
    """The throughput model's predictions over a fixed candidate set, from one set of
    coefficients (the plan's prior; the adaptive search corrects them per family and cell in
    `_estimates`, it does not refit them: see `_adaptive`)."""

    def __init__(self, candidates: pd.DataFrame, workloads: Mapping[str, Workload],
                 coefficients: Coefficients) -> None:
        parts = [features(group, workloads[str(model)], coefficients.inter_scaling
                          ).reindex(group.index)
                 for model, group in candidates.groupby("model", sort=False)]
        self.feats = pd.concat(parts).reindex(candidates.index).to_numpy()
        tokens = pd.concat([pd.Series(tokens_per_step(g, workloads[str(m)]), index=g.index)
                            for m, g in candidates.groupby("model", sort=False)])
        gpus = candidates.dp * candidates.tp * candidates.pp
        gpus = gpus * candidates.get("cp", 1) * candidates.get("ep", 1)
        self.tokens_per_gpu = (tokens.reindex(candidates.index) / gpus).to_numpy(float)
        self.position = pd.Series(np.arange(len(candidates)), index=candidates.index)
        self.coefficients = coefficients

    def tokens_per_s_per_gpu(self, ids: pd.Index) -> np.ndarray:
        rows = self.position[ids].to_numpy()
        return self.tokens_per_gpu[rows] / predict_step(self.feats[rows], self.coefficients)


# The search -------------------------------------------------------------------------------------

Oracle = Callable[[pd.Index], pd.DataFrame]
OUTCOME_COLUMNS: Final = ("status", "tokens_per_s_per_gpu", "gpu_hours")


def table_oracle(outcomes: pd.DataFrame) -> Oracle:
    """An oracle that answers from a table of known outcomes (a replay)."""
    return lambda ids: outcomes.loc[ids]


def search(candidates: pd.DataFrame, oracle: pd.DataFrame | Oracle, strategy: str,
           workloads: Mapping[str, Workload], prior: Coefficients = Coefficients(),
           params: Params = Params(), held: pd.Index | None = None,
           replan: Replan | None = None) -> Search:
    """Run `strategy` over `candidates`, asking `oracle` for the outcomes of each round.

    The oracle is a table indexed like the candidates (a replay), or a callable that runs the
    candidate ids it is given and returns their outcomes (a live sweep): columns status
    (completed, oom, failed), tokens_per_s_per_gpu and gpu_hours, indexed by candidate id.

    `held`: candidates the plan does not keep yet (pruned by a rule a re-plan may revise, such
    as the memory rule under self-calibration); `replan`, called once before the first round
    and after every round, says which candidates the plan keeps now. An untried candidate it no
    longer keeps is held back; a held one it keeps joins the search (the exhaustive strategy
    then runs another round).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    if isinstance(oracle, pd.DataFrame):
        missing = sorted(set(OUTCOME_COLUMNS) - set(oracle))
        if missing:
            raise ValueError(f"outcomes lack column(s) {missing}")
        if not candidates.index.equals(oracle.index):
            raise ValueError("outcomes must be indexed like the candidates")
        oracle = table_oracle(oracle)
    memory = pd.concat([memory_components(g, workloads[str(m)])
                        for m, g in candidates.groupby("model", sort=False)]).loc[candidates.index]
    state = _State(candidates, oracle, OomRules(candidates, memory, params.heuristic_skips),
                   params, held, replan)
    state.replanned(0)
    if strategy == "exhaustive":
        round_no = 0
        while len(state.untried) and round_no < params.max_rounds:
            round_no += 1
            state.launch(state.untried, round_no)
        return state.result(strategy, round_no)
    if strategy == "pruned":
        return _pruned(state)
    if strategy == "shortlist":
        if params.top < 1:
            raise ValueError(f"shortlist: top must be at least 1, got {params.top}")
        return _shortlist(state, _ranking(candidates, workloads, prior), prior)
    return _adaptive(state, Predictor(candidates, workloads, prior))


class _State:
    def __init__(self, candidates: pd.DataFrame, oracle: Oracle, rules: OomRules,
                 params: Params, held: pd.Index | None = None,
                 replan: Replan | None = None) -> None:
        self.candidates, self.oracle, self.rules, self.params = candidates, oracle, rules, params
        self.cells = cell_keys(candidates)
        self.held: dict[int, str] = {int(c): "held back by the plan" for c in
                                     (held if held is not None else [])}
        self.untried = pd.Index(candidates.index).difference(pd.Index(list(self.held)))
        self.considered = set(self.untried)
        self.replan = replan
        self.coefficients: Coefficients | None = None  # what the next round's picks are made with
        self.launched: list[dict] = []
        self.known = pd.DataFrame(columns=list(OUTCOME_COLUMNS))
        self.skipped: dict[int, str] = {}

    def replanned(self, round_no: int) -> None:
        """Ask the re-plan which candidates the plan keeps now: release the held ones it keeps,
        hold back the untried ones it no longer keeps (a skip by an OOM stays a skip)."""
        if self.replan is None:
            return
        verdict = self.replan(self.known, round_no, self.coefficients)
        eligible = set(int(c) for c in verdict.eligible)
        released = [c for c in self.held if c in eligible]
        dropped = [int(c) for c in self.untried if int(c) not in eligible]
        for c in released:
            del self.held[c]
        for c in dropped:
            self.held[c] = verdict.reason
        self.considered.update(released)
        self.untried = self.untried.difference(pd.Index(dropped)).union(pd.Index(released))

    def eligible_sizes(self) -> pd.Series:
        """Candidates per cell that the plan keeps or has run (what a cell's floor is a share of)."""
        return self.cells[self.cells.index.difference(pd.Index(list(self.held)))].value_counts()

    def launch(self, ids: pd.Index, round_no: int) -> pd.DataFrame:
        ids = pd.Index(ids)
        self.untried = self.untried.difference(ids)
        got = self.oracle(ids)
        missing = sorted(set(OUTCOME_COLUMNS) - set(got))
        if missing or not got.index.sort_values().equals(ids.sort_values()):
            raise ValueError(f"the oracle must return {list(OUTCOME_COLUMNS)} for exactly the "
                             f"candidates it was given (missing columns: {missing})")
        got = got.loc[ids, list(OUTCOME_COLUMNS)]
        self.known = got if self.known.empty else pd.concat([self.known, got])
        ooms = got.index[got.status == "oom"]
        failed = got.index[got.status == "failed"] if self.params.failed_is_oom else ids[:0]
        for c in ids:
            self.launched.append({"candidate": c, "round": round_no})
        for oom, proof in [(c, True) for c in ooms] + [(c, False) for c in failed]:
            for c, reason in self.rules.skipped_by(oom, self.untried, proof).items():
                self.skipped.setdefault(c, reason)
        self.untried = self.untried.difference(pd.Index(list(self.skipped)))
        self.replanned(round_no)
        return got

    def result(self, strategy: str, rounds: int, coeffs: Coefficients | None = None,
               remaining_reason: str = "") -> Search:
        for c in self.untried:
            self.skipped.setdefault(int(c), remaining_reason or "not reached")
        for c, reason in self.held.items():  # kept once, then held back by a re-plan
            if c in self.considered:
                self.skipped.setdefault(c, reason)
        launched = pd.DataFrame(self.launched, columns=["candidate", "round"])
        launched = launched.join(self.candidates[list(CELL)], on="candidate")
        launched = launched.join(self.known, on="candidate")
        skipped = pd.DataFrame(sorted(self.skipped.items()), columns=["candidate", "reason"])
        skipped = skipped.join(self.candidates[list(CELL)], on="candidate")
        considered = pd.Index(sorted(self.considered), dtype=self.candidates.index.dtype)
        return Search(strategy, launched, skipped, coeffs, rounds, considered=considered)


def _pruned(state: _State) -> Search:
    """Each round, the smallest untried micro-batch of every layout."""
    layouts = layout_keys(state.candidates)
    round_no = 0
    while len(state.untried) and round_no < state.params.max_rounds:
        round_no += 1
        frame = state.candidates.loc[state.untried]
        first = frame.assign(_l=layouts[state.untried]).sort_values("mbs").groupby("_l").head(1)
        state.launch(first.index, round_no)
    return state.result("pruned", round_no)


def _ranking(candidates: pd.DataFrame, workloads: Mapping[str, Workload],
             prior: Coefficients) -> pd.Series:
    """Predicted tokens/s/GPU per candidate: the plan's own prediction (`PLAN_PREDICTION`) where
    the candidate carries one, else the prior's, computed only for those."""
    planned = (pd.to_numeric(candidates[PLAN_PREDICTION], errors="coerce").astype(float)
               if PLAN_PREDICTION in candidates
               else pd.Series(np.nan, index=candidates.index, dtype=float))
    missing = candidates[planned.isna()]
    for model, group in missing.groupby("model", sort=False):
        planned[group.index] = predict(group, workloads[str(model)],
                                       prior)["pred_tokens_per_s_per_gpu"]
    return planned


def _shortlist(state: _State, predicted: pd.Series, prior: Coefficients) -> Search:
    """Each round, per cell, the `top` best `predicted` candidates that may still complete (the
    untried ones the plan keeps, and the completed runs), and launch the untried among them; a
    run that ran out of memory or failed so drops out and gives its place to the next (an OOM
    also skips what it proves cannot fit), and a candidate a re-plan releases takes its place in
    the ranking. The ranking is fixed before the first round (`_ranking`)."""
    top = state.params.top
    round_no = 0
    while len(state.untried) and round_no < state.params.max_rounds:
        completed = state.known.index[state.known.status == "completed"]
        standing = state.untried.union(completed)
        batch: list[int] = []
        for _, ids in standing.groupby(state.cells[standing].to_numpy()).items():
            batch += [c for c in predicted[ids].nlargest(top).index if c in state.untried]
        if not batch:
            break
        round_no += 1
        state.launch(pd.Index(batch), round_no)
    return state.result("shortlist", round_no, prior,
                        f"shortlist: {top} runs predicted faster completed in its cell")


def _adaptive(state: _State, model: Predictor) -> Search:
    p = state.params
    cols = [c for c in FAMILY if c in state.candidates]
    family = state.cells + "|" + joined_key(state.candidates, cols)
    closed: dict[str, int] = {}
    bound: dict[str, float] = {}
    forced: dict[str, int] = {}
    round_no = 0
    while round_no < p.max_rounds:
        done = pd.Index([r["candidate"] for r in state.launched])
        ok = state.known[state.known.status == "completed"]
        state.coefficients = model.coefficients
        sizes = state.eligible_sizes()
        open_untried = state.untried[~state.cells[state.untried].isin(closed).to_numpy()]
        if not len(open_untried):
            break
        estimate, optimistic = _estimates(state, model, ok, open_untried, family)
        tried = set(family[done])
        batch: list[int] = []
        for cell, ids in open_untried.groupby(state.cells[open_untried].to_numpy()).items():
            measured = ok.tokens_per_s_per_gpu[(state.cells[ok.index] == cell).to_numpy()]
            # The floor counts measurements, not launches: the rescaling and the band stand on
            # measured runs, and a launch that ran out of memory at its first step measured
            # nothing (docs/search.md, "Sweep economy": the charts table's cell this closed short).
            needed = min(p.min_cell_runs, max(3, int(np.ceil(p.min_cell_frac * sizes[cell]))))
            band_closes = bool(len(measured)) and bool(
                optimistic[ids].max() <= measured.max() * (1 + p.epsilon))
            if band_closes and len(measured) >= needed:
                closed[str(cell)] = round_no
                bound[str(cell)] = max(0.0, 1.0 - measured.max() / optimistic[ids].max())
                continue
            picks = list(estimate[ids].nlargest(max(p.k - 1, 1)).index)
            fresh = ids[~family[ids].isin(tried).to_numpy()].difference(pd.Index(picks))
            rest = ids.difference(pd.Index(picks))
            if len(fresh):  # explore: the best of a (tp, pp, ZeRO) family not yet run
                picks.append(estimate[fresh].idxmax())
            elif len(rest) and p.k > 1:
                picks.append(estimate[rest].idxmax())
            if band_closes:  # only the floor keeps this cell open
                forced[str(cell)] = forced.get(str(cell), 0) + len(picks)
            batch += picks
        if not batch:
            break
        round_no += 1
        state.launch(pd.Index(batch), round_no)
    result = state.result("adaptive", round_no, model.coefficients,
                          "adaptive: cell closed, its prediction cannot beat the best run by ε")
    left = set(state.cells[state.untried])
    for cell in set(state.cells) - set(closed):
        bound[str(cell)] = np.nan if cell in left else 0.0  # ran out of candidates: nothing left
    result.closed_at, result.regret_bound, result.forced = closed, bound, forced
    return result


def _estimates(state: _State, model: Predictor, ok: pd.DataFrame, ids: pd.Index,
               family: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Corrected and optimistic tokens/s/GPU of untried candidates.

    Runs launched together share a fabric's mood (the playbook's ZeRO-0 runs on 8 nodes ran 4×
    slower than their ZeRO-1 twins), so the model's prediction is rescaled by the median
    log(measured/predicted) of the most specific group with measurements: the candidate's
    (tp, pp, ZeRO) family, else its cell. Optimism adds the larger of the cell's and the sweep's
    `quantile` of deviations from those medians, at least `min_margin`; a cell with no
    completed run is unbounded.
    """
    p = state.params
    predicted = pd.Series(model.tokens_per_s_per_gpu(ids), index=ids)
    if not len(ok):
        return predicted, pd.Series(np.inf, index=ids)
    ratio = pd.Series(np.log(ok.tokens_per_s_per_gpu.to_numpy(float)
                             / model.tokens_per_s_per_gpu(ok.index)), index=ok.index)
    cell_of, family_of = state.cells[ok.index].to_numpy(), family[ok.index].to_numpy()
    cell_median = ratio.groupby(cell_of).median()
    family_stats = ratio.groupby(family_of).agg(["median", "size"])
    family_median = family_stats["median"][family_stats["size"] >= 2]
    group_median = pd.Series(family_of, index=ok.index).map(family_median)
    group_median = group_median.fillna(pd.Series(cell_of, index=ok.index).map(cell_median))
    cells = state.cells[ids]
    by_family = family[ids].map(family_median)
    shift = by_family.fillna(cells.map(cell_median))
    # The band is the spread around the median the estimate was rescaled by: a candidate whose
    # family ran is off by what runs deviate from their family's median; one whose family has
    # not run is off by what runs deviate from their cell's median, which also holds how far a
    # whole family's bias strays from the cell's.
    within = _band(ratio - group_median, cell_of, cells, p)
    across = _band(ratio - pd.Series(cell_of, index=ok.index).map(cell_median), cell_of, cells, p)
    margin = np.where(by_family.isna().to_numpy(), across, within)
    estimate = predicted * np.exp(shift.fillna(0.0).to_numpy())
    optimistic = pd.Series(np.where(shift.isna(), np.inf, estimate * np.exp(margin)), index=ids)
    return estimate, optimistic


def _band(deviation: pd.Series, cell_of: np.ndarray, cells: pd.Series, p: Params) -> np.ndarray:
    """Per candidate, the larger of its cell's and the sweep's `quantile` of `deviation`, at
    least `min_margin` (infinite in a cell with no completed run)."""
    pooled = float(np.quantile(deviation, p.quantile))
    own = deviation.groupby(cell_of).quantile(p.quantile)
    return np.maximum(cells.map(own).fillna(np.inf).to_numpy(), max(pooled, p.min_margin))


__all__ = ["FAMILY", "OUTCOME_COLUMNS", "PLAN_PREDICTION", "STRATEGIES", "Oracle", "Params",
           "Predictor", "Replan", "Replanned", "Search", "search", "table_oracle"]
