"""A draft model with another tokenizer (drafters/cross_vocab.py): TLI and SLEM stay lossless.

Micro models with small, different tokenizers (tests/cross_vocab_models.py): the vocabulary map,
the seams of re-tokenizing, greedy identity through ``LLM`` (drafts proposed and accepted), and
the exact distribution of 5-token outputs under sampling with the harness of
tests/test_lossless_sampling.py (4000 samples, the broken verifier caught).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

import specdec.verify as verify_mod
from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.drafters.cross_vocab import CrossVocab, CrossVocabDrafter, MethodScores
from specdec.drafters.registry import DraftResources
from specdec.drafters.retokenize import DraftContext, TokenizerPair
from specdec.drafters.vocab_map import VocabMap
from specdec.errors import ModelLoadError
from specdec.llm import LLM
from specdec.runners.load import load_runner
from specdec.text import load_tokenizer
from tests.cross_vocab_models import DRAFT_VOCAB, TARGET_SPECIALS, TARGET_VOCAB, build_pair
from tests.test_lossless import chi2_pvalue
from tests.test_lossless_sampling import (
    ALPHA,
    BATCH,
    DraftQ,
    Micro,
    assert_lossless,
    assert_speculated,
    build_micro,
    sample,
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    return build_pair(tmp_path_factory.mktemp("cross"), build_micro)


@pytest.fixture(scope="module")
def tokenizers(folders):
    return load_tokenizer(folders[0]), load_tokenizer(folders[1])


@pytest.fixture(scope="module")
def cross_micro(folders, tokenizers):
    """The target and its draft loaded for the sampling harness, with the vocabulary map."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    target = load_runner(str(folders[0]), max_seq_len=16, num_slots=BATCH, backend="torch")[0]
    draft = load_runner(str(folders[1]), max_seq_len=64, num_slots=BATCH, backend="torch")[0]
    vocab = VocabMap.build(*tokenizers, TARGET_VOCAB, DRAFT_VOCAB)
    yield Micro(target, draft, {}, DraftQ(draft)), TokenizerPair(*tokenizers), vocab
    torch.set_num_threads(threads)


# -- the vocabulary map and the seams ------------------------------------------------------------


def test_vocabulary_map_matches_twins_across_space_markers(tokenizers):
    target, draft = tokenizers
    vocab = VocabMap.build(target, draft, TARGET_VOCAB, DRAFT_VOCAB)
    d2t = vocab.draft_to_target.tolist()
    for text in ("ab", " a", " ab", "abc", "h"):  # Ġ on one side, ▁ on the other
        assert d2t[draft.convert_tokens_to_ids(text.replace(" ", "▁"))] == \
            target.convert_tokens_to_ids(text.replace(" ", "Ġ"))
    for text in ("bc", "bcd", "<eos>", "<bos>"):  # the draft's own merges, its own specials
        assert d2t[draft.convert_tokens_to_ids(text)] == -1
    assert d2t[draft.convert_tokens_to_ids("<|endoftext|>")] == target.convert_tokens_to_ids("<|endoftext|>")
    assert vocab.num_mapped == 22 and vocab.summary() == \
        "draft vocabulary: 22 of 32 tokens (69%) map to the target's"


def test_draft_context_equals_encoding_the_whole_text(tokenizers):
    """Kept up token by token, the draft's ids are the draft's encoding of the whole text, also
    where new tokens re-split the old end (look-behind) and at unknown characters (special tokens
    the draft lacks)."""
    target, draft = tokenizers
    pair, rng = TokenizerPair(target, draft), random.Random(0)
    resplit = 0
    for _ in range(200):
        ids = [rng.randrange(TARGET_VOCAB) for _ in range(12)]
        mirror = DraftContext(pair)
        before = []
        for i in range(1, len(ids) + 1):
            out = mirror.update(ids[:i])
            resplit += out[: len(before)] != before
            before = out
        assert out == draft(target.decode(ids), add_special_tokens=False).input_ids
    assert resplit > 50  # the seams were exercised: new text changed how old text splits


def test_target_continuation_cuts_the_unstable_last_token(tokenizers):
    target, draft = tokenizers
    pair = TokenizerPair(target, draft)
    enc = lambda text: target(text, add_special_tokens=False).input_ids
    # "ab" + " abcd ef": the committed "ab" re-encodes unchanged, so the rest is the target's own
    # split, less its last token ("ef" could grow with what follows)
    assert pair.target_continuation(enc("ab"), " abcd ef") == enc("ab abcd ")[1:]
    # "ab a" + "bcd": " a" (one token) splits as " ", "ab" in "ab abcd", so the draft's text is encoded alone
    assert enc("ab abcd")[:2] != enc("ab a")
    assert pair.target_continuation(enc("ab a"), "bcd ef") == enc("bcd ")
    assert pair.target_continuation(enc("ab"), "b</s>cc") == enc("b")  # cut before a special token
    # the last token kept when it is the twin of the draft's last one (both tokenizers end a token there)
    whole = enc("ab abcd ef")
    assert pair.target_continuation(enc("ab"), " abcd ef", last_twin=whole[-1]) == whole[1:]


