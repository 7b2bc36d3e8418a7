"""`specdec` command line: generate, serve, bench, train, advise. A thin layer over the Python API.

Bad input never shows a traceback: it ends with one `specdec: error: ...` line
on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from specdec.cli.args import (
    Parser,
    add_logprobs_mode_arg,
    add_model_args,
    add_spec_args,
    model_options,
    positive_int,
    spec_from_args,
)
from specdec.config import SamplingParams, SpecConfig, StructuredKind, StructuredOutput
from specdec.errors import ModelLoadError, UsageError
from specdec.server.cli import add_serve_args, cmd_serve

if TYPE_CHECKING:
    from specdec.llm import LLM
    from specdec.logprobs import TokenLogprob

Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


# The heavy subcommands' modules import torch (and numba, transformers) at their top: they load only
# when their command is named, so `specdec --help`, `generate` and `serve` parse at once.
def _bench() -> Command:
    from specdec.bench.cli import add_bench_args, cmd_bench

    return add_bench_args, cmd_bench


def _train() -> Command:
    from specdec.train.cli import add_train_args, cmd_train

    return add_train_args, cmd_train


def _advise() -> Command:
    from specdec.bench.advise_cli import add_advise_args, cmd_advise

    return add_advise_args, cmd_advise


def _datastore() -> Command:
    from specdec.cli.datastore import add_datastore_args, cmd_datastore

    return add_datastore_args, cmd_datastore


def _models() -> Command:
    from specdec.cli.catalog import add_models_args, cmd_models

    return add_models_args, cmd_models


# name -> (help, its (add-arguments, run) functions)
COMMANDS: dict[str, tuple[str, Callable[[], Command]]] = {
    "generate": ("generate text from a prompt", lambda: (add_generate_args, cmd_generate)),
    "serve": ("OpenAI-compatible HTTP server", lambda: (add_serve_args, cmd_serve)),
    "bench": ("benchmark methods and peers side by side", _bench),
    "train": ("train a drafter head (eagle3) for a target model", _train),
    "advise": ("measure a workload's prompts and say which method to run, and why", _advise),
    "models": ("the models --model NAME accepts, and how to install each", _models),
    "datastore": ("build a retrieval datastore (--spec-type retrieval) from an offline corpus", _datastore),
}


def build_parser(command: str | None = None) -> Parser:
    """The whole parser; with ``command``, only that subcommand gets its arguments (the others'
    modules stay unimported), which is all ``main`` needs to parse one command line."""
    parser = Parser(prog="specdec", description="Lossless speculative decoding for open LLMs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, (help_, load) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        if command is None or command == name:
            add_args, run = load()
            add_args(p)
            p.set_defaults(run=run)
    return parser


def add_generate_args(g: argparse.ArgumentParser) -> None:
    g.add_argument("prompt", nargs="?", help="prompt text")
    g.add_argument("--prompt-file", help="read the prompt from a file")
    g.add_argument("--prompts-file", help="JSONL file, one {\"prompt\": ...} per line")
    g.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    g.add_argument("--system", help="system message (with --chat)")
    g.add_argument("--max-new-tokens", type=int, default=128,
                   help="0 with --prompt-logprobs: score the prompt, generate nothing")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--n", type=positive_int, default=1, help="independent samples per prompt")
    g.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-new-tokens tokens")
    g.add_argument("--json", action="store_true",
                   help="one JSON object per prompt on stdout (\"origins\": per token, the drafter or \"target\")")
    g.add_argument("--show-drafts", action="store_true",
                   help="colour accepted drafted tokens by drafter (target tokens plain), with a legend on stderr")
    add_processor_args(g)
    add_model_args(g)
    add_spec_args(g)


def add_processor_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("logprobs, penalties and structured output (all exact under speculation)")
    g.add_argument("--logprobs", type=int, default=None, metavar="N",
                   help="with --json: each token's logprob and the N most likely tokens' (see --logprobs-mode)")
    g.add_argument("--prompt-logprobs", type=int, default=None, metavar="N",
                   help="with --json: the same for the prompt's tokens (raw; the first has none)")
    add_logprobs_mode_arg(g)
    g.add_argument("--presence-penalty", type=float, default=0.0)
    g.add_argument("--frequency-penalty", type=float, default=0.0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--logit-bias", action="append", default=[], metavar="TOKEN=BIAS",
                   help="add BIAS to token id TOKEN's logit (repeatable)")
    g.add_argument("--min-tokens", type=int, default=0, help="no EOS before this many tokens")
    g.add_argument("--bad-word", action="append", default=[], help="a word never to produce (repeatable)")
    s = g.add_mutually_exclusive_group()
    s.add_argument("--json-schema", metavar="FILE", help="output follows this JSON schema")
    s.add_argument("--json-object", action="store_true", help="output is a JSON object")
    s.add_argument("--regex", metavar="R", help="output matches this regular expression")
    s.add_argument("--grammar", metavar="FILE", help="output follows this Lark or GBNF grammar")
    s.add_argument("--choice", action="append", metavar="TEXT", help="output is one of these (repeatable)")


def structured_from_args(args: argparse.Namespace) -> StructuredOutput | None:
    if args.json_schema:
        return StructuredOutput(StructuredKind.JSON_SCHEMA, _read_text(args.json_schema))
    if args.json_object:
        return StructuredOutput(StructuredKind.JSON_OBJECT)
    if args.regex:
        return StructuredOutput(StructuredKind.REGEX, args.regex)
    if args.grammar:
        return StructuredOutput(StructuredKind.GRAMMAR, _read_text(args.grammar))
    if args.choice:
        return StructuredOutput(StructuredKind.CHOICE, json.dumps(args.choice))
    return None


def parse_logit_bias(items: list[str]) -> dict[int, float]:
    bias = {}
    for item in items:
        token, sep, value = item.partition("=")
        try:
            bias[int(token)] = float(value)
        except ValueError:
            raise UsageError(f"--logit-bias wants TOKEN=BIAS, got {item!r}") from None
        if not sep:
            raise UsageError(f"--logit-bias wants TOKEN=BIAS, got {item!r}")
    return bias


def read_prompts(args: argparse.Namespace) -> list[str]:
    given = [x for x in (args.prompt, args.prompt_file, args.prompts_file) if x is not None]
    if len(given) != 1:
        raise UsageError("give exactly one of PROMPT, --prompt-file or --prompts-file")
    if args.prompt is not None:
        prompts = [args.prompt]
    elif args.prompt_file:
        prompts = [_read_text(args.prompt_file)]
    else:
        prompts = []
        for n, line in enumerate(_read_text(args.prompts_file).splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{args.prompts_file}:{n}: invalid JSON ({exc.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise UsageError(f'{args.prompts_file}:{n}: expected an object with a "prompt" string')
            prompts.append(row["prompt"])
    if not prompts or any(not p.strip() for p in prompts):
        raise UsageError("the prompt is empty")
    return prompts


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None


# SamplingParams' field names in its errors -> the flags that set them
_FIELD = re.compile(r"\b(max_new_tokens|temperature|top_k|top_p|min_p|prompt_logprobs|logprobs|presence_penalty|"
                    r"frequency_penalty|repetition_penalty|logit_bias|min_tokens)\b")


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    try:
        return SamplingParams(
            max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
            top_p=args.top_p, min_p=args.min_p, seed=args.seed, stop=tuple(args.stop), n=args.n,
            ignore_eos=args.ignore_eos, logprobs=args.logprobs, prompt_logprobs=args.prompt_logprobs,
            presence_penalty=args.presence_penalty,
            frequency_penalty=args.frequency_penalty, repetition_penalty=args.repetition_penalty,
            logit_bias=parse_logit_bias(args.logit_bias), min_tokens=args.min_tokens,
            bad_words=tuple(args.bad_word), structured=structured_from_args(args),
        )
    except ValueError as exc:
        raise UsageError(_FIELD.sub(lambda m: "--" + m.group(0).replace("_", "-"), str(exc))) from None


def cmd_generate(args: argparse.Namespace) -> int:
    if args.show_drafts and args.json:
        raise UsageError("--show-drafts colours the text output; with --json, read \"origins\" instead")
    prompts = read_prompts(args)
    params = sampling_from_args(args)
    for flag, value in (("--logprobs", params.logprobs), ("--prompt-logprobs", params.prompt_logprobs)):
        if value is not None and not args.json:
            raise UsageError(f"{flag} needs --json")
    spec = spec_from_args(args)
    from specdec.llm import LLM  # torch and the model code: only once the arguments are known good

    llm = LLM(args.model, spec=spec, logprobs_mode=args.logprobs_mode, **model_options(args))
    inputs: list[str | list[int]] = []
    for p in prompts:
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            inputs.append(llm.chat_prompt([*messages, {"role": "user", "content": p}]))
        else:
            inputs.append(p)
    for ids in inputs:
        llm.engine.check_prompt(llm.encode(ids))
        llm.processors(llm.encode(ids), params)  # a bad grammar or logit_bias fails here, before warm-up
    llm.warmup()
    with llm:  # saves --spec-ngram-cache-file at the end
        write_outputs(args, llm, inputs, params, spec)
    return 0


def write_outputs(args: argparse.Namespace, llm: LLM, inputs: list[str | list[int]], params: SamplingParams,
                  spec: SpecConfig) -> None:
    """Generate each input and print it: one JSON record per prompt, or the streamed text and a stats line."""
    from specdec.terminal import DraftPainter

    painter = DraftPainter([t.value for t in llm.drafts.loaded()], sys.stdout, sys.stderr) if args.show_drafts \
        else None
    for prompt in inputs:
        if args.json:
            out = llm.generate(prompt, params)[0]
            record = {"text": out.text, "token_ids": out.token_ids, "origins": out.choices[0].origins,
                      "finish_reason": out.choices[0].finish_reason, "stats": out.stats.to_dict()}
            if params.logprobs is not None:
                record["logprobs"] = logprobs_record(llm, out.choices[0].logprobs)
            if params.prompt_logprobs is not None:
                record["prompt_logprobs"] = logprobs_record(llm, out.prompt_logprobs)
            if params.n > 1:
                record["choices"] = [{"text": c.text, "token_ids": c.token_ids, "origins": c.origins,
                                      "finish_reason": c.finish_reason} for c in out.choices]
                if params.logprobs is not None:
                    for rec, c in zip(record["choices"], out.choices, strict=True):
                        rec["logprobs"] = logprobs_record(llm, c.logprobs)
            print(json.dumps(record), flush=True)
        else:
            for i in range(params.n):
                for event in llm.stream(prompt, params.for_choice(i)):
                    if painter is not None:
                        painter.write(event.pieces)
                    else:
                        sys.stdout.write(event.text)
                        sys.stdout.flush()
                    if event.finished:
                        print()
                        print(stats_line(event.stats, spec), file=sys.stderr)
                        if painter is not None:
                            painter.legend()


def logprobs_record(llm: LLM, entries: list[TokenLogprob | None]) -> list[dict | None]:
    """One object per token: its id, text, logprob, rank and the top tokens (None: the prompt's first token)."""
    from specdec.logprobs import json_logprob

    def text(token_id: int) -> str:
        return llm.tokenizer.decode([token_id])

    return [None if e is None else
            {"token_id": e.token_id, "token": text(e.token_id), "logprob": json_logprob(e.logprob), "rank": e.rank,
             "top_logprobs": [{"token_id": t, "token": text(t), "logprob": json_logprob(lp)} for t, lp in e.top]}
            for e in entries]


def stats_line(stats, spec: SpecConfig) -> str:
    line = (f"[specdec] {stats.new_tokens} tokens in {stats.seconds:.2f} s ({stats.tokens_per_s:.1f} tok/s), "
            f"{stats.target_forwards} target passes")
    if spec.enabled:
        line += (f" | {','.join(t.value for t in spec.types)}: drafted {stats.drafted}, accepted {stats.accepted} "
                 f"(acceptance rate {stats.acceptance_rate:.2f}), tau {stats.mean_accepted_len:.2f}, "
                 f"draft {stats.draft_seconds:.2f} s, target {stats.target_seconds:.2f} s")
        if stats.accepted_by:
            line += " | accepted by " + ", ".join(f"{k} {v}" for k, v in stats.accepted_by.items())
        if stats.spec_off_steps:
            line += f" | paused {stats.spec_off_steps} steps ({stats.spec_probes} probes)"
    return line


def main(argv: list[str] | None = None) -> int:
    if "TRANSFORMERS_VERBOSITY" not in os.environ:  # the user's own setting wins
        # transformers reads the variable when first imported; if a caller imported it before
        # main, only its logger's level still takes effect: set both.
        os.environ["TRANSFORMERS_VERBOSITY"] = "error"
        logging.getLogger("transformers").setLevel(logging.ERROR)
    argv = sys.argv[1:] if argv is None else argv
    try:
        command = next((a for a in argv if not a.startswith("-")), "")  # "" (none, or unknown): no arguments
        args = build_parser(command).parse_args(argv)
        return args.run(args)
    except (UsageError, ModelLoadError, ValueError) as exc:
        print(f"specdec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specdec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
