"""The Python API: ``LLM(model=...).generate(prompts, SamplingParams)``, in the spirit of vLLM's LLM."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from threadpoolctl import threadpool_limits

from specdec.config import SamplingParams, SpecConfig, SpecType, StructuredKind, StructuredOutput, parse_spec_types
from specdec.drafters.registry import DraftResources
from specdec.engine import Engine, SequenceState, StepResult
from specdec.errors import ModelLoadError
from specdec.grammar import GrammarCompiler, GrammarError
from specdec.logprobs import LogprobsMode, TokenLogprob
from specdec.pass_cost import PassCost
from specdec.processors import HistoryProcessor, SequenceProcessors
from specdec.provenance import PieceStream, TokenPiece, step_origins
from specdec.runners.load import load_runner
from specdec.stats import SpecStats
from specdec.text import (
    StopChecker,
    TextStream,
    as_prompt_list,
    bad_words_ids,
    encode_chat,
    encode_prompt,
    load_tokenizer,
)


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str | None
    origins: list[str] = field(default_factory=list)  # per token: the drafter that proposed it, or "target"
    logprobs: list[TokenLogprob] | None = None  # one per token, when SamplingParams.logprobs is set


@dataclass
class Output:
    prompt: str | list[int]
    prompt_token_ids: list[int]
    choices: list[Completion]
    stats: SpecStats = field(default_factory=SpecStats)
    prompt_logprobs: list[TokenLogprob | None] | None = None  # when SamplingParams.prompt_logprobs is set

    @property
    def text(self) -> str:
        return self.choices[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.choices[0].token_ids


@dataclass
class StreamEvent:
    text: str  # new text since the previous event: "".join(p.text for p in pieces)
    token_ids: list[int]  # tokens committed by this step
    finished: bool
    finish_reason: str | None = None
    stats: SpecStats | None = None  # on the last event
    origins: list[str] = field(default_factory=list)  # per token of token_ids: a drafter's name or "target"
    pieces: list[TokenPiece] = field(default_factory=list)  # the tokens whose text this event shows
    step: StepResult | None = None  # the engine step, with its drafted and rejected tokens
    logprobs: list[TokenLogprob] | None = None  # for token_ids, when SamplingParams.logprobs is set


class LLM:
    """Load a model (GGUF, local folder or hub id; None = the embedded default) and generate.

    ``spec`` is a SpecConfig, or a --spec-type string such as "ngram" or "suffix,draft-model"; None =
    "adaptive" (``SpecConfig()``), "none" = plain decoding.
    ``backend``: "auto", "cpu-kernels" or "torch" (see ``model.backend``); default
    ``$SPECDEC_BACKEND`` or "auto". ``quantization``: "gguf" runs a GGUF file's blocks as they
    are, "none" dequantises them; default gguf for a GGUF file where the CPU kernels run.
    ``logprobs_mode``: what ``SamplingParams.logprobs`` report, vLLM's names: "raw_logprobs" (default),
    "raw_logits", "processed_logprobs", "processed_logits" (see ``specdec.logprobs``).
    ``kv_cache_dtype``: "auto" (float16 for quantized blocks, as llama.cpp; else the compute dtype), "float32",
    "float16" or "bfloat16", for the target and a draft model.
    """

    def __init__(
        self,
        model: str | None = None,
        dtype: str = "float32",
        spec: SpecConfig | str | None = None,
        max_model_len: int = 4096,
        device: str | None = None,
        max_num_seqs: int = 1,
        backend: str | None = None,
        quantization: str | None = None,
        logprobs_mode: LogprobsMode | str = LogprobsMode.RAW_LOGPROBS,
        plan_drafts: bool = True,
        kv_cache_dtype: str = "auto",
    ) -> None:
        self.logprobs_mode = _logprobs_mode(logprobs_mode)
        # False: every step drafts the configured budget instead of what the measured pass costs
        # say pays (``Engine.plan_drafts``): what tests of "speculation changes nothing" need, so
        # they cannot pass by not speculating on a busy machine.
        self.plan_drafts = plan_drafts
        # The one place that reads the environment and sets torch's threads (see model.backend).
        backend = backend or os.environ.get("SPECDEC_BACKEND", "auto")
        self.runner, self.folder = load_runner(
            model, dtype=dtype, device=device, max_seq_len=max_model_len, num_slots=max_num_seqs, backend=backend,
            quantization=quantization, kv_cache_dtype=kv_cache_dtype,
        )
        if self.runner.device.type == "cpu":
            kernels = self.runner.backend == "cpu-kernels"
            # numba's kernels run on the OpenMP threads torch shares; a second pool (OpenBLAS's
            # pthreads, for prefill) spinning beside them made a 40-token prefill 4x slower and
            # decoding 1.4x slower: with the kernels, BLAS and torch keep one thread each.
            torch.set_num_threads(1 if kernels else os.cpu_count() or 1)
            if kernels:
                threadpool_limits(limits=1, user_api="blas")
        self.tokenizer = load_tokenizer(self.folder)
        self.model_name = str(model) if model else "SmolLM2-135M-Instruct"
        self.grammars = GrammarCompiler(self.tokenizer, self.runner.vocab_size, self.runner.eos_token_ids)
        self._dtype, self._device, self._max_num_seqs = dtype, device, max_num_seqs
        self._kv_cache_dtype = kv_cache_dtype
        self._model = None if model is None else str(model)  # draft-mtp reads its MTP module
        self.set_spec(spec or SpecConfig())

    def set_spec(self, spec: SpecConfig | str, drafts: DraftResources | None = None) -> DraftResources:
        """Switch the drafting method without reloading the target; return its draft resources.

        Pass back resources this method returned earlier (for the same spec) to switch
        without reloading a draft model. Call between generations, not during one.
        """
        if isinstance(spec, str):
            spec = SpecConfig(types=parse_spec_types(spec))
        self.spec = spec
        self.drafts = drafts or DraftResources(spec, self.runner, self.tokenizer, self._max_num_seqs,
                                               self._dtype, self._device, target_model=self._model,
                                               plan_drafts=self.plan_drafts, kv_cache_dtype=self._kv_cache_dtype)
        self.engine = Engine(self.runner, spec.draft_n_max, spec.draft_n_min, plan_drafts=self.plan_drafts,
                             min_acceptance=spec.min_acceptance, logprobs_mode=self.logprobs_mode)
        return self.drafts

    def forget_prefixes(self) -> None:
        """Drop every prompt the KV caches keep, the target's and a draft model's: the next requests
        prefill cold (runs timed against each other over the same prompts)."""
        self.runner.forget_prefixes()
        self.drafts.forget_prefixes()

    # -- prompts -------------------------------------------------------------------------------
    def encode(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, add_special_tokens)

    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> list[int]:
        """Token ids of ``messages`` (and ``tools``, where the template renders them) under the chat template."""
        return encode_chat(self.tokenizer, messages, add_generation_prompt, tools)

    # -- generation ----------------------------------------------------------------------------
    def new_sequence(self, prompt_ids: list[int], params: SamplingParams,
                     spec_types: Sequence[SpecType] | None = None) -> SequenceState:
        """An engine sequence; raises ValueError (GrammarError for a bad grammar) on unusable settings.

        spec_types: draft with these of the loaded methods only (() = plain decoding); None = all."""
        stop = StopChecker(self.tokenizer, params.stop) if params.stop else None
        processors = self.processors(prompt_ids, params)
        return SequenceState(prompt_ids, params, drafter=self.drafts.new_drafter(spec_types), should_stop=stop,
                        processors=processors)

    def processors(self, prompt_ids: list[int], params: SamplingParams) -> SequenceProcessors | None:
        """The sequence's history processors and grammar matcher; None when it has neither."""
        if not params.has_history_processors and params.structured is None:
            return None
        history = None
        if params.has_history_processors:
            history = HistoryProcessor(params, prompt_ids, self.runner.vocab_size, self.runner.eos_token_ids,
                                       bad_words_ids(self.tokenizer, params.bad_words))
        grammar = None if params.structured is None else self.grammars.matcher(params.structured)
        return SequenceProcessors(history, grammar)

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None) -> Iterator[StreamEvent]:
        """Generate one completion, yielding text as each step commits tokens."""
        params = params or SamplingParams()
        seq = self.new_sequence(self.encode(prompt), params)
        text = PieceStream(self.tokenizer, params.stop)
        for step in self.engine.generate(seq):
            origins = step_origins(step)
            pieces = text.push(step.token_ids, origins, final=seq.finished)
            delta = "".join(p.text for p in pieces)
            stats = seq.stats if seq.finished else None
            logprobs = list(step.logprobs) if params.logprobs is not None else None
            yield StreamEvent(delta, step.token_ids, seq.finished, seq.finish_reason, stats, origins, pieces, step,
                              logprobs)
        if params.max_new_tokens == 0:  # a scored prompt (prefill only) takes no step: one last, empty event
            yield StreamEvent("", [], True, seq.finish_reason, seq.stats,
                              logprobs=[] if params.logprobs is not None else None)

    def generate(
        self, prompts: str | list[int] | Sequence[str | list[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[Output]:
        """One Output per prompt; with params.n > 1, n independent samples per prompt.

        ``params``: one SamplingParams for every prompt, or one per prompt. The prompts' sequences
        (n per prompt) run as static batches of ``max_num_seqs`` through ``Engine.run_batch``, in
        order; see ``run_batches``.
        """
        return self.run_batches(prompts, params).outputs

    def run_batches(
        self, prompts: str | list[int] | Sequence[str | list[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> BatchRun:
        """``generate``, with the counters of all its batches (what the bench records).

        Batching changes no output: greedy tokens are those of one prompt at a time (a verify row's
        logits do not depend on the other rows), and so are seeded samples with plain decoding
        (each sequence draws from its own generator, seeded with its ``seed``; choice i > 0 of n with
        one derived from (seed, i): ``SamplingParams.for_choice``). With drafting, a seeded sample is
        drawn from the same distribution but need not be the same tokens: how many draws a step
        takes depends on the draft, and the drafts depend on the batch (the engine plans draft
        lengths from the batch's pass cost, and drafters that learn across requests learn in another
        order).
        """
        prompts = as_prompt_list(prompts)
        per_prompt = _params_per_prompt(params, len(prompts))
        outputs: list[Output] = []
        todo: list[tuple[Output, SamplingParams]] = []  # one per sequence: its prompt's output, its settings
        for prompt, p in zip(prompts, per_prompt, strict=True):
            ids = self.encode(prompt)
            self.engine.check_prompt(ids)
            outputs.append(Output(prompt, ids, []))
            todo += [(outputs[-1], p.for_choice(i)) for i in range(p.n)]
        total = SpecStats()
        for start in range(0, len(todo), self.runner.num_slots):
            total.merge(self._run_batch(todo[start:start + self.runner.num_slots]))
        return BatchRun(outputs, total)

    def _run_batch(self, todo: list[tuple[Output, SamplingParams]]) -> SpecStats:
        """One static batch: each sequence's choice joins its Output; the batch's counters."""
        t0 = time.perf_counter()
        seqs = [self.new_sequence(out.prompt_token_ids, p) for out, p in todo]
        origins: dict[int, list[str]] = {id(s): [] for s in seqs}

        def collect(running: list[SequenceState], results: list[StepResult]) -> None:
            for seq, step in zip(running, results, strict=True):
                origins[id(seq)].extend(step_origins(step))

        pass_seconds = self.engine.run_batch(seqs, collect)
        wall = time.perf_counter() - t0
        for (out, p), seq in zip(todo, seqs, strict=True):
            text = TextStream(self.tokenizer, p.stop).final(seq.output_ids)
            logprobs = seq.logprobs if p.logprobs is not None else None
            out.choices.append(Completion(text, seq.output_ids, seq.finish_reason, origins[id(seq)], logprobs))
            out.stats.merge(seq.stats)
            out.prompt_logprobs = seq.prompt_logprobs
        for out in {id(out): out for out, _ in todo}.values():
            out.stats.seconds += wall  # the wall time of the batches its choices ran in
        return SpecStats.of_batch([seq.stats for seq in seqs], wall, pass_seconds)

    def warmup(self) -> None:
        """One short generation so timings exclude first-call costs (allocations, kernel picks).

        The entry points that keep a process running (server, CLI, demo) call this once."""
        self.generate("Hello", SamplingParams(max_new_tokens=4))
        self.settle()

    def settle(self) -> None:
        """What a warm-up ends with (this one's, the bench's). Its pass timings are forgotten: first calls
        are slow, and a wide pass priced by them kept the engine's draft planning from drafting until the
        width aged out (the demo measured 1.0x). And what is loaded leaves the garbage collector's sight
        (``freeze_heap``)."""
        self.runner.pass_cost = PassCost()
        freeze_heap()

    def close(self) -> None:
        """Save what drafters learned that outlives the process (--spec-ngram-cache-file); ValueError if it cannot."""
        self.drafts.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def freeze_heap() -> None:
    """Move every object alive now into the collector's permanent generation (after a collection).

    A loaded model brings ~760K tracked Python objects (torch, transformers, numba, the tokenizer;
    SmolLM2-135M), and each full collection scanned them all: 0.3-0.4 s, twice in 34 s of sampled
    adaptive requests on a 2-core Zen 4, a stall in a stream and a bench cell read 0.91x from one. They
    live as long as the process (one of them that became cyclic garbage later would stay: ``gc.unfreeze``
    hands them back); objects made later are collected as before. vLLM's engine core freezes its heap
    after loading too."""
    gc.collect()
    gc.freeze()


@dataclass
class BatchRun:
    """What ``LLM.run_batches`` produced: one Output per prompt, and the counters of every batch."""

    outputs: list[Output]
    # Every sequence's counters added; seconds = wall time, target_seconds and prefill_seconds count
    # each batched pass once.
    stats: SpecStats


def _params_per_prompt(params: SamplingParams | Sequence[SamplingParams] | None, num_prompts: int) \
        -> list[SamplingParams]:
    if params is None or isinstance(params, SamplingParams):
        return [params or SamplingParams()] * num_prompts
    params = list(params)
    if len(params) != num_prompts:
        raise ValueError(f"{len(params)} SamplingParams for {num_prompts} prompts: give one, or one per prompt")
    return params


def _logprobs_mode(value: LogprobsMode | str) -> LogprobsMode:
    try:
        return LogprobsMode(value)
    except ValueError:
        raise ValueError(f"unknown logprobs mode {value!r}; choose from: "
                         f"{', '.join(m.value for m in LogprobsMode)}") from None


__all__ = ["LLM", "Output", "BatchRun", "Completion", "StreamEvent", "SamplingParams", "SpecConfig", "SpecType",
           "ModelLoadError", "GrammarError", "StructuredOutput", "StructuredKind", "TokenLogprob", "LogprobsMode"]
