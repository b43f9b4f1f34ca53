"""Generate the Python gRPC code from proto/dspark/v1/*.proto (grpcio-tools), never committed.

Run as `python -m dspark_client._codegen` (what `make install` does), by the SDK's wheel build, or on
first import from a source checkout. Output goes to `dspark_client/_generated/`, with a hash of the
sources so a changed .proto is noticed and the code rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
OUT_DIR = PACKAGE_DIR / "_generated"
# The repository's proto/ folder; absent when the SDK was installed from a wheel.
PROTO_ROOT = PACKAGE_DIR.parents[1] / "proto"
HASH_FILE = "SOURCE_HASH"
# Generated modules import each other by this prefix, so the protos are laid out under it for protoc.
IMPORT_PREFIX = Path("dspark_client", "_generated")


def proto_files(root: Path = PROTO_ROOT) -> list[Path]:
    return sorted(root.glob("dspark/v1/*.proto"))


def source_hash(root: Path = PROTO_ROOT) -> str:
    digest = hashlib.sha256()
    for path in proto_files(root):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def is_stale(root: Path = PROTO_ROOT, out: Path = OUT_DIR) -> bool:
    """True when there is no generated code, or the sources here changed since it was generated."""
    if not (out / HASH_FILE).is_file():
        return True
    if not proto_files(root):  # installed from a wheel: what it shipped is what there is
        return False
    return (out / HASH_FILE).read_text().strip() != source_hash(root)


def generate(root: Path = PROTO_ROOT, out: Path = OUT_DIR) -> Path:
    from grpc_tools import protoc  # a build-time dependency only

    files = proto_files(root)
    if not files:
        raise FileNotFoundError(f"no .proto files under {root}/dspark/v1")
    with tempfile.TemporaryDirectory(prefix="dspark-protoc-") as tmp:
        src, dst = Path(tmp, "src"), Path(tmp, "out")
        for path in files:
            target = src / IMPORT_PREFIX / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        dst.mkdir()
        args = [
            "grpc_tools.protoc",
            f"-I{src}",
            f"-I{Path(protoc.__file__).parent / '_proto'}",
            f"--python_out={dst}",
            f"--pyi_out={dst}",
            f"--grpc_python_out={dst}",
            *(str(src / IMPORT_PREFIX / p.relative_to(root)) for p in files),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {[str(p) for p in files]}")
        generated = dst / IMPORT_PREFIX
        for folder in [generated, *(p for p in generated.rglob("*") if p.is_dir())]:
            (folder / "__init__.py").touch()
        (generated / HASH_FILE).write_text(source_hash(root) + "\n")
        _swap_in(generated, out)
    return out


def _swap_in(new: Path, out: Path) -> None:
    """Replace `out` by `new` with renames, so concurrent importers never see a half-written package."""
    staging = out.with_name(f"{out.name}.new-{os.getpid()}")
    shutil.copytree(new, staging)
    old = out.with_name(f"{out.name}.old-{os.getpid()}")
    if out.exists():
        os.replace(out, old)
    try:
        os.replace(staging, out)
    except OSError:  # another process won the race; its output is as good as ours
        shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


def main() -> int:
    out = generate()
    print(f"generated gRPC code from {PROTO_ROOT} into {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
