"""Command-line pieces shared by `specdec generate`, `serve` and `bench`.

A leaf of the CLI: ``cli.py``, ``server/cli.py`` and ``bench/cli.py`` import it, and
it imports none of them. It imports no torch either (``specdec --help`` stays instant).
"""

from __future__ import annotations

import argparse

from specdec.config import (
    DEFAULT_SPEC_TYPES,
    DRAFT_VOCAB_METHODS,
    LogprobsMode,
    SpecConfig,
    SpecType,
    parse_layer_list,
    parse_spec_types,
)
from specdec.errors import UsageError


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage dump
        raise UsageError(message)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default=None,
                   help="a name from `specdec models`, GGUF file, HF folder or hub id (default: smollm2-135m)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--backend", default=None, choices=["auto", "cpu-kernels", "torch"],
                   help="how the model runs: cpu-kernels = specdec's fused CPU kernels, torch = PyTorch ops "
                        "(default: $SPECDEC_BACKEND or auto = cpu-kernels on a CPU)")
    p.add_argument("--quantization", "-q", default=None,
                   choices=["none", "gguf", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"],
                   help="gguf = run a GGUF file's quantized blocks as they are (integer-dot CPU kernels; the "
                        "default for a GGUF file), none = dequantise them to --dtype at load; q8_0, q4_0, ... = "
                        "quantize a float checkpoint to those GGUF blocks at load")
    p.add_argument("--max-model-len", type=positive_int, default=4096, help="context length (tokens)")


def add_logprobs_mode_arg(p) -> None:
    p.add_argument("--logprobs-mode", default=LogprobsMode.RAW_LOGPROBS.value, choices=[m.value for m in LogprobsMode],
                   help="what logprobs report (vLLM's names): raw_logprobs = the model's distribution (default), "
                        "processed_logprobs = the one sampled from (after penalties, logit_bias, grammar, "
                        "temperature, top-k/top-p/min-p), or the logits of either")


def add_spec_args(p: argparse.ArgumentParser, with_type: bool = True) -> None:
    """Every drafter setting, once for all commands. ``with_type`` False: the command picks the drafting
    methods itself (`specdec bench --methods`; pass them to ``spec_from_args``), so no --spec-type."""
    g = p.add_argument_group("speculative decoding (llama-server flag names)")
    if with_type:
        g.add_argument("--spec-type", default=None,
                       help=f"{', '.join(t.value for t in SpecType)}; a comma list chains them (the first that "
                            "proposes wins); adaptive (the default) picks or merges the cheap drafters' proposals "
                            "each step, plus the draft model / EAGLE-3 head given with --draft-model / --spec-model; "
                            "none = plain decoding")
    else:
        p.set_defaults(spec_type=None)
    g.add_argument("--spec-min-acceptance", type=float, default=SpecConfig.min_acceptance,
                   help="pause speculation while a sequence's recent per-token acceptance is below this "
                        "(re-probed with growing back-off)")
    g.add_argument("--spec-draft-n-max", type=positive_int, default=None, help="most drafted tokens per step")
    g.add_argument("--spec-draft-n-min", type=int, default=0, help="drop drafts shorter than this")
    g.add_argument("--spec-draft-p-min", type=float, default=0.0,
                   help="draft-model and draft-layerskip stop drafting below this top probability")
    g.add_argument("--spec-draft-p-split", type=float, nargs="?", const=0.1, default=None, metavar="P",
                   help="draft model drafts a tree: branch where a candidate after the first has probability "
                        "above P (alone: 0.1, llama.cpp's default); off unless given")
    g.add_argument("--spec-draft-branches", type=positive_int, default=SpecConfig.draft_branches,
                   help="most branches of a --spec-draft-p-split tree, the main chain counted "
                        "(llama-speculative's -np)")
    g.add_argument("--spec-ngram-size-n", type=positive_int, default=12, help="longest n-gram matched")
    g.add_argument("--spec-ngram-size-m", type=positive_int, default=48, help="most tokens an n-gram proposes")
    g.add_argument("--spec-ngram-min-hits", type=positive_int, default=1)
    g.add_argument("--spec-ngram-mod-n-match", type=positive_int, default=SpecConfig.ngram_mod_n_match,
                   help="ngram-mod: tokens hashed per n-gram of the shared pool")
    g.add_argument("--spec-ngram-mod-n-min", type=positive_int, default=SpecConfig.ngram_mod_n_min,
                   help="ngram-mod: drop drafts shorter than this (scaled down with the per-step budget)")
    g.add_argument("--spec-ngram-mod-n-max", type=positive_int, default=SpecConfig.ngram_mod_n_max,
                   help="ngram-mod: most tokens drafted (--spec-draft-n-max still caps a step)")
    g.add_argument("--spec-ngram-cache-file", default=None, metavar="PATH",
                   help="ngram-cache: the n-gram counts learned from earlier requests, read at start when the "
                        "file exists and written at exit (llama.cpp's lookup cache format)")
    g.add_argument("--spec-ngram-cache-static", default=None, metavar="PATH",
                   help="ngram-cache: read-only n-gram counts, e.g. of a corpus (llama.cpp's --lookup-cache-static)")
    g.add_argument("--draft-model", default=None,
                   help="draft model for --spec-type draft-model (bench: adds method draft-model and the "
                        "transformers assistant_model peer)")
    g.add_argument("--spec-draft-vocab", default=SpecConfig.draft_vocab, choices=DRAFT_VOCAB_METHODS,
                   help="a --draft-model with another tokenizer drafts by tli (token-level intersection: "
                        "only its tokens with an exact twin in the target's vocabulary), slem (string-level "
                        "exact match: its text re-encoded by the target's tokenizer) or auto (the one measured "
                        "to be accepted more); both lossless")
    g.add_argument("--spec-draft-vocab-size", type=positive_int, default=None, metavar="N",
                   help="draft-model drafts from the N tokens most frequent in an offline corpus only (FR-Spec: its "
                        "LM head cut to those rows; the target still verifies over every token, so lossless)")
    g.add_argument("--spec-draft-prompt-tail", type=positive_int, default=None, metavar="M",
                   help="draft-model reads only the last M prompt tokens (bounds its prefill on long prompts)")
    g.add_argument("--spec-datastore", default=None, metavar="PATH",
                   help="retrieval: the datastore to draft from (`specdec datastore build --out PATH`)")
    g.add_argument("--spec-model", default=None,
                   help="EAGLE-3 head folder for --spec-type eagle3 (none ships: `specdec train eagle3` makes one); "
                        "for draft-mtp, a module trained by `specdec train mtp` (default: the target's own)")
    g.add_argument("--spec-eagle-topk", type=positive_int, default=SpecConfig.eagle_topk,
                   help="eagle3: children expanded per tree node (1 = a chain)")
    g.add_argument("--spec-num-steps", type=positive_int, default=SpecConfig.num_steps,
                   help="eagle3: draft tree depth (head passes per draft)")
    g.add_argument("--spec-parallel-drafting", action="store_true",
                   help="eagle3: a P-EAGLE head (specdec train eagle3 --parallel K) drafts its K tokens in one "
                        "pass instead of K")
    g.add_argument("--spec-layerskip-layers", default=None, metavar="auto|LIST",
                   help="draft-layerskip: the layers the draft skips, a comma list of indices, or auto (the "
                        "default: searched during generation by acceptance and cost); given, adaptive asks "
                        "draft-layerskip too")
    g.add_argument("--spec-layerskip-exit", type=positive_int, default=None, metavar="E",
                   help="draft-layerskip: draft with the first E layers, then the final norm and LM head (early "
                        "exit, for checkpoints trained for it such as facebook/layerskip-*); given, adaptive asks "
                        "draft-layerskip too")
    g.add_argument("--spec-num-draft-tokens", type=positive_int, default=None,
                   help=f"eagle3: tree nodes verified per step (default {SpecConfig.num_draft_tokens}; "
                        "raises --spec-draft-n-max to match unless that is given)")


def spec_from_args(args: argparse.Namespace, types: tuple[SpecType, ...] | None = None) -> SpecConfig:
    """The SpecConfig of ``add_spec_args``' flags; UsageError (one line) on a bad value.

    ``types``: the methods, for a command that picks them itself (bench: all its methods', so each
    flag is checked against them); None = --spec-type, or the default types without it."""
    try:
        if types is None:
            types = DEFAULT_SPEC_TYPES if args.spec_type is None else parse_spec_types(args.spec_type)
        num_draft = args.spec_num_draft_tokens or SpecConfig.num_draft_tokens
        layers = args.spec_layerskip_layers
        n_max = args.spec_draft_n_max or (
            max(num_draft, SpecConfig.draft_n_max) if SpecType.EAGLE3 in types else SpecConfig.draft_n_max
        )
        return SpecConfig(
            types=types, draft_n_max=n_max, draft_n_min=args.spec_draft_n_min,
            draft_p_min=args.spec_draft_p_min, draft_p_split=args.spec_draft_p_split,
            draft_branches=args.spec_draft_branches, ngram_size_n=args.spec_ngram_size_n,
            ngram_size_m=args.spec_ngram_size_m, ngram_min_hits=args.spec_ngram_min_hits,
            ngram_mod_n_match=args.spec_ngram_mod_n_match, ngram_mod_n_min=args.spec_ngram_mod_n_min,
            ngram_mod_n_max=args.spec_ngram_mod_n_max, ngram_cache_file=args.spec_ngram_cache_file,
            ngram_cache_static=args.spec_ngram_cache_static,
            draft_model=args.draft_model, draft_vocab=args.spec_draft_vocab, spec_model=args.spec_model,
            draft_vocab_size=args.spec_draft_vocab_size, draft_prompt_tail=args.spec_draft_prompt_tail,
            datastore=args.spec_datastore,
            eagle_topk=args.spec_eagle_topk,
            num_steps=args.spec_num_steps, num_draft_tokens=num_draft, min_acceptance=args.spec_min_acceptance,
            parallel_drafting=args.spec_parallel_drafting,
            layerskip_layers=None if layers is None else parse_layer_list(layers),
            layerskip_exit=args.spec_layerskip_exit,
            adaptive_layerskip=layers is not None or args.spec_layerskip_exit is not None,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
