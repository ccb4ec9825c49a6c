"""The README stays a short first page, and every link in it and in docs/ leads somewhere.

A newcomer reads README.md, then follows its links into docs/. A link to a
moved page or a renamed heading fails here rather than in a reader's browser;
a page nobody links to is one nobody finds. The docs speak to users, so the
project's internal vocabulary (issue numbers, work sessions) stays out of them.
"""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from pathlib import Path

import pytest

import shared

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_MAX_LINES = 220
PAGES = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, *PAGES, ROOT / "CHANGELOG.md"]
# [text](target) or [text](target "title"), outside fenced code blocks.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
EXTERNAL = ("http://", "https://", "mailto:")
INTERNAL_PHRASES = re.compile(
    r"\bissues? #?\d+|the issue's|this session|lent to us|\breview mends?\b", re.IGNORECASE
)


def _prose(path: Path) -> str:
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def _anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: Counter[str] = Counter()
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", _prose(path), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return anchors


def _relative_links(path: Path) -> list[str]:
    return [target for target in LINK.findall(_prose(path)) if not target.startswith(EXTERNAL)]


def test_readme_is_a_short_first_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "make serve" in text and "make test" in text


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(document: Path) -> None:
    broken = []
    for target in _relative_links(document):
        file_part, _, anchor = target.partition("#")
        linked = (document.parent / file_part).resolve() if file_part else document
        if not linked.exists():
            broken.append(f"{target}: no file {linked.relative_to(ROOT)}")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert broken == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in _relative_links(README)}
    assert [page.name for page in PAGES if page.resolve() not in linked] == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_docs_speak_to_users_not_to_the_project(document: Path) -> None:
    assert INTERNAL_PHRASES.findall(document.read_text(encoding="utf-8")) == []


def test_license_is_the_apache_license_pyproject_declares() -> None:
    with (ROOT / "pyproject.toml").open("rb") as file:
        assert tomllib.load(file)["project"]["license"] == "Apache-2.0"
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text


def test_changelog_has_unreleased_work_and_the_current_version() -> None:
    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert headings[0] == "Unreleased"
    assert shared.__version__ in headings
