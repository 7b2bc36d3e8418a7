"""Plain (autoregressive) decoding speed: specdec's native runner vs transformers `generate`.

Same model folder, prompts, dtype and token budget; both sides measured in one
process, one after the other, each after a warm-up. Prints a markdown table.

    python scripts/ar_speed.py [--model M] [--dtypes float32,bfloat16] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from specdec.config import SamplingParams
from specdec.llm import LLM

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain in three sentences why the sky is blue.",
    "List five uses of a paperclip.",
]


def specdec_speed(llm: LLM, prompts: list[list[int]], n: int) -> tuple[float, list[list[int]]]:
    params = SamplingParams(max_new_tokens=n, ignore_eos=True)
    tokens, seconds, outs = 0, 0.0, []
    for ids in prompts:
        out = llm.generate(ids, params)[0]
        tokens += len(out.token_ids)
        seconds += out.stats.seconds
        outs.append(out.token_ids)
    return tokens / seconds, outs


def transformers_speed(folder, dtype: torch.dtype, prompts: list[list[int]], n: int, threads: int):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False)
    model.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=False)  # warm-up
    tokens, seconds, outs = 0, 0.0, []
    for ids in prompts:
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), **kw)[0, len(ids) :].tolist()
        seconds += time.perf_counter() - t0
        tokens += len(out)
        outs.append(out)
    return tokens / seconds, outs


def until_eos(ids: list[int], eos: set[int]) -> list[int]:
    """Tokens up to the first EOS: past it specdec (ignore_eos) and transformers (min_new_tokens,
    which masks EOS) legitimately differ."""
    cut = next((i for i, t in enumerate(ids) if t in eos), len(ids))
    return ids[:cut]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    default_threads = torch.get_num_threads()
    rows = []
    for dtype in args.dtypes.split(","):
        llm = LLM(args.model, dtype=dtype)
        prompts = [llm.chat_prompt([{"role": "user", "content": p}]) for p in PROMPTS]
        llm.warmup()
        ours, our_ids = specdec_speed(llm, prompts, args.max_new_tokens)
        backend, our_threads = llm.runner.backend, torch.get_num_threads()
        theirs, their_ids = transformers_speed(
            llm.folder, llm.runner.dtype, prompts, args.max_new_tokens, default_threads
        )
        eos = set(llm.runner.eos_token_ids)
        same = sum(until_eos(a, eos) == until_eos(b, eos) for a, b in zip(our_ids, their_ids, strict=True))
        rows.append((dtype, ours, theirs, backend, our_threads, same, len(prompts)))
        del llm
    print(f"CPU: {platform.processor() or platform.machine()}, {default_threads} threads, torch {torch.__version__}")
    print(f"{args.max_new_tokens} new tokens x {len(PROMPTS)} chat prompts, greedy, default model\n")
    print("| dtype | specdec tok/s | transformers tok/s | ratio | specdec backend | same greedy output (to EOS) |")
    print("|---|---|---|---|---|---|")
    for dtype, ours, theirs, backend, threads, same, total in rows:
        print(f"| {dtype} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f}x | {backend} ({threads} torch thread) "
              f"| {same}/{total} |")


if __name__ == "__main__":
    main()
