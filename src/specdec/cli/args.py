"""Command-line pieces shared by `specdec generate`, `serve` and `bench`.

A leaf of the CLI: ``cli/main.py``, ``server/cli.py`` and ``bench/cli.py`` import it, and
it imports none of them. It imports no torch either (``specdec --help`` stays instant).
"""

from __future__ import annotations

import argparse
from dataclasses import Field, fields

from specdec.config import DEFAULT_SPEC_TYPES, Flag, LogprobsMode, SpecConfig, SpecType, parse_spec_types
from specdec.errors import UsageError


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage dump
        raise UsageError(message)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_seconds(text: str) -> float:
    """A finite number of seconds > 0 (argparse's type: a bad one is a one-line usage error on every parser)."""
    value = float(text)
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default=None,
                   help="a name from `specdec models`, GGUF file, HF folder or hub id (default: smollm2-135m)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"],
                   help="the KV cache's type, the target's and a draft model's (default auto: float16 for a GGUF "
                        "file's blocks, as llama.cpp, else --dtype); a 16-bit cache halves what attention reads")
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


def model_options(args: argparse.Namespace) -> dict:
    """``LLM``'s keyword arguments from ``add_model_args``' flags (the model itself comes first)."""
    return dict(dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype, device=args.device, backend=args.backend,
                quantization=args.quantization, max_model_len=args.max_model_len)


def add_logprobs_mode_arg(p) -> None:
    p.add_argument("--logprobs-mode", default=LogprobsMode.RAW_LOGPROBS.value, choices=[m.value for m in LogprobsMode],
                   help="what logprobs report (vLLM's names): raw_logprobs = the model's distribution (default), "
                        "processed_logprobs = the one sampled from (after penalties, logit_bias, grammar, "
                        "temperature, top-k/top-p/min-p), or the logits of either")


def add_spec_args(p: argparse.ArgumentParser, with_type: bool = True) -> None:
    """Every drafter setting, once for all commands: a flag per ``SpecConfig`` field that declares one
    (``config.Flag``). ``with_type`` False: the command picks the drafting methods itself (`specdec bench
    --methods`; pass them to ``spec_from_args``), so no --spec-type."""
    g = p.add_argument_group("speculative decoding (llama-server flag names)")
    if with_type:
        g.add_argument("--spec-type", default=None,
                       help=f"{', '.join(t.value for t in SpecType)}; a comma list chains them (the first that "
                            "proposes wins); adaptive (the default) picks or merges the cheap drafters' proposals "
                            "each step, plus the draft model / EAGLE-3 head given with --draft-model / --spec-model; "
                            "none = plain decoding")
    else:
        p.set_defaults(spec_type=None)
    for f, flag in spec_flags():
        if flag.switch:
            g.add_argument(flag.name, action="store_true", help=flag.help)
            continue
        options = {"nargs": "?", "const": flag.const} if flag.const is not None else {}
        g.add_argument(flag.name, type=positive_int if flag.positive else flag.type, metavar=flag.metavar,
                       choices=flag.choices, default=None if flag.derived else f.default, help=flag.help, **options)


def spec_flags() -> list[tuple[Field, Flag]]:
    """Each ``SpecConfig`` field with a flag, in field order."""
    return [(f, f.metadata["flag"]) for f in fields(SpecConfig) if "flag" in f.metadata]


def spec_from_args(args: argparse.Namespace, types: tuple[SpecType, ...] | None = None) -> SpecConfig:
    """The SpecConfig of ``add_spec_args``' flags; UsageError (one line) on a bad value.

    ``types``: the methods, for a command that picks them itself (bench: all its methods', so each
    flag is checked against them); None = --spec-type, or the default types without it."""
    try:
        if types is None:
            types = DEFAULT_SPEC_TYPES if args.spec_type is None else parse_spec_types(args.spec_type)
        values = {}
        for f, flag in spec_flags():
            value = getattr(args, flag.dest)
            if value is not None:  # None: not given (the field's default), or given as "auto" layers
                values[f.name] = value if flag.parse is None else flag.parse(value)
        # eagle3 verifies num_draft_tokens nodes a step: the draft budget grows to match unless given
        if args.spec_draft_n_max is None and SpecType.EAGLE3 in types:
            values["draft_n_max"] = max(values.get("num_draft_tokens", SpecConfig.num_draft_tokens),
                                        SpecConfig.draft_n_max)
        layerskip = args.spec_layerskip_layers is not None or args.spec_layerskip_exit is not None
        return SpecConfig(types=types, adaptive_layerskip=layerskip, **values)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
