"""Losslessness of the whole draft -> verify -> commit loop, for every drafter.

Greedy: output token-identical to plain decoding (float32), on tiny random
models (property tests) and on the real default model. Sampling: the
distribution tests run on micro models (tests/test_lossless_sampling.py); the
chi-square they share lives here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from specdec.config import SamplingParams, SpecConfig, SpecType, StructuredKind, StructuredOutput, parse_spec_types
from specdec.drafters.adaptive import AdaptiveDrafter
from specdec.drafters.base import Drafter, DraftProposal
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.ngram_map import chains_to_proposal
from specdec.drafters.registry import DraftResources
from specdec.engine import Engine, SequenceState
from specdec.errors import ModelLoadError
from specdec.llm import LLM
from specdec.logprobs import LogprobsMode
from specdec.runners.base import SeqInput

# Drafters that need nothing but tokens (eagle3 needs a head: tests/test_eagle3.py runs these checks for it;
# draft-mtp a checkpoint with an MTP module: tests/test_mtp.py;
# draft-layerskip a model whose skipped layers matter little: tests/test_layerskip.py)
TOKEN_DRAFTERS = [t for t in SpecType
                  if t not in (SpecType.NONE, SpecType.DRAFT_MODEL, SpecType.EAGLE3, SpecType.DRAFT_LAYERSKIP,
                               SpecType.DRAFT_MTP, SpecType.RETRIEVAL)]  # retrieval needs a datastore: its own tests


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


def run(engine: Engine, prompt: list[int], params: SamplingParams, drafter: Drafter | None) -> SequenceState:
    seq = SequenceState(prompt, params, drafter=drafter)
    for _ in engine.generate(seq):
        pass
    return seq


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True)


_RESOURCES: dict[tuple, DraftResources] = {}
# ngram-mod's defaults (llama.cpp's) wait for 24-token repeats, which the tests' short prompts lack.
SHORT_MATCHES = {SpecType.NGRAM_MOD: dict(ngram_mod_n_match=2, ngram_mod_n_min=1)}


def drafter_for(llm: LLM, kind: SpecType, n_max: int = 8, draft_model: str | None = None) -> Drafter:
    """A fresh drafter; the shared resources (a loaded draft model) are built once per setting."""
    key = (id(llm), kind, n_max, draft_model)
    if key not in _RESOURCES:
        spec = SpecConfig(types=(kind,), draft_n_max=n_max, draft_model=draft_model, **SHORT_MATCHES.get(kind, {}))
        _RESOURCES[key] = DraftResources(spec, llm.runner, llm.tokenizer)
    drafter = _RESOURCES[key].new_drafter()
    if isinstance(drafter, AdaptiveDrafter):
        # Verify what the members propose: the pass costs timed on a busy machine (and the tiny models,
        # whose LM head is most of a pass) may decide drafting does not pay. tests/test_drafters_adaptive.py
        # tests the choices the costs make.
        drafter.cost = None
    return drafter


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
    engine = Engine(tiny.runner, draft_n_max=k, plan_drafts=False)
    plain = run(engine, prompt, greedy(24), None).output_ids
    spec = run(engine, prompt, greedy(24), drafter_for(tiny, kind, k))
    assert spec.output_ids == plain  # random prompts: drafts may all be rejected (the next test drafts)


# A 4-cycle of the bigram model's greedy map (seed 2): from 3272 its output repeats these four tokens,
# found by applying the map to every token (2 fixed points, cycles of 4, 10 and 41).
CYCLE = [3272, 32613, 45863, 13875]


@pytest.mark.parametrize("kind", TOKEN_DRAFTERS, ids=lambda k: k.value)
def test_greedy_identity_every_token_drafter_drafts_and_accepts(bigram, kind):
    """Each drafter's own case, with drafts proposed and accepted: the look-up drafters copy the
    prompt's cycle, draft-self (never the prompt) the output's own repeats once they come."""
    engine = Engine(bigram.runner, draft_n_max=6, plan_drafts=False)
    prompt = [*CYCLE, *CYCLE, CYCLE[0]]
    plain = run(engine, prompt, greedy(20), None).output_ids
    assert plain == (CYCLE[1:] + CYCLE[:1]) * 5, "the bigram model's cycle moved: pick another"
    seq = run(engine, prompt, greedy(20), drafter_for(bigram, kind, 6))
    assert seq.output_ids == plain
    assert seq.stats.drafted >= 8 and seq.stats.accepted >= 8, seq.stats


@pytest.mark.parametrize("types", ["ngram-cache,suffix", "suffix,ngram-mod", "ngram-mod,ngram-cache"])
def test_greedy_identity_chains_with_state_shared_across_requests(tiny, types):
    spec = SpecConfig(types=parse_spec_types(types), draft_n_max=6, **SHORT_MATCHES[SpecType.NGRAM_MOD])
    resources = DraftResources(spec, tiny.runner, tiny.tokenizer)
    # Drafts not planned: on the tiny model (its LM head is most of a pass) the cost model rightly finds
    # that drafting does not pay, and this test needs drafts.
    engine = Engine(tiny.runner, draft_n_max=6, plan_drafts=False)
    for prompt in ([5, 6, 7, 8] * 3, [9, 10, 5, 6, 7] * 2, [5, 6, 7, 8] * 3):  # later ones draft from earlier ones
        plain = run(engine, prompt, greedy(24), None).output_ids
        seq = run(engine, prompt, greedy(24), resources.new_drafter())
        assert seq.output_ids == plain and seq.stats.drafted > 0


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts, k=st.integers(1, 12), wrong_at=st.integers(0, 14), tree=st.booleans())
def test_greedy_identity_long_accepts_and_rejections(tiny, prompt, k, wrong_at, tree):
    engine = Engine(tiny.runner, draft_n_max=k, plan_drafts=False)
    plain = run(engine, prompt, greedy(30), None).output_ids
    seq = run(engine, prompt, greedy(30), ReplayDrafter(plain, len(prompt), wrong_at, tree))
    assert seq.output_ids == plain
    assert seq.stats.accepted > 0 or wrong_at == 0 or k == 1


def test_static_batch_equals_single_runs_after_switching_spec(tiny_llama):
    llm = LLM(str(tiny_llama), max_model_len=512, max_num_seqs=3, spec="none")
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


def test_generate_batches_equal_one_prompt_at_a_time(tiny_llama, monkeypatch):
    """LLM.generate runs prompts x n as batches of max_num_seqs through Engine.run_batch; batching changes
    no output: greedy with drafts accepted, and seeded samples with plain decoding (per-sequence seeds)."""
    llm = LLM(str(tiny_llama), max_model_len=512, max_num_seqs=2,
              spec=SpecConfig(types=(SpecType.DRAFT_MODEL,), draft_n_max=4, draft_model=str(tiny_llama)))
    batches = []  # sequences per Engine.run_batch call
    run_batch = Engine.run_batch
    monkeypatch.setattr(Engine, "run_batch", lambda self, seqs, on_step=None: (batches.append(len(seqs)),
                                                                             run_batch(self, seqs, on_step))[1])
    prompts = [[5, 6, 7, 8] * 4, list(range(300, 340)), [9, 9, 9, 9, 1, 2]]
    params = [greedy(n) for n in (20, 7, 30)]
    batched = llm.generate(prompts, params)
    assert batches == [2, 1]  # three sequences, two slots
    alone = [llm.generate([p], q)[0] for p, q in zip(prompts, params, strict=True)]
    assert [o.token_ids for o in batched] == [o.token_ids for o in alone]
    # Origins may differ: the engine plans drafts from the batch's pass cost. Each token has one.
    assert all(len(o.choices[0].origins) == len(o.token_ids) for o in batched)
    assert sum(o.stats.accepted for o in batched) > 0 and any("draft-model" in o.choices[0].origins for o in batched)

    llm.set_spec("none")
    batches.clear()
    sampled = [SamplingParams(max_new_tokens=16, temperature=1.0, seed=seed, ignore_eos=True, n=n)
               for seed, n in ((11, 2), (12, 1), (13, 1))]
    batched = llm.generate(prompts, sampled)
    assert batches == [2, 2]  # four sequences
    alone = [llm.generate([p], q)[0] for p, q in zip(prompts, sampled, strict=True)]
    ids = [[c.token_ids for c in o.choices] for o in batched]
    assert ids == [[c.token_ids for c in o.choices] for o in alone]
    assert ids[0][0] != ids[0][1]  # really sampled: the two choices' seeds differ
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate(prompts, sampled[:2])


def test_greedy_identity_draft_model(tiny, tiny_model_factory):
    other = str(tiny_model_factory("llama", seed=1))
    prompt = list(range(200, 230))
    engine = Engine(tiny.runner, draft_n_max=5, plan_drafts=False)
    plain = run(engine, prompt, greedy(40), None).output_ids
    for draft in (other, str(tiny_model_factory("llama"))):  # a bad draft, then a perfect one
        seq = run(engine, prompt, greedy(40), drafter_for(tiny, SpecType.DRAFT_MODEL, 5, draft))
        assert seq.output_ids == plain
    assert seq.stats.acceptance_rate > 0.9  # the target drafting for itself


@pytest.mark.parametrize("kv_cache_dtype", ["float16", "bfloat16"])
def test_greedy_identity_with_a_16_bit_kv_cache(tiny_llama, kv_cache_dtype):
    """--kv-cache-dtype float16 / bfloat16 (target and draft model): speculation still gives plain decoding's
    tokens in that format; a draft model with the target's weights drafts with its own 16-bit cache, and a
    replayed draft wrong at its third token rolls back keys already written."""
    llm = LLM(str(tiny_llama), max_model_len=256, kv_cache_dtype=kv_cache_dtype, spec="none")
    engine = Engine(llm.runner, draft_n_max=6, plan_drafts=False)
    prompt = [5, 6, 7, 8] * 4
    plain = run(engine, prompt, greedy(40), None).output_ids
    spec = SpecConfig(types=(SpecType.DRAFT_MODEL,), draft_n_max=6, draft_model=str(tiny_llama))
    resources = DraftResources(spec, llm.runner, llm.tokenizer, kv_cache_dtype=kv_cache_dtype)
    assert resources.state(SpecType.DRAFT_MODEL).runner.kv_cache_label == kv_cache_dtype
    for drafter in (resources.new_drafter(), ReplayDrafter(plain, len(prompt), wrong_at=2)):
        seq = run(engine, prompt, greedy(40), drafter)
        assert seq.output_ids == plain, drafter.name
        assert seq.stats.drafted > 0 and seq.stats.accepted > 0, drafter.name
    assert seq.stats.accepted < seq.stats.drafted  # the replayed draft's wrong tokens were rejected


def test_greedy_identity_on_the_torch_backend(tiny_llama):
    """The torch backend (what CUDA runs) in float32 on a CPU: greedy output with a draft model, a
    chain and a tree equals plain decoding. Its verify rows are not bit-identical to
    one-token passes (SDPA and F.linear sum in an order that depends on the pass width); they agree
    to ~1e-5 here, so only a near-tie of the top two logits could flip a token (README: Numerics).
    Drafts: the draft model, and the known continuation corrupted at one token (chain and tree)."""
    llm = LLM(str(tiny_llama), max_model_len=256, backend="torch")
    assert llm.runner.backend == "torch"
    engine = Engine(llm.runner, draft_n_max=6, plan_drafts=False)
    prompt = [5, 6, 7, 8] * 4
    plain = run(engine, prompt, greedy(32), None).output_ids
    drafters = [drafter_for(llm, SpecType.DRAFT_MODEL, 6, str(tiny_llama)),  # the target drafting for itself
                ReplayDrafter(plain, len(prompt), wrong_at=3), ReplayDrafter(plain, len(prompt), wrong_at=2, tree=True)]
    for drafter in drafters:
        seq = run(engine, prompt, greedy(32), drafter)
        assert seq.output_ids == plain, drafter.name
        assert seq.stats.drafted > 0 and seq.stats.accepted > 0, drafter.name
    # how far a verify row is from the same token decoded alone, on this backend
    runner, slot = llm.runner, llm.runner.allocate()
    runner.run([SeqInput(slot, prompt, all_logits=False)])
    alone = [runner.run([SeqInput(slot, [t])]).logits[0][-1] for t in plain[:8]]
    runner.truncate(slot, len(prompt))
    rows = runner.run([SeqInput(slot, plain[:8])]).logits[0]
    runner.free(slot)
    assert max(float((rows[i] - alone[i]).abs().max()) for i in range(8)) < 1e-3


def recorded_proposals(drafter: Drafter) -> list[DraftProposal]:
    """The list that ``drafter``'s proposals are appended to from now on."""
    proposals: list[DraftProposal] = []
    propose = drafter.propose

    def recorded(context, max_tokens):
        proposals.append(propose(context, max_tokens))
        return proposals[-1]

    drafter.propose = recorded
    return proposals


