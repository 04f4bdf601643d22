"""A real MLflow tracking server for the export tests and benchmarks/export_speed.py: `mlflow
server` with a SQLite backend store and a local artifact root in a folder, on a free port, waited
for and stopped at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT_S = 120.0  # a loaded 2-core machine starts it in 5-30 s


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def closed_port() -> int:
    """A port nothing listens on (bound, then released: the kernel does not hand it out again
    at once)."""
    return free_port()


@contextlib.contextmanager
def mlflow_server(folder: Path, workers: int = 1) -> Iterator[str]:
    """Start `mlflow server` on a free port with its store in `folder`; yield its URI. One
    worker: more processes on one SQLite file wait on its lock (4 workers took 3× longer per run
    than 1 in benchmarks/export_speed.py's set-up)."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    mlflow = Path(sys.executable).with_name("mlflow")
    log = open(folder / "server.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", str(workers),
         "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
         "--artifacts-destination", str(folder / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        # No job runner: it starts about eight huey consumer processes for MLflow's GenAI
        # jobs, which a tracking store never uses, and which cost a 2-core machine seconds.
        env={**os.environ, "PYTHONUNBUFFERED": "1", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    try:
        _wait_for(uri, server, folder / "server.log")
        yield uri
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def _wait_for(uri: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"mlflow server exited ({server.returncode}): {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"mlflow server did not answer {uri}/health in {START_TIMEOUT_S:.0f} s: "
                       f"{log.read_text()[-2000:]}")
