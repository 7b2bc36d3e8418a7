"""Structured output: a grammar's token mask on the target's logits at every draft position.

Each sequence holds one matcher, advanced by the committed tokens. For a verify
pass the matcher walks the draft tree: at node i (after consuming the drafted
path root -> i) it fills row i of a token bitmask, then rolls back, so row i
allows exactly what plain decoding would allow after those tokens. Branches of a
tree are walked one after another from their common ancestor (roll back to it,
consume down), so every branch sees its own matcher state.

Drafts are cut before verification: a drafted token the grammar rejects has
p = 0 under the mask, so it and everything after it would be rejected anyway.
For a deterministic drafter (one-hot q) the token is dropped too: rejecting x
with p(x) = 0 leaves the residual p unchanged, the same as not drafting x. A
drafter with a real q (a draft model) keeps the invalid token as the last one:
its rejection resamples from norm(max(0, p - q)), and dropping it would sample
from p instead, which is not lossless.

Engine: llguidance (chosen over xgrammar). Measured on this machine with
SmolLM2's tokenizer, a 3-field JSON schema, 22 tokens:

    engine       tokenizer table   compile   mask per token (median / max)   rollback
    llguidance   0.28 s            1.5 ms    9 us / 0.2-1.3 ms               5 us
    xgrammar     0.11 s            4.5 ms    5 us / 22-83 us                 5 us

Both cost well under 1% of a 20 ms target pass; llguidance is one wheel with no
dependencies (xgrammar pulls triton and a TVM runtime), reads JSON schema, regex,
Lark and GBNF, and validates a whole draft in one call (``validate_tokens``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import llguidance
import llguidance.numpy as llg_numpy  # (llguidance.torch imports torch._dynamo: 1.7 s of every start)
import numpy as np
import torch

from specdec.config import StructuredKind, StructuredOutput
from specdec.drafters.base import DraftProposal
from specdec.tree import DraftTree

# Compact, deterministic JSON: a small model left free to emit whitespace can loop on it.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """The schema, regex or grammar cannot be compiled (the caller's input: a 400)."""


def grammar_text(structured: StructuredOutput) -> str:
    """StructuredOutput -> an llguidance grammar definition (not yet validated)."""
    kind, spec = structured.kind, structured.spec
    try:
        if kind is StructuredKind.JSON_OBJECT:
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS)
        if kind is StructuredKind.JSON_SCHEMA:
            schema = json.loads(spec)
            if not isinstance(schema, dict):
                raise GrammarError("a JSON schema must be a JSON object")
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        if kind is StructuredKind.CHOICE:
            choices = json.loads(spec)
            if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
                raise GrammarError("choice must be a non-empty list of strings")
            return llguidance.grammar_from("choice", spec)
        if kind is StructuredKind.REGEX:
            return llguidance.LLMatcher.grammar_from_regex(spec)
        return llguidance.grammar_from("grammar", spec)  # Lark, or GBNF converted to Lark
    except json.JSONDecodeError as exc:
        raise GrammarError(f"invalid JSON in the {kind.value} spec: {exc.msg}") from None
    except ValueError as exc:
        if isinstance(exc, GrammarError):
            raise
        raise GrammarError(str(exc)) from None


class GrammarCompiler:
    """Builds matchers for one tokenizer; its token table (~0.3 s) is built on first use."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self.tokenizer, self.vocab_size, self.eos_token_ids = tokenizer, vocab_size, eos_token_ids
        self._lltokenizer: llguidance.LLTokenizer | None = None

    @property
    def lltokenizer(self) -> llguidance.LLTokenizer:
        if self._lltokenizer is None:
            import llguidance.hf  # imports transformers: on first use

            eos = [t for t in self.eos_token_ids if 0 <= t < self.vocab_size] or None
            self._lltokenizer = llguidance.hf.from_tokenizer(self.tokenizer, self.vocab_size, eos_token=eos)
        return self._lltokenizer

    def matcher(self, structured: StructuredOutput) -> GrammarMatcher:
        """A fresh matcher; raises GrammarError on a bad schema, regex or grammar."""
        grammar = grammar_text(structured)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.lltokenizer)
        if is_error:
            raise GrammarError(f"invalid {structured.kind.value}: {messages[0] if messages else 'rejected'}")
        matcher = llguidance.LLMatcher(self.lltokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"invalid {structured.kind.value}: {matcher.get_error()}")
        return GrammarMatcher(matcher, self.vocab_size)


_BITS = torch.arange(32, dtype=torch.int32)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set logits [N, V] to -inf where bitmask [N, ceil(V / 32)] (int32, bit j of word w = token 32w + j)
    has a 0 bit. (llguidance's own kernel goes through torch.compile: seconds of compiling per process.)"""
    n, vocab = logits.shape
    bits = _BITS.to(bitmask.device)
    allowed = ((bitmask[:, :, None] >> bits) & 1).bool().reshape(n, -1)[:, :vocab]  # [N, V]
    logits.masked_fill_(~allowed, float("-inf"))