def test_greedy_identity_draft_model_tree(tiny, tiny_model_factory):
    """--spec-draft-p-split: the draft model's trees (its top candidates at uncertain positions) keep
    the output; some verified trees branch and some branches are accepted. The tiny models' q is flat
    (49,152 tokens), hence the low p-split."""
    prompt = list(range(200, 230))
    engine = Engine(tiny.runner, draft_n_max=6, plan_drafts=False)
    plain = run(engine, prompt, greedy(40), None).output_ids
    for draft, split in ((tiny_model_factory("llama", seed=1), 1e-4), (tiny_model_factory("llama"), 1e-4)):
        spec = SpecConfig(types=(SpecType.DRAFT_MODEL,), draft_n_max=6, draft_model=str(draft),
                          draft_p_split=split, draft_branches=3)
        drafter = DraftResources(spec, tiny.runner, tiny.tokenizer).new_drafter()
        proposals = recorded_proposals(drafter)
        seq = run(engine, prompt, greedy(40), drafter)
        assert seq.output_ids == plain
        trees = [p for p in proposals if not p.is_chain]
        assert trees and seq.stats.drafted > 0, (len(trees), seq.stats.drafted)
    # the target drafting for itself: more than one drafted token kept per pass (every branch counts as drafted)
    assert seq.stats.accepted > seq.stats.decode_passes, seq.stats