def test_slem_runs_no_pass_past_a_twin(cross_micro):
    """SLEM drafts until its text re-encodes to enough target tokens, and keeps a last token that is the
    twin of the draft's last one: an n-token draft whose tokens have twins costs the catch-up and n - 1
    passes (with every last token cut, n passes: one for a draft token that is only looked at)."""
    micro, pair, vocab = cross_micro
    drafter = CrossVocabDrafter(micro.draft, CrossVocab(pair, vocab, "slem", MethodScores()))
    runs: list[list[int]] = []
    run = drafter._run
    drafter._run = lambda tokens: runs.append(tokens) or run(tokens)
    rng, full = random.Random(1), {1: 0, 3: 0}
    for _ in range(40):
        prompt = [rng.randrange(len(TARGET_SPECIALS), TARGET_VOCAB) for _ in range(5)]
        n = rng.choice((1, 3))
        drafter.begin(prompt, SamplingParams())
        runs.clear()
        proposal = drafter.propose(prompt, n)
        drafter.end(prompt)
        if len(proposal) == n:
            assert len(runs) <= n, (n, proposal.token_ids, runs)
            full[n] += 1
    assert min(full.values()) >= 10, full


# -- greedy identity through LLM --------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm(folders) -> LLM:
    # plan_drafts=False: every step drafts its budget, whatever the measured pass costs say on a busy
    # machine (the adaptive test accepted nothing under a loaded suite: a timing-dependent check)
    return LLM(str(folders[0]), max_model_len=64, spec="none", plan_drafts=False)


def drafted_against_plain(llm: LLM, prompts, plain, params) -> tuple[int, int]:
    """Each prompt under the current spec, its output plain's; the drafted and accepted tokens of all."""
    llm.engine.plan_drafts = False  # the micro model's pass costs would say drafting does not pay
    drafted = accepted = 0
    for p, want in zip(prompts, plain, strict=True):
        seq = llm.new_sequence(p, params)
        llm.engine.run_batch([seq])
        assert seq.output_ids == want
        drafted, accepted = drafted + seq.stats.drafted, accepted + seq.stats.accepted
    return drafted, accepted


@pytest.mark.parametrize("method", ["tli", "slem", "auto"])
def test_greedy_identity_across_tokenizers(llm, folders, method, capsys):
    prompts = [[3, 4, 5], [6, 11, 7, 8], [12, 13, 9, 9, 14]]
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    llm.set_spec("none")
    plain = [llm.generate([p], params)[0].token_ids for p in prompts]
    spec = SpecConfig(types=(SpecType.DRAFT_MODEL,), draft_n_max=4, draft_model=str(folders[1]), draft_vocab=method)
    resources = llm.set_spec(spec)
    assert "draft vocabulary: 22 of 32 tokens (69%) map to the target's" in capsys.readouterr().err
    drafted, accepted = drafted_against_plain(llm, prompts, plain, params)
    assert drafted > 20 and accepted > 10, (drafted, accepted)
    if method == "auto":
        assert min(resources.state(SpecType.DRAFT_MODEL).cross.scores.steps.values()) >= 4  # both measured


def test_adaptive_with_a_cross_tokenizer_member_is_greedy_identical(llm, folders):
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    llm.set_spec("none")
    plain = llm.generate([[3, 4, 5]], params)[0].token_ids
    llm.set_spec(SpecConfig(draft_model=str(folders[1]), draft_n_max=4))
    drafter = llm.drafts.new_drafter()
    drafter.cost = None  # verify what the members propose (the tiny model's costs say it does not pay)
    assert any(isinstance(m.drafter, CrossVocabDrafter) for m in drafter.members)
    seq = llm.new_sequence([3, 4, 5], params)
    seq.drafter = drafter
    llm.engine.run_batch([seq])
    assert seq.output_ids == plain and seq.stats.accepted > 0


