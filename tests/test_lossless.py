"""Losslessness of the whole draft -> verify -> commit loop, for every drafter.

Greedy: output token-identical to plain decoding (float32), on tiny random
models (property tests) and on the real default model. Sampling: the
distribution of generated sequences equals the exact target distribution,
checked with a chi-square test that a deliberately broken verifier fails.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

import specdec.verify as verify_mod
from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.drafters.base import Drafter, DraftProposal
from specdec.drafters.ngram_map import chains_to_proposal
from specdec.drafters.registry import DraftResources
from specdec.engine import Engine, Sequence
from specdec.llm import LLM
from specdec.runners.base import SeqInput
from specdec.sampling import probs_from_logits

# Drafters that need nothing but tokens (eagle3 needs a head: tests/test_eagle3.py runs these checks for it)
TOKEN_DRAFTERS = [t for t in SpecType if t not in (SpecType.NONE, SpecType.DRAFT_MODEL, SpecType.EAGLE3)]


class ReplayDrafter(Drafter):
    """Test drafter: proposes the known reference continuation, corrupted at one position.

    With ``tree=True`` the corrupted chain is the first branch and the true one the
    second, so the verifier must pick the later sibling.
    """

    name = "replay"

    def __init__(self, reference: list[int], prompt_len: int, wrong_at: int, tree: bool = False) -> None:
        self.reference, self.prompt_len, self.wrong_at, self.tree = reference, prompt_len, wrong_at, tree

    def propose(self, context, max_tokens):
        done = len(context) - self.prompt_len
        true = self.reference[done : done + max_tokens]
        if not true:
            return DraftProposal([])
        bad = list(true)
        if self.wrong_at < len(bad):
            bad[self.wrong_at] = (bad[self.wrong_at] + 1) % 49152
        if not self.tree or bad == true:
            return DraftProposal(bad)
        # Wrong branch first, the true one second; the trie shares their common prefix.
        half = max(max_tokens // 2, 1)
        merged = chains_to_proposal([bad[:half], true[:half]])
        return merged if len(merged) <= max_tokens else DraftProposal(bad)


def run(engine: Engine, prompt: list[int], params: SamplingParams, drafter: Drafter | None) -> Sequence:
    seq = Sequence(prompt, params, drafter=drafter)
    for _ in engine.generate(seq):
        pass
    return seq


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True)


_RESOURCES: dict[tuple, DraftResources] = {}


def drafter_for(llm: LLM, kind: SpecType, n_max: int = 8, draft_model: str | None = None) -> Drafter:
    """A fresh drafter; the shared resources (a loaded draft model) are built once per setting."""
    key = (id(llm), kind, n_max, draft_model)
    if key not in _RESOURCES:
        spec = SpecConfig(types=(kind,), draft_n_max=n_max, draft_model=draft_model)
        _RESOURCES[key] = DraftResources(spec, llm.runner, llm.tokenizer)
    return _RESOURCES[key].new_drafter()


@pytest.fixture(scope="module")
def tiny(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), max_model_len=512)


# -- greedy on tiny random models --------------------------------------------------------------

prompts = st.lists(st.integers(3, 3000), min_size=2, max_size=12).flatmap(
    lambda motif: st.tuples(st.just(motif), st.integers(1, 4), st.lists(st.integers(3, 3000), max_size=6))
).map(lambda t: t[0] * t[1] + t[2])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts, k=st.integers(1, 10), kind=st.sampled_from(TOKEN_DRAFTERS))
def test_greedy_identity_every_token_drafter(tiny, prompt, k, kind):
    engine = Engine(tiny.runner, draft_n_max=k)
    plain = run(engine, prompt, greedy(24), None).output_ids
    spec = run(engine, prompt, greedy(24), drafter_for(tiny, kind, k))
    assert spec.output_ids == plain


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts, k=st.integers(1, 12), wrong_at=st.integers(0, 14), tree=st.booleans())
def test_greedy_identity_long_accepts_and_rejections(tiny, prompt, k, wrong_at, tree):
    engine = Engine(tiny.runner, draft_n_max=k)
    plain = run(engine, prompt, greedy(30), None).output_ids
    seq = run(engine, prompt, greedy(30), ReplayDrafter(plain, len(prompt), wrong_at, tree))
    assert seq.output_ids == plain
    assert seq.stats.accepted > 0 or wrong_at == 0 or k == 1


def test_static_batch_equals_single_runs_after_switching_spec(tiny_llama):
    llm = LLM(str(tiny_llama), max_model_len=512, max_num_seqs=3)
    prompts = [[5, 6, 7, 8] * 4, list(range(300, 340)), [9, 9, 9, 9, 1, 2]]
    params = [greedy(n) for n in (20, 7, 30)]
    plain = [llm.generate([p], q)[0].token_ids for p, q in zip(prompts, params, strict=True)]
    # The target drafting for itself: drafts are accepted, so batched verification is exercised.
    llm.set_spec(SpecConfig(types=(SpecType.DRAFT_MODEL,), draft_n_max=4, draft_model=str(tiny_llama)))
    seqs = [llm.new_sequence(p, q) for p, q in zip(prompts, params, strict=True)]
    pass_seconds = llm.engine.run_batch(seqs)
    assert [s.output_ids for s in seqs] == plain
    assert all(s.slot == -1 for s in seqs)  # every slot freed
    assert sum(s.stats.accepted for s in seqs) > 0
    assert 0 < pass_seconds <= sum(s.stats.target_seconds for s in seqs)


def test_greedy_identity_draft_model(tiny, tiny_model_factory):
    other = str(tiny_model_factory("llama", seed=1))
    prompt = list(range(200, 230))
    engine = Engine(tiny.runner, draft_n_max=5)
    plain = run(engine, prompt, greedy(40), None).output_ids
    for draft in (other, str(tiny_model_factory("llama"))):  # a bad draft, then a perfect one
        seq = run(engine, prompt, greedy(40), drafter_for(tiny, SpecType.DRAFT_MODEL, 5, draft))
        assert seq.output_ids == plain
    assert seq.stats.acceptance_rate > 0.9  # the target drafting for itself


def test_draft_model_with_another_vocabulary_is_refused(tiny, tmp_path):
    from specdec.errors import ModelLoadError
    from tests.conftest import build_tiny_model

    folder = build_tiny_model(tmp_path / "m", "qwen2", tiny.folder)
    tok = (folder / "tokenizer.json").read_text().replace('"<|im_end|>"', '"<|im_stop|>"')
    (folder / "tokenizer.json").write_text(tok)
    with pytest.raises(ModelLoadError, match="vocabulary"):
        drafter_for(tiny, SpecType.DRAFT_MODEL, 4, str(folder))


# -- greedy on the real default model ------------------------------------------------------------
# Cost (SmolLM2-135M, 2 CPU cores, warm numba cache): loading ~3 s, 48 tokens ~1 s. The greedy
# identity tests stay in the fast suite on purpose: the plain outputs are decoded once per module
# and shared, so each drafter costs three 48-token runs (~5 s). The transformers.generate
# comparison loads a second copy of the model and is marked slow; test_runner's logits parity
# on the default model keeps that claim in the fast suite.

REAL_PROMPTS = {
    "repetitive": "Repeat this line five times:\nThe quick brown fox jumps over the lazy dog.\n",
    "code-edit": (
        "Rename the variable total to acc and output the full function:\n"
        "def add_all(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total\n"
    ),
    "open": "Write a short poem about the sea.",
}


@pytest.fixture(scope="module")
def smol() -> LLM:
    return LLM(None, max_model_len=1024)


@pytest.fixture(scope="module")
def smol_plain(smol) -> dict[str, tuple[list[int], list[int]]]:
    """(prompt ids, plain greedy output) per real prompt: decoded once, shared by every drafter's test."""
    engine = Engine(smol.runner)
    out = {}
    for name, text in REAL_PROMPTS.items():
        prompt = smol.chat_prompt([{"role": "user", "content": text}])
        out[name] = prompt, run(engine, prompt, greedy(48), None).output_ids
    return out


