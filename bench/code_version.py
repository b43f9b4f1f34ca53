"""Which code a benchmark's result came from, and whether that code has changed since (git, read-only).

A result carried from an earlier run (bench/sim.py --arms-from) is only as current as the code that
made it: deterministic as the simulator is, a week of engine and router changes moves its figures.
Each result is stamped with the commit it ran at (and whether the files that decide it had uncommitted
changes); a report that carries it can then say which of those files changed since. Outside a git
checkout every answer is None ("unrecorded").
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path


def _git(repo: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def stamp(repo: Path, paths: Sequence[str]) -> dict:
    """{"commit": HEAD's hash or None, "dirty": whether `paths` differ from it in the work tree}."""
    head = _git(repo, "rev-parse", "HEAD")
    if head is None:
        return {"commit": None, "dirty": None}
    diff = _git(repo, "status", "--porcelain", "--", *paths)
    return {"commit": head.strip(), "dirty": bool(diff and diff.strip())}


def changed_since(repo: Path, commit: str | None, paths: Sequence[str]) -> list[str] | None:
    """The files under `paths` that differ now (work tree included) from `commit`; None when that cannot
    be told (no commit recorded, not a checkout, a commit this clone does not have)."""
    if not commit:
        return None
    out = _git(repo, "diff", "--name-only", commit, "--", *paths)
    if out is None:
        return None
    untracked = _git(repo, "ls-files", "--others", "--exclude-standard", "--", *paths) or ""
    return sorted({*out.split(), *untracked.split()})