def test_draft_model_with_another_vocabulary_drafts_across_tokenizers(tiny, tmp_path):
    """A draft whose tokenizer differs (one special token renamed) drafts through the vocabulary
    map (drafters/cross_vocab.py; tests/test_cross_vocab.py tests TLI and SLEM at length)."""
    from tests.conftest import build_tiny_model

    folder = build_tiny_model(tmp_path / "m", "qwen2", tiny.folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):  # everywhere, or the
        if (folder / name).exists():  # old name comes back as a 49,153rd token the draft cannot embed
            text = (folder / name).read_text().replace('"<|im_end|>"', '"<|im_stop|>"')
            (folder / name).write_text(text)
    prompt = list(range(200, 230))
    engine = Engine(tiny.runner, draft_n_max=4, plan_drafts=False)
    plain = run(engine, prompt, greedy(24), None).output_ids
    spec = SpecConfig(types=(SpecType.DRAFT_MODEL,), draft_n_max=4, draft_model=str(folder))
    resources = DraftResources(spec, tiny.runner, tiny.tokenizer)
    cross = resources.state(SpecType.DRAFT_MODEL).cross
    assert cross is not None and cross.vocab.num_mapped == 49151
    for method in ("tli", "slem"):
        cross.method = method
        seq = run(engine, prompt, greedy(24), resources.new_drafter())
        assert seq.output_ids == plain and seq.stats.drafted > 0
    with pytest.raises(ModelLoadError, match="--spec-draft-p-split drafts trees with a draft model that shares"):
        DraftResources(replace(spec, draft_p_split=0.1), tiny.runner, tiny.tokenizer)  # TLI / SLEM draft chains