@pytest.mark.parametrize("kind", [*TOKEN_DRAFTERS, SpecType.DRAFT_MODEL])
def test_greedy_identity_on_default_model(smol, smol_plain, kind, tiny_llama):
    engine = Engine(smol.runner, draft_n_max=8)
    accepted = 0
    for text, (prompt, plain) in zip(REAL_PROMPTS.values(), smol_plain.values(), strict=True):
        draft = str(tiny_llama) if kind is SpecType.DRAFT_MODEL else None
        seq = run(engine, prompt, greedy(48), drafter_for(smol, kind, 8, draft))
        assert seq.output_ids == plain, f"{kind.value} diverged on {text[:30]!r}"
        accepted += seq.stats.accepted
    if kind is not SpecType.DRAFT_MODEL:  # the random draft model may never be right
        assert accepted > 0, "the repetitive prompts should exercise acceptance"


@pytest.mark.slow  # a second copy of the model and transformers' eager generate: 8 s to 70 s on 2 busy cores
def test_plain_greedy_equals_transformers_generate(smol):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(smol.folder, dtype=torch.float32).eval()
    for text in REAL_PROMPTS.values():
        prompt = smol.chat_prompt([{"role": "user", "content": text}])
        ours = run(smol.engine, prompt, SamplingParams(max_new_tokens=32), None).output_ids
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)
        assert ours == ref[0, len(prompt) :].tolist()  # both stop after EOS or 32 tokens


