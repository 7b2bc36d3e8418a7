"""FR-Spec drafts (--spec-draft-vocab-size), the draft's prompt tail (--spec-draft-prompt-tail) and its
cached prompt starts: the subset, the restricted head, greedy identity with drafting asserted, and the
4000-sample distribution test with q renormalized over the subset (tokens outside it reached as recovered /
bonus tokens)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from specdec.config import SpecConfig, SpecType
from specdec.datastore import Datastore, tokenizer_identity
from specdec.drafters import cross_vocab
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.frequent_vocab import DraftVocab, frequent_tokens, restrict_draft_vocab, special_ids, store_counts
from specdec.drafters.registry import DraftResources
from specdec.engine import Engine
from specdec.errors import ModelLoadError
from specdec.llm import LLM
from specdec.model.weights import default_model_path
from specdec.runners.base import SeqInput
from specdec.runners.load import load_runner
from tests.test_lossless import REAL_PROMPTS, greedy, run
from tests.test_lossless_sampling import BATCH, MAX_LEN, VOCAB, assert_lossless, build_micro, micro, sample  # noqa: F401


def test_frequent_tokens_worked_example():
    assert frequent_tokens(np.array([5, 0, 9, 1, 3]), 3, keep=[1]).tolist() == [0, 1, 2]
    assert frequent_tokens(np.array([1, 1, 1, 1]), 2).tolist() == [0, 1]  # ties: the lower id
    with pytest.raises(ValueError, match="cannot hold"):
        frequent_tokens(np.array([1, 1, 1]), 1, keep=[0, 2])


def test_expand_puts_minus_infinity_outside_the_subset():
    vocab = DraftVocab(torch.tensor([1, 3]), 5)
    full = vocab.expand(torch.tensor([2.0, -1.0]))
    assert full.tolist() == [float("-inf"), 2.0, float("-inf"), -1.0, float("-inf")]
    q = torch.softmax(full, dim=-1)
    assert q[[0, 2, 4]].sum() == 0 and torch.isclose(q.sum(), torch.tensor(1.0))
    # a sampled draft's q over its own [N] row, spread: the same row as expand's softmax
    assert torch.equal(vocab.spread(torch.softmax(torch.tensor([2.0, -1.0]), dim=-1)), q)


def one_pass(runner, tokens: list[int]) -> torch.Tensor:
    slot = runner.allocate()
    logits = runner.run([SeqInput(slot, tokens, all_logits=False)]).logits[0][-1]
    runner.free(slot)
    return logits


@pytest.mark.parametrize("quantization", [None, "q8_0"])
def test_restricted_head_gives_those_columns(tmp_path, quantization):
    """The restricted head's logits are the full head's at those ids (float: the same rows; a GGUF head
    requantized as Q8_0 rows: close), over the fused kernels and the torch backend."""
    folder = build_micro(tmp_path / "m", seed=3, hidden=64, vocab=VOCAB)
    ids = torch.tensor([0, 2, 5, 7, 11, 30])
    for backend in ("auto", "torch") if quantization is None else ("auto",):
        full, _ = load_runner(str(folder), max_seq_len=MAX_LEN, backend=backend, quantization=quantization)
        small, _ = load_runner(str(folder), max_seq_len=MAX_LEN, backend=backend, quantization=quantization)
        small.restrict_head(ids)
        assert small.vocab_size == 6
        want, got = one_pass(full, [3, 4, 5])[ids], one_pass(small, [3, 4, 5])
        assert got.shape == (6,)
        assert torch.allclose(got, want, atol=1e-4 if quantization is None else 0.05 * want.abs().max()), backend


def test_generic_runner_and_other_tokenizers_are_refused():
    class NoRows:
        vocab_size = 10

    with pytest.raises(ModelLoadError, match="native runner"):
        restrict_draft_vocab(NoRows(), 4, np.ones(10))
    with pytest.raises(ModelLoadError, match="not below"):
        restrict_draft_vocab(NoRows(), 10, np.ones(10))


# -- greedy identity -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), max_model_len=512)


def test_greedy_identity_tiny_target_drafting_for_itself_from_a_subset(tiny, tiny_llama):
    """The target's own weights draft from the tokens its greedy output uses plus a few hundred others:
    drafts are accepted (where the target's argmax is in the subset), the output is plain decoding's."""
    engine = Engine(tiny.runner, draft_n_max=5, plan_drafts=False)
    prompt = list(range(200, 230))
    plain = run(engine, prompt, greedy(40), None).output_ids
    counts = np.zeros(tiny.runner.vocab_size)
    counts[plain[:20]] = 10  # the first half's tokens are in the subset; the rest only by chance
    counts[: 300] += 1
    draft, _ = load_runner(str(tiny_llama), max_seq_len=512)
    vocab = restrict_draft_vocab(draft, 256, counts, keep=tiny.runner.eos_token_ids)
    for tail in (None, 8):
        drafter = DraftModelDrafter(draft, vocab=vocab, prompt_tail=tail)
        seq = run(engine, prompt, greedy(40), drafter)
        assert seq.output_ids == plain
        assert seq.stats.drafted > 0 and seq.stats.accepted > 0, seq.stats
        assert any(t not in set(vocab.ids.tolist()) for t in plain)  # tokens the draft cannot propose


def test_a_datastore_ranks_the_draft_vocabulary(tiny, tiny_llama, tmp_path):
    """--spec-datastore given: its documents (here the model's own answer) rank the tokens, not the corpus."""
    engine = Engine(tiny.runner, draft_n_max=5, plan_drafts=False)
    prompt = [5, 6, 7, 8] * 4
    plain = run(engine, prompt, greedy(32), None).output_ids
    store = Datastore.build([plain * 3], tokenizer_identity(tiny.tokenizer))
    assert store_counts(store, tiny.runner.vocab_size)[plain[0]] >= 3
    store.save(tmp_path / "answers.npz")
    spec = SpecConfig(types=(SpecType.DRAFT_MODEL,), draft_n_max=5, draft_model=str(tiny_llama), draft_vocab_size=64,
                      datastore=str(tmp_path / "answers.npz"))
    resources = DraftResources(spec, tiny.runner, tiny.tokenizer)
    assert set(plain) <= set(resources.state(SpecType.DRAFT_MODEL).vocab.ids.tolist())
    seq = run(engine, prompt, greedy(32), resources.new_drafter())
    assert seq.output_ids == plain and seq.stats.accepted > 0


def test_adaptive_asks_the_reduced_draft_and_retrieval_losslessly(tiny, tiny_llama, tmp_path):
    """`--spec-type adaptive --draft-model M --spec-draft-vocab-size N --spec-datastore S`: the store holds the
    answer's first 16 tokens (retrieval drafts them) and the rest's tokens out of order, ranking the cut head's
    64 tokens; the draft model, drafting for itself from those, drafts the rest. Both members' tokens are
    accepted; the output is plain decoding's."""
    engine = Engine(tiny.runner, draft_n_max=5, plan_drafts=False)
    prompt = list(range(200, 230))
    plain = run(engine, prompt, greedy(40), None).output_ids
    docs = [[*prompt[-4:], *plain[:16]], sorted(plain[16:])]  # the rest's tokens, ranked but out of order
    Datastore.build(docs, tokenizer_identity(tiny.tokenizer)).save(tmp_path / "s.npz")
    spec = SpecConfig(draft_n_max=5, draft_model=str(tiny_llama), draft_vocab_size=64,
                      datastore=str(tmp_path / "s.npz"))
    resources = DraftResources(spec, tiny.runner, tiny.tokenizer)
    drafter = resources.new_drafter()
    drafter.cost = None  # verify what the members propose, whatever this machine's timings
    assert [m.drafter.name for m in drafter.members][-2:] == ["retrieval", "draft-model"]
    assert drafter.members[-1].drafter.vocab is resources.state(SpecType.DRAFT_MODEL).vocab
    seq = run(engine, prompt, greedy(40), drafter)
    assert seq.output_ids == plain
    assert seq.stats.accepted_by.get("retrieval", 0) > 0 and seq.stats.accepted_by.get("draft-model", 0) > 0, \
        seq.stats.accepted_by


def test_prompt_tail_bounds_what_the_draft_reads(tiny, tiny_llama):
    draft, _ = load_runner(str(tiny_llama), max_seq_len=512)
    engine = Engine(tiny.runner, draft_n_max=4, plan_drafts=False)
    prompt = list(range(100, 300))
    drafter = DraftModelDrafter(draft, prompt_tail=16)
    seen = []
    real_run = drafter._run
    drafter._run = lambda tokens: (seen.append(len(tokens)), real_run(tokens))[1]
    seq = run(engine, prompt, greedy(12), drafter)
    assert seq.output_ids == run(engine, prompt, greedy(12), None).output_ids
    assert seen[0] == 16  # the first catch-up: the prompt's last 16 tokens, not 200
    assert drafter.catch_up_seconds([*prompt, *seq.output_ids]) == 0.0


def test_a_first_catch_up_is_priced_before_it_is_paid(tiny_llama):
    """A fresh draft has timed no pass, so its first prompt's catch-up would read as free: it times a 1- and a
    32-token pass on its slot first (their cache entries dropped), and prices the prompt and a drafted token
    from them."""
    draft, _ = load_runner(str(tiny_llama), max_seq_len=512)
    drafter = DraftModelDrafter(draft)
    drafter.begin(list(range(100, 300)), greedy(4))
    assert not draft.pass_cost.measured
    assert drafter.token_seconds() is None  # nothing timed yet
    assert drafter.catch_up_seconds(list(range(100, 300))) > 0.0
    assert draft.pass_cost.measured and draft.lengths[drafter.slot] == 0 and drafter.cached == []
    assert drafter.token_seconds() == draft.pass_cost.estimate(1) > 0.0  # a drafted token: its 1-token pass


def test_a_freed_draft_slot_serves_the_next_prompt_that_starts_the_same(tiny, tiny_llama):
    """The draft's slot is freed as the target's: over quantized blocks it keeps its tokens, and a second turn
    catches up on its new tokens only (priced free: within a step's catch-up), drafting the same bits as cold."""
    draft, _ = load_runner(str(tiny_llama), max_seq_len=512, quantization="q8_0")
    assert draft.keeps_prefixes
    engine = Engine(tiny.runner, draft_n_max=4, plan_drafts=False)
    prompt = list(range(100, 160))

    def second_turn(first: list[int]):
        drafter = DraftModelDrafter(draft)
        seen = []
        real_run = drafter._run
        drafter._run = lambda tokens: (seen.append(len(tokens)), real_run(tokens))[1]
        turn = [*first, 7, 8, 9]
        drafter.begin(turn, greedy(12))
        priced = drafter.catch_up_seconds(turn)
        drafter.end(turn)
        seq = run(engine, turn, greedy(12), drafter)
        return seq, seen[0], priced

    first = run(engine, prompt, greedy(12), DraftModelDrafter(draft))
    first_turn = [*prompt, *first.output_ids]
    warm, warm_read, warm_price = second_turn(first_turn)
    draft.forget_prefixes()
    cold, cold_read, cold_price = second_turn(first_turn)
    assert cold_read == len(first_turn) + 3 and cold_price > 0.0  # the whole conversation
    assert warm_read < 12 and warm_price == 0.0  # what turn 1 left uncached, and the new tokens
    assert warm.output_ids == cold.output_ids == run(engine, first_turn + [7, 8, 9], greedy(12), None).output_ids
    assert warm.stats.accepted_by == cold.stats.accepted_by and cold.stats.accepted_by.get("draft-model", 0) > 0


@pytest.fixture(scope="module")
def smol() -> LLM:
    return LLM(None, max_model_len=1024)


def test_greedy_identity_default_model_with_a_reduced_draft_head(smol, monkeypatch):
    """SmolLM2 drafting for itself from its 8192 most frequent tokens (counted on Python's help text here:
    the offline corpus's cheap part), through the registry as --spec-draft-vocab-size builds it; the GGUF
    head's rows run as Q8_0 rows."""
    from specdec.corpus import corpus_documents

    def pydoc_counts(tokenizer, vocab_size):
        docs = corpus_documents(tokenizer, ("pydoc",), 300_000)
        return np.bincount(np.concatenate(docs), minlength=vocab_size)[:vocab_size]

    monkeypatch.setattr(cross_vocab, "vocab_counts", pydoc_counts)
    spec = SpecConfig(types=(SpecType.DRAFT_MODEL,), draft_n_max=6, draft_model=str(default_model_path()),
                      draft_vocab_size=8192, draft_prompt_tail=64)
    resources = DraftResources(spec, smol.runner, smol.tokenizer)
    draft = resources.state(SpecType.DRAFT_MODEL)
    assert draft.runner.vocab_size == 8192 and draft.vocab.size == smol.runner.vocab_size
    assert special_ids(smol.tokenizer, smol.runner.eos_token_ids) <= set(draft.vocab.ids.tolist())
    engine = Engine(smol.runner, draft_n_max=4, plan_drafts=False)
    prompt = smol.chat_prompt([{"role": "user", "content": REAL_PROMPTS["open"]}])
    plain = run(engine, prompt, greedy(16), None).output_ids
    seq = run(engine, prompt, greedy(16), resources.new_drafter())
    assert seq.output_ids == plain
    assert seq.stats.drafted > 0 and seq.stats.accepted > seq.stats.drafted // 3, seq.stats
    with pytest.raises(ModelLoadError, match="target's tokenizer"):
        cross_vocab.draft_vocab_for(spec, draft.runner, None, smol.runner, None)


# -- sampling: the exact distribution, q renormalized over the subset ---------------------------------


def test_reduced_vocabulary_draft_keeps_the_distribution(micro, tmp_path):  # noqa: F811
    """The micro draft restricted to the 12 tokens the target's 5-token outputs use most (of 32): q is zero on
    the other 20, which the target still samples (as recovered or bonus tokens)."""
    folder = build_micro(tmp_path / "draft", seed=0, head_scale=0.5)
    draft, _ = load_runner(str(folder), max_seq_len=MAX_LEN, num_slots=BATCH, backend="torch")
    usage = Counter()
    for out, p in micro.dist().items():
        for t in out:
            usage[t] += p
    counts = np.array([usage[t] for t in range(VOCAB)])
    vocab = restrict_draft_vocab(draft, 12, counts)
    s = sample(micro, lambda: DraftModelDrafter(draft, vocab=vocab))
    assert_lossless(s, micro.dist())
    outside = set(range(VOCAB)) - set(vocab.ids.tolist())
    assert sum(n for out, n in s.counts.items() if outside & set(out)) > 100  # the target's own tokens
