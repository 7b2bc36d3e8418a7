"""`specdec datastore build`: tokenize an offline corpus with a target's tokenizer into a retrieval datastore;
`specdec datastore answers`: the target's own greedy answers to the project's prompt set, a source for it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from specdec.cli.args import add_model_args, model_options, positive_int
from specdec.corpus import SOURCES
from specdec.errors import UsageError


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
    a = sub.add_parser("answers", help="the target's own greedy answers to a generated prompt set (a jsonl source)")
    add_model_args(a)
    a.add_argument("--out", required=True, metavar="PATH",
                   help="the .jsonl file to append to (prompts it already answers are skipped: a cut run resumes)")
    a.add_argument("--prompts", type=positive_int, default=200,
                   help="how many of the project's templated prompts (stdlib modules, help topics and their text, "
                        "built-ins, arithmetic; never an evaluation set) to answer (default 200)")
    a.add_argument("--max-new-tokens", type=positive_int, default=128, help="tokens per answer at most (default 128)")


def cmd_datastore(args: argparse.Namespace) -> int:
    if args.datastore_command == "answers":
        return cmd_answers(args)
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


def cmd_answers(args: argparse.Namespace) -> int:
    from specdec.llm import LLM
    from specdec.own_answers import own_prompts, write_answers

    out = Path(args.out)
    if out.suffix != ".jsonl":
        raise UsageError(f"--out {out}: answers are written as .jsonl (one answer a line)")
    llm = LLM(args.model, **model_options(args))
    t0 = time.perf_counter()
    log = lambda line: print(f"[specdec datastore answers] {line}", file=sys.stderr, flush=True)  # noqa: E731
    n = write_answers(llm, own_prompts(args.prompts), args.max_new_tokens, out, log)
    print(f"{out}: {n} new answers of {llm.model_name} ({args.prompts} prompts, greedy, at most {args.max_new_tokens} "
          f"tokens each; {time.perf_counter() - t0:.1f} s). Next: specdec datastore build --model ... --out STORE.npz "
          f"--source jsonl:{out}")
    return 0
