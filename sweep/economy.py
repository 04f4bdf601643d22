"""Search strategies that find each cell's best configuration without running every candidate.

A *cell* is one (model, nodes) pair; its *candidates* are plan rows. A strategy asks an oracle
for outcomes in rounds and records every candidate it did not run, with the reason:

- ``exhaustive``: everything, in one round.
- ``pruned``: ascending micro-batch per layout, with OOM-monotonic skipping. A skip is either a
  *proof* (``pruned:``) or a *heuristic* (``heuristic:``), and says which. The proof: a candidate
  that differs from an OOMed one only in settings that can only add memory (a larger micro-batch,
  a lower ZeRO stage, less recomputation, no sequence parallelism; same dp, tp, pp, cp, ep and
  schedule) cannot fit either. Comparing *different* layouts needs a memory model, and the proxy
  below is not exact (replaying nanotron's results table it skipped 22 runs that completed: high
  TP shards less of the activations than it assumes), so that rule is a heuristic, off unless
  asked for (`Params.heuristic_skips`), as is treating an unclassified failure as an OOM.
- ``adaptive``: rounds per open cell of the k − 1 best predicted candidates plus the best of a
  (tp, pp, ZeRO) family not yet run. After each round the throughput model is refitted on every
  completed run, and predictions are rescaled by the median measured/predicted ratio of the
  candidate's family (else its cell). Each untried candidate gets an optimistic throughput: its
  rescaled prediction times the `quantile` of the sweep's own residuals so far (the cell's, or
  the sweep's if larger, at least `min_margin`), so a cell where the model is wrong widens its
  band. A cell closes when no optimistic throughput beats its best measured run by more than ε,
  once it has run a floor of min(min_cell_runs, min_cell_frac of its candidates, at least 3).
  What the search records per cell: the regret bound at closing (1 − best / the highest
  optimistic throughput left untried) and how many launches the floor forced (the band alone
  would have closed the cell). The OOM rules of ``pruned`` apply too.
- ``shortlist``: per cell, the `top` candidates predicted fastest (the plan's own prediction,
  `PLAN_PREDICTION`, where the candidates carry it; else the prior's), and for each of them
  that ran out of memory or failed, the next: rounds go on until every cell has `top`
  completed runs or nothing left to try. No refit and no closing band: it bets on the model's
  *ranking* within a cell, which holds where its absolute error does not (replaying the
  playbook, a model fitted on one size predicts the other's throughput 20 % off, yet ranks the
  cell's best among its few fastest). What it costs and what it finds is measured, left out,
  by `sweep replay --cv model --strategy shortlist`; `top` is chosen the same way.

The oracle is a table of outcomes (`sweep replay` of a published sweep) or a callable that runs a
batch and returns its outcomes (a live sweep), so the same code does both. Pure: no I/O of its
own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import pandas as pd

from sweep.calibrate import fit_matrix
from sweep.throughput import Coefficients, Workload, features, tokens_per_step

STRATEGIES: Final = ("exhaustive", "pruned", "adaptive", "shortlist")
CELL: Final = ("model", "nodes")
# Columns that define a layout apart from the micro-batch split of the global batch.
LAYOUT_KEY: Final = ("dp", "tp", "pp", "cp", "ep", "zero_stage", "recompute", "sp")
# What the OOM proof holds fixed: the parallel layout and the schedule. Everything else a
# candidate may differ in has a memory order (`memory_order`).
PROOF_BASE: Final = ("dp", "tp", "pp", "cp", "ep", "pp_schedule", "vpp")
FAMILY: Final = ("tp", "pp", "zero_stage")  # what adaptive exploration spreads over
PROOF: Final = "pruned:"  # a skip that an OOM proves
HEURISTIC: Final = "heuristic:"  # a skip that a proxy or a guess suggests
# The plan's predicted throughput of a candidate (`sweep.calibrate.with_predictions`).
PLAN_PREDICTION: Final = "pred_tokens_per_s_per_gpu"
# The planner's per-component estimate (`sweep.memory`), when the candidates carry it.
PLANNER_MEMORY: Final = tuple(f"mem_{c}_bytes" for c in ("weights", "gradients", "optimizer",
                                                         "activations", "logits"))


@dataclass(frozen=True)
class Params:
    """Knobs of the strategies. The adaptive floor and band (`min_cell_runs`, `quantile`) and the
    shortlist's `top` are not tuned by hand: they are what
    `sweep.cross_validation.default_settings` picks on the playbook's charts table
    (tests/test_cross_validation.py reproduces them), and `sweep replay --cv model` picks them
    again without the model it reports on."""

    k: int = 4                 # candidates per open cell per round
    epsilon: float = 0.02      # close a cell when nothing can beat its best by more than this
    quantile: float = 1.0      # optimism: this quantile of the cell's log(measured/predicted)
    min_margin: float = 0.05   # ... but never less optimistic than this
    max_rounds: int = 200
    min_fit_runs: int = 8      # completed runs before the model is refitted
    min_cell_runs: int = 16    # runs launched in a cell before it may close ...
    min_cell_frac: float = 0.25  # ... or this share of its candidates, if smaller (at least 3)
    fit_iterations: int = 800
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


# Memory dominance -------------------------------------------------------------------------------

def memory_components(frame: pd.DataFrame, work: Workload) -> pd.DataFrame:
    """Per-GPU memory by component, in relative units, for the dominance rule.

    Uses the planner's `mem_<component>_bytes` columns when present; otherwise monotone proxies:
    model states (weights + fp32 gradients + Adam, ZeRO-sharded), activations in flight on the
    first stage, and logits on the last. Only their ordering matters: "needs more on every
    component".
    """
    if all(c in frame for c in PLANNER_MEMORY):
        return frame[list(PLANNER_MEMORY)].astype(float)
    shape, s = work.shape, work.seq_len
    dp, tp, pp, mbs, m = (frame[c].to_numpy(float) for c in ("dp", "tp", "pp", "mbs", "grad_acc"))
    cp = frame["cp"].to_numpy(float) if "cp" in frame else np.ones(len(frame))
    zero = frame["zero_stage"].to_numpy(int)
    layers = np.ceil(shape.num_layers / pp)
    per_layer = 12 * shape.hidden_size**2 + 3 * shape.hidden_size * shape.ffn_hidden_size
    params = (layers * per_layer + shape.vocab_size * shape.hidden_size) / tp
    states = params * (2 + np.where(zero >= 2, 4 / dp, 4) + np.where(zero >= 1, 12 / dp, 12))
    in_flight = np.minimum(pp, m)
    activations = mbs * s / cp * shape.hidden_size * layers * in_flight / tp
    logits = mbs * s / cp * shape.vocab_size / tp
    return pd.DataFrame({"mem_states": states, "mem_activations": activations,
                         "mem_logits": logits}, index=frame.index)


def _layout_keys(frame: pd.DataFrame) -> pd.Series:
    cols = [c for c in LAYOUT_KEY if c in frame]
    return frame[list(CELL) + cols].astype(str).agg("|".join, axis=1)


# Least memory first: recomputing more keeps fewer activations; sequence parallelism shards what
# TP alone replicates (norms, dropout); a higher ZeRO stage shards more states.
RECOMPUTE_MEMORY: Final = {"full": 0, "selective": 1, "none": 2}


def memory_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Per candidate, the settings that can only add memory when they grow, all other things
    equal: micro-batch size, sequences in flight on the first pipeline stage (min(pp, m)·mbs
    under 1F1B; a table may hold runs of another global batch), −ZeRO stage, less
    recomputation, sequence parallelism off."""
    n = len(frame)
    recompute = frame["recompute"].astype(str) if "recompute" in frame else pd.Series(
        "none", index=frame.index)
    sp = frame["sp"].astype(bool) if "sp" in frame else pd.Series(True, index=frame.index)
    return pd.DataFrame({
        "mbs": frame["mbs"].to_numpy(float),
        "in_flight": (np.minimum(frame["pp"].to_numpy(float), frame["grad_acc"].to_numpy(float))
                      * frame["mbs"].to_numpy(float)),
        "zero": -frame["zero_stage"].to_numpy(float),
        "recompute": recompute.map(RECOMPUTE_MEMORY).fillna(2).to_numpy(float),
        "no_sp": (~sp).to_numpy(float) if n else np.zeros(0),
    }, index=frame.index)


