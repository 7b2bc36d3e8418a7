"""Speed with a JSON schema, with and without speculation: does the grammar mask eat the speedup?

For each method, the same chat prompts are decoded greedily with and without a JSON schema
(`SamplingParams.structured`), after a warm-up. Reports tokens/s, the speedup over plain decoding
*with the same schema*, tau, and the grammar's own cost: the seconds spent in the mask
(``GrammarMatcher.bitmask`` + ``cut`` + ``advance``) per output token and as a share of the run.
Every schema output is checked to parse and validate, and to equal plain decoding's.

    python scripts/schema_speed.py [--methods none,suffix,ngram,adaptive] [--max-new-tokens 160]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable

import jsonschema

from specdec import grammar
from specdec.bench.machine import cpu_info
from specdec.config import SamplingParams, StructuredKind, StructuredOutput
from specdec.llm import LLM

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "language": {"type": "string", "enum": ["python", "rust", "go", "javascript"]},
        "functions": {
            "type": "array", "maxItems": 4,
            "items": {"type": "object", "properties": {"name": {"type": "string"}, "purpose": {"type": "string"}},
                      "required": ["name", "purpose"]},
        },
        "tested": {"type": "boolean"},
    },
    "required": ["name", "language", "functions", "tested"],
}
PROMPTS = [
    "Describe a small Python library for parsing dates as JSON with its name, language, functions and whether "
    "it is tested.",
    "Give a JSON record of a command-line tool written in Rust that counts words in files.",
    "Return JSON describing a Go web server package: its name, language, three functions and tested flag.",
    "Summarise, as JSON, a JavaScript module that validates e-mail addresses and phone numbers.",
]


class MaskClock:
    """Seconds spent inside the grammar matcher's per-pass methods (wrapped for the run)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.saved: dict[str, Callable] = {}

    def __enter__(self) -> MaskClock:
        for name in ("bitmask", "cut", "advance"):
            original = getattr(grammar.GrammarMatcher, name)
            self.saved[name] = original

            def timed(*args, _f=original, **kwargs):
                t0 = time.perf_counter()
                try:
                    return _f(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - t0

            setattr(grammar.GrammarMatcher, name, timed)
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self.saved.items():
            setattr(grammar.GrammarMatcher, name, original)


def run(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> dict:
    with MaskClock() as clock:
        tokens, seconds, passes, outs = 0, 0.0, 0, []
        for ids in prompts:
            out = llm.generate(ids, params)[0]
            tokens += len(out.token_ids)
            seconds += out.stats.seconds
            passes += out.stats.decode_passes
            outs.append(out)
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds, "tau": tokens / max(passes, 1),
            "mask_us_per_token": 1e6 * clock.seconds / max(tokens, 1), "mask_share": clock.seconds / seconds,
            "outputs": outs}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--methods", default="none,suffix,ngram")
    p.add_argument("--max-new-tokens", type=int, default=160)
    args = p.parse_args()
    structured = StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(SCHEMA))
    free = SamplingParams(max_new_tokens=args.max_new_tokens)
    constrained = SamplingParams(max_new_tokens=args.max_new_tokens, structured=structured)
    rows, outputs = [], {}
    for method in args.methods.split(","):
        llm = LLM(args.model, spec=method, max_model_len=2048)
        prompts = [llm.chat_prompt([{"role": "user", "content": text}]) for text in PROMPTS]
        llm.generate(prompts[0], SamplingParams(max_new_tokens=8, structured=structured))  # warm-up
        for label, params in (("free", free), ("schema", constrained)):
            r = run(llm, prompts, params)
            outputs[method, label] = r.pop("outputs")
            rows.append({"method": method, "mode": label, **r})
        llm.close()
    for (method, label), outs in outputs.items():
        plain_ids = [o.token_ids for o in outputs["none", label]]
        if [o.token_ids for o in outs] != plain_ids:
            raise SystemExit(f"{method} ({label}) differs from plain decoding")
        if label == "schema":
            for o in outs:  # a reply cut by max_new_tokens is not complete JSON: counted, not validated
                if o.choices[0].finish_reason == "stop":
                    jsonschema.validate(json.loads(o.text), SCHEMA)
    for row in rows:
        base = next(b for b in rows if b["method"] == "none" and b["mode"] == row["mode"])
        row["speedup"] = row["tok_s"] / base["tok_s"]
    cpu = cpu_info()
    print(f"CPU: {cpu['cpu']}, {cpu['cores']} cores, {cpu['simd']}; Python {platform.python_version()}; "
          f"schema: {len(json.dumps(SCHEMA))} chars, {len(PROMPTS)} prompts, greedy, "
          f"max {args.max_new_tokens} new tokens")
    print("| method | output | tok/s | speedup vs plain (same output mode) | tau | mask us/token | mask share |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['mode']} | {r['tok_s']:.1f} | {r['speedup']:.2f}x | {r['tau']:.2f} | "
              f"{r['mask_us_per_token']:.0f} | {100 * r['mask_share']:.1f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
