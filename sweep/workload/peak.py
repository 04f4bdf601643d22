"""The dense peak FLOP/s that MFU divides by.

GPUs: the catalog's dense peak for the run's dtype. CPU has no catalogue peak, so it is measured,
and measured so that it is the best this host can do for the ranks a run uses:

- **the run's shape**: as many worker processes as the run has ranks on the node, each with
  the threads a rank trains with (`cpu_threads_per_rank`), all timing square matmuls at once,
  so they contend for cores, caches and memory bandwidth as the ranks do in training;
- **the best of several trials**: each trial gives the FLOP/s per rank (the workers' sum over
  the ranks), and the measurement is the best trial, not a mean and not one short trial;
- **on-core time**: a worker's rate is its FLOPs over the trial's time less the time it waited
  for a core that another process held (`sweep.workload.cpu_wait`), as a run's MFU counts its
  steps, so a neighbour's load lowers neither and their ratio stays what the host can do;
- **the best the host has ever done**: what a host can do is a property of the host and the
  run's shape, not of one sweep, so it is kept per host in a user-level record outside any sweep
  folder (`host_peak_cache()`: `$SWEEP_CPU_PEAK_CACHE`, else `$XDG_CACHE_HOME/llm-sweep/cpu-peaks`,
  else `~/.cache/llm-sweep/cpu-peaks`), one file per host, dtype and ranks × threads. It only
  ever rises: a measurement, or a run that achieved more (collect, `sweep.collect.cpu_peaks`),
  raises it; nothing lowers it. Writers take a lock beside the file and replace it atomically,
  so concurrent sweeps keep the max;
- **once per sweep, at its start**: `sweep run` measures every shape its runs use before the
  first starts (`ensure_cpu_peak`); a job on a host that has no peak yet (a Slurm node, a run by
  hand) measures it before its first step, while its ranks wait. The peak the sweep uses is the
  larger of its measurement and the host record, so a sweep that starts under a neighbour's load
  still divides by what the host can do. It is stored in `<sweep>/peaks/`, keyed by host, dtype,
  ranks per node and threads per rank, with the measurement, the host record before and after,
  and which of them was used: the sweep folder alone says what MFU divided by, and why. Every
  run of the sweep on that host and shape divides by it.

The source string says all of it: `measured:cpu-matmul-fp32 best of 5 trials, 2 ranks × 1
threads at once on <host>: the best of this sweep's trials (… GFLOP/s per rank) and of earlier
sweeps on this host (host record … GFLOP/s per rank), <which> used (a measured CPU peak, not a
datasheet figure; peaks/<file>)`.

Collect raises a stored peak that a run beat (`sweep.collect.cpu_peaks`), and the host record
with it, so MFU never exceeds 100 %. torch is imported only by the workers and by `train`, so
`sweep run` can measure without it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from sweep.core.catalog import get_gpu
from sweep.core.state import exclusive_lock
from sweep.workload.cpu_wait import thread_waits, waited_s
from sweep.workload.metrics import core_time_s

# The measurement's defaults; SWEEP_CPU_PEAK_TRIALS / SWEEP_CPU_PEAK_TRIAL_S override them (the
# tests shorten the trials; a sweep records what it used in the source string).
DEFAULT_TRIALS: Final = 5
DEFAULT_TRIAL_S: Final = 0.5
MATMUL_SIZE: Final = 512
LOCK_WAIT_S: Final = 900.0  # a run waits this long for another process measuring the same peak
HOST_LOCK_WAIT_S: Final = 60.0  # a writer of the host record waits this long for another
HOST_CACHE_ENV: Final = "SWEEP_CPU_PEAK_CACHE"  # the host records' folder (the tests point it away)
HOST_HISTORY: Final = 20  # a host record keeps this many of its latest rises
CPU_DTYPES: Final = ("fp32", "tf32", "bf16", "fp16")


def catalog_peak(gpu: str, dtype: str) -> tuple[float, str]:
    spec = get_gpu(gpu)
    return spec.dense_peak(dtype), f"catalog:{spec.name}:{dtype}"


def cpu_threads_per_rank(ranks_per_node: int) -> int:
    """The threads each rank of a CPU run trains with: the node's cores shared by its ranks."""
    return max(1, (os.cpu_count() or 1) // max(1, ranks_per_node))


def matmul_dtype_name(dtype: str) -> str:
    """The dtype the matmul runs in: tf32 has no CPU kernel and runs in fp32."""
    return "fp32" if dtype in ("fp32", "tf32") or dtype not in CPU_DTYPES else dtype


def host_name() -> str:
    return "".join(c if c.isalnum() or c in "-._" else "_" for c in socket.gethostname())


def peak_file(sweep_dir: Path, dtype: str, ranks_per_node: int, threads: int) -> Path:
    """Where the sweep keeps this host's CPU peak for runs of this shape."""
    return sweep_dir / "peaks" / f"{host_name()}-{dtype}-{ranks_per_node}x{threads}.json"


@dataclass(frozen=True)
class CpuPeak:
    """One measurement: every trial's FLOP/s per rank, and the best of them."""

    dtype: str
    ranks: int
    threads: int
    trial_s: float
    size: int
    trials: list[float] = field(default_factory=list)
    worker_pids: list[int] = field(default_factory=list)  # one process per rank
    worker_threads: list[int] = field(default_factory=list)  # torch's threads in each

    @property
    def per_rank(self) -> float:
        return max(self.trials)

    def source(self, path: Path | None = None, host_record: float | None = None) -> str:
        """In words: what was measured, how, and, with the host record, which of the two is the
        peak used (the larger)."""
        where = f"; peaks/{path.name}" if path is not None else ""
        earlier = (f"host record {host_record / 1e9:.4g} GFLOP/s per rank" if host_record is not None
                   else "no host record yet")
        used = ("the host record used" if host_record is not None and host_record > self.per_rank
                else "this sweep's trials used")
        return (f"measured:cpu-matmul-{matmul_dtype_name(self.dtype)} best of {len(self.trials)} "
                f"trials, {self.ranks} ranks × {self.threads} threads at once on {host_name()}, "
                f"FLOPs over on-core time: "
                f"the best of this sweep's trials ({self.per_rank / 1e9:.4g} GFLOP/s per rank) and "
                f"of earlier sweeps on this host ({earlier}), {used} (a measured CPU peak, not a "
                f"datasheet figure{where})")


def _trial_settings(trials: int | None, trial_s: float | None) -> tuple[int, float]:
    trials = trials if trials is not None else int(os.environ.get("SWEEP_CPU_PEAK_TRIALS", DEFAULT_TRIALS))
    trial_s = trial_s if trial_s is not None else float(os.environ.get("SWEEP_CPU_PEAK_TRIAL_S",
                                                                       DEFAULT_TRIAL_S))
    return max(1, trials), max(0.001, trial_s)


def measure_cpu_peak(dtype: str, ranks: int, threads: int, trials: int | None = None,
                     trial_s: float | None = None, size: int = MATMUL_SIZE) -> CpuPeak:
    """Start `ranks` worker processes of `threads` threads each; in each of `trials` trials they
    all time size×size matmuls for `trial_s` seconds at once. A trial's figure is the FLOP/s per
    rank (the workers' sum / ranks); the peak is the best trial."""
    trials, trial_s = _trial_settings(trials, trial_s)
    command = [sys.executable, "-m", "sweep.workload.peak", "--worker", "--dtype", dtype,
               "--threads", str(threads), "--seconds", repr(trial_s), "--size", str(size)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    workers = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env=env) for _ in range(ranks)]
    results: list[float] = []
    try:
        threads_seen = [int(_answer(worker, "ready")) for worker in workers]
        for _ in range(trials):
            for worker in workers:  # every worker starts within a millisecond of the others
                assert worker.stdin is not None
                worker.stdin.write("go\n")
                worker.stdin.flush()
            rates = [float(_answer(worker, "rate")) for worker in workers]
            results.append(sum(rates) / ranks)
    finally:
        for worker in workers:
            if worker.stdin is not None:
                worker.stdin.close()
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    return CpuPeak(dtype=dtype, ranks=ranks, threads=threads, trial_s=trial_s, size=size,
                   trials=results, worker_pids=[worker.pid for worker in workers],
                   worker_threads=threads_seen)


