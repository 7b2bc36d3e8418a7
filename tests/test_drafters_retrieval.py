"""retrieval (REST): the match and the trie on hand-made stores; lossless greedy on a tiny model and the
default model, and the 4000-sample distribution test, drafting asserted; bad setups as one line."""

from __future__ import annotations

import os

import pytest

from specdec.cli.main import main
from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.datastore import Datastore, DatastoreError, TokenizerIdentity, tokenizer_identity
from specdec.drafters.registry import DraftResources
from specdec.drafters.retrieval import Match, RetrievalDrafter, continuation_trie, load_datastore, longest_match
from specdec.engine import Engine, SequenceState
from specdec.llm import LLM
from tests.test_lossless import REAL_PROMPTS, greedy, run
from tests.test_lossless_sampling import N_SAMPLES, PARAMS, PROMPT, VOCAB, assert_lossless, lookup, micro, sample  # noqa: F401

A, B, C, D, E, F, X = 1, 2, 3, 4, 5, 6, 7
IDENTITY = TokenizerIdentity(100, "test")


@pytest.fixture
def abcd() -> Datastore:
    """continuation_trie's worked example: [a, b] followed by "c d", "c d", "c e", "f"."""
    return Datastore.build([[A, B, C, D], [A, B, C, D], [A, B, C, E], [A, B, F]], IDENTITY)


def test_longest_match_worked_example(abcd):
    match = longest_match(abcd, [X, A, B], min_match=2, max_match=16)
    assert (match.length, match.count) == (2, 4)
    assert longest_match(abcd, [X, A, B, C], 2, 16).length == 3  # [a, b, c] occurs too
    assert longest_match(abcd, [X, B], 2, 16) is None  # [x, b] never occurs, and 1 < min match
    assert longest_match(abcd, [X, B], 1, 16).length == 1


def test_continuation_trie_worked_example(abcd):
    match = longest_match(abcd, [X, A, B], 2, 16)
    assert continuation_trie(abcd, match, 3, 0.2, 16) == ([C, D, F], [0, 1, 0])
    assert continuation_trie(abcd, match, 4, 0.2, 16) == ([C, D, F, E], [0, 1, 0, 1])
    assert continuation_trie(abcd, match, 8, 0.3, 16) == ([C, D], [0, 1])
    assert continuation_trie(abcd, match, 8, 0.0, 1) == ([C, F], [0, 0])  # max depth 1


def test_drafter_proposes_a_tree_or_a_chain(abcd):
    tree = RetrievalDrafter(abcd).propose([X, A, B], 4)
    assert (tree.token_ids, tree.parents) == ([C, D, F, E], [0, 1, 0, 1])
    chain = RetrievalDrafter(abcd, tree=False).propose([X, A, B], 4)
    assert chain.token_ids == [C, D] and chain.is_chain  # c (3/4) then d (2/4); then the end
    assert len(RetrievalDrafter(abcd).propose([X, X], 4)) == 0
    assert len(RetrievalDrafter(abcd).propose([A, B], 0)) == 0
    assert Match(2, 5, 9).count == 4
    with pytest.raises(ValueError, match="min match"):
        RetrievalDrafter(abcd, min_match=0)


def store_file(tmp_path, docs, identity=IDENTITY, name="ds.npz") -> str:
    path = tmp_path / name
    Datastore.build(docs, identity).save(path)
    return str(path)


def test_registry_loads_the_store_and_refuses_bad_ones(tiny, tmp_path):
    with pytest.raises(ValueError, match="needs --spec-datastore"):
        SpecConfig(types=(SpecType.RETRIEVAL,))
    spec = SpecConfig(types=(SpecType.RETRIEVAL,), datastore=str(tmp_path / "missing.npz"))
    with pytest.raises(DatastoreError, match="no such file"):
        DraftResources(spec, tiny.runner, tiny.tokenizer)
    other = store_file(tmp_path, [[5, 6, 7]], TokenizerIdentity(49152, "another"))
    with pytest.raises(DatastoreError, match="another tokenizer"):
        DraftResources(SpecConfig(types=(SpecType.RETRIEVAL,), datastore=other), tiny.runner, tiny.tokenizer)
    mine = store_file(tmp_path, [[5, 6, 7]], tokenizer_identity(tiny.tokenizer), "mine.npz")
    resources = DraftResources(SpecConfig(types=(SpecType.RETRIEVAL,), datastore=mine), tiny.runner, tiny.tokenizer)
    drafter = resources.new_drafter()
    assert isinstance(drafter, RetrievalDrafter) and drafter.tree  # the native runner verifies trees
    assert drafter.propose([9, 5, 6], 4).token_ids == [7]


