"""The repository stands on its own: code cites docs/ by section, every cited section exists, and
nothing points at design documents outside the repository."""

from __future__ import annotations

import os
import re
from pathlib import Path

from serving import REPO

DOCS = ("ALGORITHM.md", "ARCHITECTURE.md")
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache"}
BUILT_DIRS = {"models", "build"}  # at the top: the demo stack and build outputs, not sources
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".proto", ".toml", ".cfg", ".txt"} | {""}
# "docs/ALGORITHM.md §7", "docs/ALGORITHM.md §2-§4", "docs/ALGORITHM.md §7 and §8"
CITATION = re.compile(r"docs/(?P<doc>[A-Z]+\.md)\s*(?P<sections>§\d+(?:\s*(?:-|–|,|and)\s*§\d+)*)")
OUTSIDE = re.compile(r"\.\./shared|shared/docs|\bDSPARK\.md|\bDESIGN\.md")


def repo_files() -> list[Path]:
    """Source and documentation files of the checkout, without this test (its examples are not cited)."""
    this, files = Path(__file__).resolve(), []
    for root, dirs, names in os.walk(REPO):
        top = Path(root) == REPO
        dirs[:] = [
            d
            for d in dirs
            if d not in SKIP_DIRS
            and not (top and d in BUILT_DIRS)
            and not d.endswith(".egg-info")
            and "_generated" not in d
        ]
        files += [Path(root, n) for n in names if Path(n).suffix in SUFFIXES]
    return [f for f in files if f.resolve() != this]


def sections(doc: str) -> set[int]:
    text = (REPO / "docs" / doc).read_text(encoding="utf-8")
    return {int(n) for n in re.findall(r"^## (\d+)\. ", text, flags=re.M)}


def test_docs_sections_are_numbered_in_order():
    for doc in DOCS:
        numbers = sections(doc)
        assert numbers == set(range(1, len(numbers) + 1)), doc


def test_every_cited_section_exists():
    known = {doc: sections(doc) for doc in DOCS}
    cited, missing = 0, []
    for path in repo_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in CITATION.finditer(text):
            numbers = [int(n) for n in re.findall(r"§(\d+)", match.group("sections"))]
            cited += 1
            if match.group("doc") not in known or not set(numbers) <= known[match.group("doc")]:
                missing.append(f"{path.relative_to(REPO)}: {match.group(0)}")
    assert cited >= 10 and not missing, missing


def test_nothing_points_outside_the_repository():
    offenders = [
        f"{path.relative_to(REPO)}: {m.group(0)}"
        for path in repo_files()
        for m in OUTSIDE.finditer(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not offenders, offenders
