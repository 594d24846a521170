"""The front door stays a front door: a README a newcomer can read, links that lead somewhere,
and a repository that stands alone (nothing points outside it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation gone, spaces as hyphens."""
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_the_readme_fits_on_a_few_screens_with_run_and_test_on_the_first() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 300
    first_screen = "\n".join(lines[:25])
    assert "make run" in first_screen
    assert "make test" in first_screen


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        missing_heading = anchor and linked.suffix == ".md" and anchor not in anchors(linked)
        if not linked.exists() or missing_heading:
            broken.append(target)
    assert broken == []


def test_nothing_in_the_repository_points_outside_it() -> None:
    outside = re.compile(r"\.\./shared|shared/DESIGN\.md|REFERENCES\.md|STYLE\.md")
    found = []
    for path in ROOT.rglob("*"):
        parts = set(path.relative_to(ROOT).parts)
        ignored = {".git", ".venv", ".models", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
        if parts & ignored or any(part.endswith(".egg-info") for part in parts):
            continue
        if path.is_file() and path.suffix in {".md", ".py", ".yaml", ".toml", ".tf", ".sh", ""}:
            try:
                text = path.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            found += [f"{path.relative_to(ROOT)}" for _ in outside.findall(text)]
    assert found == []
