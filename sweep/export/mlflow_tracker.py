"""Export to MLflow: a sweep is an experiment, an attempt a run (and the report one more).

Fast and idempotent through MLflow's own client: one search per experiment finds every run the
sweep already has (by its `sweep.key` tag, with its `sweep.fingerprint`), so an unchanged
attempt costs nothing; a new one is `create_run` (with its tags), one `log_batch` (parameters,
metrics, step series, in as few calls as MLflow's limits allow) and `set_terminated`, run by a
thread pool; a new run's tags, its fingerprint included, go with `create_run`. Files are
uploaded once: a file already in the run with the same size is skipped.
Metric points carry the attempt's own end time, so sending one again is the same point, which
the server keeps once.
"""

from __future__ import annotations

import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Final

from sweep.core.errors import UserError
from sweep.core.trackers import TrackerTarget
from sweep.export.base import ExportReport, TrackerMissing, TrackerUnreachable
from sweep.export.records import FINGERPRINT_TAG, KEY_TAG, AttemptRecord

WORKERS: Final = 8
PAGE: Final = 5000  # runs per search page (the server allows up to 50,000)
# MLflow's log_batch limits (mlflow.utils.validation): per call, and in all.
MAX_METRICS, MAX_PARAMS, MAX_TAGS, MAX_ENTRIES = 1000, 100, 100, 1000
MAX_PARAM_VALUE, MAX_TAG_VALUE = 6000, 8000
PROBE_TIMEOUT_S: Final = 10.0
STATUS: Final = {"completed": "FINISHED", "cancelled": "KILLED", "preempted": "KILLED"}


@dataclass(frozen=True)
class Existing:
    """A run the experiment already has for a key."""

    run_id: str
    fingerprint: str | None
    status: str
    params: Mapping[str, str]


class MlflowExporter:
    def __init__(self, target: TrackerTarget, workers: int = WORKERS) -> None:
        self.target = target
        self.workers = workers
        self._lost: str | None = None  # set once the server stops answering mid-export
        self._lock = threading.Lock()

    @property
    def uri(self) -> str:
        uri = self.target.where or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise UserError("mlflow: no tracking URI; write --to mlflow:http://HOST:PORT (or "
                            "export.to: [mlflow:URI] in the spec), or set MLFLOW_TRACKING_URI")
        return uri

    def export(self, records: Sequence[AttemptRecord]) -> ExportReport:
        uri = self.uri
        probe(uri)
        client = _client(uri)
        report = ExportReport(str(self.target))
        for sweep in sorted({r.sweep for r in records}):
            self._export_sweep(client, [r for r in records if r.sweep == sweep], report)
        if self._lost is not None:
            raise TrackerUnreachable(f"mlflow at {uri} stopped answering after {report.sent} "
                                     f"run(s) were sent: {self._lost}")
        return report

    def _export_sweep(self, client: Any, records: Sequence[AttemptRecord], report: ExportReport
                      ) -> None:
        """One sweep's records into its experiment, by a thread pool."""
        experiment = self._experiment(client, records[0].sweep)
        report.where = f"{self.uri.rstrip('/')}/#/experiments/{experiment}"
        existing = self._existing(client, experiment)
        with ThreadPoolExecutor(self.workers) as pool:
            results = pool.map(lambda r: self._one(client, experiment, r, existing.get(r.key)),
                               records)
            for record, (what, uploaded, skipped, problem) in zip(records, results):
                if problem:
                    report.failed.append(f"{record.key}: {problem}")
                    continue
                setattr(report, what, getattr(report, what) + 1)
                report.files_uploaded += uploaded
                report.files_skipped += skipped

    # -- the experiment and what it holds ---------------------------------------------------

    def _experiment(self, client: Any, sweep: str) -> str:
        """The sweep's experiment, created on the first export (another exporter creating it
        at the same moment is no error)."""
        from mlflow.exceptions import MlflowException

        try:
            found = client.get_experiment_by_name(sweep)
            if found is not None:
                return str(found.experiment_id)
            return str(client.create_experiment(sweep, tags={"sweep.name": sweep}))
        except MlflowException as error:
            found = _quietly(lambda: client.get_experiment_by_name(sweep))
            if found is not None:
                return str(found.experiment_id)
            raise TrackerUnreachable(f"mlflow at {self.uri}: {_said(error)}") from None

    @staticmethod
    def _existing(client: Any, experiment: str) -> dict[str, Existing]:
        """Every run of the experiment that carries a key, by key (one search, paged)."""
        found: dict[str, Existing] = {}
        token = None
        while True:
            page = client.search_runs([experiment], filter_string=f"tags.`{KEY_TAG}` != ''",
                                      max_results=PAGE, page_token=token,
                                      order_by=["attributes.start_time ASC"])
            for run in page:
                key = run.data.tags.get(KEY_TAG)
                if key and key not in found:  # the oldest one, should two exports have raced
                    found[key] = Existing(run.info.run_id, run.data.tags.get(FINGERPRINT_TAG),
                                          run.info.status, dict(run.data.params))
            token = page.token
            if not token:
                return found

    # -- one record ---------------------------------------------------------------------------

    def _one(self, client: Any, experiment: str, record: AttemptRecord,
             existing: Existing | None) -> tuple[str, int, int, str | None]:
        """('created' | 'updated' | 'unchanged', files uploaded, files skipped, problem)."""
        status = STATUS.get(record.outcome, "FINISHED" if record.kind == "report" else "FAILED")
        if existing is not None and existing.fingerprint == record.fingerprint \
                and existing.status == status:
            return "unchanged", 0, 0, None
        if self._lost is not None:
            return "unchanged", 0, 0, "not sent: the server stopped answering"
        try:
            return self._send(client, experiment, record, existing, status)
        except Exception as error:  # noqa: BLE001 - one record's failure is reported, not fatal
            said = _said(error)
            if _unreachable(error):
                with self._lock:
                    self._lost = self._lost or said
            return "unchanged", 0, 0, said

    def _send(self, client: Any, experiment: str, record: AttemptRecord, existing: Existing | None,
              status: str) -> tuple[str, int, int, None]:
        # A new run gets every tag, its fingerprint too, when it is created: the server's store
        # then commits no tags in log_batch. A run cut short before set_terminated is still
        # RUNNING, which no finished export leaves, so the next export sends it again.
        if existing is None:
            run = client.create_run(experiment, run_name=record.name,
                                    tags=_tags({**record.all_tags, FINGERPRINT_TAG: record.fingerprint}),
                                    start_time=_ms(record.started_at or record.ended_at))
            run_id, have_files = run.info.run_id, {}
            have_params: Mapping[str, str] = {}
        else:
            run_id, have_params = existing.run_id, existing.params
            have_files = dict(_artifacts(client, run_id))
        uploaded = skipped = 0
        for artifact in record.artifacts:
            if have_files.get(artifact.name) == artifact.size:
                skipped += 1
                continue
            folder = str(PurePosixPath(artifact.name).parent)
            client.log_artifact(run_id, str(artifact.path), folder if folder != "." else None)
            uploaded += 1
        tags = {} if existing is None else {**record.all_tags, FINGERPRINT_TAG: record.fingerprint}
        for metrics, params, batch_tags in batches(record, have_params, tags):
            client.log_batch(run_id, metrics=metrics, params=params, tags=batch_tags)
        client.set_terminated(run_id, status, end_time=_ms(record.ended_at or record.started_at))
        return ("created" if existing is None else "updated"), uploaded, skipped, None


