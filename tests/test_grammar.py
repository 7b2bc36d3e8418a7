"""Structured output: grammar compilation errors, draft cutting, per-row masks with rollback, and
outputs that parse, with and without speculation (greedy identical)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from specdec.config import SamplingParams, SpecType, StructuredKind, StructuredOutput
from specdec.drafters.base import Drafter, DraftProposal
from specdec.engine import Engine, SequenceState
from specdec.grammar import GrammarError
from specdec.llm import LLM
from specdec.tree import DraftTree
from tests.test_lossless import drafter_for

REGEX = StructuredOutput(StructuredKind.REGEX, r"(ab|cd){1,8}x")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "n": {"type": "integer"}}, "required": ["name", "n"]}


@pytest.fixture(scope="module")
def tiny(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), max_model_len=512)


def ids(llm: LLM, text: str) -> list[int]:
    return llm.tokenizer(text, add_special_tokens=False).input_ids


@pytest.mark.parametrize("kind,spec,message", [
    (StructuredKind.JSON_SCHEMA, '{"type": "object", "properties": 5}', "properties"),
    (StructuredKind.JSON_SCHEMA, "{not json", "invalid JSON"),
    (StructuredKind.REGEX, "a((", "unclosed group"),
    (StructuredKind.GRAMMAR, "start: missing_rule", "unknown name"),
    (StructuredKind.CHOICE, "[]", "non-empty"),
])
def test_bad_specs_raise_grammar_error(tiny, kind, spec, message):
    with pytest.raises(GrammarError, match=message):
        tiny.grammars.matcher(StructuredOutput(kind, spec))


def test_cut_chain_drops_the_invalid_token_unless_it_carries_q(tiny):
    m = tiny.grammars.matcher(REGEX)
    good, bad = ids(tiny, "abcd"), ids(tiny, "Z")
    assert m.cut(DraftProposal([*good, *bad, *good])).token_ids == good
    q = torch.full((len(good) + 2, tiny.runner.vocab_size), 1.0 / tiny.runner.vocab_size)
    with_q = m.cut(DraftProposal([*good, *bad, good[0]], probs=q))
    assert with_q.token_ids == [*good, *bad] and with_q.probs.shape[0] == len(good) + 1  # rejected by the verifier


def test_cut_tree_keeps_valid_branches(tiny):
    m = tiny.grammars.matcher(REGEX)
    ab, cd, z = ids(tiny, "ab")[0], ids(tiny, "cd")[0], ids(tiny, "Z")[0]
    # root -> ab -> cd, root -> Z -> ab, root -> cd
    cut = m.cut(DraftProposal([ab, cd, z, ab, cd], [0, 1, 0, 3, 0]))
    assert cut.token_ids == [ab, cd, cd] and cut.parents == [0, 1, 0]


def test_bitmask_rows_equal_step_by_step_masks_and_roll_back(tiny):
    m = tiny.grammars.matcher(StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(SCHEMA)))
    m.advance(ids(tiny, '{"name": "'))
    a, b, c = ids(tiny, "bob")[0], ids(tiny, '"')[0], ids(tiny, "x")[0]
    tree = DraftTree([0, a, b, c], [-1, 0, 1, 0])  # two branches from the root
    before = m.bitmask(DraftTree.chain(0, []))
    rows = m.bitmask(tree)
    assert torch.equal(m.bitmask(DraftTree.chain(0, [])), before)  # the matcher is back where it was
    for node in range(tree.num_nodes):
        fresh = tiny.grammars.matcher(StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(SCHEMA)))
        fresh.advance([*ids(tiny, '{"name": "'), *(tree.tokens[n] for n in tree.path_to(node)[1:])])
        assert torch.equal(rows[node], fresh.bitmask(DraftTree.chain(0, []))[0]), node


class InvalidTailDrafter(Drafter):
    """Proposes the reference continuation with a token the grammar rejects at ``wrong_at``."""

    name = "invalid-tail"

    def __init__(self, reference: list[int], prompt_len: int, wrong_at: int, bad: int) -> None:
        self.reference, self.prompt_len, self.wrong_at, self.bad = reference, prompt_len, wrong_at, bad
        self.proposed = 0

    def propose(self, context, max_tokens):
        done = len(context) - self.prompt_len
        draft = list(self.reference[done : done + max_tokens])
        if self.wrong_at < len(draft):
            draft[self.wrong_at] = self.bad
            draft.extend(self.reference[done + max_tokens : done + max_tokens + 1])
            draft = draft[:max_tokens]
        self.proposed += len(draft)
        return DraftProposal(draft)


def generate(llm: LLM, prompt: list[int], params: SamplingParams, drafter: Drafter | None, k: int = 6) -> SequenceState:
    seq = SequenceState(prompt, params, drafter=drafter, processors=llm.processors(prompt, params))
    for _ in Engine(llm.runner, draft_n_max=k, plan_drafts=False).generate(seq):  # always draft: cuts are tested
        pass
    return seq


def test_drafts_the_grammar_rejects_are_cut_and_rolled_back(tiny):
    params = SamplingParams(max_new_tokens=40, structured=REGEX)
    prompt = ids(tiny, "abab cd")
    plain = generate(tiny, prompt, params, None)
    assert re.fullmatch(r"(ab|cd){1,8}x", tiny.tokenizer.decode(plain.output_ids))
    assert plain.finish_reason == "stop"
    for wrong_at in (0, 1, 3):
        drafter = InvalidTailDrafter(plain.output_ids, len(prompt), wrong_at, ids(tiny, "Z")[0])
        seq = generate(tiny, prompt, params, drafter)
        assert seq.output_ids == plain.output_ids
        assert seq.stats.drafted < drafter.proposed  # cut before the pass, not rejected in it
        assert wrong_at == 0 or seq.stats.accepted > 0


CASES = {
    "regex": (StructuredOutput(StructuredKind.REGEX, r"[a-z]{2,6}( [a-z]{2,6}){2,5}\."),
              lambda text: re.fullmatch(r"[a-z]{2,6}( [a-z]{2,6}){2,5}\.", text)),
    "choice": (StructuredOutput(StructuredKind.CHOICE, '["red", "green", "blue"]'),
               lambda text: text in ("red", "green", "blue")),
    "json": (StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(SCHEMA)),
             lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None),
    "json_object": (StructuredOutput(StructuredKind.JSON_OBJECT),
                    lambda text: isinstance(json.loads(text), dict)),
    "gbnf": (StructuredOutput(StructuredKind.GRAMMAR, 'root ::= "yes" | "no" | "maybe " [0-9]'),
             lambda text: re.fullmatch(r"yes|no|maybe [0-9]", text)),
}


BOUNDED = ("regex", "choice", "gbnf")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", [None, SpecType.NGRAM, SpecType.SUFFIX, SpecType.DRAFT_MODEL])
def test_output_follows_the_grammar_with_and_without_speculation(tiny, tiny_llama, case, kind):
    structured, check = CASES[case]
    prompt = ids(tiny, 'Answer: {"name": "ab", "n": 1} red green blue yes no')
    drafter = None if kind is None else drafter_for(tiny, kind, 6, str(tiny_llama) if kind is SpecType.DRAFT_MODEL
                                                     else None)
    greedy = generate(tiny, prompt, SamplingParams(max_new_tokens=60, structured=structured), drafter)
    plain = generate(tiny, prompt, SamplingParams(max_new_tokens=60, structured=structured), None)
    assert greedy.output_ids == plain.output_ids
    assert greedy.finish_reason == "stop", "the grammar must complete within 60 tokens"
    assert check(tiny.tokenizer.decode(greedy.output_ids, skip_special_tokens=True))
    drafter = None if kind is None else drafter_for(tiny, kind, 6, str(tiny_llama) if kind is SpecType.DRAFT_MODEL
                                                     else None)
    sampled = generate(tiny, prompt, SamplingParams(max_new_tokens=60, temperature=1.0, seed=3,
                                                    structured=structured), drafter)
    # Every sampled token is one the grammar allows, finished or not; a finished one passes the check.
    # The bounded grammars (at most 41 characters) must finish in 60 tokens; JSON may go on (extra keys).
    matcher = tiny.grammars.matcher(structured)
    assert matcher.advance(sampled.output_ids) == len(sampled.output_ids)
    if case in BOUNDED or sampled.finish_reason == "stop":
        assert sampled.finish_reason == "stop", sampled.output_ids
        assert matcher.finished and check(tiny.tokenizer.decode(sampled.output_ids, skip_special_tokens=True))
    else:
        assert sampled.finish_reason == "length" and len(sampled.output_ids) == 60


def test_min_tokens_yields_to_a_complete_grammar(tiny):
    params = SamplingParams(max_new_tokens=20, min_tokens=15, structured=StructuredOutput(StructuredKind.CHOICE,
                                                                                          '["ok"]'))
    seq = generate(tiny, ids(tiny, "say ok"), params, None)
    assert tiny.tokenizer.decode(seq.output_ids) == "ok" and seq.finish_reason == "stop"
