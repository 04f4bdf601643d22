"""Where a sweep's attempts are exported: an experiment tracker named as `mlflow[:URI]` or
`wandb[:ENTITY/PROJECT]` (`sweep export --to`, the spec's `export.to`).

The spelling is parsed here, in the vocabulary every layer shares, because the spec (in
`plan/`) validates it and the exporters (in `export/`, above) act on it: one parser, one set
of error messages. Nothing here talks to a tracker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

TrackerKind = Literal["mlflow", "wandb"]
KINDS: Final[tuple[TrackerKind, ...]] = ("mlflow", "wandb")
FORMS: Final = "mlflow[:URI] or wandb[:ENTITY/PROJECT]"

# W&B names: letters, digits, '-', '_' and '.' (its own rule for entities and projects).
_WANDB_NAME: Final = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_URI: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


@dataclass(frozen=True)
class TrackerTarget:
    """One tracker: `where` is MLflow's tracking URI or W&B's ENTITY/PROJECT (or PROJECT);
    None leaves it to the tracker's own environment (MLFLOW_TRACKING_URI, WANDB_ENTITY and
    WANDB_PROJECT)."""

    kind: TrackerKind
    where: str | None = None

    def __str__(self) -> str:
        return self.kind if self.where is None else f"{self.kind}:{self.where}"

    @property
    def entity(self) -> str | None:
        """W&B: the entity of ENTITY/PROJECT (None: the API key's default entity)."""
        if self.kind != "wandb" or self.where is None or "/" not in self.where:
            return None
        return self.where.split("/", 1)[0]

    @property
    def project(self) -> str | None:
        """W&B: the project of ENTITY/PROJECT or PROJECT."""
        if self.kind != "wandb" or self.where is None:
            return None
        return self.where.split("/", 1)[-1]


def parse_target(text: str) -> TrackerTarget:
    """`mlflow`, `mlflow:http://host:5000`, `wandb`, `wandb:team/project` or `wandb:project`.
    Raises ValueError saying which forms are accepted."""
    kind, _, where = text.strip().partition(":")
    if kind not in KINDS:
        raise ValueError(f"{text!r} is not a tracker: write {FORMS} "
                         "(e.g. mlflow:http://127.0.0.1:5000 or wandb:my-team/llm-bench)")
    if not where:
        return TrackerTarget(kind)
    if kind == "mlflow":
        bare_host = re.match(r"^[^/:]+:\d+(/|$)", where)  # localhost:5000: a host, no scheme
        if bare_host or (not _URI.match(where) and not where.startswith("/") and where != "databricks"):
            raise ValueError(f"{text!r}: the MLflow tracking URI {where!r} has no scheme; write "
                             "mlflow:http://HOST:PORT (or https://, file:///PATH, databricks)")
        return TrackerTarget("mlflow", where)
    parts = where.split("/")
    if len(parts) > 2 or not all(_WANDB_NAME.match(part) for part in parts):
        raise ValueError(f"{text!r}: write wandb:ENTITY/PROJECT or wandb:PROJECT, each name of "
                         "letters, digits, '-', '_' or '.'")
    return TrackerTarget("wandb", where)
