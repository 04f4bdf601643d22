#!/usr/bin/env python3
"""Count the built-in workload's memory-bound bytes and compare them with sweep/models/traffic.py.

    python scripts/count_traffic.py            # print the counts, per precision and recomputation
    python scripts/count_traffic.py --check    # and fail unless sweep.models.traffic.BUILTIN holds them

Runs small training steps of the built-in workload on CPU under `sweep.workload.bytes_moved`
(bytes read and written by every operator but the matmuls and attention) and reads the
coefficients of `sweep.models.traffic.TrafficCounts` off them (`count_builtin_traffic`, about 20 s).
tests/workload/test_memory_traffic.py runs the check, and checks the counts on another shape.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sweep.core.catalog import get_model  # noqa: E402
from sweep.models.traffic import BUILTIN  # noqa: E402
from sweep.workload.bytes_moved import count_builtin_traffic  # noqa: E402

TOLERANCE = 0.002  # the committed figures are rounded to 0.1 byte


def differences() -> list[str]:
    problems = []
    for precision, dtype, mixed in (("mixed", "bf16", True), ("full", "fp32", False)):
        for mode in ("none", "recomputed"):
            counted = count_builtin_traffic(get_model("tiny-4l"), mixed, "none" if mode == "none" else "full")
            committed = asdict(BUILTIN.counts(dtype, mode))
            print(f"{precision:5} {mode:10} " + " ".join(f"{k}={v:.4f}" for k, v in counted.items()))
            problems += [f"{precision} {mode} {k}: counted {v:.4f}, sweep/models/traffic.py has {committed[k]}"
                         for k, v in counted.items() if abs(v - committed[k]) > TOLERANCE * max(1.0, abs(v))]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail unless sweep/models/traffic.py holds the counts")
    args = parser.parse_args(argv)
    problems = differences()
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if args.check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
