"""`specdec datastore build`: tokenize an offline corpus with a target's tokenizer into a retrieval datastore."""

from __future__ import annotations

import argparse
import time

from specdec.cli_args import positive_int
from specdec.corpus import SOURCES


def add_datastore_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="datastore_command", required=True, parser_class=type(p))
    b = sub.add_parser("build", help="tokenize a corpus into a datastore for --spec-type retrieval")
    b.add_argument("--model", "-m", default=None,
                   help="the target whose tokenizer writes the ids (a `specdec models` name, GGUF file, folder or "
                        "hub id; default: smollm2-135m)")
    b.add_argument("--out", required=True, metavar="PATH", help="the .npz file to write")
    b.add_argument("--source", action="append", default=None, metavar="SOURCE",
                   help=f"{', '.join(SOURCES)} (Python's own sources and help text, offline) or jsonl:PATH (one "
                        "document per line: a text/output/completion/answer field); repeatable (default: "
                        f"{' and '.join(SOURCES)})")
    b.add_argument("--max-tokens", type=positive_int, default=4_000_000,
                   help="most tokens stored, shared evenly among the sources")


def cmd_datastore(args: argparse.Namespace) -> int:
    from specdec.corpus import corpus_documents
    from specdec.datastore import Datastore, tokenizer_identity
    from specdec.model.weights import resolve_model
    from specdec.text import load_tokenizer

    sources = tuple(args.source or SOURCES)
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(resolve_model(args.model, weights=False))
    docs = corpus_documents(tokenizer, sources, args.max_tokens)
    t1 = time.perf_counter()
    store = Datastore.build(docs, tokenizer_identity(tokenizer), sources=",".join(sources))
    store.save(args.out)
    print(f"{args.out}: {store.num_tokens:,} tokens in {len(docs):,} documents from {', '.join(sources)} "
          f"(tokenized in {t1 - t0:.1f} s, suffix array {time.perf_counter() - t1:.1f} s; tokenizer "
          f"{store.identity.describe()})")
    return 0