class OomRules:
    """Skip what an observed OOM rules out.

    The proof (``pruned:oom_monotonic``): same cell, same dp, tp, pp, cp, ep and schedule, and at
    least as much of every setting in `memory_order`. Per GPU, weights, gradients and optimizer
    states then stay or grow (ZeRO shards less), and so do activations: a micro-batch holds more
    sequences and the first stage at least as many in flight (min(pp, m)·mbs, also compared, as
    a table may mix global batches). Tested against every shared table's real outcomes, not
    against a model of them. The heuristic (``heuristic:oom_dominated``, only with `dominance`):
    another layout of the cell that the memory proxy says needs more on every component.
    """

    def __init__(self, candidates: pd.DataFrame, memory: pd.DataFrame,
                 dominance: bool = False) -> None:
        base = [c for c in PROOF_BASE if c in candidates]
        self.base = candidates[list(CELL) + base].astype(str).agg("|".join, axis=1)
        self.order = memory_order(candidates)
        self.mbs = candidates["mbs"]
        self.cells = candidates[list(CELL)].astype(str).agg("|".join, axis=1)
        self.memory = memory
        self.dominance = dominance

    def skipped_by(self, oom: int, untried: pd.Index, proof: bool = True) -> dict[int, str]:
        """Untried candidates that candidate `oom` (an OOM, or with `proof` false a failure
        treated as one) rules out, with the reason."""
        out: dict[int, str] = {}
        prefix = PROOF if proof else HEURISTIC
        what = "OOMed" if proof else "failed (taken for an OOM)"
        same = untried[(self.base[untried] == self.base[oom]).to_numpy()]
        if len(same):
            more = (self.order.loc[same] >= self.order.loc[oom].to_numpy()).all(axis=1)
            for c in same[more.to_numpy()]:
                out[int(c)] = (f"{prefix}oom_monotonic (run {oom} {what} at mbs "
                               f"{self.mbs[oom]}; same layout, no less memory)")
        if not self.dominance:
            return out
        cell = untried[(self.cells[untried] == self.cells[oom]).to_numpy()]
        if len(cell):
            dominated = (self.memory.loc[cell] >= self.memory.loc[oom].to_numpy()).all(axis=1)
            for c in cell[dominated.to_numpy()]:
                out.setdefault(int(c), f"{HEURISTIC}oom_dominated (the memory proxy says it "
                                       f"needs more than run {oom} on every component)")
        return out