def test_rollback_then_decode_equals_fresh_decode(smol):  # cheap: four short passes on the loaded model
    runner = smol.runner
    ids = smol.encode("The capital of France is")
    slot = runner.allocate()
    try:
        runner.run([SeqInput(slot, ids)])
        runner.run([SeqInput(slot, [11, 22, 33, 44])])
        runner.truncate(slot, len(ids))  # roll the 4 tokens back
        after = runner.run([SeqInput(slot, [55])]).logits[0]
        runner.truncate(slot, 0)
        fresh = runner.run([SeqInput(slot, [*ids, 55])]).logits[0][-1:]
        assert torch.allclose(after, fresh, atol=1e-4)
    finally:
        runner.free(slot)


# -- sampling: exact sequence distribution ---------------------------------------------------------

SEQ_LEN, TOP_K, N_SAMPLES = 3, 3, 700


@pytest.fixture(scope="module")
def peaked(tiny_model_factory) -> LLM:
    # Large logits make p peaked, so drafts from repetition are often right and often wrong.
    return LLM(str(tiny_model_factory("qwen2", seed=3, logit_scale=4.0, bigram=True)), max_model_len=256)


def exact_distribution(llm: LLM, prompt: list[int], params: SamplingParams) -> dict[tuple, float]:
    """P(sequence) for every length-SEQ_LEN continuation, by enumerating prefixes."""
    slot = llm.runner.allocate()

    def next_probs(prefix: tuple) -> torch.Tensor:
        llm.runner.truncate(slot, 0)
        out = llm.runner.run([SeqInput(slot, [*prompt, *prefix], all_logits=False)])
        return probs_from_logits(out.logits[0], params)[0]

    dist: dict[tuple, float] = {(): 1.0}
    for _ in range(SEQ_LEN):
        nxt = {}
        for prefix, mass in dist.items():
            p = next_probs(prefix)
            for tok in torch.nonzero(p).flatten().tolist():
                nxt[(*prefix, tok)] = mass * float(p[tok])
        dist = nxt
    llm.runner.free(slot)
    return dist


def sample_counts(llm: LLM, prompt, params, make_drafter, n: int = N_SAMPLES) -> tuple[Counter, int]:
    engine = Engine(llm.runner, draft_n_max=4)
    counts, accepted = Counter(), 0
    for i in range(n):
        seq = run(engine, prompt, SamplingParams(**{**params.__dict__, "seed": 10_000 + i}), make_drafter())
        counts[tuple(seq.output_ids)] += 1
        accepted += seq.stats.accepted
    return counts, accepted