def batches(record: AttemptRecord, have_params: Mapping[str, str], tags: Mapping[str, str]
            ) -> Iterator[tuple[list[Any], list[Any], list[Any]]]:
    """(metrics, params, tags) for log_batch calls within MLflow's limits: usually one call.
    A parameter the run already has is not sent again (MLflow refuses a changed value; the
    layout of a run id never changes). The fingerprint tag is in the last call, so a run cut
    short mid-way is sent again next time."""
    from mlflow.entities import Metric, Param, RunTag

    stamp = _ms(record.ended_at or record.started_at)
    metrics = [Metric(k, v, stamp, 0) for k, v in record.metrics.items()]
    metrics += [Metric(name, value, stamp, step) for name, points in record.series.items()
                for step, value in points]
    params = [Param(k[:250], v[:MAX_PARAM_VALUE]) for k, v in record.params.items()
              if k not in have_params]
    ordered = sorted(tags.items(), key=lambda item: item[0] == FINGERPRINT_TAG)
    tag_list = [RunTag(k, v[:MAX_TAG_VALUE]) for k, v in ordered]
    while metrics or params or tag_list:
        take_params = params[:MAX_PARAMS]
        room = MAX_ENTRIES - len(take_params)
        take_metrics = metrics[:min(MAX_METRICS, room)]
        room -= len(take_metrics)
        # the fingerprint waits for the last call
        last = not metrics[len(take_metrics):] and not params[len(take_params):]
        take_tags = tag_list[:min(MAX_TAGS, room)]
        if not last and take_tags and take_tags[-1].key == FINGERPRINT_TAG:
            take_tags = take_tags[:-1]
        yield take_metrics, take_params, take_tags
        metrics, params = metrics[len(take_metrics):], params[len(take_params):]
        tag_list = tag_list[len(take_tags):]


def probe(uri: str) -> None:
    """Refuse early, and within seconds, a tracking server that does not answer (MLflow's
    client would retry for minutes). Any HTTP answer, even 401 or 404, is a live server."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=PROBE_TIMEOUT_S):
            return
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise TrackerUnreachable(f"mlflow at {uri} does not answer ({reason})") from None


def _client(uri: str) -> Any:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise TrackerMissing("mlflow: its client is not installed; pip install "
                             "'llm-sweep[mlflow]' (mlflow-skinny)") from None
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    # set_terminated would fetch the run again to print a "View run at" line: two lines and a
    # request per run
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    return MlflowClient(tracking_uri=uri)


def _artifacts(client: Any, run_id: str, path: str | None = None) -> Iterator[tuple[str, int]]:
    """(path, size) of every file the run holds."""
    for info in client.list_artifacts(run_id, path):
        if info.is_dir:
            yield from _artifacts(client, run_id, info.path)
        else:
            yield info.path, int(info.file_size or 0)


def _tags(tags: Mapping[str, str]) -> dict[str, str]:
    return {k: v[:MAX_TAG_VALUE] for k, v in tags.items()}


def _ms(seconds: float | None) -> int:
    return int((seconds or 0.0) * 1000)


def _unreachable(error: Exception) -> bool:
    text = str(error)
    return any(s in text for s in ("Max retries exceeded", "Connection refused", "ConnectionError",
                                   "Failed to establish", "timed out"))


def _said(error: Exception) -> str:
    return " ".join(str(error).split())[:300] or type(error).__name__


def _quietly(call: Any) -> Any:
    try:
        return call()
    except Exception:  # noqa: BLE001 - a second look after a failure; None means none
        return None