def test_a_store_is_read_once_while_its_file_is_unchanged(tiny, tmp_path):
    """Retrieval and --spec-draft-vocab-size both load --spec-datastore: one read serves both, and a
    rebuilt file is read again."""
    path = store_file(tmp_path, [[5, 6, 7]], tokenizer_identity(tiny.tokenizer))
    first = load_datastore(path, tiny.runner, tiny.tokenizer)
    assert load_datastore(path, tiny.runner, tiny.tokenizer) is first
    os.remove(path)
    store_file(tmp_path, [[5, 6, 8, 9]], tokenizer_identity(tiny.tokenizer))
    assert load_datastore(path, tiny.runner, tiny.tokenizer).num_tokens != first.num_tokens


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["generate", "hi", "--spec-type", "retrieval"]) == 2
    assert "--spec-datastore" in capsys.readouterr().err
    bad = tmp_path / "bad.npz"
    bad.write_text("junk")
    assert main(["generate", "hi", "--max-new-tokens", "2", "--spec-type", "retrieval",
                 "--spec-datastore", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("specdec: error: --spec-datastore") and "not a specdec datastore" in err[-1]


# -- greedy identity -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), max_model_len=512)


def test_greedy_identity_on_a_tiny_model(tiny, tmp_path):
    """The store holds the model's own greedy continuation (and noise): drafts are accepted, output unchanged."""
    engine = Engine(tiny.runner, draft_n_max=6, plan_drafts=False)
    prompts = [list(range(200, 230)), [5, 6, 7, 8] * 4, [9, 10, 11]]
    plain = [run(engine, p, greedy(32), None).output_ids for p in prompts]
    docs = [[*p[-4:], *out] for p, out in zip(prompts, plain, strict=True)]
    docs += [[*p[-3:], *reversed(out)] for p, out in zip(prompts, plain, strict=True)]  # wrong branches
    path = store_file(tmp_path, docs, tokenizer_identity(tiny.tokenizer))
    resources = DraftResources(SpecConfig(types=(SpecType.RETRIEVAL,), draft_n_max=6, datastore=path),
                               tiny.runner, tiny.tokenizer)
    for prompt, ref in zip(prompts, plain, strict=True):
        seq = run(engine, prompt, greedy(32), resources.new_drafter())
        assert seq.output_ids == ref
        assert seq.stats.drafted > 0 and seq.stats.accepted > 0, seq.stats


def test_adaptive_with_a_store_drafts_from_it_losslessly(tiny, tmp_path):
    """--spec-datastore makes retrieval an adaptive member (the default type): on prompts the look-up
    members find nothing in, its tokens are drafted and accepted, and the output is plain decoding's."""
    engine = Engine(tiny.runner, draft_n_max=6, plan_drafts=False)
    prompts = [list(range(200, 230)), list(range(300, 320))]
    plain = [run(engine, p, greedy(32), None).output_ids for p in prompts]
    docs = [[*p[-4:], *out] for p, out in zip(prompts, plain, strict=True)]
    path = store_file(tmp_path, docs, tokenizer_identity(tiny.tokenizer))
    resources = DraftResources(SpecConfig(draft_n_max=6, datastore=path), tiny.runner, tiny.tokenizer)
    for prompt, ref in zip(prompts, plain, strict=True):
        drafter = resources.new_drafter()
        drafter.cost = None  # verify what the members propose, whatever this machine's timings
        member = next(m for m in drafter.members if m.drafter.name == "retrieval")
        seq = run(engine, prompt, greedy(32), drafter)
        assert seq.output_ids == ref
        assert seq.stats.accepted_by.get("retrieval", 0) > 0, seq.stats.accepted_by
        assert member.lookup and member.draft_seconds > 0  # priced by its measured drafting time


@pytest.fixture(scope="module")
def smol() -> LLM:
    return LLM(None, max_model_len=1024)


def test_greedy_identity_on_the_default_model(smol, tmp_path):
    """A store of Python's help text plus the model's answers to two of the prompts (its "own answers"
    source): every prompt's output equals plain decoding; the answered ones draft and accept."""
    from specdec.corpus import corpus_documents

    engine = Engine(smol.runner, draft_n_max=8, plan_drafts=False)
    prompts = {name: smol.chat_prompt([{"role": "user", "content": REAL_PROMPTS[name]}])
               for name in ("repetitive", "open", "code-edit")}
    plain = {name: run(engine, p, greedy(24), None).output_ids for name, p in prompts.items()}
    docs = corpus_documents(smol.tokenizer, ("pydoc",), 200_000)
    docs += [plain["open"], plain["code-edit"]]
    path = store_file(tmp_path, docs, tokenizer_identity(smol.tokenizer))
    resources = DraftResources(SpecConfig(types=(SpecType.RETRIEVAL,), draft_n_max=8, datastore=path),
                               smol.runner, smol.tokenizer)
    accepted = {}
    for name, prompt in prompts.items():
        seq = run(engine, prompt, greedy(24), resources.new_drafter())
        assert seq.output_ids == plain[name], f"retrieval diverged on {name}"
        accepted[name] = (seq.stats.drafted, seq.stats.accepted)
    assert all(d > 0 and a > 0 for d, a in (accepted["open"], accepted["code-edit"])), accepted


# -- sampling: the exact distribution ----------------------------------------------------------------


def test_retrieval_keeps_the_distribution(micro, lookup, tmp_path):  # noqa: F811
    """The look-up prompt's chain in the store, with wrong turns beside it: 4000 samples of 5 tokens,
    the store shared by every sequence as a server's requests share it."""
    prompt = list(lookup.prompt)
    chain = prompt[1:7]  # the target's greedy chain from token 3
    wrong = [*chain[:2], (chain[2] + 1) % VOCAB, *chain[3:]]
    docs = [[3, *chain, 3, *chain], [3, *wrong], [3, *reversed(chain)]]
    path = store_file(tmp_path, docs, TokenizerIdentity(VOCAB, "micro"))
    resources = DraftResources(SpecConfig(types=(SpecType.RETRIEVAL,), draft_n_max=4, datastore=path),
                               micro.target, None)
    s = sample(micro, resources.new_drafter, lookup)
    assert_lossless(s, micro.dist(lookup), deep=False)


def test_adaptive_with_a_retrieval_member_keeps_the_distribution(micro, tmp_path):  # noqa: F811
    """Adaptive's default members plus retrieval (--spec-datastore), never switched off: on the plain
    prompt, where the look-up members find nothing at first, retrieval's trie is what is verified."""
    probe = SequenceState(list(PROMPT), SamplingParams(max_new_tokens=6, ignore_eos=True))
    Engine(micro.target).run_batch([probe])
    chain = probe.output_ids  # the target's greedy chain after the prompt
    wrong = [chain[0], (chain[1] + 1) % VOCAB, *chain[2:]]
    docs = [[*PROMPT[-2:], *chain], [*PROMPT[-2:], *wrong], [*PROMPT[-2:], *reversed(chain)]]
    path = store_file(tmp_path, docs, TokenizerIdentity(VOCAB, "micro"))
    resources = DraftResources(SpecConfig(draft_n_max=4, datastore=path, min_acceptance=0.0), micro.target, None)

    def make():
        drafter = resources.new_drafter()
        drafter.cost = None  # verify what the members propose, whatever the timings
        return drafter

    first = make()
    first.begin(list(PROMPT), PARAMS)
    assert first.propose(list(PROMPT), 4).drafter == "retrieval"
    s = sample(micro, make)
    assert_lossless(s, micro.dist(), deep=False, min_drafted=N_SAMPLES // 2)