def _answer(worker: subprocess.Popen[str], expected: str) -> str:
    assert worker.stdout is not None
    line = worker.stdout.readline().split()
    if len(line) != 2 or line[0] != expected:
        worker.kill()
        raise RuntimeError(f"CPU peak worker (pid {worker.pid}) ended without its {expected!r} "
                           f"line (exit code {worker.wait()})")
    return line[1]


def _worker(dtype: str, threads: int, seconds: float, size: int) -> int:
    """One worker: warm up, say ready, then time matmuls for `seconds` on each `go`."""
    import torch

    torch.set_num_threads(threads)
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
    a = torch.randn(size, size).to(torch_dtype)
    b = torch.randn(size, size).to(torch_dtype)
    torch.mm(a, b)  # warm-up: thread pool, packing buffers
    print(f"ready {torch.get_num_threads()}", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        count, waits_before, start = 0, thread_waits(), time.perf_counter()
        while time.perf_counter() - start < seconds:
            torch.mm(a, b)
            count += 1
        waits_after = thread_waits()  # read inside the timed window, so the wait is within it
        elapsed = time.perf_counter() - start
        on_core = core_time_s(elapsed, waited_s(waits_before, waits_after))
        print(f"rate {2.0 * size ** 3 * count / on_core!r}", flush=True)
    return 0


def host_peak_cache() -> Path:
    """The user-level folder of the host records: $SWEEP_CPU_PEAK_CACHE, else
    $XDG_CACHE_HOME/llm-sweep/cpu-peaks, else ~/.cache/llm-sweep/cpu-peaks."""
    override = os.environ.get(HOST_CACHE_ENV)
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "llm-sweep" / "cpu-peaks"


def host_record_file(name: str) -> Path:
    """The host record for a sweep's peak file name (`<host>-<dtype>-<ranks>x<threads>.json`)."""
    return host_peak_cache() / name


def read_host_record(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        float(record["peak_flops"])
        return dict(record)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def raise_host_record(path: Path, value: float, source: str,
                      details: dict[str, Any] | None = None
                      ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Raise the host record at `path` to `value` if that is higher; never lower it. Returns the
    record before and after. A lock beside the file makes read-compare-write one step for
    concurrent writers (other sweeps, other collects); the file is replaced atomically, so a
    reader sees the old record or the new, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(path.with_name(f".{path.name}.lock"), wait_s=HOST_LOCK_WAIT_S):
        before = read_host_record(path)
        if before is not None and float(before["peak_flops"]) >= value:
            return before, before
        now = time.time()
        history = list(before.get("history", [])) if before is not None else []
        history.append({"peak_flops": value, "source": source, "at": now})
        record = {"peak_flops": value, "source": source, "host": socket.gethostname(),
                  "updated_at": now, **(details or {}),
                  "rule": "the best CPU peak measured or achieved on this host for this dtype and "
                          "ranks × threads; it only ever rises",
                  "history": history[-HOST_HISTORY:]}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
        os.replace(tmp, path)
        return before, record


def read_stored_peak(path: Path) -> tuple[float, str] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return float(data["peak_flops"]), str(data["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store_peak(path: Path, value: float, source: str,
               details: dict[str, Any] | None = None) -> tuple[float, str]:
    """Keep the first peak stored for this host and shape (two processes storing at once: the
    first to link its file wins, and both use the winner's); returns the peak to use."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"peak_flops": value, "source": source, "host": socket.gethostname(),
                               "measured_at": time.time(), **(details or {})}, indent=1))
    try:
        os.link(tmp, path)  # atomic create-if-absent, also on NFS
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return read_stored_peak(path) or (value, source)


def ensure_cpu_peak(sweep_dir: Path, dtype: str, ranks: int, threads: int, *, measured_by: str,
                    trials: int | None = None, trial_s: float | None = None) -> tuple[float, str]:
    """The sweep's stored peak for this host and shape; if it has none, measured now and
    compared with the host record: the sweep uses the larger, and the host record rises to it.
    One process measures at a time (a lock beside the file): two measuring at once would
    contend and each record a peak too low."""
    path = peak_file(sweep_dir, dtype, ranks, threads)
    stored = read_stored_peak(path)
    if stored is not None:
        return stored
    with exclusive_lock(path.with_name(f".{path.name}.lock"), wait_s=LOCK_WAIT_S):
        stored = read_stored_peak(path)
        if stored is not None:
            return stored
        began = time.time()
        peak = measure_cpu_peak(dtype, ranks, threads, trials, trial_s)
        measure_s = time.time() - began
        shape = {"dtype": dtype, "ranks_per_node": ranks, "threads_per_rank": threads}
        record_path = host_record_file(path.name)
        before, after = raise_host_record(
            record_path, peak.per_rank,
            f"measured:cpu-matmul-{matmul_dtype_name(dtype)} best of {len(peak.trials)} trials, "
            f"{ranks} ranks × {threads} threads at once, by {measured_by} for the sweep "
            f"{sweep_dir.resolve()}", shape)
        used = float(after["peak_flops"])  # ≥ the measurement: the record took the larger
        from_host = used > peak.per_rank
        host_shown = used if from_host else (float(before["peak_flops"]) if before else None)
        return store_peak(path, used, peak.source(path, host_shown), {
            **shape, "peak_from": "the host record" if from_host else "this sweep's measurement",
            "rule": "the peak used is the larger of this sweep's measurement (the best of its "
                    "trials) and the host record (the best peak measured or achieved on this host "
                    "for this dtype and shape by earlier sweeps)",
            "measured_peak_flops": peak.per_rank, "matmul_size": peak.size,
            "trial_s": peak.trial_s, "trials_flops_per_rank": peak.trials,
            "worker_pids": peak.worker_pids, "worker_threads": peak.worker_threads,
            "measured_by": measured_by, "measure_s": measure_s,
            "host_record_file": str(record_path),
            "host_record_before": _record_summary(before),
            "host_record_after": _record_summary(after)})


def _record_summary(record: dict[str, Any] | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {key: record[key] for key in ("peak_flops", "source", "updated_at") if key in record}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweep.workload.peak",
                                     description="Measure a sweep's CPU peak for one run shape.")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sweep-dir", type=Path, default=None)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--ranks", type=int, default=1, help="ranks per node")
    parser.add_argument("--threads", type=int, default=None, help="threads per rank")
    parser.add_argument("--seconds", type=float, default=DEFAULT_TRIAL_S)
    parser.add_argument("--size", type=int, default=MATMUL_SIZE)
    args = parser.parse_args(argv)
    threads = args.threads or cpu_threads_per_rank(args.ranks)
    if args.worker:
        return _worker(args.dtype, threads, args.seconds, args.size)
    if args.sweep_dir is None:
        parser.error("--sweep-dir is required")
    value, source = ensure_cpu_peak(args.sweep_dir, args.dtype, args.ranks, threads,
                                    measured_by="python -m sweep.workload.peak")
    print(json.dumps({"peak_flops": value, "source": source}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