@pytest.mark.parametrize("method", ["tli", "slem"])
def test_a_cut_draft_head_across_tokenizers_is_greedy_identical(llm, folders, tokenizers, method, monkeypatch):
    """--spec-draft-vocab-size with another tokenizer: the draft's head cut to its own tokens that the plain
    outputs use (ranked by their counts), its special ones kept; its drafts are mapped back from the cut
    rows (whose indices are not their ids), and the output is plain's."""
    import numpy as np

    import specdec.drafters.cross_vocab as cross_vocab
    from specdec.drafters.frequent_vocab import special_ids

    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    prompts = [[3, 4, 5], [6, 11, 7, 8]]
    llm.set_spec("none")
    plain = [llm.generate([p], params)[0].token_ids for p in prompts]
    draft_tok = tokenizers[1]
    used = [t for out in plain for t in draft_tok(llm.tokenizer.decode(out), add_special_tokens=False).input_ids]
    kept = sorted(set(used) | special_ids(draft_tok))
    assert sum(i != t for i, t in enumerate(kept)) >= len(kept) // 2  # rows are not ids
    ranked = []

    def counts(tok, n):  # the "corpus": the plain outputs under the draft's tokenizer
        ranked.append(tok)
        return np.bincount(used, minlength=n)[:n]

    monkeypatch.setattr(cross_vocab, "vocab_counts", counts)
    spec = SpecConfig(types=(SpecType.DRAFT_MODEL,), draft_n_max=4, draft_model=str(folders[1]), draft_vocab=method,
                      draft_vocab_size=len(kept))
    state = llm.set_spec(spec).state(SpecType.DRAFT_MODEL)
    assert ranked[0] is state.cross.draft_tokenizer  # the draft's own tokens were ranked
    assert state.vocab.ids.tolist() == kept and state.runner.vocab_size == len(kept) < DRAFT_VOCAB
    drafted, accepted = drafted_against_plain(llm, prompts, plain, params)
    assert drafted > 10 and accepted > drafted // 6, (drafted, accepted)


def test_a_draft_sharing_no_token_is_refused(llm, tmp_path, folders):
    """A draft whose every token is spelled differently (upper case) cannot draft: one clear error."""
    import shutil

    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    other = tmp_path / "upper"
    shutil.copytree(folders[1], other)
    for f in other.glob("tokenizer*"):
        f.unlink()
    words = models.WordLevel({w: i for i, w in enumerate(["<UNK>", *"ABCDEFGH"])}, unk_token="<UNK>")
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(words), unk_token="<UNK>").save_pretrained(other)
    spec = SpecConfig(types=(SpecType.DRAFT_MODEL,), draft_model=str(other))
    with pytest.raises(ModelLoadError, match="shares no token"):
        DraftResources(spec, llm.runner, llm.tokenizer)


def test_auto_tries_both_then_keeps_the_better_and_re_probes():
    scores = MethodScores()
    tried = []
    for _ in range(8):
        tried.append(scores.choose())
        scores.record(tried[-1], 3 if tried[-1] == "slem" else 1)
    assert sorted(tried) == ["slem"] * 4 + ["tli"] * 4
    later = []
    for _ in range(64):
        later.append(scores.choose())
        scores.record(later[-1], 3 if later[-1] == "slem" else 1)
    assert later.count("tli") == 2 and later.count("slem") == 62  # re-probed every PROBE_EVERY decisions


# -- the sampled distribution -----------------------------------------------------------------------


def cross_drafter(cross_micro, method: str, p_min: float = 0.0):
    micro, pair, vocab = cross_micro
    cross = CrossVocab(pair, vocab, method, MethodScores())
    return lambda: CrossVocabDrafter(micro.draft, cross, p_min)


# SLEM's 4000-sample runs are slow-marked (25 s each): its drafts are deterministic, verified as any
# n-gram draft is (tests/test_lossless_sampling.py); TLI's q-carrying drafts stay in the default suite.
@pytest.mark.parametrize("method", ["tli", pytest.param("slem", marks=pytest.mark.slow)])
def test_cross_tokenizer_draft_keeps_the_distribution(cross_micro, method):
    s = sample(cross_micro[0], cross_drafter(cross_micro, method))
    assert_lossless(s, cross_micro[0].dist())


@pytest.mark.slow  # ~30-80 s on 2 busy cores; draft_model's p-min test pins the same stop rule in the fast suite
def test_tli_with_p_min_keeps_the_distribution(cross_micro):
    s = sample(cross_micro[0], cross_drafter(cross_micro, "tli", p_min=0.5))
    assert_lossless(s, cross_micro[0].dist(), deep=False)


@pytest.mark.slow  # 20 s each; the same harness catches it on chains and trees by default (test_lossless_sampling)
@pytest.mark.parametrize("method", ["tli", "slem"])
def test_harness_catches_resampling_from_p_across_tokenizers(cross_micro, monkeypatch, method):
    monkeypatch.setattr(verify_mod, "_residual", lambda p, q, x: p)
    s = sample(cross_micro[0], cross_drafter(cross_micro, method))
    assert_speculated(s)
    assert chi2_pvalue(s.counts, cross_micro[0].dist()) < ALPHA
