"""The retrieval datastore: suffix array, look-ups on hand-made arrays, the file format and its errors,
the corpus sources, and `specdec datastore build`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdec.cli.main import main
from specdec.corpus import corpus_documents, source_texts
from specdec.datastore import SEP, Datastore, DatastoreError, TokenizerIdentity, suffix_array, tokenizer_identity

IDENTITY = TokenizerIdentity(100, "test")


def test_suffix_array_worked_example():
    assert suffix_array(np.array([5, 6, 5, 7])).tolist() == [0, 2, 1, 3]


def test_suffix_array_sorts_every_suffix_by_its_first_depth_tokens():
    rng = np.random.default_rng(0)
    for _ in range(100):
        tokens = rng.integers(-1, 4, size=int(rng.integers(1, 60)))
        for depth in (2, 8, 64):
            sa = suffix_array(tokens, depth)
            keys = [tokens[i : i + depth].tolist() for i in sa]
            assert sorted(sa.tolist()) == list(range(len(tokens)))
            assert keys == sorted(keys), (tokens, depth)


def test_find_counts_occurrences_and_next_tokens_split_the_range():
    store = Datastore.build([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6]], IDENTITY)
    lo, hi = store.find([1, 2])
    assert hi - lo == 4 and store.occurs([2, 3]) and not store.occurs([2, 1])
    nxt = store.next_tokens(lo, hi, 2)  # what follows [1, 2]: 3 three times, 6 once
    assert [(t, b - a) for t, a, b in nxt] == [(3, 3), (6, 1)]
    t3 = nxt[0]
    assert [(t, b - a) for t, a, b in store.next_tokens(t3[1], t3[2], 3)] == [(4, 2), (5, 1)]
    assert store.next_tokens(*store.find([6]), 1) == []  # a document's end (SEP) is no continuation
    assert store.num_tokens == 15 and (store.tokens[-store.depth :] == SEP).all()


def test_next_tokens_of_a_large_range_samples_candidates_but_counts_exactly():
    rng = np.random.default_rng(1)
    docs = [[7, int(t)] for t in rng.choice([1, 2, 3], size=5000, p=[0.6, 0.3, 0.1])]
    store = Datastore.build(docs, IDENTITY)
    lo, hi = store.find([7])
    exact = {(t, b - a) for t, a, b in store.next_tokens(lo, hi, 1, max_scan=1 << 20)}
    assert {(t, b - a) for t, a, b in store.next_tokens(lo, hi, 1, max_scan=64)} == exact
    assert sum(c for _, c in exact) == 5000


def test_save_load_round_trip(tmp_path):
    store = Datastore.build([[1, 2, 3], [2, 3, 4]], IDENTITY, sources="hand-made")
    store.save(tmp_path / "ds.npz")
    back = Datastore.load(tmp_path / "ds.npz")
    assert back.identity == IDENTITY and back.sources == "hand-made" and back.depth == store.depth
    assert (back.tokens == store.tokens).all() and (back.sa == store.sa).all()


def test_bad_files_and_another_tokenizer_are_one_line_errors(tmp_path):
    with pytest.raises(DatastoreError, match="no such file.*specdec datastore build"):
        Datastore.load(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DatastoreError, match="not a specdec datastore"):
        Datastore.load(tmp_path / "junk.npz")
    np.savez(tmp_path / "old.npz", version=99)
    with pytest.raises(DatastoreError, match="format version 99"):
        Datastore.load(tmp_path / "old.npz")
    store = Datastore.build([[1, 2, 3]], IDENTITY)
    with pytest.raises(DatastoreError, match="another tokenizer"):
        store.check_tokenizer(TokenizerIdentity(100, "other"), 100)
    with pytest.raises(DatastoreError, match="outside the target's vocabulary of 3"):
        store.check_tokenizer(None, 3)
    store.check_tokenizer(IDENTITY, 100)  # the same tokenizer: fine
    for err in (DatastoreError,):
        assert issubclass(err, ValueError)  # the CLI prints a ValueError as one line


def test_corpus_sources_offline_and_the_evaluation_set_refused(tmp_path):
    assert any("def " in t for t in source_texts("stdlib"))
    assert len(list(source_texts("pydoc"))) > 10
    answers = tmp_path / "answers.jsonl"
    answers.write_text(json.dumps({"text": "an answer"}) + "\n" + json.dumps({"output": "another"}) + "\n")
    assert list(source_texts(f"jsonl:{answers}")) == ["an answer", "another"]
    bench = tmp_path / "spec_bench_dev.jsonl"
    bench.write_text(json.dumps({"text": "x"}) + "\n")
    with pytest.raises(ValueError, match="evaluation set"):
        source_texts(f"jsonl:{bench}")
    with pytest.raises(ValueError, match="unknown --source"):
        source_texts("wikipedia")


def test_datastore_build_command(tmp_path, default_model_folder, capsys):
    from specdec.text import load_tokenizer

    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"text": f"Answer {i}: the sea is calm."}) + "\n" for i in range(5)))
    out = tmp_path / "ds.npz"
    assert main(["datastore", "build", "--model", str(default_model_folder), "--out", str(out),
                 "--source", "pydoc", "--source", f"jsonl:{answers}", "--max-tokens", "20000"]) == 0
    store = Datastore.load(out)
    tokenizer = load_tokenizer(default_model_folder)
    assert store.identity == tokenizer_identity(tokenizer) and store.sources == f"pydoc,jsonl:{answers}"
    assert 5 < store.num_tokens <= 20000
    assert store.occurs(tokenizer(" the sea is calm", add_special_tokens=False)["input_ids"])
    assert len(corpus_documents(tokenizer, ("pydoc",), 1000)) >= 1
    # bad input: one line, exit status 2
    assert main(["datastore", "build", "--out", str(out), "--source", "nope"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
