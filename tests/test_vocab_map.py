"""The vocabulary map and the seams on real tokenizers: SmolLM2 (49,152 tokens) drafting for
Qwen2.5-Coder (151,936), both byte-level BPE that split digits, CJK and runs of spaces differently.

Cost: loading the two tokenizers and mapping them takes ~10 s on 2 busy cores, so the module is
marked slow; tests/test_cross_vocab.py pins the same code on micro tokenizers in the fast suite.
"""

from __future__ import annotations

import pytest

from specdec.drafters.retokenize import DraftContext, TokenizerPair
from specdec.drafters.vocab_map import VocabMap
from specdec.errors import ModelLoadError
from specdec.model.weights import resolve_model
from specdec.text import load_tokenizer

pytestmark = pytest.mark.slow

SEAMS = [  # texts the two tokenizers split differently
    "日本語のテキスト",  # Qwen: 'æĹ¥æľ¬', 'èªŀ'; SmolLM2: 'æĹ', '¥', 'æľ¬', ...
    "   \n\n  x = 1234567\n",  # runs of spaces and newlines, digits one by one on both
    "def add_all(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total\n",
    "naïve café — “quoted” 🎉🎉",
]


@pytest.fixture(scope="module")
def pair():
    try:
        target = load_tokenizer(resolve_model("qwen2.5-coder-0.5b", weights=False))
    except ModelLoadError as exc:  # a catalog model this checkout has not installed
        pytest.skip(str(exc))
    draft = load_tokenizer(resolve_model("smollm2-135m", weights=False))
    return target, draft


@pytest.fixture(scope="module")
def vocab(pair) -> VocabMap:
    return VocabMap.build(*pair, 151936, 49152)


def test_smollm2_to_qwen_overlap(vocab):
    assert 37_000 <= vocab.num_mapped <= 42_000, vocab.summary()  # 39,237 (80%) with these files


def test_twins_are_the_same_text(pair, vocab):
    target, draft = pair
    d2t = vocab.draft_to_target
    for text in (" hello", "\n", "    ", " the", "é", "<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        ids = draft(text, add_special_tokens=False).input_ids
        assert all(d2t[i] >= 0 for i in ids), text
        assert target.decode([int(d2t[i]) for i in ids]) == text


def test_draft_context_follows_the_target_text(pair):
    """Qwen ids fed a few at a time (a chat prompt, then seams) give SmolLM2's own encoding of the
    text, its <|im_start|> included as its own special token."""
    target, draft = pair
    text = target.apply_chat_template([{"role": "user", "content": SEAMS[2]}], tokenize=False,
                                      add_generation_prompt=True) + "".join(SEAMS)
    ids = target(text, add_special_tokens=False).input_ids
    mirror = DraftContext(TokenizerPair(target, draft))
    for end in range(1, len(ids) + 1, 3):
        mirror.update(ids[:end])
    out = mirror.update(ids)
    assert out == draft(text, add_special_tokens=False).input_ids
    assert out[0] == draft.convert_tokens_to_ids("<|im_start|>")


@pytest.mark.parametrize("seam", SEAMS)
def test_target_continuation_of_draft_text(pair, seam):
    """SmolLM2's text becomes Qwen ids that write it exactly, less a last token that could still grow."""
    target, draft = pair
    tokens = TokenizerPair(target, draft)
    context = target("Text: ", add_special_tokens=False).input_ids
    new = tokens.target_continuation(context, seam)
    written = target.decode(context + new)
    assert new and seam.startswith(written[len("Text: "):])
    assert len(written) < len("Text: " + seam)
