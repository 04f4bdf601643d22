"""The README's generated sections match the code they document (run this file to refresh them)."""

from __future__ import annotations

import re
from pathlib import Path

from sweep.collect import schema
from sweep.frameworks.matrix import capability_tables, support_matrix
from sweep.job import classify

README = Path(__file__).resolve().parents[1] / "README.md"


def generated_sections() -> dict[str, str]:
    rules = ["| rule | outcome | when |", "|---|---|---|"]
    for row in classify.rule_table():
        when = row["description"].replace("|", r"\|")
        rules.append(f"| `{row['rule']}` | {row['outcome']} | {when} |")
    return {"rules": "\n".join(rules), "schema": schema.markdown_table(),
            "frameworks": support_matrix(), "capabilities": capability_tables()}


def section(text: str, name: str) -> str | None:
    match = re.search(rf"<!-- {name}:begin -->\n(.*?)\n?<!-- {name}:end -->", text, re.S)
    return match.group(1).strip() if match else None


def refresh(text: str) -> str:
    for name, body in generated_sections().items():
        text = re.sub(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)",
                      lambda m, body=body: f"{m.group(1)}{body}\n{m.group(2)}", text, flags=re.S)
    return text


def test_the_schema_and_the_classification_rules_in_the_readme_are_current() -> None:
    text = README.read_text(encoding="utf-8")
    for name, body in generated_sections().items():
        assert section(text, name) == body, \
            f"README section {name!r} is stale: run `python tests/test_readme.py`"


def test_the_readme_gives_the_two_commands_that_ci_runs() -> None:
    text = README.read_text(encoding="utf-8")
    assert "bash scripts/setup-env.sh && .venv/bin/sweep run examples/local-cpu.yaml" in text
    assert "bash scripts/test.sh" in text
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "scripts/test.sh" in ci


if __name__ == "__main__":
    README.write_text(refresh(README.read_text(encoding="utf-8")), encoding="utf-8")
