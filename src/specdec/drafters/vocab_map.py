"""Which draft tokens have an exact twin in the target's vocabulary: the map TLI drafts through.

Two tokens are twins when they stand for the same bytes. A token's bytes depend on how its
tokenizer spells them: byte-level BPE (GPT-2, SmolLM2, Qwen) writes each byte as one printable
character (``Ġ`` is the space byte 0x20); sentencepiece-style vocabularies (Llama 2, Gemma) write
the space as ``▁`` and unknown bytes as ``<0xNN>`` byte-fallback tokens. Added and special tokens
(``<|im_end|>``, ``<bos>``) are matched by their content, and only to the other side's added tokens.

Example: SmolLM2's ``Ġhello`` and Gemma's ``▁hello`` are both the bytes b" hello": twins.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import torch

ADDED = b"\xff\xfeadded:"  # prefix of an added token's key: never the bytes of ordinary text
BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable character for each byte, inverted: character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def is_byte_level(tokenizer) -> bool:
    """Whether the tokenizer's decoder maps token characters to bytes GPT-2 style."""
    decoder = json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder") or {}
    return '"ByteLevel"' in json.dumps(decoder)


def token_keys(tokenizer) -> list[bytes | None]:
    """Each token id's key (its bytes, or ADDED + content for an added token); None where it has none."""
    added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
    strings = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    alphabet = byte_level_alphabet() if is_byte_level(tokenizer) else None
    keys: list[bytes | None] = []
    for i, s in enumerate(strings):
        if i in added:
            keys.append(ADDED + added[i].encode())
        elif s is None:
            keys.append(None)
        elif alphabet is not None and all(c in alphabet for c in s):
            keys.append(bytes(alphabet[c] for c in s))
        elif m := BYTE_FALLBACK.match(s):
            keys.append(bytes([int(m.group(1), 16)]))
        else:
            keys.append(s.replace("▁", " ").encode())
    return keys


@dataclass
class VocabMap:
    """draft_to_target[d]: the target id of draft token d's twin, or -1 (``draft_size`` rows: the
    draft model's logits width, which may pad its tokenizer's vocabulary)."""

    draft_to_target: torch.Tensor  # [draft_size] int64
    target_size: int  # the target's logits width
    tokenizer_size: int  # tokens in the draft's tokenizer

    @classmethod
    def build(cls, target_tok, draft_tok, target_size: int, draft_size: int) -> VocabMap:
        target: dict[bytes, int] = {}
        for i, key in enumerate(token_keys(target_tok)[:target_size]):
            if key is None:
                continue
            # twins within the target (a byte-fallback <0x41> and "A"): keep the ordinary token
            if key not in target or (len(key) == 1 and _is_fallback(target_tok, target[key])):
                target[key] = i
        d2t = torch.full((draft_size,), -1, dtype=torch.long)
        keys = token_keys(draft_tok)[:draft_size]
        for d, key in enumerate(keys):
            if key is not None and key in target:
                d2t[d] = target[key]
        return cls(d2t, target_size, min(len(keys), draft_size))

    @property
    def num_mapped(self) -> int:
        return int((self.draft_to_target >= 0).sum())

    @property
    def fraction(self) -> float:
        return self.num_mapped / max(self.tokenizer_size, 1)

    def summary(self) -> str:
        """One line for the load report."""
        return (f"draft vocabulary: {self.num_mapped:,} of {self.tokenizer_size:,} tokens "
                f"({self.fraction:.0%}) map to the target's")

    def to(self, device: torch.device | str) -> VocabMap:
        return VocabMap(self.draft_to_target.to(device), self.target_size, self.tokenizer_size)


def _is_fallback(tokenizer, token_id: int) -> bool:
    return bool(BYTE_FALLBACK.match(tokenizer.convert_ids_to_tokens(token_id) or ""))


def token_lengths(tokenizer) -> list[int]:
    """Each token's length in bytes of text (-1 where unknown)."""
    return [-1 if k is None else len(k) - len(ADDED) if k.startswith(ADDED) else len(k) for k in token_keys(tokenizer)]