# -- greedy on the real default model ------------------------------------------------------------
# The default model loads its GGUF blocks as they are (quantization "gguf", the default for a GGUF
# file), so these tests are the greedy identity of every drafter on the quantized kernels.
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
    # the model restates its own lines: draft-self's case (its acceptance is asserted below)
    "refrain": "Write a poem where every line starts with 'The sea is'.",
}


@pytest.fixture(scope="module")
def smol() -> LLM:
    return LLM(None, max_model_len=1024)


@pytest.fixture(scope="module")
def smol_plain(smol) -> dict[str, tuple[list[int], list[int]]]:
    """(prompt ids, plain greedy output) per real prompt: decoded once, shared by every drafter's test."""
    engine = Engine(smol.runner, plan_drafts=False)
    out = {}
    for name, text in REAL_PROMPTS.items():
        prompt = smol.chat_prompt([{"role": "user", "content": text}])
        out[name] = prompt, run(engine, prompt, greedy(48), None).output_ids
    return out


@pytest.mark.parametrize("kind", [*TOKEN_DRAFTERS, SpecType.DRAFT_MODEL])
def test_greedy_identity_on_default_model(smol, smol_plain, kind, tiny_llama):
    # Drafts not planned: timed on a busy machine the cost model may draft nothing, and this asserts acceptance.
    engine = Engine(smol.runner, draft_n_max=8, plan_drafts=False)
    accepted = 0
    for text, (prompt, plain) in zip(REAL_PROMPTS.values(), smol_plain.values(), strict=True):
        draft = str(tiny_llama) if kind is SpecType.DRAFT_MODEL else None
        seq = run(engine, prompt, greedy(48), drafter_for(smol, kind, 8, draft))
        assert seq.output_ids == plain, f"{kind.value} diverged on {text[:30]!r}"
        accepted += seq.stats.accepted
    if kind is not SpecType.DRAFT_MODEL:  # the random draft model may never be right
        assert accepted > 0, "the repetitive prompts should exercise acceptance"


