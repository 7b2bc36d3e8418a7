"""Sampled output keeps the target's exact distribution under every sampling option and processor.

The micro harness of tests/test_lossless_sampling.py with one option set: temperature 0.7, top-k 4,
top-p, min-p (the last two without top-k), the penalties (repetition, presence, frequency) and a
grammar (llguidance over a 32-token vocabulary of single characters). The exact distribution is
enumerated with the same processors the engine applies: a penalty or a grammar reads the history,
so each enumerated prefix gets processors advanced by that prefix, as each verify row gets the
drafted path before it. Every setting samples 4000 5-token outputs with a chain from the draft
model's q and with a width-2 tree, both drafting their whole budget, and asserts the exact
distribution (chi-square p > ALPHA) and that drafts were verified and accepted; the broken verifier
(resample-from-p) is caught under the penalties, where p and q differ most.

Cost on 2 busy cores: ~3-8 s per 4000 samples (the draft model's q is memoized per context).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import specdec.verify as verify_mod
from specdec.config import SamplingParams, StructuredKind, StructuredOutput
from specdec.drafters.base import Drafter
from specdec.grammar import GrammarCompiler, GrammarMatcher
from specdec.processors import HistoryProcessor, SequenceProcessors
from tests.test_lossless import chi2_pvalue
from tests.test_lossless_sampling import (
    ALPHA,
    PARAMS,
    PLAIN,
    VOCAB,
    Case,
    DraftModelChain,
    DraftModelTree,
    Micro,
    assert_lossless,
    assert_speculated,
    micro,  # noqa: F401 - the fixture
    sample,
)

EOS = 2
# Token 3 + i is CHARS[i]; 0-2 are <unk>, <s>, </s>.
CHARS = "abcdefghijklmnopqrstuvwxyz.,-"


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A real tokenizer for the micro models' 32 ids: one character per token (byte-level, so
    llguidance reads each token's bytes)."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": EOS, **{c: 3 + i for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def penalties(prompt: list[int], params: SamplingParams) -> SequenceProcessors:
    return SequenceProcessors(history=HistoryProcessor(params, prompt, VOCAB, (EOS,)))


# 'b' first, never 'r' or 'z' (the target's likeliest output after PROMPT is "brbbg"), no 'f', 'v'
# or 'r' right after 'f' (its second likeliest is "bfvvv"): which tokens row t allows depends on
# the path before it. Six characters at least: no 5-token output completes it, so EOS stays masked
# and every output has 5 tokens.
REGEX = StructuredOutput(StructuredKind.REGEX, r"b([a-eg-qs-y.,\-]|f[a-eg-qs-uw-y.,\-]){5,}")
_GRAMMAR: list[GrammarMatcher] = []


def grammar(prompt: list[int], params: SamplingParams) -> SequenceProcessors:
    """A fresh matcher per sequence, copied from one compiled matcher."""
    if not _GRAMMAR:
        _GRAMMAR.append(GrammarCompiler(char_tokenizer(), VOCAB, (EOS,)).matcher(REGEX))
    return SequenceProcessors(grammar=GrammarMatcher(_GRAMMAR[0].matcher.deep_copy(), VOCAB))


CASES = {
    "temperature-0.7": Case(params=replace(PARAMS, temperature=0.7)),
    "top-k-4": Case(params=replace(PARAMS, top_k=4)),
    "top-p-0.7": Case(params=replace(PARAMS, top_k=0, top_p=0.7)),
    "min-p-0.25": Case(params=replace(PARAMS, top_k=0, min_p=0.25)),
    "penalties": Case(params=replace(PARAMS, repetition_penalty=1.3, frequency_penalty=0.7, presence_penalty=0.3),
                      processors=penalties),
    "grammar": Case(params=replace(PARAMS, structured=REGEX), processors=grammar),
}


def deep_drafter(m: Micro, shape: str) -> Callable[[], Drafter]:
    """Both draw from the draft model's q and draft their whole budget (4 tokens, depth 4 or 3)."""
    return (lambda: DraftModelChain(m.q)) if shape == "chain" else (lambda: DraftModelTree(m.q))


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("name", CASES)
def test_sampling_option_keeps_the_distribution(micro, name, shape):  # noqa: F811 - micro is the fixture
    case = CASES[name]
    dist, plain = micro.dist(case), micro.dist(PLAIN)
    assert abs(sum(dist.values()) - 1.0) < 1e-4
    # the option changes the target's distribution, so a test that ignored it would fail
    assert max(abs(dist.get(k, 0.0) - plain.get(k, 0.0)) for k in dist.keys() | plain.keys()) > 0.01
    s = sample(micro, deep_drafter(micro, shape), case)
    assert_lossless(s, dist, trees=shape == "tree")


def test_harness_catches_resampling_from_p_under_penalties(micro, monkeypatch):  # noqa: F811
    monkeypatch.setattr(verify_mod, "_residual", lambda p, q, x: p)
    case = CASES["penalties"]
    s = sample(micro, deep_drafter(micro, "chain"), case)
    assert_speculated(s)
    assert chi2_pvalue(s.counts, micro.dist(case)) < ALPHA
