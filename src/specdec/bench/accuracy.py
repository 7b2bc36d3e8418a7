"""`specdec bench accuracy`: a quantized format against the dequantised float32 model, same file.

A quantized path is a different numeric model (llama.cpp's is too): this measures how different,
on text that ships with Python (so it is the same on every machine and never a training set):
the largest logit difference, the perplexity of both on the fixed text, and how many greedy
continuations of a few prompts agree token for token. What must be exact is speculation vs plain
decoding *within* a format; the tests pin that.
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from specdec.llm import LLM
from specdec.runners.base import ModelRunner, SeqInput
from specdec.sampling import SamplingParams

PROMPTS = (
    "Explain what a Python generator is in two sentences.",
    "Write a haiku about the autumn sea.",
    "List three prime numbers greater than 50.",
    "Translate to French: The library opens at nine in the morning.",
    "Rename the variable total to acc:\ndef add_all(xs):\n    total = 0\n    for x in xs:\n        total += x\n"
    "    return total\n",
)


def fixed_text() -> str:
    """English prose that ships with CPython: the reference manual's chapter on assignment."""
    from pydoc_data.topics import topics

    return topics["assignment"]


def score(runner: ModelRunner, ids: list[int]) -> tuple[torch.Tensor, float]:
    """Teacher-forced logits over ``ids`` (one pass) and the perplexity of ids[1:]."""
    slot = runner.allocate()
    try:
        logits = runner.run([SeqInput(slot, ids)]).logits[0]
    finally:
        runner.free(slot)
    nll = torch.nn.functional.cross_entropy(logits[:-1].float(), torch.tensor(ids[1:]))
    return logits, math.exp(nll.item())


def cmd_accuracy(args: argparse.Namespace) -> int:
    quant = args.quantization or "gguf"
    kw = dict(dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype, device=args.device, backend=args.backend,
              max_model_len=args.tokens + 256, spec="none")
    test = LLM(args.model, quantization=quant, **kw)
    ref = LLM(args.model, quantization="none", **kw)
    ids = test.encode(fixed_text())[: args.tokens]
    got, ppl_test = score(test.runner, ids)
    want, ppl_ref = score(ref.runner, ids)
    diff = (got - want).abs()
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    same, prefix = 0, []
    for text in PROMPTS:
        prompt = _prompt(test, text)
        outs = [llm.generate([prompt], params)[0].token_ids for llm in (test, ref)]
        same += outs[0] == outs[1]
        prefix.append(next((i for i, (a, b) in enumerate(zip(*outs, strict=False)) if a != b), min(map(len, outs))))
    result = {
        "model": test.model_name, "weights": test.runner.weights_label, "reference": ref.runner.weights_label,
        "text_tokens": len(ids), "max_abs_logit_diff": diff.max().item(), "mean_abs_logit_diff": diff.mean().item(),
        "logit_scale": want.abs().max().item(),
        "top1_agreement": (got.argmax(-1) == want.argmax(-1)).float().mean().item(),
        "perplexity": ppl_test, "perplexity_reference": ppl_ref, "greedy_identical": same, "prompts": len(PROMPTS),
        "greedy_common_prefix": prefix, "max_new_tokens": args.max_new_tokens,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['model']}: {result['weights']} vs {result['reference']}, {len(ids)} tokens of "
          "pydoc_data 'assignment'")
    print("| measure | quantized | float32 reference |")
    print("|---|---:|---:|")
    print(f"| perplexity on the fixed text | {ppl_test:.3f} | {ppl_ref:.3f} |")
    print(f"| max / mean abs logit difference (largest logit {result['logit_scale']:.1f}) | "
          f"{result['max_abs_logit_diff']:.3f} / {result['mean_abs_logit_diff']:.3f} | 0 |")
    print(f"| top-1 agreement over the text | {result['top1_agreement']:.3f} | 1 |")
    print(f"| greedy outputs identical ({args.max_new_tokens} tokens) | {same} of {len(PROMPTS)} "
          f"(common prefixes {prefix}) | - |")
    return 0


def _prompt(llm: LLM, text: str) -> list[int]:
    """The chat-templated prompt, or the raw text for a base model without a chat template."""
    try:
        return llm.chat_prompt([{"role": "user", "content": text}])
    except ValueError:  # no chat template
        return llm.encode(text)
