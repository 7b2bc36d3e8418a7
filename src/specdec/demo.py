"""`make demo`: a code-editing prompt decoded plainly and with speculation, side by side.

Run: python -m specdec.demo [--model M] [--spec-type suffix] [--max-new-tokens N]
Both runs use the same loaded model and prompt; the demo fails loudly if the
speculative output differs from plain greedy decoding by a single token.
"""

from __future__ import annotations

import argparse
import inspect
import shlex
import sys
import textwrap

from specdec.config import SamplingParams, SpecConfig, parse_spec_types
from specdec.engine import SequenceState
from specdec.llm import LLM


def code_edit_prompt() -> str:
    source = textwrap.dedent(inspect.getsource(shlex.quote))
    return (
        "Here is a Python function:\n\n" + source + "\nRewrite it with the parameter `s` renamed to "
        "`text`. Output only the full function."
    )


def timed_run(llm: LLM, prompt: list[int], params: SamplingParams, speculate: bool) -> SequenceState:
    seq = SequenceState(prompt, params, drafter=llm.drafts.new_drafter() if speculate else None)
    for _ in llm.engine.generate(seq):
        pass
    return seq


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--spec-type", default="suffix,ngram")
    parser.add_argument("--spec-draft-n-max", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    args = parser.parse_args(argv)
    spec = SpecConfig(types=parse_spec_types(args.spec_type), draft_n_max=args.spec_draft_n_max)
    llm = LLM(args.model, spec=spec)
    prompt = llm.chat_prompt([{"role": "user", "content": code_edit_prompt()}])
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    llm.warmup()
    plain = timed_run(llm, prompt, params, speculate=False)
    fast = timed_run(llm, prompt, params, speculate=True)
    print(llm.tokenizer.decode(fast.output_ids, skip_special_tokens=True))
    print()
    if fast.output_ids != plain.output_ids:
        print("ERROR: speculative output differs from plain decoding", file=sys.stderr)
        return 1
    p, s = plain.stats, fast.stats
    print(f"plain decoding : {p.new_tokens} tokens, {p.tokens_per_s:6.1f} tok/s")
    name = ",".join(t.value for t in spec.types)
    print(f"{name:<15}: {s.new_tokens} tokens, {s.tokens_per_s:6.1f} tok/s "
          f"(tau {s.mean_accepted_len:.2f}, acceptance rate {s.acceptance_rate:.2f}, "
          f"{s.target_forwards} target passes)")
    print(f"speedup        : {s.tokens_per_s / p.tokens_per_s:.2f}x, identical output: yes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
