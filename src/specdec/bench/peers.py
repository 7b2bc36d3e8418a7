"""Peers: other engines run on the same token ids with the same token budget.

- ``transformers``: ``model.generate`` plain, with prompt lookup
  (``prompt_lookup_num_tokens``), and with ``assistant_model`` when the run has a
  draft model. The model is loaded from the folder specdec itself uses, in the
  same dtype, and runs with torch's default thread count (specdec's loader may
  have lowered it: see ``torch_threads``).
- ``llama-cpp``: llama.cpp's ``llama-server`` plain and with its n-gram ``--spec-type``s
  when a binary is found (``bench.llama_cpp``; timed by llama.cpp's own reported timings),
  and llama-cpp-python plain and with ``LlamaPromptLookupDecoding``,
  only when ``llama_cpp`` is importable and the model is a GGUF file. Known
  settings: on CPUs with AMX, ``llama_decode`` segfaults on batches of more than
  one token unless ``use_extra_bufts=False`` (passed when the installed version
  takes it); with a draft model, contexts past 512 tokens need ``logits_all=True``.

Peers run at batch size 1 (transformers' assisted generation supports no other).
Token counts come from token ids; greedy outputs that differ from specdec's plain
decoding are counted, not fatal (kernels differ, so near-ties may flip).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from specdec.bench.llama_cpp import LlamaServerPeer, server_peers
from specdec.bench.records import GREEDY, BenchResult, Cell, Request, peak_rss_bytes
from specdec.config import SamplingParams
from specdec.llm import LLM
from specdec.model.weights import gguf_file, resolve_model
from specdec.stats import SpecStats
from specdec.text import load_tokenizer

PROMPT_LOOKUP_TOKENS = 10  # transformers' and llama-cpp-python's documented default


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Peer(ABC):
    name: str

    @abstractmethod
    def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        """Output token ids (EOS included when produced), at most params.max_new_tokens."""

    def warmup(self) -> None:
        self.generate([1, 2, 3], SamplingParams(max_new_tokens=4))

    def run(self, prompts: list[list[int]], params: list[SamplingParams],
            tick: Callable[[int], None]) -> tuple[list[list[int]], SpecStats]:
        """Outputs of one cell and its summed stats; seconds: wall time around each ``generate``."""
        outputs, stats = [], SpecStats()
        for ids, p in zip(prompts, params, strict=True):
            t0 = time.perf_counter()
            out = self.generate(ids, p)
            stats.seconds += time.perf_counter() - t0
            stats.new_tokens += len(out)
            stats.prompt_tokens += len(ids)
            outputs.append(out)
            tick(1)
        return outputs, stats


Peer.register(LlamaServerPeer)  # llama.cpp's llama-server rows (their own timings; see bench.llama_cpp)


class TransformersPeer(Peer):
    def __init__(self, model, eos_ids: list[int], mode: str = "plain", assistant=None,
                 tokenizers: tuple | None = None) -> None:
        self.model, self.eos_ids, self.mode, self.assistant = model, eos_ids, mode, assistant
        self.tokenizers = tokenizers  # (target's, assistant's) when they differ: universal assisted generation
        self.name = "transformers" if mode == "plain" else f"transformers+{mode}"

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        x = torch.tensor([prompt_ids])
        kwargs = dict(
            attention_mask=torch.ones_like(x), max_new_tokens=params.max_new_tokens,
            eos_token_id=self.eos_ids, pad_token_id=self.eos_ids[0],
        )
        if params.ignore_eos:
            kwargs.update(min_new_tokens=params.max_new_tokens)
        if params.greedy:
            kwargs.update(do_sample=False)
        else:
            kwargs.update(do_sample=True, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
            torch.manual_seed(params.seed or 0)
        if self.mode == "prompt-lookup":
            kwargs.update(prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS)
        elif self.mode == "assisted":
            kwargs.update(assistant_model=self.assistant)
            if self.tokenizers is not None:
                kwargs.update(tokenizer=self.tokenizers[0], assistant_tokenizer=self.tokenizers[1])
        with torch.inference_mode():
            out = self.model.generate(x, **kwargs)
        return out[0, len(prompt_ids):].tolist()


def load_transformers(folder: Path, dtype: str):
    from transformers import AutoModelForCausalLM, GenerationConfig  # lazy: heavy, and only this peer needs it

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    # A clean generation config: the folder's may carry sampling defaults (top_k=50, ...)
    # that specdec does not apply; everything is passed explicitly per call.
    model.generation_config = GenerationConfig(bos_token_id=model.config.bos_token_id)
    return model


class LlamaCppPeer(Peer):
    def __init__(self, gguf: Path, n_ctx: int, eos_ids: list[int], lookup: bool, threads: int) -> None:
        from llama_cpp import Llama  # lazy: an optional dependency (specdec[llama-cpp])

        kwargs = dict(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads, verbose=False)
        if "use_extra_bufts" in inspect.signature(Llama.__init__).parameters:
            kwargs["use_extra_bufts"] = False  # AMX CPUs: multi-token decode segfaults otherwise
        if lookup:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            kwargs["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=PROMPT_LOOKUP_TOKENS)
            kwargs["logits_all"] = n_ctx > 512  # drafting past 512 tokens of context needs every logit
        self.llama = Llama(**kwargs)
        self.eos_ids = set(eos_ids)
        self.name = "llama-cpp+prompt-lookup" if lookup else "llama-cpp"

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        out: list[int] = []
        if params.seed is not None:
            self.llama.set_seed(params.seed)
        for tok in self.llama.generate(prompt_ids, temp=params.temperature, top_k=params.top_k,
                                       top_p=params.top_p, min_p=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(tok))
            if (tok in self.eos_ids and not params.ignore_eos) or len(out) >= params.max_new_tokens:
                break
        return out


def make_peers(result: BenchResult, llm: LLM) -> list[Peer]:
    """The requested peers that can run here; a note in the report for each one skipped."""
    cfg = result.config
    eos = list(llm.runner.eos_token_ids)
    peers: list[Peer] = []
    if "transformers" in cfg.peers:
        # A GGUF target's folder holds only its config and tokenizer: transformers runs the float
        # copy of its weights (dequantised once into the same cache), so greedy outputs may differ.
        folder = resolve_model(cfg.model) if gguf_file(cfg.model) is not None else llm.folder
        model = load_transformers(folder, cfg.dtype)
        peers += [TransformersPeer(model, eos), TransformersPeer(model, eos, "prompt-lookup")]
        if cfg.draft_model:
            draft_folder = resolve_model(cfg.draft_model)
            assistant = load_transformers(draft_folder, cfg.dtype)
            draft_tok = load_tokenizer(draft_folder)
            other = draft_tok.get_vocab() != llm.tokenizer.get_vocab()  # drafts across tokenizers
            peers.append(TransformersPeer(model, eos, "assisted", assistant,
                                          (llm.tokenizer, draft_tok) if other else None))
    if "llama-cpp" in cfg.peers:
        gguf = gguf_file(cfg.model)  # the default and catalog names are GGUF files too
        llama_server = server_peers(cfg, gguf, result.notes)  # or a notice saying why not
        peers += llama_server
        if importlib.util.find_spec("llama_cpp") is None:
            if not llama_server:  # llama-cpp-python is the other way in: say so only when neither runs
                result.notes.append(
                    "llama-cpp-python peer skipped: it is not installed (`pip install specdec[llama-cpp]`). "
                    "Known settings when it is: on AMX CPUs `llama_decode` segfaults on batches of more than "
                    "one token unless `use_extra_bufts=False`; with a draft model, contexts past 512 tokens "
                    "need `logits_all=True`."
                )
        elif gguf is None:
            result.notes.append("llama-cpp peer skipped: it needs a GGUF model (--model FILE.gguf).")
        else:
            threads = cfg.peer_threads or cfg.default_threads
            peers += [LlamaCppPeer(gguf, cfg.max_model_len, eos, lookup, threads) for lookup in (False, True)]
    with torch_threads(cfg.peer_threads or cfg.default_threads):
        for peer in peers:
            peer.warmup()
    return peers


def run_peer_cell(peer: Peer, result: BenchResult, workload: str, temperature: float, bar: tqdm) -> Cell:
    requests: list[Request] = result.requests[workload]
    params = [req.params(temperature, result.config.max_new_tokens, result.config.ignore_eos) for req in requests]
    with torch_threads(result.config.peer_threads or result.config.default_threads):
        outputs, stats = peer.run([list(req.prompt_ids) for req in requests], params, bar.update)
    cell = Cell(peer.name, "peer", workload, 1, temperature, outputs, stats, peak_rss_bytes=peak_rss_bytes())
    if temperature == GREEDY and workload in result.reference:
        ref = result.reference[workload]
        cell.mismatches = sum(got != want for got, want in zip(outputs, ref, strict=True))
    return cell