def test_logprobs_and_penalties_on_default_model(smol, smol_plain):
    """The quantized default model too: logprobs and penalised greedy output equal plain decoding's."""
    params = SamplingParams(max_new_tokens=32, logprobs=2, frequency_penalty=0.3, repetition_penalty=1.1)
    # Drafts not planned: on a busy machine the pass-cost model may decide drafting does not pay.
    engine = Engine(smol.runner, draft_n_max=8, plan_drafts=False)
    accepted = 0
    for name in ("repetitive", "code-edit"):  # which one a penalty leaves repetitive depends on the kernels
        prompt, _ = smol_plain[name]
        plain = run_processed(smol, engine, prompt, params, None)
        for kind in (SpecType.SUFFIX, SpecType.NGRAM):
            seq = run_processed(smol, engine, prompt, params, drafter_for(smol, kind, 8))
            assert seq.output_ids == plain.output_ids and seq.logprobs == plain.logprobs
            accepted += seq.stats.accepted
    # penalties discourage repeats: suffix (prompt + history) still gets drafts accepted here, ngram may not
    assert accepted > 0, "the prompts should exercise acceptance"
    # vLLM's processed_logprobs (after the penalties) are equal too
    engine = Engine(smol.runner, draft_n_max=8, plan_drafts=False, logprobs_mode=LogprobsMode.PROCESSED_LOGPROBS)
    prompt, _ = smol_plain["repetitive"]
    plain = run_processed(smol, engine, prompt, params, None)
    seq = run_processed(smol, engine, prompt, params, drafter_for(smol, SpecType.SUFFIX, 8))
    assert seq.output_ids == plain.output_ids and seq.logprobs == plain.logprobs


@pytest.mark.slow  # a second copy of the model and transformers' eager generate: 8 s to 70 s on 2 busy cores
def test_plain_greedy_equals_transformers_generate():
    from transformers import AutoModelForCausalLM

    smol = LLM(None, max_model_len=1024, quantization="none")  # the dequantised float32 model, as transformers'
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
# Every drafter's distribution test (4000 samples, 5-token outputs, drafting asserted, broken
# verifiers caught) runs on micro models: tests/test_lossless_sampling.py and, for each sampling
# option and processor, tests/test_lossless_sampling_processors.py. What stays here is the chi-square
# they share and the one-sequence-at-a-time harness of tests/test_eagle3.py's trained-head check.



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


