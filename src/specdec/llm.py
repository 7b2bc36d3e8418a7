"""The Python API: ``LLM(model=...).generate(prompts, SamplingParams)``, in the spirit of vLLM's LLM."""

from __future__ import annotations

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
    ) -> None:
        self.logprobs_mode = _logprobs_mode(logprobs_mode)
        # The one place that reads the environment and sets torch's threads (see model.backend).
        backend = backend or os.environ.get("SPECDEC_BACKEND", "auto")
        self.runner, self.folder = load_runner(
            model, dtype=dtype, device=device, max_seq_len=max_model_len, num_slots=max_num_seqs, backend=backend,
            quantization=quantization,
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
                                               self._dtype, self._device)
        self.engine = Engine(self.runner, spec.draft_n_max, spec.draft_n_min, min_acceptance=spec.min_acceptance,
                             logprobs_mode=self.logprobs_mode)
        return self.drafts

    # -- prompts -------------------------------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

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
        self, prompts: str | list[int] | Sequence[str | list[int]], params: SamplingParams | None = None
    ) -> list[Output]:
        """One Output per prompt; with params.n > 1, n independent samples per prompt."""
        params = params or SamplingParams()
        outputs = []
        for prompt in as_prompt_list(prompts):
            ids = self.encode(prompt)
            self.engine.check_prompt(ids)
            out = Output(prompt, ids, [])
            t0 = time.perf_counter()
            for i in range(params.n):
                choice, seq = self._run_one(ids, params.for_choice(i))
                out.choices.append(choice)
                out.stats.merge(seq.stats)
                out.prompt_logprobs = seq.prompt_logprobs
            out.stats.seconds = time.perf_counter() - t0
            outputs.append(out)
        return outputs

    def _run_one(self, ids: list[int], params: SamplingParams) -> tuple[Completion, SequenceState]:
        seq = self.new_sequence(ids, params)
        origins = []
        for step in self.engine.generate(seq):
            origins.extend(step_origins(step))
        text = TextStream(self.tokenizer, params.stop).final(seq.output_ids)
        logprobs = seq.logprobs if params.logprobs is not None else None
        return Completion(text, seq.output_ids, seq.finish_reason, origins, logprobs), seq

    def warmup(self) -> None:
        """One short generation so timings exclude first-call costs (allocations, kernel picks).

        Its pass timings are forgotten: first calls are slow, and a wide pass priced by them kept
        the engine's draft planning from drafting until the width aged out (the demo measured 1.0x)."""
        self.generate("Hello", SamplingParams(max_new_tokens=4))
        self.runner.pass_cost = PassCost()

    def close(self) -> None:
        """Save what drafters learned that outlives the process (--spec-ngram-cache-file); ValueError if it cannot."""
        self.drafts.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _logprobs_mode(value: LogprobsMode | str) -> LogprobsMode:
    try:
        return LogprobsMode(value)
    except ValueError:
        raise ValueError(f"unknown logprobs mode {value!r}; choose from: "
                         f"{', '.join(m.value for m in LogprobsMode)}") from None


__all__ = ["LLM", "Output", "Completion", "StreamEvent", "SamplingParams", "SpecConfig", "SpecType",
           "ModelLoadError", "GrammarError", "StructuredOutput", "StructuredKind", "TokenLogprob", "LogprobsMode"]
