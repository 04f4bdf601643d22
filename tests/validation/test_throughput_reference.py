"""The throughput prior of a nanotron sweep on H100: fitted on nanotron's published runs by a
script in the repo, reproduced here, and used only where it was measured."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sweep.core.state import file_sha256
from sweep.models import fitted_throughput
from sweep.models.throughput import Coefficients
from sweep.plan.predictions import default_prior
from sweep.plan.spec import Spec, load_spec
from sweep.validation import throughput_reference


@pytest.fixture(scope="module")
def playbook(repo_root: Path) -> Spec:
    return load_spec(repo_root / throughput_reference.SPEC_FILE)


def test_the_committed_coefficients_are_what_the_script_fits(refdata: Path, playbook: Spec
                                                              ) -> None:
    ref = throughput_reference.fit_reference(refdata, playbook)
    fitted = ref.coefficients.to_dict()
    assert fitted.keys() == fitted_throughput.COEFFICIENTS.keys()
    for name, value in fitted.items():
        assert math.isclose(fitted_throughput.COEFFICIENTS[name], value, rel_tol=1e-9,
                            abs_tol=1e-15), name
    committed = fitted_throughput.PROVENANCE
    data = refdata / throughput_reference.RUNS_FILE
    assert committed["data"] == {throughput_reference.RUNS_FILE: file_sha256(data)}
    assert committed["rows"] == ref.provenance["rows"] == 751
    for model, figures in ref.provenance["left_out_model"].items():
        assert committed["left_out_model"][model] == pytest.approx(figures, rel=1e-9)


def test_each_model_left_out_is_predicted_better_than_by_the_physical_prior(
        refdata: Path, playbook: Spec) -> None:
    """The figure a user with a model of their own should expect, recorded with the fit."""
    left_out = fitted_throughput.PROVENANCE["left_out_model"]
    assert set(left_out) == {"playbook-1b", "playbook-8b"}
    for figures in left_out.values():
        assert figures["median_abs_error"] < 0.25 and figures["p90_abs_error"] < 0.65


def test_only_a_nanotron_sweep_on_the_gpu_it_was_measured_on_starts_from_the_fit(
        playbook: Spec) -> None:
    fitted = Coefficients.from_dict(dict(fitted_throughput.COEFFICIENTS))
    assert default_prior(playbook) == fitted
    for other in ({"framework": "megatron"}, {"framework": "builtin"}, {"gpu": "a100-80gb"}):
        assert default_prior(playbook.model_copy(update=other)) == Coefficients(), other
