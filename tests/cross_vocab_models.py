"""Micro models with small, deliberately different tokenizers, for the cross-tokenizer tests.

The target's tokenizer is byte-level BPE (space as ``Ġ``, specials ``<|endoftext|>``, ``<s>``,
``</s>``); the draft's is sentencepiece-style (space as ``▁``, specials ``<|endoftext|>``,
``<bos>``, ``<eos>``, ``<unk>``), its ids shuffled. They share the characters and 12 of the
target's 20 merged tokens; the draft has 7 merges of its own, so words split differently
("abcd" is one target token; the draft has "bcd" and "abc").

Both networks have their attention outputs zeroed (the next token follows the last one alone).
The draft model is the target's own network with its embedding and LM-head rows moved to the
draft's ids (twins get the target's rows, the rest random ones) and its head flattened: where
its last token is a twin of the target's it predicts close to the target (accepted often),
elsewhere not (rejected often).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

CHARS = list("abcdefgh") + [" "]
TARGET_MERGES = ["ab", "cd", "ef", "gh", "ba", "dc", " a", " b", " c", " d", " e", "abc", "abcd", " ab", "aa",
                 "bb", "cc", "hh", "fe", " ef"]
DRAFT_MERGES = ["ab", "cd", "ef", "gh", "ba", " a", " b", " c", "aa", "bb", "abc", " ab", "bc", "de", "fg", "hg",
                " f", " g", "bcd"]
TARGET_SPECIALS = ["<|endoftext|>", "<s>", "</s>"]
DRAFT_SPECIALS = ["<|endoftext|>", "<bos>", "<eos>", "<unk>"]
TARGET_VOCAB = len(TARGET_SPECIALS) + len(CHARS) + len(TARGET_MERGES)  # 32
DRAFT_VOCAB = len(DRAFT_SPECIALS) + len(CHARS) + len(DRAFT_MERGES)  # 32


def _merges(tokens: list[str], vocab: set[str]) -> list[tuple[str, str]]:
    """BPE merges that build each multi-character token from a shorter token and one character."""
    out = []
    for t in tokens:
        split = next(i for i in range(len(t) - 1, 0, -1) if t[:i] in vocab and t[i:] in vocab)
        out.append((t[:split], t[split:]))
    return out


def build_tokenizer(folder: Path, byte_level: bool, shuffle_seed: int | None = None) -> list[str]:
    """Save the target's (byte_level) or the draft's tokenizer in ``folder``; return its tokens by id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials, merges = (TARGET_SPECIALS, TARGET_MERGES) if byte_level else (DRAFT_SPECIALS, DRAFT_MERGES)
    space = "Ġ" if byte_level else "▁"
    ordinary = [c.replace(" ", space) for c in CHARS] + [m.replace(" ", space) for m in merges]
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(ordinary)
    tokens = specials + ordinary
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = _merges([m.replace(" ", space) for m in merges], set(ordinary))
    if byte_level:
        tok = Tokenizer(models.BPE(vocab, pairs))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    else:
        tok = Tokenizer(models.BPE(vocab, pairs, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                       unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": [s for s in specials if s != "<unk>"]})
    fast.save_pretrained(folder)
    return tokens


def twin_rows(target_tokens: list[str], draft_tokens: list[str]) -> list[int | None]:
    """For each draft id, the target id spelling the same text (None: no twin)."""
    text = lambda t: t.replace("Ġ", " ").replace("▁", " ")
    target = {text(t): i for i, t in enumerate(target_tokens)}
    return [target.get(text(t)) for t in draft_tokens]


def build_pair(root: Path, build_micro) -> tuple[Path, Path]:
    """(target folder, draft folder): ``build_micro`` makes the target's network (tests/test_lossless_sampling)."""
    target = build_micro(root / "target", seed=0)
    target_tokens = build_tokenizer(target, byte_level=True)
    draft = build_micro(root / "draft", seed=0, head_scale=0.6)
    draft_tokens = build_tokenizer(draft, byte_level=False, shuffle_seed=3)
    _move_rows(draft, twin_rows(target_tokens, draft_tokens))
    for folder in (target, draft):
        _zero_attention(folder)
    return target, draft


def _zero_attention(folder: Path) -> None:
    """Zero the attention outputs: the next token then depends on the last token alone, so the
    draft predicts like the target wherever its last token is a twin of the target's last."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    weights = load_file(path)
    for name in weights:
        if name.endswith("o_proj.weight"):
            weights[name] = torch.zeros_like(weights[name])
    save_file(weights, path, metadata={"format": "pt"})


def _move_rows(folder: Path, twins: list[int | None]) -> None:
    """Give draft id d the embedding and LM-head rows of its twin (a random row where it has none)."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    weights = load_file(path)
    gen = torch.Generator().manual_seed(7)
    for name, scale in (("model.embed_tokens.weight", 0.5), ("lm_head.weight", 0.05)):  # rarely argmax
        old = weights[name]
        new = torch.empty_like(old)
        for d, t in enumerate(twins):
            new[d] = old[t] if t is not None else scale * torch.randn(old.shape[1], generator=gen)
        weights[name] = new.contiguous()
    save_file(weights, path, metadata={"format": "pt"})