def chi2_pvalue(counts: Counter, dist: dict[tuple, float]) -> float:
    if set(counts) - set(dist):
        return 0.0  # produced a sequence the target can never produce
    n = sum(counts.values())
    cells, rest_obs, rest_exp = [], 0, 0.0
    for key, prob in dist.items():  # pool rare cells so every expected count is >= 5
        if prob * n >= 5:
            cells.append((counts[key], prob * n))
        else:
            rest_obs, rest_exp = rest_obs + counts[key], rest_exp + prob * n
    if rest_exp > 0:
        cells.append((rest_obs, rest_exp))
    obs, exp = zip(*cells, strict=True)
    total = sum(exp)
    return chisquare(obs, [e * n / total for e in exp]).pvalue  # rescale away float rounding


def sampling_case(peaked: LLM):
    params = SamplingParams(max_new_tokens=SEQ_LEN, temperature=1.0, top_k=TOP_K, ignore_eos=True)
    # The model's likely chain from token 300, then its start again: look-up drafters propose
    # the rest of the chain, which the (bigram, peaked) target often accepts.
    probe = run(Engine(peaked.runner), [300], greedy(10), None).output_ids
    prompt = [300, *probe, 300, *probe[:3]]
    return prompt, params, exact_distribution(peaked, prompt, params)


@pytest.mark.parametrize("kind", [*TOKEN_DRAFTERS, SpecType.DRAFT_MODEL])
def test_sampling_distribution_every_drafter(peaked, tiny_model_factory, kind):
    prompt, params, dist = sampling_case(peaked)
    draft = flat_draft(tiny_model_factory) if kind is SpecType.DRAFT_MODEL else None
    counts, accepted = sample_counts(peaked, prompt, params, lambda: drafter_for(peaked, kind, 4, draft))
    assert chi2_pvalue(counts, dist) > 1e-3
    # draft-self drafts from its own earlier output only, which 3 tokens do not give it;
    # its acceptance is exercised by the greedy tests on the default model.
    if kind is not SpecType.DRAFT_SELF:
        assert accepted > 0, "the test must exercise acceptance, not only rejections"


def flat_draft(tiny_model_factory) -> str:
    """The target's weights with unscaled logits: q ranks tokens like p but is far flatter,
    so drafts are often rejected and the residual max(0, p - q) does real work."""
    return str(tiny_model_factory("qwen2", seed=3, logit_scale=1.0, bigram=True))


# A deliberately broken verifier, patched in: the distribution test above is evidence only if it fails it.
@pytest.mark.parametrize("bug", ["resample-from-p", "accept-always"])
def test_statistical_test_catches_broken_verifier_end_to_end(peaked, tiny_model_factory, monkeypatch, bug):
    prompt, params, dist = sampling_case(peaked)
    if bug == "resample-from-p":
        monkeypatch.setattr(verify_mod, "_residual", lambda p, q, x: p)
    else:
        real = verify_mod.verify_sampling

        def accept_always(tree, target_probs, draft_probs, generator):
            path = tree.path_to(max(range(tree.num_nodes), key=lambda n: tree.depths[n]))
            last = real(tree, target_probs, draft_probs, generator)  # for a bonus token only
            return verify_mod.VerifyResult([tree.tokens[n] for n in path[1:]] + last.token_ids[-1:], path)

        monkeypatch.setattr(verify_mod, "verify_sampling", accept_always)
    kind = SpecType.DRAFT_MODEL if bug == "resample-from-p" else SpecType.NGRAM
    draft = flat_draft(tiny_model_factory) if kind is SpecType.DRAFT_MODEL else None
    # resample-from-p is a subtle bug: over seed bases its p-value ranged 1e-6..0.03 at 700 samples
    # and 1e-10..2e-3 at 2800, so it gets 8x the samples to be caught whatever the draws.
    n = 8 * N_SAMPLES if bug == "resample-from-p" else N_SAMPLES
    counts, _ = sample_counts(peaked, prompt, params, lambda: drafter_for(peaked, kind, 4, draft), n)
    assert chi2_pvalue(counts, dist) < 1e-3


def test_exact_distribution_sums_to_one(peaked):
    _, _, dist = sampling_case(peaked)
    assert abs(sum(dist.values()) - 1.0) < 1e-4
    assert len(dist) <= TOP_K**SEQ_LEN
    assert all(len(k) == SEQ_LEN for k in itertools.islice(dist, 5))
