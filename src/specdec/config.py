"""Frozen configuration dataclasses: the model, sampling and speculation settings."""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only transformer; family differences are flags."""

    arch: str  # "llama", "qwen2", "qwen3", "mistral", "gemma3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # llama3-style {"rope_type": "llama3", "factor", ...}
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # qkv bias (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3, Gemma3)
    # Gemma3 flags
    norm_offset: bool = False  # RMSNorm weight is (1 + w)
    sandwich_norm: bool = False  # extra norms after attention and MLP
    embed_scale: bool = False  # multiply embeddings by sqrt(hidden)
    hidden_act: str = "silu"  # "silu" or "gelu_pytorch_tanh"
    query_pre_attn_scalar: float | None = None
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()  # layers that attend within sliding_window only
    rope_local_base_freq: float | None = None
    final_logit_softcapping: float | None = None  # attention soft-capping is refused when the config is read
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def layer_is_sliding(self, layer: int) -> bool:
        return self.sliding_window is not None and layer in self.sliding_layers


MAX_LOGPROBS = 20  # vLLM's default max_logprobs; OpenAI allows 20 top_logprobs


class LogprobsMode(str, enum.Enum):
    """What ``logprobs`` report (vLLM's ``logprobs_mode`` names); see ``logprobs.py``."""

    RAW_LOGPROBS = "raw_logprobs"
    RAW_LOGITS = "raw_logits"
    PROCESSED_LOGPROBS = "processed_logprobs"
    PROCESSED_LOGITS = "processed_logits"


class StructuredKind(str, enum.Enum):
    """What a ``StructuredOutput`` constrains the text to (vLLM's ``structured_outputs`` keys)."""

    JSON_SCHEMA = "json"  # a JSON schema, as JSON text
    JSON_OBJECT = "json_object"  # any JSON object (``spec`` unused)
    REGEX = "regex"
    CHOICE = "choice"  # ``spec`` is a JSON list of strings
    GRAMMAR = "grammar"  # Lark, or GBNF/EBNF (llama.cpp's grammar format)


@dataclass(frozen=True)
class StructuredOutput:
    """A grammar the output must follow; compiled per request by ``specdec.grammar``."""

    kind: StructuredKind
    spec: str = ""


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. temperature == 0 means greedy.

    The history-dependent processors (penalties, logit_bias, min_tokens, bad_words)
    and ``structured`` act on the target's logits at every verified position, with
    the draft tokens before that position counted as history: see ``processors.py``.
    """

    max_new_tokens: int = 128  # 0 only with prompt_logprobs: score the prompt, generate nothing
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    n: int = 1
    # None = off; N = the chosen token's logprob and the N most likely tokens' at each output position,
    # in the engine's logprobs_mode (the raw target distribution by default: logprobs.py).
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # the same for the prompt's tokens (the first has none; always raw)
    presence_penalty: float = 0.0  # OpenAI: minus this once a token is in the output
    frequency_penalty: float = 0.0  # OpenAI: minus this times the token's count in the output
    repetition_penalty: float = 1.0  # CTRL/vLLM: divide (or multiply, when < 0) logits of prompt+output tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias); a dict is accepted and sorted
    min_tokens: int = 0  # EOS is banned until this many tokens are out
    bad_words: tuple[str, ...] = ()  # never produce these words (as tokens, with and without a leading space)
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        if isinstance(self.logit_bias, dict):
            pairs = tuple(sorted((int(k), float(v)) for k, v in self.logit_bias.items()))
            object.__setattr__(self, "logit_bias", pairs)
        if self.max_new_tokens < 0 or (self.max_new_tokens == 0 and self.prompt_logprobs is None):
            raise ValueError(f"max_new_tokens must be >= 1 (0 only with prompt_logprobs, to score a prompt), "
                             f"got {self.max_new_tokens}")
        if not 0 <= self.temperature < math.inf:  # NaN fails too
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")
        if not -2.0 <= self.presence_penalty <= 2.0 or not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError("presence_penalty and frequency_penalty must be in [-2, 2]")
        if not 0 < self.repetition_penalty <= 10:
            raise ValueError(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}")
        if any(not -100 <= bias <= 100 for _, bias in self.logit_bias):
            raise ValueError("logit_bias values must be in [-100, 100]")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if any(not w for w in self.bad_words):
            raise ValueError("bad_words holds an empty word")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_history_processors(self) -> bool:
        """Whether any processor reads the tokens before a position (see ``processors.py``)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens or self.bad_words)

    def for_choice(self, i: int) -> SamplingParams:
        """Settings of the i-th of n samples: one sequence; choice 0 keeps the seed, choice i > 0
        gets a seed derived from (seed, i), so no choice's stream is another's or a drafter's
        (seed + i made choice i's draft stream, seed + i + 1, choice i + 1's target stream)."""
        seed = self.seed if self.seed is None or i == 0 else derive_seed(self.seed, f"choice {i}")
        return replace(self, n=1, seed=seed)

    @property
    def draft_seed(self) -> int | None:
        """The seed of a drafter's own sampling stream: independent of the target's and of every
        other choice's (None: unseeded)."""
        return None if self.seed is None else derive_seed(self.seed, "draft")


