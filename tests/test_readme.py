"""The generated sections of the README and the docs pages match the code they document.

A section is the text between `<!-- NAME:begin -->` and `<!-- NAME:end -->`, in exactly one of
README.md and docs/**/*.md. Run this file (`python tests/test_readme.py`) to refresh them all.
"""

from __future__ import annotations

import re
from pathlib import Path

from sweep.collect import schema
from sweep.frameworks.matrix import capability_tables, freshness_table, support_matrix
from sweep.job import classify
from sweep.plan.space import PRUNE_RULES

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def documents() -> list[Path]:
    """The README and every docs page: where a generated section may live."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def generated_sections() -> dict[str, str]:
    rules = ["| rule | outcome | when |", "|---|---|---|"]
    for row in classify.rule_table():
        when = row["description"].replace("|", r"\|")
        rules.append(f"| `{row['rule']}` | {row['outcome']} | {when} |")
    prune = ["| rule | prunes |", "|---|---|"]
    for rule in PRUNE_RULES:
        prune.append(f"| `{rule.name}` | {rule.why.replace('|', chr(92) + '|')} |")
    return {"rules": "\n".join(rules), "prune_rules": "\n".join(prune),
            "schema": schema.markdown_table(),
            "frameworks": support_matrix(), "freshness": freshness_table(),
            "capabilities": capability_tables()}


def section(text: str, name: str) -> str | None:
    match = re.search(rf"<!-- {name}:begin -->\n(.*?)\n?<!-- {name}:end -->", text, re.S)
    return match.group(1).strip() if match else None


def refresh(text: str) -> str:
    for name, body in generated_sections().items():
        text = re.sub(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)",
                      lambda m, body=body: f"{m.group(1)}{body}\n{m.group(2)}", text, flags=re.S)
    return text


def holders(name: str) -> list[tuple[Path, int]]:
    """Each document that marks the section, with how many times it does."""
    marks = []
    for path in documents():
        count = path.read_text(encoding="utf-8").count(f"<!-- {name}:begin -->")
        if count:
            marks.append((path.relative_to(ROOT), count))
    return marks


def test_each_generated_section_lives_in_exactly_one_place() -> None:
    for name in generated_sections():
        marks = holders(name)
        assert [count for _, count in marks] == [1], \
            f"section {name!r} must be marked once across README.md and docs/, found: {marks or 'none'}"


def test_the_generated_sections_are_current() -> None:
    for name, body in generated_sections().items():
        for path in documents():
            text = path.read_text(encoding="utf-8")
            if f"<!-- {name}:begin -->" in text:
                assert section(text, name) == body, \
                    f"{path.relative_to(ROOT)}: section {name!r} is stale: run `python tests/test_readme.py`"


def test_the_readme_gives_the_two_commands_that_ci_runs() -> None:
    text = README.read_text(encoding="utf-8")
    assert "bash scripts/setup-env.sh && .venv/bin/sweep run examples/local-cpu.yaml" in text
    assert "bash scripts/test.sh" in text
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "scripts/test.sh" in ci


if __name__ == "__main__":
    for document in documents():
        before = document.read_text(encoding="utf-8")
        after = refresh(before)
        if after != before:
            document.write_text(after, encoding="utf-8")
            print(f"refreshed {document.relative_to(ROOT)}")
