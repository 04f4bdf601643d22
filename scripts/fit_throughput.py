#!/usr/bin/env python3
"""Fit the throughput model on nanotron's published H100 runs and write sweep/models/fitted_throughput.py.

    python scripts/fit_throughput.py            # fit on $SWEEP_REFDATA and write the module
    python scripts/fit_throughput.py --check    # fit and compare with the committed values

Reads the playbook's results table (playbook_bench_full_1B_8B.csv) from the reference data
(`sweep.validation.refdata`), fits as `sweep calibrate` does (`sweep.validation.throughput_reference.fit_reference`),
scores each model by the fit to the other alone, and writes the coefficients with their
provenance: the table's sha256, the rows fitted and left out, the in-sample and left-out
figures, the date. tests/validation/test_throughput_reference.py checks that this reproduces the module.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sweep.plan.spec import load_spec  # noqa: E402
from sweep.validation import throughput_reference  # noqa: E402
from sweep.validation.refdata import refdata_dir  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refdata", type=Path, default=refdata_dir())
    parser.add_argument("--out", type=Path, default=REPO / throughput_reference.MODULE)
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed coefficients; write nothing")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    ref = throughput_reference.fit_reference(
        args.refdata, load_spec(REPO / throughput_reference.SPEC_FILE))
    print(f"fitted in {time.perf_counter() - start:.1f} s on {ref.provenance['rows']} runs: "
          f"in sample {ref.provenance['in_sample']}")
    for model, figures in ref.provenance["left_out_model"].items():
        print(f"  {model} left out: {figures}")
    if args.check:
        from sweep.models import fitted_throughput as committed

        fitted = ref.coefficients.to_dict()
        same = committed.COEFFICIENTS.keys() == fitted.keys() and all(
            math.isclose(committed.COEFFICIENTS[k], v, rel_tol=1e-9, abs_tol=1e-15)
            for k, v in fitted.items())
        print("the committed coefficients are reproduced" if same
              else "the committed coefficients differ: rerun without --check")
        return 0 if same else 1
    args.out.write_text(throughput_reference.render_module(ref, dt.date.today().isoformat()),
                        encoding="utf-8")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
