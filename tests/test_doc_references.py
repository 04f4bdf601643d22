"""Code and tests point to the docs page that has what they cite: the README's sections moved to
docs/, so a reference such as (README, "Sweep economy") sends a reader to a section that is not
there any more. References to the reference data's README (data/README.md) are not these."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_SECTION = re.compile(r"""(?<![\w.])\(README[,:)]|README:\s*["']|the README's\s+["']|README\s*\(["']"""
                            r"""|the README's (rule table|spec reference|fidelity|calibration fig)"""
                            r"""|README fidelity""")


def test_no_code_cites_a_readme_section_that_moved_to_docs() -> None:
    found = []
    for folder in ("sweep", "tests", "benchmarks", "scripts", "examples"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in {".py", ".sh", ".yaml"} or "fixtures" in path.parts:
                continue
            relative = path.relative_to(ROOT).as_posix()
            if path == Path(__file__):
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if README_SECTION.search(line):
                    found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "cite the docs page instead:\n" + "\n".join(found)


def test_the_docs_sections_the_code_cites_exist() -> None:
    cited = {
        "docs/planning.md": ["The rules", "The constants are fitted, not chosen"],
        "docs/search.md": ["Sweep economy"],
        "docs/workload.md": ["Checks on a real GPU"],
        "docs/validation.md": ["Self-calibration of the memory model", "Models no fit saw",
                               "The throughput model", "The memory model"],
        "docs/frameworks.md": ["Framework options"],
        "docs/cluster.md": ["Resources"],
    }
    for page, sections in cited.items():
        headings = {line.lstrip("#").strip()
                    for line in (ROOT / page).read_text(encoding="utf-8").splitlines()
                    if line.startswith("#")}
        missing = [s for s in sections if s not in headings]
        assert not missing, f"{page} has no section {missing}"




def test_the_docs_and_messages_say_as_root_not_sudo() -> None:
    """The test machine has no sudo: its commands run as root, so the docs say "as root"."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in ("sweep", "scripts", "examples", "benchmarks", "templates"):
        paths += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file()
                        and p.suffix in {".py", ".sh", ".yaml", ".j2", ".md"})
    paths += sorted((ROOT / "tests").glob("*.py"))
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in paths if path != Path(__file__)
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bsudo\b", line)]
    assert not found, "say 'as root' instead:\n" + "\n".join(found)
