"""Retrieval drafting cost, in microseconds per step, and what the drafts hold.

Each text below (none from the evaluation set) is tokenized with the datastore's tokenizer and
walked token by token: at every position the drafter proposes from the context so far, as it
would at every decode step. Prints the cost per step (mean, median, p90), the share of steps with
a match, the mean match length and draft size; with --generate, also greedy tau (accepted tokens
per verify pass + 1) on those texts as chat prompts.

    python scripts/retrieval_cost.py --datastore PATH [--model M] [--generate 64]
"""

from __future__ import annotations

import argparse
import statistics
import time

from specdec.datastore import Datastore, tokenizer_identity
from specdec.drafters.retrieval import RetrievalDrafter, longest_match
from specdec.model.weights import resolve_model
from specdec.text import load_tokenizer

TEXTS = [
    "Write a Python function that reads a CSV file and returns the rows as a list of dictionaries.",
    "def parse_args():\n    parser = argparse.ArgumentParser(description='Copy files.')\n"
    "    parser.add_argument('--verbose', action='store_true', help='print each file')\n",
    "Explain the difference between a list and a tuple in Python, with an example of each.",
    "The quick brown fox jumps over the lazy dog. Summarize this sentence in five words.",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
]


def walk(drafter: RetrievalDrafter, ids: list[int], budget: int) -> dict[str, float]:
    seconds, sizes, matches = [], [], []
    for end in range(2, len(ids) + 1):
        context = ids[:end]
        t0 = time.perf_counter()
        proposal = drafter.propose(context, budget)
        seconds.append(time.perf_counter() - t0)
        sizes.append(len(proposal))
        m = longest_match(drafter.store, context[-drafter.max_match:], drafter.min_match, drafter.max_match)
        matches.append(0 if m is None else m.length)
    us = sorted(s * 1e6 for s in seconds)
    return dict(steps=len(us), mean_us=statistics.fmean(us), median_us=us[len(us) // 2],
                p90_us=us[int(0.9 * (len(us) - 1))], matched=sum(m > 0 for m in matches) / len(matches),
                match_len=statistics.fmean(m for m in matches if m) if any(matches) else 0.0,
                draft=statistics.fmean(sizes))


def generate_tau(model: str | None, datastore: str, n: int) -> list[tuple[str, float, float]]:
    from specdec.config import SamplingParams, SpecConfig, SpecType
    from specdec.llm import LLM

    llm = LLM(model, max_model_len=2048, spec=SpecConfig(types=(SpecType.RETRIEVAL,), datastore=datastore))
    rows = []
    for text in TEXTS:
        out = llm.generate(llm.chat_prompt([{"role": "user", "content": text}]), SamplingParams(max_new_tokens=n))[0]
        s = out.stats
        rows.append((text[:40].replace("\n", " "), 1 + s.accepted / max(1, s.decode_passes),
                     s.accepted / max(1, s.drafted)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datastore", required=True)
    ap.add_argument("--model", default=None, help="the tokenizer's model (default: smollm2-135m)")
    ap.add_argument("--budget", type=int, default=8, help="draft tokens per step (--spec-draft-n-max)")
    ap.add_argument("--generate", type=int, default=0, metavar="N", help="also greedy tau over N new tokens")
    args = ap.parse_args()
    tokenizer = load_tokenizer(resolve_model(args.model, weights=False))
    store = Datastore.load(args.datastore)
    store.check_tokenizer(tokenizer_identity(tokenizer), len(tokenizer), where=args.datastore)
    drafter = RetrievalDrafter(store, max_tokens=args.budget)
    print(f"datastore {args.datastore}: {store.num_tokens:,} tokens ({store.sources})")
    print("| text | steps | mean us | median us | p90 us | steps matched | mean match | mean draft |")
    print("|---|---|---|---|---|---|---|---|")
    for text in TEXTS:
        r = walk(drafter, tokenizer(text, add_special_tokens=False)["input_ids"], args.budget)
        print(f"| {text[:32]!r} | {r['steps']} | {r['mean_us']:.0f} | {r['median_us']:.0f} | {r['p90_us']:.0f} "
              f"| {r['matched']:.0%} | {r['match_len']:.1f} | {r['draft']:.1f} |")
    if args.generate:
        print("\n| prompt | tau (greedy) | accepted / drafted |\n|---|---|---|")
        for name, tau, alpha in generate_tau(args.model, args.datastore, args.generate):
            print(f"| {name!r} | {tau:.2f} | {alpha:.2f} |")


if __name__ == "__main__":
    main()