# Predictions ------------------------------------------------------------------------------------

class Predictor:
    """The throughput model over a fixed candidate set, refittable on measured runs."""

    GRID: Final = (0.0, 0.5, 1.0, 1.5, 2.0)

    def __init__(self, candidates: pd.DataFrame, workloads: Mapping[str, Workload],
                 prior: Coefficients, iterations: int) -> None:
        self.prior, self.iterations = prior, iterations
        grid = sorted(set(self.GRID) | {prior.inter_scaling})
        self.feats: dict[float, np.ndarray] = {}
        for gamma in grid:
            parts = [features(group, workloads[str(model)], gamma).reindex(group.index)
                     for model, group in candidates.groupby("model", sort=False)]
            self.feats[gamma] = pd.concat(parts).reindex(candidates.index).to_numpy()
        tokens = pd.concat([pd.Series(tokens_per_step(g, workloads[str(m)]), index=g.index)
                            for m, g in candidates.groupby("model", sort=False)])
        gpus = candidates.dp * candidates.tp * candidates.pp
        gpus = gpus * candidates.get("cp", 1) * candidates.get("ep", 1)
        self.tokens_per_gpu = (tokens.reindex(candidates.index) / gpus).to_numpy(float)
        self.position = pd.Series(np.arange(len(candidates)), index=candidates.index)
        self.coefficients = prior

    def tokens_per_s_per_gpu(self, ids: pd.Index) -> np.ndarray:
        rows = self.position[ids].to_numpy()
        step = self.feats[self.coefficients.inter_scaling][rows] @ self.coefficients.vector()
        return self.tokens_per_gpu[rows] / step

    def refit(self, ids: pd.Index, measured_tps: np.ndarray) -> None:
        rows = self.position[ids].to_numpy()
        step = self.tokens_per_gpu[rows] / measured_tps
        best, best_err = self.coefficients, np.inf
        for gamma, feats in self.feats.items():
            coeffs = fit_matrix(feats[rows], step, self.prior, iterations=self.iterations,
                                inter_scaling=gamma)
            err = float(np.median(np.abs(np.log(feats[rows] @ coeffs.vector() / step))))
            if err < best_err:
                best, best_err = coeffs, err
        self.coefficients = best


# The search -------------------------------------------------------------------------------------

def _cell_keys(frame: pd.DataFrame) -> pd.Series:
    return frame[list(CELL)].astype(str).agg("|".join, axis=1)


