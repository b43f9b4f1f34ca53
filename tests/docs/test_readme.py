"""Every example in README.md runs as written, against a live stack.

The examples address the demo stack `make serve` starts: HTTP on localhost:8000, gRPC on
localhost:9000, the model served as "target" from `models/target`, the CLI from `.venv/bin/`; the
DeepSpec example names a user's target and checkpoint by placeholder paths. The test stack serves the
tiny test checkpoint under the same name "target", so only these environment-specific strings are
rewritten, and nothing else in a block:

    http://localhost:8000 / localhost:8000  ->  the test stack's HTTP address
    localhost:9000                          ->  the test stack's gRPC address
    models/target, /models/Qwen3-4B         ->  the tiny test checkpoint's directory
    /checkpoints/dspark_qwen3_4b_block7     ->  a drafter in DeepSpec's layout for it
                                                (tests/drafter_service/deepspec_fixture.py)
    .venv/bin/                              ->  the directory of the Python running the tests

Python blocks run in a subprocess with this interpreter, bash blocks with `bash -euo pipefail`; each
must exit 0 and print something. Every fenced block is run unless the line before it is a comment
`<!-- not run by tests/docs/test_readme.py: REASON -->`; a block in any other language that is not
so marked fails the test, so no example can silently go unchecked.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from serving import REPO

README = REPO / "README.md"
SKIP = re.compile(r"<!-- not run by tests/docs/test_readme\.py: (?P<reason>\S.*?) -->")
RUNNERS = {"python": [sys.executable, "-"], "bash": ["bash", "-euo", "pipefail", "-s"]}
TIMEOUT_S = 300


def fenced_blocks(text: str) -> list[tuple[int, str, str, str | None]]:
    """(line number, language, code, reason it is not run or None) of every fenced block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^(```+)\s*(\S*)", lines[i])
        if not fence:
            i += 1
            continue
        start, marker, language = i, fence.group(1), fence.group(2)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(marker))
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP.fullmatch(before.strip())
        code = "\n".join(lines[start + 1 : end]) + "\n"
        blocks.append((start + 1, language, code, skip.group("reason") if skip else None))
        i = end + 1
    return blocks


def localize(code: str, http_url: str, grpc_target: str, model_dir: Path, deepspec_dir: Path) -> str:
    http = urlparse(http_url)
    for demo, test in [
        ("http://localhost:8000", f"http://{http.netloc}"),
        ("localhost:8000", http.netloc),
        ("localhost:9000", grpc_target),
        ("/models/Qwen3-4B", str(model_dir)),
        ("/checkpoints/dspark_qwen3_4b_block7", str(deepspec_dir)),
        ("models/target", str(model_dir)),
        (".venv/bin/", f"{Path(sys.executable).parent}/"),
    ]:
        code = code.replace(demo, test)
    return code


@pytest.fixture(scope="module")
def deepspec_dir(tmp_path_factory, qwen3_dir) -> Path:
    """A DSpark drafter for the tiny target, written in DeepSpec's layout by the drafter tests' fixture."""
    path = REPO / "tests" / "drafter_service" / "deepspec_fixture.py"
    spec = importlib.util.spec_from_file_location("deepspec_fixture", path)
    fixture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixture)
    config = fixture.draft_config(qwen3_dir, target_layer_ids=[-1, 1], block_size=4, mask_token_id=1)
    return fixture.write_checkpoint(tmp_path_factory.mktemp("deepspec") / "drafter", qwen3_dir, config)


BLOCKS = fenced_blocks(README.read_text(encoding="utf-8"))
RUN = [(line, language, code) for line, language, code, reason in BLOCKS if reason is None]


def test_the_readme_has_examples_and_every_block_is_run_or_marked():
    assert len(RUN) >= 3
    unknown = [(line, language) for line, language, _ in RUN if language not in RUNNERS]
    assert not unknown, f"README blocks neither runnable nor marked not-runnable: {unknown}"


def test_the_rewrite_touches_only_addresses_and_paths():
    code = 'OpenAI(base_url="http://localhost:8000/v1"); Client("localhost:9000"); LLM("models/target")'
    out = localize(code, "http://127.0.0.1:4321", "127.0.0.1:5678", Path("/tmp/ckpt"), Path("/tmp/ds"))
    assert out == 'OpenAI(base_url="http://127.0.0.1:4321/v1"); Client("127.0.0.1:5678"); LLM("/tmp/ckpt")'
    cli = "dspark generate --model /models/Qwen3-4B --drafter-model /checkpoints/dspark_qwen3_4b_block7"
    assert localize(cli, "http://h:1", "h:2", Path("/t"), Path("/d")) == (
        "dspark generate --model /t --drafter-model /d"
    )


@pytest.mark.parametrize("line, language, code", RUN, ids=[f"README.md:{b[0]}-{b[1]}" for b in RUN])
def test_readme_example_runs(serve_stack, deepspec_dir, line, language, code):
    if language not in RUNNERS:
        pytest.fail(f"README.md:{line}: no runner for a {language!r} block; mark it not-runnable")
    script = localize(
        code, serve_stack.http_url, serve_stack.grpc_target, serve_stack.model_dir, deepspec_dir
    )
    done = subprocess.run(
        RUNNERS[language],
        input=script,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, f"README.md:{line} failed:\n{script}\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), f"README.md:{line} printed nothing"