def sampling_prompt(peaked: LLM) -> list[int]:
    """The model's likely chain from token 300, then its start again: look-up drafters propose the
    rest of the chain, which the (bigram, peaked) target often accepts."""
    probe = run(Engine(peaked.runner), [300], greedy(10), None).output_ids
    return [300, *probe, 300, *probe[:3]]


# -- adaptive: merged trees of several drafters ------------------------------------------------------
# The adaptive drafter runs through every test above as one of TOKEN_DRAFTERS; there its members
# often agree. Here a second member disagrees by design, and with pass costs unmeasured (cost None)
# everything within the budget is verified: each step's draft is a tree of two drafters' proposals.


class SecondOpinion(Drafter):
    """A deterministic member that agrees with the n-gram drafter's first ``split_at`` tokens, then differs."""

    name = "second-opinion"

    def __init__(self, split_at: int, vocab_size: int = 49152) -> None:
        self.inner = NgramDrafter.from_config(SpecConfig())
        self.split_at, self.vocab_size = split_at, vocab_size

    def begin(self, prompt_ids, sampling):
        self.inner.begin(prompt_ids, sampling)

    def propose(self, context, max_tokens):
        p = self.inner.propose(context, max_tokens)
        if len(p) <= self.split_at:
            return p
        return DraftProposal([*p.token_ids[: self.split_at], (p.token_ids[self.split_at] + 1) % self.vocab_size])

    def accept(self, context, num_accepted):
        self.inner.accept(context, num_accepted)


class MergingDrafter(AdaptiveDrafter):
    """Adaptive over n-gram look-up and a second opinion; counts the trees it proposes."""

    def __init__(self, split_at: int = 1, vocab_size: int = 49152, min_acceptance: float = 0.4) -> None:
        super().__init__([NgramDrafter.from_config(SpecConfig()), SecondOpinion(split_at, vocab_size)], cost=None,
                         min_acceptance=min_acceptance)
        self.num_trees = 0

    def propose(self, context, max_tokens):
        proposal = super().propose(context, max_tokens)
        self.num_trees += not proposal.is_chain
        return proposal


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts, k=st.integers(2, 10))
def test_greedy_identity_adaptive_merged_trees(tiny, prompt, k):
    engine = Engine(tiny.runner, draft_n_max=k, plan_drafts=False)
    plain = run(engine, prompt, greedy(24), None).output_ids
    drafter = MergingDrafter()
    seq = run(engine, prompt, greedy(24), drafter)
    assert seq.output_ids == plain
    assert seq.stats.drafted == sum(seq.stats.drafted_by.values())
    assert seq.stats.accepted == sum(seq.stats.accepted_by.values())


def test_greedy_adaptive_merged_trees_are_exercised(bigram):
    engine = Engine(bigram.runner, draft_n_max=6, plan_drafts=False)
    # The model's greedy chain from token 300, then its start again: n-gram look-up proposes the rest.
    probe = run(engine, [300], greedy(16), None).output_ids
    prompt = [300, *probe, 300, *probe[:3]]
    plain = run(engine, prompt, greedy(32), None).output_ids
    drafter = MergingDrafter()
    seq = run(engine, prompt, greedy(32), drafter)
    assert seq.output_ids == plain
    assert drafter.num_trees > 0 and seq.stats.accepted > 0
    assert set(seq.stats.drafted_by) == {"ngram", "second-opinion"}
    assert set(seq.stats.accepted_by) <= {"ngram", "second-opinion"}


# -- history processors and grammars: applied per verify row, so still lossless -------------------
# Each case also asks for logprobs, which must equal plain decoding's bit for bit: the raw target rows,
# and the processed ones (vLLM's processed_logprobs: after the processors, what greedy takes the argmax of).

