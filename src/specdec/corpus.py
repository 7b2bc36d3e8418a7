"""Offline text corpora, tokenized by a target's tokenizer: the retrieval datastore's documents and the
token counts that rank the vocabulary for FR-Spec drafts (``drafters.frequent_vocab``).

Sources (``--source``), all readable without a network:

- ``stdlib``: the Python standard library's own ``.py`` sources (tests left out);
- ``pydoc``: ``pydoc_data.topics``, the English text of Python's help topics;
- ``jsonl:PATH``: one document per line, its ``text``, ``output``, ``completion`` or ``answer`` field
  (the model's own answers to a prompt set: ``specdec generate --prompts-file P.jsonl --json > A.jsonl``).

The evaluation prompts (``spec_bench*``) are refused: a datastore or a ranking that saw them would
measure their own recall, not drafting.
"""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np

SOURCES = ("stdlib", "pydoc")  # the default, in this order; jsonl:PATH adds a file
TEXT_FIELDS = ("text", "output", "completion", "answer")
EVALUATION_NAMES = ("spec_bench",)  # file names never read into a corpus
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


def source_texts(source: str) -> Iterator[str]:
    """The documents of one ``--source``; ValueError (one line) for an unknown or unreadable one."""
    if source == "stdlib":
        return stdlib_texts()
    if source == "pydoc":
        return pydoc_texts()
    if source.startswith("jsonl:"):
        return jsonl_texts(Path(source.removeprefix("jsonl:")).expanduser())
    raise ValueError(f"unknown --source {source!r}; choose from: {', '.join(SOURCES)}, jsonl:PATH")


def stdlib_texts() -> Iterator[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):  # sorted: the same corpus on every machine with this Python
        if SKIP_DIRS.isdisjoint(path.relative_to(root).parts[:-1]):
            try:
                yield path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue  # a few stdlib files are deliberately not UTF-8 (codec tests)


def pydoc_texts() -> Iterator[str]:
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield topics[key]


def jsonl_texts(path: Path) -> Iterator[str]:
    if any(path.name.startswith(name) for name in EVALUATION_NAMES):
        raise ValueError(f"--source jsonl:{path}: that is an evaluation set; a corpus built from it would "
                         "score its own recall")
    if not path.is_file():
        raise ValueError(f"--source jsonl:{path}: no such file")
    return _jsonl_records(path)


def _jsonl_records(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"--source jsonl:{path}: line {n} is not JSON") from None
            text = next((record[k] for k in TEXT_FIELDS if isinstance(record, dict) and isinstance(record.get(k), str)),
                        None)
            if text is None:
                raise ValueError(f"--source jsonl:{path}: line {n} has none of the fields {', '.join(TEXT_FIELDS)}")
            yield text


def tokenize(tokenizer, texts: Iterator[str], max_tokens: int, batch: int = 64) -> list[np.ndarray]:
    """Token ids of each text (no special tokens added), in order, until ``max_tokens`` in all."""
    docs: list[np.ndarray] = []
    total = 0
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == batch:
            total = _encode(tokenizer, chunk, docs, total, max_tokens)
            chunk = []
            if total >= max_tokens:
                return docs
    if chunk:
        _encode(tokenizer, chunk, docs, total, max_tokens)
    return docs


def _encode(tokenizer, texts: list[str], docs: list[np.ndarray], total: int, max_tokens: int) -> int:
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        if total >= max_tokens:
            break
        ids = np.asarray(ids[: max_tokens - total], dtype=np.int32)
        docs.append(ids)
        total += len(ids)
    return total


def corpus_documents(tokenizer, sources: tuple[str, ...] = SOURCES, max_tokens: int = 4_000_000,
                     ) -> list[np.ndarray]:
    """The sources' documents, tokenized, at most ``max_tokens`` shared evenly among the sources (so a
    large one cannot crowd out the rest)."""
    share = max(1, max_tokens // len(sources))
    return [doc for source in sources for doc in tokenize(tokenizer, source_texts(source), share)]
