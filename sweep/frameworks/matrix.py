"""The support matrix, its freshness and the capability tables, as Markdown: the generated sections of
README.md and docs/frameworks.md and `sweep frameworks` print the adapters themselves, so neither
can drift from the code."""

from __future__ import annotations

from sweep.frameworks import all_adapters
from sweep.frameworks.releases import RELEASES_CHECKED


def support_matrix() -> str:
    lines = ["| framework | `run.framework_version` | what it covers | contract-tested with |",
             "|---|---|---|---|"]
    for adapter in all_adapters():
        for version in adapter.versions:
            default = " (default)" if version.key == adapter.default_version else ""
            tested = ", ".join(version.tested_with) or "—"
            lines.append(f"| {adapter.name} | `{version.key}`{default} | {_cell(version.description)} "
                         f"| {_cell(tested)} |")
    return "\n".join(lines)


def capability_tables() -> str:
    lines = ["| framework | rule | what the framework cannot run as labelled | source |",
             "|---|---|---|---|"]
    for adapter in all_adapters():
        for rule in adapter.capabilities:
            lines.append(f"| {adapter.name} | `{rule.name}` | {_cell(rule.reason)} "
                         f"| {_cell(rule.source)} |")
    return "\n".join(lines)


def freshness_table() -> str:
    """Per framework: the newest release on the package index when the matrix was last checked
    against it, and what the job refuses (sweep.frameworks.releases)."""
    lines = ["| framework | package | newest release checked | released | checked on | refused |",
             "|---|---|---|---|---|---|"]
    for check in RELEASES_CHECKED:
        lines.append(f"| {check.framework} | `{check.package}` | {check.newest} | "
                     f"{check.released_on} | {check.checked_on} | {_cell(check.refused)} |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", r"\|")