def _cell_order(frame: pd.DataFrame) -> list[str]:
    """Cell keys by model, then nodes as numbers (not as text: 2 before 16)."""
    cells = frame[list(CELL)].drop_duplicates()
    cells = cells.assign(_m=cells.model.astype(str)).sort_values(["_m", "nodes"])
    return list(_cell_keys(cells))


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
        return _shortlist(state, Predictor(candidates, workloads, prior, params.fit_iterations))
    return _adaptive(state, Predictor(candidates, workloads, prior, params.fit_iterations))


class _State:
    def __init__(self, candidates: pd.DataFrame, oracle: Oracle, rules: OomRules,
                 params: Params, held: pd.Index | None = None,
                 replan: Replan | None = None) -> None:
        self.candidates, self.oracle, self.rules, self.params = candidates, oracle, rules, params
        self.cells = _cell_keys(candidates)
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
    layouts = _layout_keys(state.candidates)
    round_no = 0
    while len(state.untried) and round_no < state.params.max_rounds:
        round_no += 1
        frame = state.candidates.loc[state.untried]
        first = frame.assign(_l=layouts[state.untried]).sort_values("mbs").groupby("_l").head(1)
        state.launch(first.index, round_no)
    return state.result("pruned", round_no)


def _shortlist(state: _State, model: Predictor) -> Search:
    """Each round, per cell, the `top` best predicted candidates that may still complete (the
    untried ones the plan keeps, and the completed runs), and launch the untried among them; a
    run that ran out of memory or failed so drops out and gives its place to the next (an OOM
    also skips what it proves cannot fit), and a candidate a re-plan releases takes its place in
    the ranking. The ranking is fixed before the first round: the plan's prediction where a
    candidate has one, else the prior's."""
    top = state.params.top
    predicted = pd.Series(model.tokens_per_s_per_gpu(state.candidates.index),
                          index=state.candidates.index)
    if PLAN_PREDICTION in state.candidates:
        planned = pd.to_numeric(state.candidates[PLAN_PREDICTION], errors="coerce")
        predicted = planned.where(planned.notna(), predicted)
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
    return state.result("shortlist", round_no, model.coefficients,
                        f"shortlist: {top} runs predicted faster completed in its cell")


def _adaptive(state: _State, model: Predictor) -> Search:
    p = state.params
    cols = [c for c in FAMILY if c in state.candidates]
    family = state.cells + "|" + state.candidates[cols].astype(str).agg("|".join, axis=1)
    closed: dict[str, int] = {}
    bound: dict[str, float] = {}
    forced: dict[str, int] = {}
    round_no = 0
    while round_no < p.max_rounds:
        done = pd.Index([r["candidate"] for r in state.launched])
        ok = state.known[state.known.status == "completed"]
        if len(ok) >= p.min_fit_runs and round_no > 0:
            model.refit(ok.index, ok.tokens_per_s_per_gpu.to_numpy(float))
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
            runs = int((state.cells[done] == cell).sum())
            needed = min(p.min_cell_runs, max(3, int(np.ceil(p.min_cell_frac * sizes[cell]))))
            band_closes = bool(len(measured)) and bool(
                optimistic[ids].max() <= measured.max() * (1 + p.epsilon))
            if band_closes and runs >= needed:
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
    deviation = ratio - group_median
    pooled = float(np.quantile(deviation, p.quantile))
    own = deviation.groupby(cell_of).quantile(p.quantile)
    cells = state.cells[ids]
    shift = family[ids].map(family_median).fillna(cells.map(cell_median))
    margin = np.maximum(cells.map(own).fillna(np.inf).to_numpy(), max(pooled, p.min_margin))
    estimate = predicted * np.exp(shift.fillna(0.0).to_numpy())
    optimistic = pd.Series(np.where(shift.isna(), np.inf, estimate * np.exp(margin)), index=ids)
    return estimate, optimistic


