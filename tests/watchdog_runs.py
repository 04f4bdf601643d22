"""Helpers for the watchdog tests: a rendered run directory and real launcher processes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from sweep.core.layout import Layout
from sweep.core.model import ModelShape
from sweep.core.runconfig import RunConfig
from sweep.core.state import atomic_write_json, new_attempt_dir, read_json, read_jsonl
from sweep.job import proctree

REPO = Path(__file__).resolve().parents[1]
TINY = ModelShape(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=4,
                  ffn_hidden_size=128, vocab_size=256, tie_word_embeddings=True)

# A launcher that writes `n` builtin step records to metrics.jsonl, `gap` seconds apart.
STEPS = """
import json, os, sys, time
path = os.path.join(os.environ["SWEEP_ATTEMPT_DIR"], "metrics.jsonl")
def steps(n, gap=0.05, start=1):
    for step in range(start, start + n):
        with open(path, "a") as f:
            f.write(json.dumps({"kind": "step", "step": step, "time": time.time()}) + "\\n")
        time.sleep(gap)
"""


class Run:
    """A rendered run directory with one attempt folder, and helpers to supervise a launcher."""

    def __init__(self, root: Path, *, nodes: int = 1, framework: str = "builtin", **settings: Any) -> None:
        # A run id of its own (the batch size is part of it), so that concurrent test sessions
        # and benchmarks never share a tag: survivors() and kill_leftovers() go by tag.
        config = RunConfig(sweep="t", framework=framework, model=TINY,
                           layout=Layout(dp=1, tp=1, pp=1), nodes=nodes, gpus_per_node=1, gpu="cpu",
                           dtype="fp32", seq_len=32,
                           global_batch_sequences=random.randrange(1, 1 << 30),
                           settings={"startup_timeout_s": 3, "hang_timeout_s": 2, **settings})
        self.root = root
        self.run_dir = root / "runs" / config.run_id
        atomic_write_json(self.run_dir / "run.json", config.to_json())
        self.attempt = new_attempt_dir(self.run_dir)
        self.tag = f"{config.run_id}/1"

    def argv(self, launcher: list[str], *options: str) -> list[str]:
        return [sys.executable, "-m", "sweep.job.watchdog", "--run-dir", str(self.run_dir),
                "--attempt-dir", str(self.attempt), "--poll-s", "0.1", "--grace-s", "1",
                "--signal-grace-s", "1", "--node-wait-s", "0", "--shm-dir", str(self.root / "shm"),
                "--tmp-dir", str(self.root / "tmp"), *options, "--", *launcher]

    def start(self, launcher: list[str], *options: str, env: dict[str, str] | None = None,
              ) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(launcher, *options), cwd=REPO, text=True,
                                env={**os.environ, **(env or {})},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def supervise(self, launcher: list[str], *options: str, timeout: float = 60,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        proc = self.start(launcher, *options, env=env)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def python(self, code: str) -> list[str]:
        script = self.root / f"launcher_{len(list(self.root.glob('launcher_*')))}.py"
        script.write_text(STEPS + textwrap.dedent(code))
        return [sys.executable, str(script)]

    @property
    def status(self) -> dict[str, Any]:
        status = read_json(self.attempt / "status.json")
        assert status is not None, f"no status.json in {self.attempt}"
        return status

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        events = read_jsonl(self.attempt / "watchdog.jsonl")
        return [e for e in events if kind in (None, e["event"])]

    def survivors(self) -> list[proctree.ProcInfo]:
        return [p for p in proctree.snapshot() if p.tag == self.tag and not p.zombie]


def wait_for_step(run: Run, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not (run.attempt / "metrics.jsonl").exists():
        assert time.monotonic() < deadline, "the launcher never wrote a step"
        time.sleep(0.05)


def kill_leftovers(run: Run) -> None:
    """Only if a test failed: never leave a run's processes behind."""
    for p in run.survivors():
        os.kill(p.pid, signal.SIGKILL)
