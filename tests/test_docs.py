"""The user's pages: the README is a front door, and docs/ builds strictly with every page in the nav.

`mkdocs build --strict` fails on a broken link between pages, an anchor that is not there, a
page left out of the nav or a missing snippet (mkdocs.yml's `validation:` makes each a warning).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MKDOCS = Path(sys.executable).parent / "mkdocs"  # the venv's, pinned by the `docs` extra
README_MAX_LINES = 300


def nav_pages(node: Any) -> list[str]:
    """The page files a mkdocs nav names, at any depth."""
    if isinstance(node, str):
        return [node] if node.endswith(".md") else []
    if isinstance(node, dict):
        return [page for value in node.values() for page in nav_pages(value)]
    if isinstance(node, list):
        return [page for item in node for page in nav_pages(item)]
    return []


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    if not MKDOCS.exists():
        pytest.fail(f"{MKDOCS} not found: pip install -e '.[docs]' (scripts/setup-env.sh installs it)")
    site = tmp_path / "site"
    done = subprocess.run([str(MKDOCS), "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                           "--site-dir", str(site)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    assert (site / "index.html").is_file()
    # The support matrix is the README's generated section, included by docs/frameworks.md.
    assert "run.framework_version" in (site / "frameworks" / "index.html").read_text(encoding="utf-8")


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, \
        f"README.md has {lines} lines, at most {README_MAX_LINES}: move the detail into docs/"


def test_every_docs_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs"
    listed = nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(listed) == pages, \
        f"not in the nav: {sorted(set(pages) - set(listed))}; not a page: {sorted(set(listed) - set(pages))}"
    assert len(listed) == len(set(listed)), "a page is listed twice in the nav"


def headings(page: Path) -> set[str]:
    """The anchors of a page's headings, as mkdocs' toc extension makes them (outside code)."""
    from markdown.extensions.toc import slugify

    anchors, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            title = re.sub(r"[`*]", "", line.lstrip("#").strip())
            anchors.add(slugify(title, "-"))
    return anchors


def test_the_readme_links_resolve() -> None:
    """The README's relative links (into docs/, data/, images) name files, and headings, that
    exist; mkdocs does not build the README, so this is its only link check."""
    text = README.read_text(encoding="utf-8")
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+://", t)]
    assert targets, "the README links to nothing"
    missing = sorted({t for t in targets if not (ROOT / t.split("#")[0]).exists()})
    assert not missing, f"README.md links to files that are not there: {missing}"
    anchored = [t.split("#", 1) for t in targets if "#" in t and t.split("#")[0].endswith(".md")]
    broken = sorted(f"{page}#{anchor}" for page, anchor in anchored if anchor not in headings(ROOT / page))
    assert not broken, f"README.md links to headings that are not there: {broken}"