class GrammarMatcher:
    """One sequence's grammar state, kept at the committed tokens between steps."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self.matcher, self.vocab_size = matcher, vocab_size

    @property
    def finished(self) -> bool:
        return self.matcher.is_stopped()

    def advance(self, token_ids: Sequence[int]) -> int:
        """Consume committed tokens (sampled under the mask, so valid) up to the grammar's end;
        returns how many were consumed."""
        for n, token in enumerate(token_ids):
            if self.matcher.is_stopped():
                return n
            if not self.matcher.consume_token(token):
                raise RuntimeError(f"the grammar rejected a committed token: {self.matcher.get_error()}")
        return len(token_ids)

    def cut(self, proposal: DraftProposal) -> DraftProposal:
        """The proposal without drafted tokens the grammar rejects, nor their descendants
        (see the module docstring for why a draft with q keeps the first rejected token)."""
        keep_invalid = proposal.probs is not None
        if proposal.is_chain:
            valid = self.matcher.validate_tokens(list(proposal.token_ids))
            n = min(valid + 1, len(proposal)) if keep_invalid and valid < len(proposal) else valid
            return _keep(proposal, list(range(n)))
        tree = proposal.to_tree(-1)
        ok = self._walk(tree, fill=None)
        keep = [i - 1 for i in range(1, tree.num_nodes) if ok[tree.parents[i]] and (ok[i] or keep_invalid)]
        return _keep(proposal, keep)

    def bitmask(self, tree: DraftTree) -> torch.Tensor:
        """[N+1, ceil(V / 32)] int32: row i allows what may follow the root -> node i path.

        A row whose node the grammar rejects (a draft model's kept invalid token) is
        never read by the verifier; it is left all-allowed.
        """
        bitmask = llg_numpy.allocate_token_bitmask(tree.num_nodes, self.vocab_size)
        self._walk(tree, fill=bitmask)
        return torch.from_numpy(bitmask)

    def _walk(self, tree: DraftTree, fill: np.ndarray | None) -> list[bool]:
        """Visit every node's matcher state; ok[i]: the grammar accepts the path to node i.
        Leaves the matcher where it started."""
        ok = [True] * tree.num_nodes
        stack: list[int] = [0]  # nodes consumed since the root, the root first
        for i in range(tree.num_nodes):
            path = tree.path_to(i)
            common = 0
            while common < min(len(stack), len(path)) and stack[common] == path[common]:
                common += 1
            self._rollback(len(stack) - common)
            stack = stack[:common]
            for node in path[common:]:
                if self.matcher.try_consume_tokens([tree.tokens[node]]) != 1:
                    break
                stack.append(node)
            ok[i] = stack[-1] == i
            if fill is not None:
                if ok[i]:
                    llg_numpy.fill_next_token_bitmask(self.matcher, fill, i)
                else:
                    fill[i] = -1
        self._rollback(len(stack) - 1)
        return ok

    def _rollback(self, n: int) -> None:
        if n > 0 and not self.matcher.rollback(n):
            raise RuntimeError(f"grammar rollback failed: {self.matcher.get_error()}")


def _keep(proposal: DraftProposal, keep: list[int]) -> DraftProposal:
    """The proposal restricted to drafted nodes ``keep`` (sorted; every kept node's parent kept)."""
    if len(keep) == len(proposal):
        return proposal
    token_ids = [proposal.token_ids[i] for i in keep]
    probs = None if proposal.probs is None else proposal.probs[keep]
    parents = None
    if proposal.parents is not None:
        index = {old + 1: new + 1 for new, old in enumerate(keep)}  # tree node numbers, root = 0
        index[0] = 0
        parents = [index[proposal.parents[i]] for i in keep]
    return DraftProposal(token_ids, parents, probs, proposal.drafter)
