"""bench/code_version.py: a result's commit, and which of the files that decide it changed since."""

import subprocess
from pathlib import Path

from bench.code_version import changed_since, stamp


def _git(repo: Path, *args: str) -> str:
    config = ["-c", "user.name=test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false"]
    return subprocess.run(
        ["git", *config, *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD").strip()


def test_a_stamp_names_the_commit_and_what_changed_after_it(tmp_path):
    repo = tmp_path / "repo"
    (repo / "sim").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "sim" / "replica.py").write_text("A = 1\n")
    (repo / "README.md").write_text("docs\n")
    first = _commit(repo, "first")
    assert stamp(repo, ["sim"]) == {"commit": first, "dirty": False}
    assert changed_since(repo, first, ["sim"]) == []

    (repo / "README.md").write_text("other docs\n")  # outside the paths: not the result's code
    assert stamp(repo, ["sim"])["dirty"] is False
    (repo / "sim" / "replica.py").write_text("A = 2\n")
    assert stamp(repo, ["sim"]) == {"commit": first, "dirty": True}
    assert changed_since(repo, first, ["sim"]) == ["sim/replica.py"]

    second = _commit(repo, "second")
    (repo / "sim" / "new.py").write_text("B = 1\n")  # a new file not yet committed counts too
    assert changed_since(repo, first, ["sim"]) == ["sim/new.py", "sim/replica.py"]
    assert changed_since(repo, second, ["sim"]) == ["sim/new.py"]
    # Unrecorded, or a commit this clone does not have: it cannot be told.
    assert changed_since(repo, None, ["sim"]) is None
    assert changed_since(repo, "0" * 40, ["sim"]) is None


def test_outside_a_checkout_nothing_is_recorded(tmp_path):
    assert stamp(tmp_path, ["sim"]) == {"commit": None, "dirty": None}
