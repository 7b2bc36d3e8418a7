"""History processors on hand-made logits: each verify row sees the committed tokens plus its drafted path."""

from __future__ import annotations

import pytest
import torch

from specdec.config import SamplingParams
from specdec.processors import HistoryProcessor, SequenceProcessors
from specdec.tree import DraftTree

V = 10
PROMPT = [7, 8]


def processor(**kw) -> HistoryProcessor:
    return HistoryProcessor(SamplingParams(**kw), PROMPT, V, eos_token_ids=(0,), bad_words_ids=kw.pop("bad", ()))


def one_row(proc: HistoryProcessor, logits: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """Plain decoding's view: a tree of the root alone."""
    out = logits.clone()[None]
    proc.apply(out, DraftTree.chain(tokens[-1], []), tokens)
    return out[0]


def test_frequency_and_presence_count_the_drafted_path():
    proc = processor(frequency_penalty=0.5, presence_penalty=0.25)
    proc.advance([3])  # output so far: [3] (the root)
    logits = torch.zeros(3, V)
    proc.apply(logits, DraftTree.chain(3, [4, 3]), [*PROMPT, 3])
    assert logits[0, 3] == -0.75 and logits[0, 4] == 0  # row 0: output [3]
    assert logits[1, 3] == -0.75 and logits[1, 4] == -0.75  # row 1: [3, 4]
    assert logits[2, 3] == -1.25 and logits[2, 4] == -0.75  # row 2: [3, 4, 3]
    assert logits[:, PROMPT].eq(0).all()  # the prompt is not output


def test_repetition_penalty_covers_prompt_and_output_by_sign():
    proc = processor(repetition_penalty=2.0)
    logits = torch.tensor([[1.0, -1.0, 4.0, 0, 0, 0, 0, 6.0, -6.0, 3.0], [1.0] * V])
    proc.advance([9])  # the root is output
    proc.apply(logits, DraftTree.chain(9, [2]), [*PROMPT, 9])
    assert logits[0].tolist() == [1.0, -1.0, 4.0, 0, 0, 0, 0, 3.0, -12.0, 1.5]
    assert logits[1, 2] == 0.5 and logits[1, 0] == 1.0  # row 1 has seen the drafted 2


def test_tree_branches_have_their_own_history():
    proc = processor(frequency_penalty=1.0)
    tree = DraftTree([5, 1, 2], [-1, 0, 0])  # two children of the root: 1 and 2
    logits = torch.zeros(3, V)
    proc.apply(logits, tree, [*PROMPT, 5])
    assert logits[1, 1] == -1 and logits[1, 2] == 0
    assert logits[2, 2] == -1 and logits[2, 1] == 0


def test_min_tokens_bans_eos_until_reached_along_the_draft():
    proc = processor(min_tokens=2)
    logits = torch.zeros(3, V)
    proc.apply(logits, DraftTree.chain(8, [4, 5]), list(PROMPT))  # no output yet: rows predict outputs 0, 1, 2
    assert torch.isneginf(logits[:2, 0]).all() and logits[2, 0] == 0


def test_bad_words_ban_the_last_token_after_their_prefix():
    proc = HistoryProcessor(SamplingParams(bad_words=("x",)), PROMPT, V, (0,), bad_words_ids=[(3, 4), (6,)])
    logits = torch.zeros(3, V)
    proc.advance([1])
    proc.apply(logits, DraftTree.chain(1, [3, 5]), [*PROMPT, 1])
    assert torch.isneginf(logits[:, 6]).all()  # a one-token word: always
    assert logits[0, 4] == 0 and torch.isneginf(logits[1, 4]) and logits[2, 4] == 0  # only right after 3


def test_logit_bias_and_bad_vocabulary():
    proc = processor(logit_bias={2: 5.0, 9: -100})
    logits = torch.zeros(2, V)
    proc.apply(logits, DraftTree.chain(1, [1]), [*PROMPT, 1])
    assert logits[:, 2].eq(5).all() and logits[:, 9].eq(-100).all()
    with pytest.raises(ValueError, match="logit_bias"):
        processor(logit_bias={V: 1.0})


@pytest.mark.parametrize("kw", [dict(frequency_penalty=0.7, presence_penalty=-0.4, repetition_penalty=1.3,
                                     logit_bias={4: 1.5}, min_tokens=3)])
def test_each_row_equals_plain_processing_after_its_path(kw):
    """The losslessness argument in miniature: row i == one plain step after committing the path to i."""
    torch.manual_seed(0)
    tree = DraftTree([5, 4, 4, 9, 4], [-1, 0, 1, 0, 3])
    logits = torch.randn(tree.num_nodes, V)
    spec = processor(**kw)
    spec.advance([5])
    batched = logits.clone()
    spec.apply(batched, tree, [*PROMPT, 5])
    for i in range(tree.num_nodes):
        plain = processor(**kw)
        path = [tree.tokens[n] for n in tree.path_to(i)[1:]]
        plain.advance([5, *path])
        assert torch.equal(batched[i], one_row(plain, logits[i], [*PROMPT, 5, *path]))


def test_sequence_processors_without_grammar_pass_drafts_through():
    procs = SequenceProcessors(processor(frequency_penalty=1.0))
    from specdec.drafters.base import DraftProposal

    proposal = DraftProposal([1, 2, 3])
    assert procs.cut(proposal) is proposal
    assert procs.advance([1, 2]) == 2 and not procs.finished
