"""The demo corpus: text that every Python installation ships, so `make models` needs no network.

Two domains:

- ``code``: the standard library's own ``.py`` sources;
- ``prose``: the documentation topics in ``pydoc_data.topics`` plus the module, class and function
  docstrings of those same sources, extracted with ``ast``.

Each document is assigned to ``train`` or ``heldout`` by a hash of a stable key (the file's path relative
to the stdlib root, or the pydoc topic name), never by file-system order, so the split is deterministic
and a file that one patch release adds or removes moves no other document across the split.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from transformers import PreTrainedTokenizerBase

Domain = Literal["code", "prose"]
Split = Literal["train", "heldout"]
DOMAINS: tuple[Domain, ...] = ("code", "prose")
SPLITS: tuple[Split, ...] = ("train", "heldout")

HELDOUT_PER_MILLE = 50  # ~5 % of the files of each domain are held out.

# Directories whose files are not representative library code: tests (and their fixtures, some of which
# are deliberately broken or Python 2), the IDLE application, demos, third-party packages, build configs.
EXCLUDED_DIRS = frozenset(
    {
        "site-packages",
        "dist-packages",
        "test",
        "tests",
        "idle_test",
        "idlelib",
        "turtledemo",
        "__pycache__",
        "pydoc_data",  # one 750 KB generated data file; its content is the prose domain instead.
    }
)
# Installation-specific files: they differ between machines, so including them would make the corpus
# (and the trained models) depend on where Python was built.
EXCLUDED_PREFIXES = ("_sysconfigdata", "config-")
# Generated tables (codec maps, Unicode data) teach the model nothing about Python and are large.
GENERATED_MARKERS = (
    "generated from '",
    "automatically generated",
    "auto-generated",
    "this file is generated",
    "do not edit",
)
MAX_FILE_BYTES = 300_000


@dataclass(frozen=True)
class Document:
    """One training or evaluation text; ``key`` decides its split."""

    key: str
    domain: Domain
    text: str

    @property
    def split(self) -> Split:
        return split_of(self.key)


def split_of(key: str, heldout_per_mille: int = HELDOUT_PER_MILLE) -> Split:
    """Deterministic split of a document key: sha256, so it is stable across runs and Python versions."""
    bucket = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % 1000
    return "heldout" if bucket < heldout_per_mille else "train"


def stdlib_root() -> Path:
    """Directory of this interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _is_excluded(rel: Path) -> bool:
    if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):
        return True
    return any(part.startswith(EXCLUDED_PREFIXES) for part in rel.parts)


def _read_source(path: Path) -> str | None:
    """The file's text, or None when it is not utf-8, too large, or generated."""
    data = path.read_bytes()
    if len(data) > MAX_FILE_BYTES or b"\x00" in data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    head = text[:400].lower()
    if any(marker in head for marker in GENERATED_MARKERS):
        return None
    return text


def source_files(root: Path) -> Iterator[tuple[str, str]]:
    """Yield ``(relative posix path, text)`` of the usable ``.py`` files under ``root``, sorted by path."""
    rels = sorted(p.relative_to(root) for p in root.rglob("*.py") if p.is_file())
    for rel in rels:
        if _is_excluded(rel):
            continue
        text = _read_source(root / rel)
        if text is not None and text.strip():
            yield rel.as_posix(), text


def docstrings(source: str) -> list[str] | None:
    """Module, class and function docstrings in source order; None when the file does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    nodes = [tree] + [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    # ast.walk is breadth-first; sort by line so a document reads in the file's order.
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    found = (ast.get_docstring(n, clean=True) for n in nodes)
    return [d for d in found if d and d.strip()]


def _pydoc_topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # Some distributions strip pydoc_data; the docstrings still give prose.
        return {}
    return dict(topics)


@functools.lru_cache(maxsize=4)
def load_documents(root: Path | None = None) -> tuple[Document, ...]:
    """Every document of both domains, in a deterministic order (cached: parsing takes a few seconds)."""
    root = stdlib_root() if root is None else Path(root)
    docs: list[Document] = []
    for rel, text in source_files(root):
        strings = docstrings(text)
        if strings is None:
            continue  # Not valid Python for this interpreter (test data, other dialects): not library code.
        docs.append(Document(rel, "code", text))
        if strings:
            # Same key as the code file: a held-out file's docstrings must not be trained on as prose,
            # and vice versa, or held-out perplexity would be measured on text the model has seen.
            docs.append(Document(rel, "prose", "\n\n".join(strings)))
    for name, text in sorted(_pydoc_topics().items()):
        if text.strip():
            docs.append(Document(f"pydoc_data.topics:{name}", "prose", text.strip()))
    return tuple(docs)


def documents(domain: Domain, split: Split, root: Path | None = None) -> list[str]:
    """Texts of one domain and split."""
    if domain not in DOMAINS or split not in SPLITS:
        raise ValueError(f"unknown domain/split {domain!r}/{split!r}")
    return [d.text for d in load_documents(root) if d.domain == domain and d.split == split]


def train_documents(root: Path | None = None) -> list[str]:
    """Both domains' training texts, in the corpus's deterministic order."""
    return [d.text for d in load_documents(root) if d.split == "train"]


def heldout_prompts(
    domain: Domain,
    count: int,
    length: int,
    tokenizer: PreTrainedTokenizerBase | None = None,
    root: Path | None = None,
) -> list[str]:
    """Up to ``count`` prompts: prefixes of ``length`` tokens (or characters without a tokenizer).

    Each prompt starts at the beginning of a line of a held-out document. Documents are visited
    round-robin (first window of every document, then the second of every document, ...) so a small
    ``count`` still spans many files rather than many windows of one file.
    """
    windows: list[list[str]] = []
    for text in documents(domain, "heldout", root):
        windows.append(list(_windows(text, length, tokenizer)))
    prompts: list[str] = []
    depth = 0
    while len(prompts) < count and any(depth < len(w) for w in windows):
        prompts.extend(w[depth] for w in windows if depth < len(w))
        depth += 1
    return prompts[:count]


def _windows(text: str, length: int, tokenizer: PreTrainedTokenizerBase | None) -> Iterator[str]:
    """Non-overlapping prefixes of ``length`` units starting at line starts of ``text``."""
    start = 0
    while start < len(text):
        rest = text[start:]
        if tokenizer is None:
            window = rest[:length]
            if len(window) < length:
                return
        else:
            # Tokenize a bounded slice only; 16 characters per token is more than any BPE token spans.
            ids = tokenizer(rest[: length * 16], add_special_tokens=False)["input_ids"]
            if len(ids) < length:
                return
            window = tokenizer.decode(ids[:length], clean_up_tokenization_spaces=False)
        # A token boundary inside a multi-byte character decodes to U+FFFD: not a prompt to serve.
        if window.strip() and "\ufffd" not in window:
            yield window
        nxt = text.find("\n", start + len(window))
        if nxt < 0:
            return
        start = nxt + 1
