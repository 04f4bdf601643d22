"""What the report's figures and tables call things: the hardware, the unit of a run's share of
the work, the ranked figure and its FLOPs convention, as the runs actually have them.

A CPU sweep (runs.parquet `gpu` = "cpu") has ranks, not GPUs: its axes, titles and table
headers say "CPU" and "rank". MFU there divides by a peak measured on the machine
(`peak_flops_source` "measured:…"), not a datasheet figure, and the report says so. Under the
`reported` convention the figure is whatever each run reported; the labels name the basis the
runs give (`mfu_reported_convention`), so a title never names a convention other than the one
computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from analysis.best import ranking_column

MEASURED_PREFIX = "measured:"


@dataclass(frozen=True)
class Labels:
    """The words of one report. `unit` is what a node holds ("GPU" or "rank"), `hardware` the
    device as a title names it ("CPU", a GPU name, or "" when unknown), `reported_as` the bases
    of the reported MFU ("full_attention", "published", …), `measured_peaks` the sources of
    measured peaks that MFU divides by, `per_node` the GPUs (ranks) of a node when the runs
    agree on one number."""

    metric: str = "mfu"
    convention: str = "reported"
    cpu: bool = False
    hardware: str = ""
    reported_as: tuple[str, ...] = ()
    measured_peaks: tuple[str, ...] = ()
    per_node: int | None = None

    @property
    def unit(self) -> str:
        return "rank" if self.cpu else "GPU"

    @property
    def convention_name(self) -> str:
        """The convention as computed: `reported` names the runs' own basis when they give one."""
        if self.convention != "reported":
            return self.convention
        return f"as reported: {', '.join(self.reported_as)}" if self.reported_as else "as reported"

    def describe(self) -> str:
        """The ranked figure in words, for titles ("MFU (full_attention)", "tokens/s per rank")."""
        if self.metric == "tokens_per_sec_per_gpu":
            return f"tokens/s per {self.unit}"
        return f"MFU ({self.convention_name})"

    def value_label(self, metric: str | None = None) -> str:
        """Axis and colour-bar label of `metric` (default: the ranked one), with unit and
        convention. MFU is shown in percent wherever a figure shows it."""
        if (metric or self.metric) == "tokens_per_sec_per_gpu":
            return f"Tokens/s per {self.unit}"
        return f"MFU (%), {self.convention_name}"

    def nodes_label(self) -> str:
        """The node axis: nodes, and what each holds."""
        if self.per_node is None:
            return "Nodes" + (" (CPU)" if self.cpu else "")
        unit = self.unit + ("s" if self.per_node != 1 else "")
        return f"Nodes ({self.per_node} {unit} each" + (", CPU)" if self.cpu else ")")

    def on(self) -> str:
        """" on CPU" / " on H100" / "": where the runs ran, for a title."""
        return f" on {self.hardware}" if self.hardware else ""

    def peak_note(self, most: int | None = None) -> str | None:
        """What MFU divides by, when a reader could mistake it for a datasheet figure; `most`
        sources named (a figure's note), the others counted."""
        if self.metric != "mfu" or not self.measured_peaks:
            return None
        device = "CPU" if self.cpu else "device"
        named = self.measured_peaks[:most] if most else self.measured_peaks
        more = len(self.measured_peaks) - len(named)
        return (f"MFU divides by a measured {device} peak, not a datasheet figure "
                f"({'; '.join(named)}{f'; {more} more in the report' if more else ''}).")


def labels_for(runs: pd.DataFrame, metric: str, convention: str) -> Labels:
    """The labels of a report on `runs` ranked by `metric` under `convention`. The bases and
    peaks are those of the runs that have the ranked figure (all runs when none has it)."""
    devices = sorted({str(g) for g in runs["gpu"].dropna().unique()})
    cpu = bool(devices) and all(d.lower() == "cpu" for d in devices)
    column = ranking_column(metric, convention)
    ranked = runs[(runs["outcome"] == "completed") & runs[column].notna()]
    reported = ranked["mfu_reported_convention"].dropna() if convention == "reported" else []
    sources = (ranked if not ranked.empty else runs)["peak_flops_source"].dropna().astype(str)
    return Labels(
        metric=metric, convention=convention, cpu=cpu,
        hardware="CPU" if cpu else ", ".join(devices),
        reported_as=tuple(sorted({str(r) for r in reported})),
        measured_peaks=tuple(sorted({s for s in sources if s.startswith(MEASURED_PREFIX)})),
        per_node=_single(runs["gpus_per_node"]))


def labels_of(best: pd.DataFrame) -> Labels:
    """Labels from a best_configs frame alone (GPUs, the frame's metric and convention): for
    figures drawn without the runs."""
    if best.empty or "metric" not in best.columns:
        return Labels()
    placed = best.dropna(subset=["world_size"]) if "world_size" in best.columns else best.iloc[0:0]
    per_node = pd.Series([int(w) // int(n) for w, n in zip(placed["world_size"], placed["nodes"])
                          if int(n) > 0], dtype="float64")
    return Labels(metric=str(best["metric"].iloc[0]), convention=str(best["convention"].iloc[0]),
                  per_node=_single(per_node))


def _single(values: pd.Series) -> int | None:
    """The one value of `values` (ignoring nulls), or None when there are none or several."""
    distinct = {int(v) for v in values.dropna().unique()}
    return distinct.pop() if len(distinct) == 1 else None
