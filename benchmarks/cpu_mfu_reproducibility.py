"""Is CPU MFU reproducible, and never above 100 %? The demo sweep, quiet and beside a load.

Runs the demo spec (`sweep run examples/local-cpu.yaml`, plan → runs → collect, no report) into
temporary folders: first on the machine as it is, then again (the control, below), then beside
a CPU load of two busy processes that this script starts before that sweep and stops after it
(each also ends by itself after --load-limit-s). Each sweep measures its CPU peak when it starts
(sweep.workload.peak) and uses the larger of that and the host record: the best peak measured
or achieved on this host by earlier sweeps. The script points the host records
(SWEEP_CPU_PEAK_CACHE) at a fresh temporary folder that its sweeps share, so the first sweep
starts with none and each later one with what the earlier left, as on a host whose user ran
sweeps before; the user's own ~/.cache is not touched.
Prints, per run completed in the quiet and the loaded sweep, the MFU (full-attention
convention) of each and of the control; the last line: key=value pairs with the largest
relative difference, the largest MFU of any sweep, the quiet and the loaded sweep's measured
peak, the peak each used and whether collect raised it, where the loaded sweep's peak came from
(`loaded_peak_from_host_record`: 1 if the host record), the host record after all sweeps, the
load average, and the control's measured peak and figures.

Targets (issue 37): each completed run's MFU within 15 % between the two sweeps
(|loaded − quiet| / quiet), and no MFU above 1 in either.

The control: between the two, the script runs the demo once more with nothing beside it, and
compares it with the first sweep the same way (`control_max_rel_diff`, `control_within_15pct`).
That is how far the host alone moves a run's MFU. Where it moves a run by more than 15 % with no
load at all, no correction can show the target met on that host, and the last line says so
(`target_demonstrable_here=0`; docs/flops-mfu.md: 29.6 % on a 2-vCPU VM). `--no-control` skips it.

Usage: .venv/bin/python benchmarks/cpu_mfu_reproducibility.py [--spec examples/local-cpu.yaml]
       [--load-processes N] [--no-control]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
MFU = "mfu_full_attention"
TARGET = 0.15  # issue 37: each run's MFU within 15 % between the sweeps
BUSY = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


def run_sweep(spec: Path, out: Path, cache: Path) -> tuple[dict[str, dict[str, Any]], float]:
    env = dict(os.environ, PYTHONPATH=str(REPO), SWEEP_CPU_PEAK_CACHE=str(cache))
    env.pop("SWEEP_ATTEMPT_DIR", None)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sweep.cli", "run", str(spec), "--out", str(out),
                           "--no-report"], capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"sweep run {out} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    rows = pq.read_table(out / "runs.parquet").to_pylist()
    return {row["run_id"]: row for row in rows}, wall


def peaks(rows: dict[str, dict[str, Any]], sweep_dir: Path) -> tuple[float, float, bool, float, bool]:
    """The peak measured at the sweep's start, the peak used (raised or not), whether collect
    raised it, the peak stored at the start (the larger of the measurement and the host
    record), and whether that came from the host record."""
    stored = [json.loads(path.read_text()) for path in sorted((sweep_dir / "peaks").glob("*.json"))
              if path.name != "raised.json"]
    measured = [s.get("measured_peak_flops", s["peak_flops"]) for s in stored]
    at_start = [r["peak_flops_raised_from"] or r["peak_flops"] for r in rows.values() if r["peak_flops"]]
    used = [r["peak_flops"] for r in rows.values() if r["peak_flops"]]
    raised = any(r["peak_flops_raised_from"] is not None for r in rows.values())
    from_host = any(s.get("peak_from") == "the host record" for s in stored)
    return max(measured), max(used), raised, max(at_start), from_host


def relative_differences(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> dict[str, float]:
    """|MFU in b − MFU in a| / MFU in a, per run completed with an MFU in both."""
    both = sorted(run for run in a if run in b and a[run]["outcome"] == "completed"
                  and b[run]["outcome"] == "completed" and a[run][MFU] and b[run][MFU])
    return {run: abs(b[run][MFU] - a[run][MFU]) / a[run][MFU] for run in both}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", type=Path, default=REPO / "examples" / "local-cpu.yaml")
    parser.add_argument("--load-processes", type=int, default=2)
    parser.add_argument("--load-limit-s", type=float, default=900.0,
                        help="each busy process ends by itself after this long")
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="skip the control: the demo once more, quiet, between the two")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cpu-mfu-") as tmp:
        cache = Path(tmp) / "cpu-peak-cache"  # the host records, shared by its sweeps
        quiet, quiet_s = run_sweep(args.spec, Path(tmp) / "quiet", cache)
        quiet_peak = peaks(quiet, Path(tmp) / "quiet")
        control: dict[str, dict[str, Any]] = {}
        control_peak = float("nan")
        if args.control:
            control = run_sweep(args.spec, Path(tmp) / "control", cache)[0]
            control_peak = peaks(control, Path(tmp) / "control")[0]
        load = [subprocess.Popen([sys.executable, "-c", BUSY, str(args.load_limit_s)])
                for _ in range(args.load_processes)]
        try:
            loaded, loaded_s = run_sweep(args.spec, Path(tmp) / "loaded", cache)
            load_avg = os.getloadavg()[0]
        finally:
            for process in load:
                process.kill()
            for process in load:
                process.wait()
        loaded_peak = peaks(loaded, Path(tmp) / "loaded")
        host_records = [json.loads(path.read_text())["peak_flops"] for path in cache.glob("*.json")]
    diffs = relative_differences(quiet, loaded)
    for run, diff in diffs.items():
        print(json.dumps({"run_id": run, "model": quiet[run]["model"], "nodes": quiet[run]["nodes"],
                          "layout": quiet[run]["layout_label"], "mfu_quiet": round(quiet[run][MFU], 4),
                          "mfu_control": round(control[run][MFU], 4) if control.get(run, {}).get(MFU) else None,
                          "mfu_loaded": round(loaded[run][MFU], 4), "rel_diff": round(diff, 4)}))
    mfus = [row[c] for rows in (quiet, control, loaded) for row in rows.values()
            for c in (MFU, "mfu_megatron", "mfu_6N", "mfu_reported") if row.get(c) is not None]
    figures = {
        "runs_compared": len(diffs),
        "completed_quiet": sum(r["outcome"] == "completed" for r in quiet.values()),
        "completed_loaded": sum(r["outcome"] == "completed" for r in loaded.values()),
        "max_rel_diff": max(diffs.values(), default=float("nan")),
        "within_15pct": sum(d <= TARGET for d in diffs.values()),
        "max_mfu": max(mfus, default=float("nan")),
        "measured_peak_quiet_gflops": quiet_peak[0] / 1e9, "peak_quiet_gflops": quiet_peak[1] / 1e9,
        "raised_quiet": int(quiet_peak[2]),
        "measured_peak_loaded_gflops": loaded_peak[0] / 1e9, "peak_loaded_gflops": loaded_peak[1] / 1e9,
        "raised_loaded": int(loaded_peak[2]),
        "peak_at_start_loaded_gflops": loaded_peak[3] / 1e9,
        "loaded_peak_from_host_record": int(loaded_peak[4]),
        "host_record_after_gflops": max(host_records, default=float("nan")) / 1e9,
        "sweep_quiet_s": quiet_s, "sweep_loaded_s": loaded_s,
        "load_avg_1m": load_avg, "cores": float(os.cpu_count() or 0),
    }
    if args.control:
        control_diffs = relative_differences(quiet, control).values()
        control_max = max(control_diffs, default=float("nan"))
        figures |= {"measured_peak_control_gflops": control_peak / 1e9,
                    "control_max_rel_diff": control_max,
                    "control_within_15pct": sum(d <= TARGET for d in control_diffs),
                    "target_demonstrable_here": int(control_max <= TARGET)}
    control_said = ", then once more quiet (the control)" if args.control else ""
    print(f"# {args.spec.name}: quiet{control_said}, then beside {args.load_processes} busy processes; "
          f"MFU = {MFU}; targets: max_rel_diff<={TARGET}, max_mfu<=1")
    print(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