def derive_seed(seed: int, role: str) -> int:
    """A seed in [0, 2**63) for the stream ``role`` of ``seed``: a hash, so streams derived for
    different roles or seeds do not coincide (as seed + 1 of one and seed of the next would)."""
    digest = hashlib.blake2b(f"{seed}/{role}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class SpecType(str, enum.Enum):
    """Drafting methods, named as llama-server's --spec-type values."""

    NONE = "none"
    NGRAM = "ngram"
    NGRAM_MAP_K = "ngram-map-k"
    NGRAM_MAP_K4V = "ngram-map-k4v"
    NGRAM_MOD = "ngram-mod"
    NGRAM_CACHE = "ngram-cache"
    SUFFIX = "suffix"
    DRAFT_SELF = "draft-self"
    DRAFT_MODEL = "draft-model"
    EAGLE3 = "eagle3"
    # The target itself with some layers skipped (or only its first E): drafters/layerskip.py.
    DRAFT_LAYERSKIP = "draft-layerskip"
    DRAFT_MTP = "draft-mtp"  # the target checkpoint's own multi-token-prediction module: drafters/mtp.py
    RETRIEVAL = "retrieval"  # REST: continuations found in a corpus (--spec-datastore): drafters/retrieval.py
    # Runs the cheap drafters (and the draft model or EAGLE-3 head when one is given) and per
    # step picks or merges their proposals by measured acceptance and cost: drafters/adaptive.py.
    ADAPTIVE = "adaptive"


# The methods that may draft with an EAGLE-3 head (adaptive: when one is given), so may take --spec-parallel-drafting
HEAD_DRAFTING_TYPES = frozenset({SpecType.EAGLE3, SpecType.ADAPTIVE})
DEFAULT_SPEC_TYPES = (SpecType.ADAPTIVE,)  # what `specdec serve`, `generate` and LLM draft with unless told


def parse_layer_list(text: str) -> tuple[int, ...] | None:
    """--spec-layerskip-layers: 'auto' -> None (searched); '4,6,8' -> (4, 6, 8); raises ValueError."""
    if text.strip() == "auto":
        return None
    try:
        layers = tuple(sorted({int(t) for t in text.split(",") if t.strip()}))
    except ValueError:
        raise ValueError(f"--spec-layerskip-layers wants 'auto' or a comma list of layer indices, got {text!r}") \
            from None
    if not layers:
        raise ValueError("--spec-layerskip-layers is empty")
    return layers


def parse_spec_types(text: str) -> tuple[SpecType, ...]:
    """'suffix,draft-model' -> (SpecType.SUFFIX, SpecType.DRAFT_MODEL); raises ValueError."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    valid = ", ".join(t.value for t in SpecType)
    out = []
    for name in names:
        try:
            out.append(SpecType(name))
        except ValueError:
            raise ValueError(f"unknown spec type {name!r}; choose from: {valid}") from None
    if not out:
        raise ValueError(f"empty spec type; choose from: {valid}")
    for alone in (SpecType.NONE, SpecType.ADAPTIVE):
        if alone in out and len(out) > 1:
            raise ValueError(f"'{alone.value}' cannot be combined with other spec types")
    return tuple(out)


DRAFT_VOCAB_METHODS = ("auto", "tli", "slem")


@dataclass(frozen=True)
class Flag:
    """The command-line flag of a ``SpecConfig`` field. ``cli.args`` adds one per flagged field to
    generate, serve and bench and reads it back, so a drafter's setting is declared once, here."""

    name: str  # "--spec-ngram-size-n"; the namespace attribute is argparse's ("spec_ngram_size_n")
    help: str | None = None
    type: Callable[[str], Any] | None = None  # argparse's type (None: the text as given)
    positive: bool = False  # an int >= 1: argparse refuses anything else in one line
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    const: Any = None  # the value of the flag given alone (its value then optional)
    switch: bool = False  # given: True (a store_true flag)
    parse: Callable[[str], Any] | None = None  # the given text -> the field's value
    # None when not given, as the field's default is derived from other flags (``cli.args.spec_from_args``)
    derived: bool = False

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


def flag(name: str, help: str | None = None, **options: Any) -> dict[str, Flag]:
    """A field's metadata naming its flag: ``field(default=12, metadata=flag("--spec-ngram-size-n"))``."""
    return {"flag": Flag(name, help, **options)}


@dataclass(frozen=True)
class SpecConfig:
    """Speculation settings (llama-server flag names; each field's flag in its metadata, ``Flag``)."""

    types: tuple[SpecType, ...] = DEFAULT_SPEC_TYPES  # --spec-type, comma list = chain; (NONE,) = plain
    draft_n_max: int = field(default=8, metadata=flag(  # raised to num_draft_tokens for eagle3 unless given
        "--spec-draft-n-max", "most drafted tokens per step", positive=True, derived=True))
    draft_n_min: int = field(default=0, metadata=flag("--spec-draft-n-min", "drop drafts shorter than this", type=int))
    draft_p_min: float = field(default=0.0, metadata=flag(
        "--spec-draft-p-min", "draft-model and draft-layerskip stop drafting below this top probability", type=float))
    # the draft model drafts a tree, branching where a candidate after the first has q above this
    # (llama.cpp's --draft-p-split; 0.1 is its default); None: chains (drafters/draft_model.py)
    draft_p_split: float | None = field(default=None, metadata=flag(
        "--spec-draft-p-split", "draft model drafts a tree: branch where a candidate after the first has probability "
        "above P (alone: 0.1, llama.cpp's default); off unless given", type=float, const=0.1, metavar="P"))
    draft_branches: int = field(default=2, metadata=flag(
        "--spec-draft-branches", "most branches of a --spec-draft-p-split tree, the main chain counted "
        "(llama-speculative's -np)", positive=True))
    ngram_size_n: int = field(default=12, metadata=flag("--spec-ngram-size-n", "longest n-gram matched", positive=True))
    ngram_size_m: int = field(default=48, metadata=flag(
        "--spec-ngram-size-m", "most tokens an n-gram proposes", positive=True))
    ngram_min_hits: int = field(default=1, metadata=flag("--spec-ngram-min-hits", positive=True))
    # ngram-mod: llama.cpp's defaults, sized for long drafts; the per-step budget caps them (drafters/ngram_mod.py)
    ngram_mod_n_match: int = field(default=24, metadata=flag(
        "--spec-ngram-mod-n-match", "ngram-mod: tokens hashed per n-gram of the shared pool", positive=True))
    ngram_mod_n_min: int = field(default=48, metadata=flag(
        "--spec-ngram-mod-n-min", "ngram-mod: drop drafts shorter than this (scaled down with the per-step budget)",
        positive=True))
    ngram_mod_n_max: int = field(default=64, metadata=flag(
        "--spec-ngram-mod-n-max", "ngram-mod: most tokens drafted (--spec-draft-n-max still caps a step)",
        positive=True))
    ngram_cache_file: str | None = field(default=None, metadata=flag(  # the learned counts, loaded and saved
        "--spec-ngram-cache-file", "ngram-cache: the n-gram counts learned from earlier requests, read at start "
        "when the file exists and written at exit (llama.cpp's lookup cache format)", metavar="PATH"))
    ngram_cache_static: str | None = field(default=None, metadata=flag(  # read-only counts (llama.cpp's -lcs)
        "--spec-ngram-cache-static", "ngram-cache: read-only n-gram counts, e.g. of a corpus (llama.cpp's "
        "--lookup-cache-static)", metavar="PATH"))
    draft_model: str | None = field(default=None, metadata=flag(
        "--draft-model", "draft model for --spec-type draft-model (bench: adds method draft-model and the "
        "transformers assistant_model peer)"))
    # how a draft model with another tokenizer drafts (drafters/cross_vocab.py): tli (token-level
    # intersection), slem (string-level exact match), auto (by measured acceptance)
    draft_vocab: str = field(default="auto", metadata=flag(
        "--spec-draft-vocab", "a --draft-model with another tokenizer drafts by tli (token-level intersection: "
        "only its tokens with an exact twin in the target's vocabulary), slem (string-level exact match: its text "
        "re-encoded by the target's tokenizer) or auto (the one measured to be accepted more); both lossless",
        choices=DRAFT_VOCAB_METHODS))
    # FR-Spec: the draft model's LM head only over the N most frequent tokens (drafters/frequent_vocab.py);
    # None: the whole vocabulary
    draft_vocab_size: int | None = field(default=None, metadata=flag(
        "--spec-draft-vocab-size", "draft-model drafts from the N tokens most frequent in an offline corpus only "
        "(FR-Spec: its LM head cut to those rows; the target still verifies over every token, so lossless; a draft "
        "with another tokenizer ranks its own tokens)",
        positive=True, metavar="N"))
    draft_prompt_tail: int | None = field(default=None, metadata=flag(  # the draft reads the last M prompt tokens
        "--spec-draft-prompt-tail", "draft-model reads only the last M prompt tokens (bounds its prefill on long "
        "prompts)", positive=True, metavar="M"))
    datastore: str | None = field(default=None, metadata=flag(  # `specdec datastore build` makes one
        "--spec-datastore", "retrieval: the datastore to draft from (`specdec datastore build --out PATH`)",
        metavar="PATH"))
    # eagle3 (SGLang's names): the head, and the dynamic tree it drafts
    spec_model: str | None = field(default=None, metadata=flag(  # an EAGLE-3 head folder or an MTP module
        "--spec-model", "EAGLE-3 head folder for --spec-type eagle3 (none ships: `specdec train eagle3` makes one); "
        "for draft-mtp, a module trained by `specdec train mtp` (default: the target's own)"))
    eagle_topk: int = field(default=4, metadata=flag(
        "--spec-eagle-topk", "eagle3: children expanded per tree node (1 = a chain)", positive=True))
    num_steps: int = field(default=4, metadata=flag(
        "--spec-num-steps", "eagle3: draft tree depth (head passes per draft)", positive=True))
    # nodes sent to the verifier (capped by draft_n_max); 7 + the root is one 8-row verify pass, the
    # width where the CPU kernels' 4-row blocks end (docs/performance.md)
    num_draft_tokens: int = field(default=7, metadata=flag(
        "--spec-num-draft-tokens", "eagle3: tree nodes verified per step (default 7; raises --spec-draft-n-max to "
        "match unless that is given)", positive=True, derived=True))
    # vLLM's "parallel_drafting": a P-EAGLE head drafts all its K positions in one pass (``specdec train
    # eagle3 --parallel K``); the tree is at most min(K, num_steps) deep. Other drafters ignore it; a
    # config without a head-drafting type refuses it (``with_types`` drops it)
    parallel_drafting: bool = field(default=False, metadata=flag(
        "--spec-parallel-drafting", "eagle3: a P-EAGLE head (specdec train eagle3 --parallel K) drafts its K tokens "
        "in one pass instead of K", switch=True))
    # draft-layerskip: the layers the draft skips (None = searched on the fly, ``layerskip.SkipSearch``)
    # or, with layerskip_exit = E, the first E layers only (early exit: LayerSkip checkpoints)
    layerskip_layers: tuple[int, ...] | None = field(default=None, metadata=flag(
        "--spec-layerskip-layers", "draft-layerskip: the layers the draft skips, a comma list of indices, or auto "
        "(the default: searched during generation by acceptance and cost); given, adaptive asks draft-layerskip "
        "too", metavar="auto|LIST", parse=parse_layer_list))
    layerskip_exit: int | None = field(default=None, metadata=flag(
        "--spec-layerskip-exit", "draft-layerskip: draft with the first E layers, then the final norm and LM head "
        "(early exit, for checkpoints trained for it such as facebook/layerskip-*); given, adaptive asks "
        "draft-layerskip too", positive=True, metavar="E"))
    adaptive_layerskip: bool = False  # adaptive asks draft-layerskip too (set by either flag above)
    # speculation pauses (and is re-probed with growing back-off) while the recent per-token acceptance
    # is below this, lowered to what a drafted token costs once pass costs are measured
    # (pass_cost.acceptance_floor); also when it measures slower than plain decoding
    min_acceptance: float = field(default=0.4, metadata=flag(
        "--spec-min-acceptance", "pause speculation while a sequence's recent per-token acceptance is below this, "
        "lowered to what a drafted token costs once pass costs are measured (re-probed with growing back-off; "
        "0: never pause)", type=float))

    def __post_init__(self) -> None:
        if self.draft_n_max < 1:
            raise ValueError(f"spec draft n max must be >= 1, got {self.draft_n_max}")
        if not 0 <= self.draft_n_min <= self.draft_n_max:
            raise ValueError("spec draft n min must be in [0, draft n max]")
        if self.ngram_size_n < 1 or self.ngram_size_m < 1:
            raise ValueError("ngram sizes must be >= 1")
        if self.ngram_mod_n_match < 1 or not 1 <= self.ngram_mod_n_min <= self.ngram_mod_n_max:
            raise ValueError("need --spec-ngram-mod-n-match >= 1 and 1 <= --spec-ngram-mod-n-min <= "
                             f"--spec-ngram-mod-n-max, got {self.ngram_mod_n_match}, {self.ngram_mod_n_min}, "
                             f"{self.ngram_mod_n_max}")
        if (self.ngram_cache_file or self.ngram_cache_static) and SpecType.NGRAM_CACHE not in self.types:
            raise ValueError("--spec-ngram-cache-file and --spec-ngram-cache-static need --spec-type ngram-cache")
        if SpecType.DRAFT_MODEL in self.types and not self.draft_model:
            raise ValueError("--spec-type draft-model needs --draft-model")
        if SpecType.EAGLE3 in self.types and not self.spec_model:  # issue 26: only a head that beats plain ships
            raise ValueError("--spec-type eagle3 needs --spec-model DIR: no EAGLE-3 head ships with specdec (none "
                             "trained so far beats plain decoding); `specdec train eagle3 --out DIR` makes one")
        if SpecType.RETRIEVAL in self.types and not self.datastore:
            raise ValueError("--spec-type retrieval needs --spec-datastore PATH (`specdec datastore build --out PATH` "
                             "makes one)")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"--spec-draft-vocab-size must be >= 1, got {self.draft_vocab_size}")
        if self.draft_prompt_tail is not None and self.draft_prompt_tail < 1:
            raise ValueError(f"--spec-draft-prompt-tail must be >= 1, got {self.draft_prompt_tail}")
        if self.draft_p_split is not None and not 0.0 < self.draft_p_split < 1.0:
            raise ValueError(f"--spec-draft-p-split must be in (0, 1), got {self.draft_p_split}")
        if self.draft_branches < 1:
            raise ValueError(f"--spec-draft-branches must be >= 1, got {self.draft_branches}")
        if self.draft_vocab not in DRAFT_VOCAB_METHODS:
            raise ValueError(f"unknown --spec-draft-vocab {self.draft_vocab!r}; choose from: "
                             f"{', '.join(DRAFT_VOCAB_METHODS)}")
        if not 0.0 <= self.min_acceptance <= 1.0:
            raise ValueError(f"--spec-min-acceptance must be in [0, 1], got {self.min_acceptance}")
        if min(self.eagle_topk, self.num_steps, self.num_draft_tokens) < 1:
            raise ValueError("--spec-eagle-topk, --spec-num-steps and --spec-num-draft-tokens must be >= 1")
        if self.layerskip_layers is not None and self.layerskip_exit is not None:
            raise ValueError("give either --spec-layerskip-layers or --spec-layerskip-exit, not both")
        if self.layerskip_layers is not None and (not self.layerskip_layers or min(self.layerskip_layers) < 0):
            raise ValueError(f"--spec-layerskip-layers needs layer indices >= 0, got {self.layerskip_layers}")
        if self.layerskip_exit is not None and self.layerskip_exit < 1:
            raise ValueError(f"--spec-layerskip-exit must be >= 1, got {self.layerskip_exit}")
        # The one check of the flag against the methods (the CLI, the server's --speculative-config and
        # the bench all build a SpecConfig); whether the head was trained for it: eagle_checkpoint.check_parallel
        if self.parallel_drafting and not HEAD_DRAFTING_TYPES & set(self.types):
            raise ValueError("--spec-parallel-drafting drafts with an EAGLE-3 head: it needs --spec-type eagle3 "
                             "(or adaptive with --spec-model)")

    def with_types(self, types: tuple[SpecType, ...]) -> SpecConfig:
        """These settings drafting with ``types`` (a bench's methods share one config): the P-EAGLE flag
        kept only where an EAGLE-3 head drafts, as the other drafters ignore it."""
        parallel = self.parallel_drafting and bool(HEAD_DRAFTING_TYPES & set(types))
        return replace(self, types=types, parallel_drafting=parallel)

    @property
    def enabled(self) -> bool:
        return self.types != (SpecType.NONE,)
