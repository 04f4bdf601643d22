#!/usr/bin/env python3
"""Fit the memory model's allocator constants and write sweep/models/fitted_memory.py.

    python scripts/fit_memory.py            # fit on $SWEEP_REFDATA and write the module
    python scripts/fit_memory.py --check    # fit and compare with the committed values

Reads the playbook's results table (playbook_bench_full_1B_8B.csv) and the LLM Foundry MPT
benchmarks from the reference data (`sweep.validation.refdata`), searches the grid of `sweep.validation.memory_fit.GRID` for
the objective of `sweep.validation.memory_fit.OBJECTIVE`, cross-validates by model for the band of
`sweep.models.memory.reserved_interval`, and writes the four constants and the band with their
provenance: the data files' sha256, the grid, the objective, the figures at the chosen point and
the date. tests/validation/test_memory_fit.py checks that this reproduces the committed module.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sweep.plan.spec import load_spec  # noqa: E402
from sweep.validation import memory_fit, memory_reference  # noqa: E402
from sweep.validation.refdata import refdata_dir  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refdata", type=Path, default=refdata_dir())
    parser.add_argument("--out", type=Path, default=REPO / memory_reference.CONSTANTS_MODULE)
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed constants; write nothing")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    ref = memory_reference.fit_reference(args.refdata, load_spec(REPO / memory_reference.SPEC_FILE))
    a, figures = ref.fit.allocator, ref.fit.figures
    print(f"fitted in {time.perf_counter() - start:.1f} s over {ref.fit.points} grid points "
          f"({ref.fit.feasible_points} feasible): sequential={a.sequential} pipelined={a.pipelined} "
          f"logits={a.logits} floor={a.floor_bytes / memory_fit.MiB:g} MiB; band {ref.band}")
    print(f"on the rows fitted: {figures}")
    if args.check:
        from sweep.models import fitted_memory as committed

        same = (committed.FRAG_SEQUENTIAL, committed.FRAG_PIPELINED, committed.FRAG_LOGITS,
                committed.RESERVED_FLOOR_BYTES, committed.RESERVED_BAND) == (
                    a.sequential, a.pipelined, a.logits, a.floor_bytes, ref.band)
        print("the committed constants are reproduced" if same
              else "the committed constants differ: rerun without --check")
        return 0 if same else 1
    if not ref.fit.gates_met:  # the planner's constants must keep what ran and prune OOMs
        print(f"no grid point meets the gates ({memory_fit.OBJECTIVE}); nothing written: widen the "
              "grid (sweep.validation.memory_fit.GRID) or check the reference data", file=sys.stderr)
        return 1
    args.out.write_text(memory_reference.render_constants(ref, dt.date.today().isoformat()), encoding="utf-8")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
