"""The throughput model applied to a plan: each candidate's predicted step time, tokens/s per GPU
and MFU, the workload of each of a spec's models, and the prior a spec's plan starts from.

This is the throughput model's interface to the rest of llm-sweep (`sweep.models.throughput` is
its arithmetic; `sweep.calibration.throughput_fit` fits its coefficients). Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

import pandas as pd

from sweep.core import catalog
from sweep.core.model import count_parameters
from sweep.models.throughput import (
    Coefficients,
    predict,
)
from sweep.models.throughput_inputs import Workload
from sweep.plan import space
from sweep.plan.spec import Spec


def workloads_for(spec: Spec) -> dict[str, Workload]:
    """One throughput-model workload per model of the spec, by model name."""
    from sweep.frameworks import get_adapter
    from sweep.models.traffic import traffic_for

    adapter = get_adapter(spec.framework)
    return {shape.name: Workload(shape, spec.seq_len, spec.gpu_spec, spec.dtype,
                                 spec.gpus_per_node_resolved, adapter.grad_reduce_bytes,
                                 stage_split=spec.memory_profile.stage_split,
                                 traffic=traffic_for(adapter.kernels))
            for shape in spec.model_shapes}


def model_names_for(spec: Spec, labels: list[str]) -> dict[str, str]:
    """Map the model labels of a runs table (catalog names or aliases such as the playbook's
    `1B`) to the spec's model names; labels that name no model of the spec are left out."""
    names = {shape.name for shape in spec.model_shapes}
    out = {}
    for label in labels:
        if label in names:
            out[label] = label
            continue
        try:
            canonical = catalog.get_model(label).name
        except catalog.CatalogError:
            continue
        if canonical in names:
            out[label] = canonical
    return out


def predict_plan(plan: pd.DataFrame, spec: Spec, coeffs: Coefficients = Coefficients()
                 ) -> pd.DataFrame:
    """Predicted step time, tokens/s/GPU and MFU for every row of a plan (`sweep.plan.space.plan`),
    indexed like the plan; what `sweep plan` shows beside each kept candidate."""
    workloads = workloads_for(spec)
    unknown = sorted(set(plan["model"].astype(str)) - set(workloads))
    if unknown:
        raise ValueError(f"plan rows name model(s) {unknown} that the spec does not have")
    parts = [predict(group, workloads[str(name)], coeffs)[
                 ["pred_step_time_s", "pred_tokens_per_s_per_gpu", "pred_mfu"]]
             for name, group in plan.groupby(plan["model"].astype(str), sort=False)]
    if not parts:
        return pd.DataFrame(columns=["pred_step_time_s", "pred_tokens_per_s_per_gpu", "pred_mfu"])
    return pd.concat(parts).reindex(plan.index)


def _fit_applies(spec: Spec) -> bool:
    """Whether the committed fit (sweep/models/fitted_throughput.py) was measured on this framework
    and GPU."""
    from sweep.models import fitted_throughput

    return (spec.framework, spec.gpu) == (fitted_throughput.FRAMEWORK, fitted_throughput.GPU)


def default_prior(spec: Spec) -> Coefficients:
    """The coefficients a plan predicts with when nobody calibrated them: the fit to nanotron's
    published H100 runs (sweep/models/fitted_throughput.py) for a nanotron sweep on that GPU, where it
    was measured; the physical prior elsewhere. `sweep.validation.throughput_reference` says why."""
    from sweep.models import fitted_throughput

    if _fit_applies(spec):
        return Coefficients.from_dict(dict(fitted_throughput.COEFFICIENTS))
    return Coefficients()


def describe_default_prior(spec: Spec) -> str:
    """What `default_prior` gives this spec, and what it is worth, for `sweep plan` to say."""
    from sweep.models import fitted_throughput

    if not _fit_applies(spec):
        return ("the physical prior (not fitted to any run; `sweep calibrate` or `sweep plan "
                "--calibrate-from` fit it)")
    left_out = fitted_throughput.PROVENANCE["left_out_model"]
    medians = sorted(float(f["median_abs_error"]) for f in left_out.values())
    text = (f"the fit to {fitted_throughput.FRAMEWORK}'s published {fitted_throughput.GPU} runs "
            f"(sweep/models/fitted_throughput.py; median error {medians[0]:.1%}-{medians[-1]:.1%} on a "
            "model it was not fitted on; `sweep plan --calibrate-from` calibrates it)")
    fitted = [count_parameters(catalog.get_model(m)).total for m in left_out]
    low, high = min(fitted), max(fitted)
    sizes = {m.name: count_parameters(m).total for m in spec.model_shapes}
    beyond = [f"{name} ({_billions(size)})" for name, size in sizes.items()
              if not low / EXTRAPOLATION <= size <= high * EXTRAPOLATION]
    if beyond:
        text += (f"; it was fitted on models of {_billions(low)}-{_billions(high)} parameters, so "
                 f"{', '.join(beyond)} extrapolate{'s' if len(beyond) == 1 else ''}: expect a "
                 "larger error there (docs/validation.md, 'Models no fit saw')")
    return text


# How far outside the fitted model sizes `describe_default_prior` still stays quiet: the 3B,
# between the fitted 1B and 8B, was predicted within 12 % (median 5.2 %, `sweep.validation.unseen_models`).
EXTRAPOLATION: Final = 1.5


def _billions(parameters: float) -> str:
    return f"{parameters / 1e9:.1f}B"


PREDICTIONS: Final = ("pred_step_time_s", "pred_tokens_per_s_per_gpu", "pred_mfu")


def with_predictions(frame: pd.DataFrame, spec: Spec, coefficients: Coefficients
                     ) -> pd.DataFrame:
    """The plan with the throughput model's step time, tokens/s/GPU and MFU on every kept row
    (NaN on pruned rows, and MFU on a device without a catalogue peak), and `pred_rank`: the
    row's place in its (model, nodes) cell by predicted tokens/s/GPU, 1 the fastest (the order
    the shortlist search runs them in; ties in plan order; missing on pruned rows)."""
    kept = frame["status"] == space.KEPT
    predicted = predict_plan(frame[kept], spec, coefficients)
    out = frame.assign(**{name: predicted[name].reindex(frame.index).astype("float64")
                          for name in PREDICTIONS})
    rank = predicted["pred_tokens_per_s_per_gpu"].groupby(
        [frame.loc[kept, "model"].astype(str), frame.loc[kept, "nodes"]]).rank(
            method="first", ascending=False)
    return out.assign(pred_rank=rank.reindex(frame.index).astype("Int64"))


__all__ = ["default_prior", "describe_default_prior", "model_names_for", "predict_plan", "with_predictions", "workloads_for"]