def progress(result: Search, candidates: pd.DataFrame) -> pd.DataFrame:
    """Per-cell progress of a search, without knowing the answer (what a live report shows):
    candidates, runs launched / completed / failed, skipped by rule, best tokens/s/GPU so far,
    rounds, and (adaptive) the round the cell closed, its regret bound then (1 − best / the
    highest optimistic throughput left untried; 0 once nothing is left) and the launches the
    floor forced."""
    cells = _cell_keys(candidates)
    launched = result.launched.assign(cell=cells[result.launched.candidate].to_numpy())
    skipped = result.skipped.assign(cell=cells[result.skipped.candidate].to_numpy(),
                                    rule=result.skipped.reason.str.replace(r" \(.*", "",
                                                                           regex=True))
    table = pd.DataFrame({"candidates": cells.groupby(cells).size()}).reindex(
        _cell_order(candidates))
    by = launched.groupby("cell")
    table["launched"] = by.size()
    table["completed"] = by.status.apply(lambda s: int((s == "completed").sum()))
    table["failed"] = table.launched - table.completed
    table["best_tokens_per_s_per_gpu"] = launched[launched.status == "completed"].groupby(
        "cell").tokens_per_s_per_gpu.max()
    table["rounds"] = by["round"].max()
    table["closed_at_round"] = pd.Series(result.closed_at, dtype="float64")
    table["regret_bound_at_close"] = pd.Series(result.regret_bound, dtype="float64")
    table["forced_by_floor"] = pd.Series(result.forced, dtype="float64")
    if len(skipped):
        table = table.join(skipped.groupby(["cell", "rule"]).size().unstack(fill_value=0)
                           .add_prefix("skipped:"))
    counts = [c for c in table if c in ("launched", "completed", "failed", "forced_by_floor")
              or c.startswith("skipped:")]
    table[counts] = table[counts].fillna(0).astype(int)
    return table


# Scoring ----------------------------------------------------------------------------------------

def score(result: Search, outcomes: pd.DataFrame, candidates: pd.DataFrame,
          published_runs: int, published_gpu_hours: float, tolerance: float = 0.02
          ) -> tuple[dict[str, float], pd.DataFrame]:
    """Headline figures against the whole published sweep, and the per-cell progress table."""
    cells = _cell_keys(candidates)
    ok = outcomes[outcomes.status == "completed"]
    truth = ok.tokens_per_s_per_gpu.groupby(cells[ok.index]).max()
    launched = result.launched.assign(cell=cells[result.launched.candidate].to_numpy())
    found = launched[launched.status == "completed"].groupby("cell").tokens_per_s_per_gpu.max()
    truth = truth.reindex([c for c in _cell_order(candidates) if c in truth.index])
    table = pd.DataFrame({"best": truth, "found": found.reindex(truth.index)})
    table["regret"] = 1 - table.found.fillna(0) / table.best
    table["within"] = table.regret <= tolerance
    table["launched"] = launched.groupby("cell").size().reindex(truth.index).fillna(0).astype(int)
    table["candidates"] = cells.groupby(cells).size().reindex(truth.index)
    table["rounds"] = launched.groupby("cell")["round"].max().reindex(truth.index)
    table["gpu_hours"] = launched.groupby("cell").gpu_hours.sum().reindex(truth.index)
    table["forced_by_floor"] = pd.Series(result.forced, dtype="float64").reindex(
        truth.index).fillna(0).astype(int)
    table["regret_bound_at_close"] = pd.Series(result.regret_bound, dtype="float64").reindex(
        truth.index)
    reasons = result.skipped.reason
    completed = outcomes.status.reindex(result.skipped.candidate).to_numpy() == "completed"
    proofs, guesses = reasons.str.startswith(PROOF), reasons.str.startswith(HEURISTIC)
    forced = float(sum(result.forced.values()))
    headline = {
        "runs_launched": float(len(launched)),
        "runs_launched_frac": len(launched) / published_runs,
        "gpu_hours": float(launched.gpu_hours.sum()),
        "gpu_hours_frac": float(launched.gpu_hours.sum() / published_gpu_hours),
        "cells_within_2pct": float(table.within.sum()),
        "cells_total": float(len(table)),
        "max_regret": float(table.regret.max()),
        "mean_regret": float(table.regret.mean()),
        "rounds": float(result.rounds),
        # Proofs: an OOM rules them out. A proof that skipped a run that completed is a bug.
        "pruned_skipped": float(proofs.sum()),
        "pruned_but_completed": float((proofs & completed).sum()),
        # Heuristics: named as such, and what they cost counted.
        "heuristic_skipped": float(guesses.sum()),
        "heuristic_but_completed": float((guesses & completed).sum()),
        "launches_forced_by_floor": forced,
        "launches_chosen_by_model": (float(len(launched)) - forced
                                     if result.strategy in ("adaptive", "shortlist") else 0.0),
    }
    return headline, table


__all__ = ["HEURISTIC", "PLANNER_MEMORY", "PROOF", "STRATEGIES", "OomRules", "Oracle", "Params",
           "Predictor", "Replan", "Replanned", "Search", "memory_components", "memory_order",
           "progress", "score", "search", "table_oracle"]