PROCESSED_CASES = {
    # The bias makes four tokens win, the penalties choose among them by their counts so far,
    # including the drafted tokens before each row: output cycles, so look-up drafts get accepted.
    "penalties": dict(logit_bias={10: 20.0, 11: 20.0, 12: 20.0, 13: 20.0}, frequency_penalty=0.9,
                      presence_penalty=0.5, repetition_penalty=1.2),
    # EOS (id 2) pushed to the top, held back for 12 tokens.
    "bias-min-bad": dict(logit_bias={2: 40.0, 301: -3.0}, min_tokens=12, bad_words=("the", "ing")),
    "regex": dict(structured=StructuredOutput(StructuredKind.REGEX, r"[a-z]{2,6}( [a-z]{2,6}){3,12}\.")),
    "json": dict(structured=StructuredOutput(
        StructuredKind.JSON_SCHEMA,
        '{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": '
        '{"type": "string", "maxLength": 6}, "maxItems": 4}}, "required": ["a", "b"]}')),
}


def processed(n: int, case: str, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, logprobs=4, **PROCESSED_CASES[case], **kw)


def run_processed(llm: LLM, engine: Engine, prompt: list[int], params: SamplingParams,
                  drafter: Drafter | None) -> SequenceState:
    seq = SequenceState(prompt, params, drafter=drafter, processors=llm.processors(prompt, params))
    for _ in engine.generate(seq):
        pass
    return seq


@pytest.fixture(scope="module")
def bigram(tiny_model_factory) -> LLM:
    """Greedy output of a bigram model falls into cycles: drafts from repetition get accepted,
    and the penalties bite exactly on the tokens a draft repeats."""
    return LLM(str(tiny_model_factory("llama", seed=2, bigram=True)), max_model_len=512)


@pytest.mark.parametrize("mode", [LogprobsMode.RAW_LOGPROBS, LogprobsMode.PROCESSED_LOGPROBS])
@pytest.mark.parametrize("case", PROCESSED_CASES)
@pytest.mark.parametrize("kind", [*TOKEN_DRAFTERS, SpecType.DRAFT_MODEL])
def test_greedy_identity_and_logprobs_with_processors_every_drafter(bigram, tiny_model_factory, kind, case, mode):
    engine = Engine(bigram.runner, draft_n_max=6, plan_drafts=False, logprobs_mode=mode)
    prompt = [5, 6, 7, 8, 9] * 4
    plain = run_processed(bigram, engine, prompt, processed(32, case), None)
    # draft-model drafts with the target itself, unpenalised: accepted until the processors make a difference.
    draft = str(tiny_model_factory("llama", seed=2, bigram=True)) if kind is SpecType.DRAFT_MODEL else None
    seq = run_processed(bigram, engine, prompt, processed(32, case), drafter_for(bigram, kind, 6, draft))
    assert seq.output_ids == plain.output_ids
    assert seq.logprobs == plain.logprobs  # floats compared exactly
    assert len(seq.logprobs) == len(seq.output_ids)
    if mode is LogprobsMode.PROCESSED_LOGPROBS:  # greedy took the processed argmax at every position
        assert all(t.rank == 1 for t in seq.logprobs)
    if case == "penalties" and kind is not SpecType.DRAFT_MODEL:  # the unbiased draft model is always wrong
        assert seq.stats.accepted > 0


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts, k=st.integers(1, 10), wrong_at=st.integers(0, 10), tree=st.booleans(),
       case=st.sampled_from(list(PROCESSED_CASES)), mode=st.sampled_from(list(LogprobsMode)))
def test_processors_over_long_accepts_and_rejections(bigram, prompt, k, wrong_at, tree, case, mode):
    engine = Engine(bigram.runner, draft_n_max=k, plan_drafts=False, logprobs_mode=mode)
    plain = run_processed(bigram, engine, prompt, processed(24, case), None)
    drafter = ReplayDrafter(plain.output_ids, len(prompt), wrong_at, tree)
    seq = run_processed(bigram, engine, prompt, processed(24, case), drafter)
    assert seq.output_ids == plain.output_ids and seq.logprobs == plain.logprobs
    assert seq.stats.accepted > 0 or wrong_at == 0 or k == 1 or len(plain.output_ids) < 3
