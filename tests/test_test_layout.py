"""Test folders have no __init__.py, so pytest imports test files by basename: two files with one name in
different folders fail collection on a fresh checkout ("import file mismatch")."""

from collections import Counter
from pathlib import Path


def test_test_file_names_are_unique_across_folders():
    names = Counter(p.name for p in Path(__file__).parent.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
