"""FR-Spec: a draft model's one-token pass by the size of its LM head, and what the subset covers.

Loads the draft model once, times a one-token decode pass (median of --passes, after a 64-token
prompt) with its whole head, then with the head cut to each N (largest first: the top-N sets are
nested, so each cut is a subset of the last). Coverage: the share of the offline corpus's tokens
(``corpus.SOURCES``) inside the subset, and of the model's own greedy answers to a few prompts
(not from the evaluation set), the ceiling on how often a subset draft can be accepted.

    python scripts/draft_vocab_cost.py [--model M] [--sizes 32768,16384,8192,4096] [--passes 50]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

from specdec.config import SamplingParams
from specdec.drafters.frequent_vocab import frequent_tokens, special_ids, vocab_counts
from specdec.llm import LLM
from specdec.runners.base import SeqInput

PROMPTS = ["Explain how a hash map works in four sentences.", "Write a haiku about autumn rain.",
           "Give three tips for writing clear emails."]


def pass_ms(runner, passes: int) -> float:
    slot = runner.allocate()
    runner.run([SeqInput(slot, list(range(1000, 1064)), all_logits=False)])
    times = []
    for i in range(passes):
        times.append(runner.run([SeqInput(slot, [1000 + i])]).seconds * 1e3)
    runner.free(slot)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="the draft model (default: smollm2-135m)")
    ap.add_argument("--sizes", default="32768,16384,8192,4096")
    ap.add_argument("--passes", type=int, default=50)
    ap.add_argument("--answer-tokens", type=int, default=64)
    args = ap.parse_args()
    llm = LLM(args.model, max_model_len=512, spec="none")
    runner, tokenizer = llm.runner, llm.tokenizer
    counts = vocab_counts(tokenizer, runner.vocab_size)
    answers = np.concatenate([llm.generate(llm.chat_prompt([{"role": "user", "content": p}]),
                                           SamplingParams(max_new_tokens=args.answer_tokens))[0].token_ids
                              for p in PROMPTS])
    keep = special_ids(tokenizer, runner.eos_token_ids)
    print(f"{args.model or 'smollm2-135m'}: {runner.vocab_size:,} tokens, {runner.weights_label}")
    print("| head rows | one-token pass ms | corpus tokens covered | own answers' tokens covered |")
    print("|---|---|---|---|")
    print(f"| {runner.vocab_size:,} (all) | {pass_ms(runner, args.passes):.2f} | 100% | 100% |")
    current = np.arange(runner.vocab_size)
    for n in sorted((int(s) for s in args.sizes.split(",")), reverse=True):
        if n >= len(current):
            continue
        ids = frequent_tokens(counts, n, keep)
        runner.restrict_head(torch.from_numpy(np.searchsorted(current, ids)))  # rows of the current head
        current = ids
        corpus = counts[ids].sum() / counts.sum()
        own = np.isin(answers, ids).mean()
        print(f"| {n:,} | {pass_ms(runner, args.passes):.2f} | {corpus:.1%} | {own:.1%} |")


if __name__ == "__main__":
    main()
