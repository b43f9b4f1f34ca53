from __future__ import annotations

from pathlib import Path

from drafter_service.demo.build import MARKER, BuildContext, Step, run_steps


def test_steps_skip_complete_and_rebuild_partial(tmp_path: Path) -> None:
    calls: list[str] = []

    def write(ctx: BuildContext, directory: Path) -> None:
        calls.append(directory.name)
        (directory / "weights.txt").write_text("ok")

    steps = [Step("a", "a", write), Step("b", "drafters/b", write)]
    ctx = BuildContext(tmp_path)
    run_steps(ctx, steps)
    assert calls == ["a", "b"] and (tmp_path / "drafters" / "b" / MARKER).exists()

    run_steps(ctx, steps)
    assert calls == ["a", "b"]  # Both complete: nothing rebuilt.

    (tmp_path / "a" / MARKER).unlink()  # As if interrupted before the marker was written.
    (tmp_path / "a" / "stale.txt").write_text("old")
    run_steps(ctx, steps)
    assert calls == ["a", "b", "a"]
    assert not (tmp_path / "a" / "stale.txt").exists()
