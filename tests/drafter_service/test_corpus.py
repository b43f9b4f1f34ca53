from __future__ import annotations

from pathlib import Path

from drafter_service.demo import corpus


def test_split_is_a_stable_hash() -> None:
    keys = [f"pkg/mod_{i}.py" for i in range(2000)]
    first = [corpus.split_of(k) for k in keys]
    assert first == [corpus.split_of(k) for k in reversed(keys)][::-1]
    heldout = first.count("heldout") / len(keys)
    assert 0.03 < heldout < 0.07
    # Pinned values: a change to the hash would silently reshuffle every trained model's data.
    assert corpus.split_of("asyncio/futures.py") == "heldout"
    assert corpus.split_of("argparse.py") == "train"


def test_domains_and_splits_are_non_empty_and_disjoint() -> None:
    docs = corpus.load_documents()
    for domain in corpus.DOMAINS:
        train = {d.key for d in docs if d.domain == domain and d.split == "train"}
        heldout = {d.key for d in docs if d.domain == domain and d.split == "heldout"}
        assert len(train) > 100 and len(heldout) > 5
        assert not train & heldout
        assert corpus.documents(domain, "heldout")
    # A file's docstrings share its code's split, so held-out prose was never trained on as code.
    splits = {}
    for d in docs:
        assert splits.setdefault(d.key, d.split) == d.split


def test_exclusions_and_order(tmp_path: Path) -> None:
    files = {
        "b.py": "x = 1\n",
        "a.py": '"""Doc of a."""\n\ndef f():\n    """Doc of f."""\n',
        "test/test_a.py": "assert True\n",
        "site-packages/pkg.py": "y = 2\n",
        "encodings/cp999.py": '""" Codec cp999 generated from \'X.TXT\' with gencodec.py."""\n',
        "latin1.py": None,
        "_sysconfigdata_x.py": "build_time_vars = {}\n",
        "broken.py": "def (:\n",
    }
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"s = '\xe9'\n" if text is None else text.encode())
    assert [rel for rel, _ in corpus.source_files(tmp_path)] == ["a.py", "b.py", "broken.py"]
    docs = corpus.load_documents(tmp_path)
    assert [(d.key, d.domain) for d in docs if not d.key.startswith("pydoc_data")] == [
        ("a.py", "code"),
        ("a.py", "prose"),
        ("b.py", "code"),
    ]
    assert next(d.text for d in docs if d.domain == "prose") == "Doc of a.\n\nDoc of f."


def test_heldout_prompts_by_characters_and_tokens(small_tokenizer) -> None:
    by_chars = corpus.heldout_prompts("code", 12, 200)
    assert len(by_chars) == 12 and all(len(p) == 200 for p in by_chars)
    assert by_chars == corpus.heldout_prompts("code", 12, 200)
    heldout = corpus.documents("code", "heldout")
    assert all(any(p in doc for doc in heldout) for p in by_chars)
    by_tokens = corpus.heldout_prompts("prose", 5, 32, tokenizer=small_tokenizer)
    assert len(by_tokens) == 5
    assert all(len(small_tokenizer(p, add_special_tokens=False)["input_ids"]) == 32 for p in by_tokens)
