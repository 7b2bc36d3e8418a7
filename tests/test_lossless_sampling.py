"""Sampled output keeps the target's exact distribution: 5-token outputs on micro models, 4000 samples.

The models are really tiny (a 32-token vocabulary, one layer of width 16, no tokenizer), so
the exact distribution of 5-token outputs under top-k 3 (243 sequences) is enumerated, and
4000 samples go through the engine's batch path in a few seconds. Every test drafts with
the cost policy off (``Engine(plan_drafts=False)``, and a fixed cost table where the adaptive
drafter prices drafts) and asserts that drafts were verified at depth >= 3 and accepted: a
test that passes by not speculating proves nothing. The same harness must catch a broken
verifier (resample-from-p) on chains and on trees, or a pass would prove nothing either.

Cost on 2 busy cores: ~10-40 s per 4000 samples (the draft model drafts one token per pass).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

import specdec.drafters.adaptive as adaptive_mod
import specdec.verify as verify_mod
from specdec.config import SamplingParams, SpecConfig, SpecType
from specdec.drafters.adaptive import AdaptiveDrafter
from specdec.drafters.base import Drafter, DraftProposal
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.draft_self import DraftSelfDrafter
from specdec.drafters.dynamic_tree import sampled_children
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.mtp import MtpDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.registry import DraftResources
from specdec.engine import Engine, SequenceState
from specdec.model.eagle_head import EagleHead, EagleHeadConfig
from specdec.model.mtp_head import MtpHead, MtpHeadConfig
from specdec.pass_cost import PassCost
from specdec.processors import SequenceProcessors
from specdec.row_dist import TokenDist, row_dist
from specdec.runners.base import ModelRunner, SeqInput
from specdec.runners.load import load_runner
from specdec.sampling import make_generator, probs_from_logits
from specdec.tree import DraftTree
from tests.test_lossless import MergingDrafter, chi2_pvalue

VOCAB, OUT_LEN, TOP_K, N_SAMPLES, BATCH, MAX_LEN = 32, 5, 3, 4000, 1000, 32
PROMPT = [3, 4, 5]
PARAMS = SamplingParams(max_new_tokens=OUT_LEN, temperature=1.0, top_k=TOP_K, ignore_eos=True)
ALPHA = 1e-3  # a lossless test passes above it, a broken verifier must fall below it


def build_micro(folder: Path, seed: int, noise: float = 0.0, head_scale: float = 1.0, hidden: int = 16,
                num_layers: int = 1, vocab: int = VOCAB, head_dim: int = 8, max_positions: int = 64,
                quiet: tuple[int, ...] = (), quiet_scale: float = 1.0) -> Path:
    """A random Llama (one layer over 32 tokens unless told). With ``noise``/``head_scale`` the model
    of ``seed`` is perturbed: a draft model close to the target (accepted often, rejected often).
    ``hidden`` 32 fits GGUF's 32-wide blocks (the quantized target). The ``quiet`` layers' o_proj and
    down_proj are scaled by ``quiet_scale`` (layers a layer-skipping draft may skip)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers,
        num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim, max_position_embeddings=max_positions,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0, 0.1) if "norm" in name else p.normal_(0.0, 0.5)
        gen = torch.Generator().manual_seed(seed + 1000)
        for p in model.parameters():
            p.add_(noise * torch.randn(p.shape, generator=gen))
        model.lm_head.weight.mul_(head_scale)
        for i in quiet:
            model.model.layers[i].self_attn.o_proj.weight.mul_(quiet_scale)
            model.model.layers[i].mlp.down_proj.weight.mul_(quiet_scale)
    model.save_pretrained(folder)
    return folder


@dataclass(frozen=True)
class Case:
    """What is sampled: the prompt, the sampling parameters and, per sequence, its processors
    (penalties, grammar: None for none). Both the exact distribution and the engine's samples use it."""

    params: SamplingParams = PARAMS
    prompt: tuple[int, ...] = tuple(PROMPT)
    processors: Callable[[list[int], SamplingParams], SequenceProcessors | None] = lambda prompt, params: None


PLAIN = Case()


@dataclass
class Micro:
    target: ModelRunner
    draft: ModelRunner  # close to the target: a perturbed, flatter copy
    dists: dict[Case, dict[tuple, float]]  # each case's exact distribution of OUT_LEN-token outputs
    q: DraftQ  # the draft model's q per context, shared by the test drafters
    head: EagleHead | None = None  # an EAGLE-3 head for the target, built on first use

    def dist(self, case: Case = PLAIN) -> dict[tuple, float]:
        if case not in self.dists:
            self.dists[case] = exact_distribution(self.target, case)
        return self.dists[case]


@pytest.fixture(scope="module")
def micro(tmp_path_factory) -> Micro:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead (and contend on a busy machine)
    root = tmp_path_factory.mktemp("micro")
    runners = []
    for name, kw in (("target", {}), ("draft", dict(head_scale=0.5))):
        folder = build_micro(root / name, seed=0, **kw)
        runners.append(load_runner(str(folder), max_seq_len=MAX_LEN, num_slots=BATCH, backend="torch")[0])
    yield Micro(runners[0], runners[1], {}, DraftQ(runners[1]))
    torch.set_num_threads(threads)


def exact_distribution(runner: ModelRunner, case: Case) -> dict[tuple, float]:
    """P(output) for every OUT_LEN-token output, by enumerating prefixes (batched passes per depth).
    The case's processors see each prefix as their history, as they see a drafted path in a verify row."""
    prompt = list(case.prompt)
    dist: dict[tuple, float] = {(): 1.0}
    for _ in range(OUT_LEN):
        nxt = {}
        prefixes = list(dist)
        for start in range(0, len(prefixes), BATCH):
            chunk = prefixes[start : start + BATCH]
            slots = [runner.allocate() for _ in chunk]
            out = runner.run([SeqInput(s, [*prompt, *pre], all_logits=False) for s, pre in zip(slots, chunk,
                                                                                               strict=True)])
            for s in slots:
                runner.free(s)
            for prefix, logits in zip(chunk, out.logits, strict=True):
                tokens, procs = [*prompt, *prefix], case.processors(prompt, case.params)
                if procs is not None:
                    procs.advance(list(prefix))
                    logits = procs.apply(logits, DraftTree.chain(tokens[-1], []), tokens)
                p = probs_from_logits(logits, case.params)[0]
                for tok in torch.nonzero(p).flatten().tolist():
                    nxt[(*prefix, tok)] = dist[prefix] * float(p[tok])
        dist = nxt
    return dist


@dataclass
class Samples:
    counts: Counter
    drafted: int
    accepted: int
    deep: int  # steps that accepted >= 3 drafted tokens
    trees: int  # steps whose draft was a tree of width >= 2


def sample(micro: Micro, make_drafter: Callable[[], Drafter], case: Case = PLAIN, n: int = N_SAMPLES,
           draft_n_min: int = 0, draft_n_max: int = 4, seed: int = 0, target: ModelRunner | None = None) -> Samples:
    """n outputs through ``Engine.run_batch`` in batches, the cost policy off (each step drafts its cap)."""
    engine = Engine(target or micro.target, draft_n_max=draft_n_max, draft_n_min=draft_n_min, plan_drafts=False)
    out = Samples(Counter(), 0, 0, 0, 0)
    _count_steps(engine, out)
    for start in range(0, n, BATCH):
        seqs = []
        for i in range(start, min(start + BATCH, n)):
            # seeds two apart, as they always were (a draft model's own stream is SamplingParams.draft_seed)
            params = replace(case.params, seed=seed + 2 * i)
            seqs.append(SequenceState(list(case.prompt), params, drafter=make_drafter(),
                                      processors=case.processors(list(case.prompt), params)))
        engine.run_batch(seqs)
        for s in seqs:
            out.counts[tuple(s.output_ids)] += 1
            out.drafted += s.stats.drafted
            out.accepted += s.stats.accepted
    return out


def _count_steps(engine: Engine, out: Samples) -> None:
    """Wrap the engine's step to count deep acceptances and tree-shaped drafts."""
    step = engine.step

    def counted(seqs, draft_budget=None):
        results = step(seqs, draft_budget)
        out.deep += sum(r.num_accepted >= 3 for r in results)
        return results

    draft = engine._draft

    def drafted(seq, k):
        d = draft(seq, k)
        out.trees += not d.proposal.is_chain
        return d

    engine.step, engine._draft = counted, drafted


def assert_lossless(s: Samples, dist: dict[tuple, float], trees: bool = False, deep: bool = True,
                    min_drafted: int = N_SAMPLES) -> float:
    pvalue = chi2_pvalue(s.counts, dist)
    print(f"p = {pvalue:.3g}, {s.drafted} drafted, {s.accepted} accepted, {s.deep} deep, {s.trees} trees")
    assert pvalue > ALPHA, f"p = {pvalue:.3g}: the output distribution is not the target's"
    assert_speculated(s, trees, deep, min_drafted)
    return pvalue


def assert_speculated(s: Samples, trees: bool = False, deep: bool = True, min_drafted: int = N_SAMPLES) -> None:
    """Drafts were verified and accepted (deep: >= 3 deep in 100 steps; False for the random EAGLE
    head and the look-up drafters, right now and then only), and with ``trees``, most drafts were trees."""
    assert s.drafted > min_drafted and s.accepted > (N_SAMPLES // 2 if deep else 200), (s.drafted, s.accepted)
    assert not deep or s.deep > 100, f"only {s.deep} steps accepted >= 3 drafted tokens"
    if trees:
        assert s.trees >= N_SAMPLES, f"only {s.trees} tree drafts"


def draft_model(micro: Micro, p_min: float = 0.0) -> Callable[[], Drafter]:
    return lambda: DraftModelDrafter(micro.draft, p_min)


# -- the draft model: plain, and with p-min / n-min ------------------------------------------------


def test_draft_model_keeps_the_distribution(micro):
    s = sample(micro, draft_model(micro))
    assert_lossless(s, micro.dist())


def test_draft_model_with_p_min_and_n_min_keeps_the_distribution(micro):
    """p-min stops the chain where the draft's own q is unsure, so a chain's length depends on
    its sampled tokens; dropping a chain shorter than n-min then made whether x1 is verified
    depend on x1 (issue 22: p = 0.0001 at 3 tokens). Short sampled drafts are verified now."""
    s = sample(micro, draft_model(micro, p_min=0.6), draft_n_min=3)
    assert_lossless(s, micro.dist())


# -- adaptive with a sampled member ----------------------------------------------------------------


def fixed_cost() -> PassCost:
    """A pass-cost table that never changes (the engine times into the runner's own, not this one):
    one drafted token never pays (c(2) = 2.5 c(1)), three do (c(4) = 1.2 c(1)). Priced on the draft's
    own shape, a chain that p-min stopped after x1 was dropped and a longer one verified: the n-min
    bias again, inside ``choose``."""
    cost = PassCost(max_age=1 << 30)
    cost.seconds = {1: 1.0, 2: 2.5, 4: 1.2}
    return cost


def adaptive(micro: Micro, members: Callable[[], list[Drafter]]) -> Callable[[], Drafter]:
    # min_acceptance 0: a member's monitor never switches it off, whatever it drew
    return lambda: AdaptiveDrafter(members(), cost=fixed_cost(), min_acceptance=0.0)


def test_adaptive_with_a_draft_model_member_keeps_the_distribution(micro):
    s = sample(micro, adaptive(micro, lambda: [DraftModelDrafter(micro.draft, 0.6)]))
    assert_lossless(s, micro.dist())


def test_adaptive_with_an_eagle_member_keeps_the_distribution(micro):
    """An EAGLE tree's shape follows its own draws, so it is cut by its planned length, like a chain."""
    s = sample(micro, adaptive(micro, lambda: [eagle(micro)]))
    assert_lossless(s, micro.dist(), trees=True, deep=False)


@dataclass
class AdaptiveCounts:
    """What the adaptive drafters of one run did: dry runs, verified drafts by kind, monitor events."""

    drafters: list[AdaptiveDrafter]
    dry_runs: int = 0
    sampled: int = 0  # verified drafts carrying q (the draft-model member's)
    lookup: int = 0  # verified deterministic drafts (the n-gram member's)

    def switch_offs(self) -> int:
        return sum(m.monitor.num_switch_offs for d in self.drafters for m in d.members)


def lookup_and_model(micro: Micro, monkeypatch, min_acceptance: float, min_samples: int = 3):
    """Adaptive over n-gram look-up and the draft model (p-min 0.6, a fixed cost table), with counters."""
    counts = AdaptiveCounts([])
    dry_run, propose = AdaptiveDrafter._dry_run, AdaptiveDrafter.propose

    def counted_dry_run(self, m, context):
        counts.dry_runs += 1
        return dry_run(self, m, context)

    def counted_propose(self, context, max_tokens):
        proposal = propose(self, context, max_tokens)
        if len(proposal):
            counts.sampled += proposal.probs is not None
            counts.lookup += proposal.probs is None
        return proposal

    monkeypatch.setattr(AdaptiveDrafter, "_dry_run", counted_dry_run)
    monkeypatch.setattr(AdaptiveDrafter, "propose", counted_propose)

    def make() -> Drafter:
        drafter = AdaptiveDrafter([NgramDrafter.from_config(SpecConfig()), DraftModelDrafter(micro.draft, 0.6)],
                                  cost=fixed_cost(), min_acceptance=min_acceptance)
        for m in drafter.members:
            m.monitor.min_samples = min_samples
        counts.drafters.append(drafter)
        return drafter

    return make, counts


def test_adaptive_probes_switch_offs_and_a_sampled_member_keep_the_distribution(micro, lookup, monkeypatch):
    """At the default min-acceptance (0.4) under sampling: the n-gram member starts as dry-run probes,
    members whose drafts keep nothing are switched off, the draft model's sampled chains are verified,
    and a probe that kept tokens switches its member on (min_samples 1: the monitors judge every draft,
    so a 5-token output sees every transition)."""
    make, counts = lookup_and_model(micro, monkeypatch, min_acceptance=0.4, min_samples=1)
    s = sample(micro, make, lookup)
    assert_lossless(s, micro.dist(lookup), deep=False)
    assert counts.dry_runs >= N_SAMPLES and counts.switch_offs() >= N_SAMPLES // 2
    assert counts.sampled >= N_SAMPLES and counts.lookup >= 100  # both kinds of draft verified


# -- the adaptive drafter's two biases, re-introduced: the same harness must catch each --------------
# verify.py's rule: whether a node is verified never depends on its own token. adaptive.choose keeps it
# by pricing a sampled offer from its member's alpha and the costs alone, and by never merging it.


def test_harness_catches_adaptive_pricing_a_sampled_draft_by_its_drawn_length(micro, monkeypatch):
    """The bias d32b040 fixed (p = 8e-87): a sampled chain priced on its own length, so a chain that
    p-min stopped after x1 was dropped (one drafted token never pays under fixed_cost) where a longer
    one was kept."""
    choose = adaptive_mod.choose

    def by_drawn_length(offers, max_tokens, cost, greedy):
        drawn = [len(o.proposal) for o in offers if o.proposal.probs is not None]
        return choose(offers, min([max_tokens, *drawn]), cost, greedy)

    monkeypatch.setattr(adaptive_mod, "choose", by_drawn_length)
    s = sample(micro, adaptive(micro, lambda: [DraftModelDrafter(micro.draft, 0.6)]), n=1000)
    assert s.drafted > 500 and s.accepted > 250, (s.drafted, s.accepted)  # 1062 and 561 here: p = 2e-14
    assert chi2_pvalue(s.counts, micro.dist()) < ALPHA


def test_harness_catches_adaptive_merging_a_sampled_draft_with_a_look_up(micro, lookup, monkeypatch):
    """A sampled offer merged into the look-up members' trie: its first node is kept more often when a
    look-up member proposes the same token, so it wins where its x1 agrees (verified with its q) and
    the look-up's draft where it does not."""
    choose = adaptive_mod.choose

    def merged(offers, max_tokens, cost, greedy):
        lookups = [o for o in offers if o.proposal.probs is None]
        firsts = {o.proposal.token_ids[0] for o in lookups}
        backed = [o for o in offers if o.proposal.probs is not None and o.proposal.token_ids[0] in firsts]
        return choose(backed or lookups or offers, max_tokens, cost, greedy)

    monkeypatch.setattr(adaptive_mod, "choose", merged)
    # the draft asked at every step, its first too: a priced prompt catch-up would leave that step (a fifth
    # of a 5-token sample's) to the look-up, and with it most of the disagreements the bias lives on
    monkeypatch.setattr(DraftModelDrafter, "catch_up_seconds", lambda self, context: 0.0)
    make, counts = lookup_and_model(micro, monkeypatch, min_acceptance=0.0)
    s = sample(micro, make, lookup, n=1000)
    assert counts.sampled > 300 and counts.lookup > 300, (counts.sampled, counts.lookup)  # 808, 1145: p = 6e-15
    assert chi2_pvalue(s.counts, micro.dist(lookup)) < ALPHA


# -- a tree: an EAGLE-3 head's sampled tree ------------------------------------------------------------


def tiny_head(micro: Micro) -> EagleHead:
    """A random head over the whole 32-token vocabulary, its LM head the target's own rows: drafts
    near the target's p (accepted often), sharpened so its q differs from p (rejected often)."""
    if micro.head is None:
        config = EagleHeadConfig.for_target(micro.target.config, VOCAB)
        head = EagleHead(config)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in head.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.05)
            head.set_vocab(torch.arange(VOCAB))
            head.lm_head.weight.copy_(2.0 * micro.target.output_rows(torch.arange(VOCAB)))
        micro.head = head
    return micro.head


def eagle(micro: Micro, topk: int = 2, steps: int = 4, n: int = 4) -> EagleDrafter:
    return EagleDrafter(tiny_head(micro), micro.target, topk=topk, num_steps=steps, num_draft_tokens=n)


# The chain (topk 1: 27 s on 2 busy cores) is slow-marked: the tree draws through the same build_tree,
# and the adaptive EAGLE member's test verifies its trees cut to their first planned nodes.
@pytest.mark.parametrize("topk", [pytest.param(1, marks=pytest.mark.slow), 2], ids=["chain", "tree"])
def test_eagle_keeps_the_distribution(micro, topk):
    s = sample(micro, lambda: eagle(micro, topk=topk))
    assert_lossless(s, micro.dist(), trees=topk > 1, deep=False)


class DraftQ:
    """The draft model's q after a context (one pass over the whole context, under the sequence's
    temperature/top-k/top-p/min-p, as the draft-model drafter reads it: ``row_dist`` of its row), memoized across
    a test's sequences: 4000 samples visit a few thousand distinct contexts, so the test drafters below pay
    that many passes instead of one per drafted token (~20000, a minute on 2 cores)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner, self.cache = runner, {}

    def dist(self, tokens: list[int], params: SamplingParams) -> TokenDist:
        key = (params.temperature, params.top_k, params.top_p, params.min_p, tuple(tokens))
        if key not in self.cache:
            slot = self.runner.allocate()
            logits = self.runner.run([SeqInput(slot, tokens, all_logits=False)]).logits[0][-1].clone()
            self.runner.free(slot)
            self.cache[key] = row_dist(logits, params)
        return self.cache[key]

    def __call__(self, tokens: list[int], params: SamplingParams) -> torch.Tensor:
        return self.dist(tokens, params).probs()


class DraftModelChain(Drafter):
    """Test drafter: the draft-model drafter's chain (x_i drawn from q after the context and x_<i,
    q carried) through DraftQ: every step drafts its whole budget."""

    name = "draft-model-chain"

    def __init__(self, q: DraftQ) -> None:
        self.q = q

    def begin(self, prompt_ids, sampling):
        self.params, self.generator = sampling, make_generator(sampling.draft_seed, "cpu")

    def propose(self, context, max_tokens):
        token_ids, qs = [], []
        while len(token_ids) < max_tokens:
            dist = self.q.dist([*context, *token_ids], self.params)
            qs.append(dist.probs())
            token_ids.append(dist.draw(self.generator))
        return DraftProposal(token_ids, probs=torch.stack(qs)) if token_ids else DraftProposal([])


class DraftModelTree(DraftModelChain):
    """Test drafter: a sampled tree from the draft model's q, which is close to the target's: the
    root's first two children drawn without replacement (Gumbel top-k, as EAGLE draws them, child 2
    carrying q without child 1), then a chain under child 1. Width 2 and depth max_tokens - 1 with
    a fixed shape, so its paths are accepted 3 deep, which the random EAGLE head's are not.

    Example (max_tokens 4): tokens [c1, c2, d, e], parents [0, 0, 1, 3]."""

    name = "draft-model-tree"

    def propose(self, context, max_tokens):
        children = sampled_children(self.generator)(self.q(list(context), self.params), min(2, max_tokens))
        token_ids, parents, qs = [c.token for c in children], [0] * len(children), [c.q for c in children]
        path = token_ids[:1]
        while len(token_ids) < max_tokens:
            dist = self.q.dist([*context, *path], self.params)
            q = dist.probs()
            token_ids.append(dist.draw(self.generator))
            parents.append(1 if len(path) == 1 else len(token_ids) - 1)
            qs.append(q)
            path.append(token_ids[-1])
        return DraftProposal.from_tree(token_ids, parents, probs=torch.stack(qs))


def test_memoized_chain_draws_what_the_draft_model_drafter_draws(micro):
    """DraftModelChain (the processors' tests use it) is the draft-model drafter's chain: on the
    same seeds, the same outputs, drafts and acceptances."""
    real, memo = (sample(micro, make, n=200) for make in (draft_model(micro), lambda: DraftModelChain(micro.q)))
    assert real.counts == memo.counts and (real.drafted, real.accepted) == (memo.drafted, memo.accepted)
    assert real.accepted > 200


def test_sampled_tree_keeps_the_distribution(micro):
    s = sample(micro, lambda: DraftModelTree(micro.q))
    assert_lossless(s, micro.dist(), trees=True)


def draft_tree(micro: Micro) -> Callable[[], Drafter]:
    """The draft-model drafter's own sampled tree (--spec-draft-p-split): at uncertain positions of the
    main chain (top-k 3 leaves three candidates, the flatter draft often puts > 0.3 on the second) it
    branches into a sibling drawn without replacement from q, continued as a chain. A split halves the
    depth (breadth-first in a 6-node budget): p-split 0.3 splits about every third step."""
    return lambda: DraftModelDrafter(micro.draft, p_split=0.3, branches=2)


TREE_N_MAX = 6
TREE_MIN = N_SAMPLES // 4  # steps whose draft was a tree of width 2 (~2100 measured)


def test_draft_model_tree_keeps_the_distribution(micro):
    s = sample(micro, draft_tree(micro), draft_n_max=TREE_N_MAX)
    assert_lossless(s, micro.dist())
    assert s.trees > TREE_MIN, f"only {s.trees} tree drafts"


# -- the same harness catches a broken verifier, on chains and on trees -----------------------------------


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_harness_catches_resampling_from_p(micro, monkeypatch, shape):
    """The classic bug: after a rejection, sample from p instead of norm(max(0, p - q))."""
    monkeypatch.setattr(verify_mod, "_residual", lambda p, q, x: p)
    s = sample(micro, lambda: DraftModelChain(micro.q) if shape == "chain" else DraftModelTree(micro.q))
    assert_speculated(s, trees=shape == "tree")
    assert chi2_pvalue(s.counts, micro.dist()) < ALPHA


class OneToken(Drafter):
    """Test drafter: one token, deterministic (q one-hot) or drawn with q (uniform)."""

    name = "one-token"

    def __init__(self, sampled: bool) -> None:
        self.sampled = sampled

    def propose(self, context, max_tokens):
        q = torch.full((1, VOCAB), 1 / VOCAB)
        return DraftProposal([7], probs=q if self.sampled else None)


def test_n_min_drops_short_deterministic_drafts_only(micro):
    """A short deterministic draft is a function of the context: dropped. A short sampled one is
    verified (its length may follow its tokens)."""
    for sampled in (False, True):
        s = sample(micro, lambda sampled=sampled: OneToken(sampled), n=8, draft_n_min=2)
        assert (s.drafted > 0) == sampled


# -- every look-up drafter, on a prompt that repeats the target's greedy chain --------------------------

# Drafters that need nothing but tokens; ngram-mod's defaults (llama.cpp's) wait for 24-token repeats.
# Model drafters are tested below (draft-mtp at the end) and in their own files (test_layerskip.py).
LOOKUP_DRAFTERS = [t for t in SpecType if t not in (SpecType.NONE, SpecType.DRAFT_MODEL, SpecType.EAGLE3,
                                                     SpecType.DRAFT_SELF, SpecType.DRAFT_LAYERSKIP,
                                                     SpecType.DRAFT_MTP, SpecType.RETRIEVAL)]
SHORT_MATCHES = {SpecType.NGRAM_MOD: dict(ngram_mod_n_match=2, ngram_mod_n_min=1)}


def lookup_case(target: ModelRunner) -> Case:
    """The target's greedy chain from token 3, twice, then its start again: look-up drafters propose
    the chain's rest, which the sampled target follows now and then."""
    probe = SequenceState([3], SamplingParams(max_new_tokens=6, ignore_eos=True))
    Engine(target).run_batch([probe])
    chain = probe.output_ids
    return Case(prompt=(3, *chain, 3, *chain, 3, *chain[:2]))


@pytest.fixture(scope="module")
def lookup(micro) -> Case:
    return lookup_case(micro.target)


def registry_drafter(target: ModelRunner, kind: SpecType) -> Callable[[], Drafter]:
    """Fresh drafters of ``kind`` as the registry builds them, sharing its resources (suffix cache,
    n-gram pool) across the run's sequences as a server's requests do."""
    # adaptive's members with min_acceptance 0: never switched off, so verified from the first step
    # (at 0.4 a sampled request's look-up members start as dry runs, and 5 tokens end first)
    never_off = dict(min_acceptance=0.0) if kind is SpecType.ADAPTIVE else {}
    spec = SpecConfig(types=(kind,), draft_n_max=4, **never_off, **SHORT_MATCHES.get(kind, {}))
    resources = DraftResources(spec, target, None)

    def make() -> Drafter:
        drafter = resources.new_drafter()
        if isinstance(drafter, AdaptiveDrafter):
            drafter.cost = None  # verify what the members propose, whatever the timings
        return drafter

    return make


@pytest.mark.parametrize("kind", LOOKUP_DRAFTERS, ids=lambda k: k.value)
def test_lookup_drafters_keep_the_distribution(micro, lookup, kind):
    s = sample(micro, registry_drafter(micro.target, kind), lookup)
    assert_lossless(s, micro.dist(lookup), deep=False)


BLOCK_FILTERS = {"min-p": dict(top_k=0, temperature=0.8, min_p=0.2), "top-k": dict(top_k=TOP_K),
                 "top-p": dict(top_k=0, temperature=0.8, top_p=0.7), "all": dict(top_k=4, top_p=0.9, min_p=0.1)}


@pytest.mark.parametrize("filters,broken", [(f, False) for f in BLOCK_FILTERS] + [("top-p", True), ("min-p", True)],
                         ids=lambda x: x if isinstance(x, str) else ("resampling-from-p" if x else "real"))
def test_lookup_drafts_over_block_rows_keep_the_distribution(micro, lookup, monkeypatch, filters, broken):
    """Each row the verifier reads is a ``row_dist.BlockDist`` (counted), its probabilities, filters and draws from
    64-column blocks, against the exact distribution from torch's softmax; the same harness catches resampling from p
    after a rejected draft."""
    from specdec.row_dist import BlockDist

    case = replace(lookup, params=replace(PARAMS, **BLOCK_FILTERS[filters]))
    made = []
    init = BlockDist.__init__
    monkeypatch.setattr(BlockDist, "__init__", lambda self, *a: made.append(1) or init(self, *a))
    if broken:
        monkeypatch.setattr(verify_mod, "_residual", lambda p, q, x: p)
    s = sample(micro, registry_drafter(micro.target, SpecType.NGRAM), case)
    assert len(made) > N_SAMPLES * OUT_LEN // 2
    if broken:
        assert_speculated(s, deep=False)
        assert chi2_pvalue(s.counts, micro.dist(case)) < ALPHA
    else:
        assert_lossless(s, micro.dist(case), deep=False)


def test_draft_self_keeps_the_distribution(micro, lookup):
    """draft-self copies the output's own earlier continuations (never the prompt): with a 1-token
    key, 5-token outputs repeat often enough to draft (its default 3-token key needs longer ones),
    most after the look-up prompt, whose chain the target keeps cycling through."""
    s = sample(micro, lambda: DraftSelfDrafter(key_size=1, max_tokens=4), lookup)
    assert_lossless(s, micro.dist(lookup), deep=False, min_drafted=N_SAMPLES // 4)


# -- the quantized target: GGUF Q4_1 blocks on the integer-dot kernels ---------------------------------


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> ModelRunner:
    """A micro target (width 32: GGUF's blocks) quantized to Q4_1 at load, on the fused CPU kernels:
    its own distribution, which speculation must keep too."""
    folder = build_micro(tmp_path_factory.mktemp("micro-q4_1"), seed=0, hidden=32)
    return load_runner(str(folder), max_seq_len=MAX_LEN, num_slots=BATCH, quantization="q4_1")[0]


def test_quantized_target_keeps_the_distribution(micro, quantized):
    """Look-up drafts (one-hot q): the verify rows come from the integer-dot kernels' multi-row passes."""
    assert quantized.weights_label.startswith("gguf Q4_1")
    case = lookup_case(quantized)
    s = sample(micro, registry_drafter(quantized, SpecType.NGRAM), case, target=quantized)
    assert_lossless(s, exact_distribution(quantized, case), deep=False)


# -- adaptive merging two deterministic members' chains into a tree; a verifier that accepts all -----


def test_adaptive_merged_trees_keep_the_distribution(micro, lookup):
    """n-gram look-up and a second opinion that agrees on the first token, then differs: with
    pass costs unmeasured (cost None) everything within the budget is verified, as one tree."""
    s = sample(micro, lambda: MergingDrafter(split_at=1, vocab_size=VOCAB, min_acceptance=0.0), lookup)
    assert_lossless(s, micro.dist(lookup), trees=True, deep=False, min_drafted=N_SAMPLES // 2)


def test_harness_catches_a_verifier_that_accepts_every_draft(micro, lookup, monkeypatch):
    """Deterministic drafts (one-hot q) taken whole: the longest path, then a bonus token."""
    real = verify_mod.verify_sampling

    def accept_always(tree, target_probs, draft_probs, generator):
        path = tree.path_to(max(range(tree.num_nodes), key=lambda n: tree.depths[n]))
        last = real(tree, target_probs, draft_probs, generator)  # for a bonus token only
        return verify_mod.VerifyResult([tree.tokens[n] for n in path[1:]] + last.token_ids[-1:], path)

    monkeypatch.setattr(verify_mod, "verify_sampling", accept_always)
    s = sample(micro, registry_drafter(micro.target, SpecType.NGRAM), lookup)
    assert s.drafted > N_SAMPLES
    assert chi2_pvalue(s.counts, micro.dist(lookup)) < ALPHA


# -- draft-mtp: an MTP module's sampled chains ---------------------------------------------------------


@pytest.fixture(scope="module")
def mtp_head(micro, tmp_path_factory) -> MtpHead:
    """An MTP module for the micro target: its block, norm and head the target's own (read from the
    same seed's checkpoint), ``eh_proj = [I, small noise]``, ``enorm`` at the embeddings' scale:
    near the target's next-token distribution (accepted often), not equal to it (rejected often)."""
    from safetensors.torch import load_file

    w = load_file(build_micro(tmp_path_factory.mktemp("micro-mtp"), seed=0) / "model.safetensors")
    gen = torch.Generator().manual_seed(7)
    H = micro.target.config.hidden_size
    parts = {"input_layernorm": "input_layernorm", "post_attention_layernorm": "post_attention_layernorm",
             "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
             "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
             "down_proj": "mlp.down_proj"}
    weights = {ours: w[f"model.layers.0.{hf}.weight"] for ours, hf in parts.items()}
    rms = w["model.embed_tokens.weight"].pow(2).mean(-1).sqrt().mean()  # enorm(e) ~ e
    weights |= dict(enorm=rms * torch.ones(H), hnorm=torch.ones(H), shared_head_norm=w["model.norm.weight"],
                    lm_head=w["lm_head.weight"], eh_proj=torch.cat([torch.eye(H), 0.1 * torch.randn(H, H, generator=gen)
                                                                     / H**0.5], dim=1))
    return MtpHead(MtpHeadConfig(block=micro.target.config, layout="deepseek"), weights)


def test_mtp_chain_keeps_the_distribution(micro, mtp_head):
    """Sampled chains of 3 from the module's own q (the recurrent steps included), verified by rejection."""
    s = sample(micro, lambda: MtpDrafter(mtp_head, micro.target, 3), draft_n_max=3)
    assert_lossless(s, micro.dist())


@pytest.mark.slow  # 20 s; test_harness_catches_resampling_from_p pins the harness on chains by default
def test_harness_catches_resampling_from_p_with_mtp(micro, mtp_head, monkeypatch):
    """The MTP chain's test has teeth: the same samples with a verifier that resamples from p fail it."""
    monkeypatch.setattr(verify_mod, "_residual", lambda p, q, x: p)
    s = sample(micro, lambda: MtpDrafter(mtp_head, micro.target, 3), draft_n_max=3)
    assert_speculated(s)
    assert chi2_pvalue(s.counts, micro.dist()) < ALPHA


# -- P-EAGLE: chains and trees from a parallel head's K distributions of one pass --------------------------


@pytest.fixture(scope="module")
def parallel_head(micro) -> EagleHead:
    """``tiny_head``'s recipe with K = 3 parallel positions: its mask entries, random, also draft near
    the target's p (the LM head is the target's, sharpened), so drafts past the root are accepted too."""
    head = EagleHead(EagleHeadConfig.for_target(micro.target.config, VOCAB, parallel_tokens=3))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.dim() == 2 or name.startswith("mask_"):
                p.normal_(0.0, 0.05)
        head.set_vocab(torch.arange(VOCAB))
        head.lm_head.weight.copy_(2.0 * micro.target.output_rows(torch.arange(VOCAB)))
    return head


def parallel(micro: Micro, head: EagleHead, topk: int) -> Callable[[], Drafter]:
    return lambda: EagleDrafter(head, micro.target, topk=topk, num_steps=3, num_draft_tokens=4, parallel=True)


# trees of 4 nodes from the 3 positions, and (slow: 30 s, the tree covers its path) a chain of 3
@pytest.mark.parametrize("topk", [2, pytest.param(1, marks=pytest.mark.slow)])
def test_parallel_drafting_keeps_the_distribution(micro, parallel_head, topk):
    """Each node carries the q of its depth's position, the distribution it was drawn from."""
    s = sample(micro, parallel(micro, parallel_head, topk))
    assert_lossless(s, micro.dist(), trees=topk > 1, deep=False)


@pytest.mark.slow  # 30 s; test_harness_catches_resampling_from_p pins the harness on chains and trees by default
def test_harness_catches_resampling_from_p_with_parallel_drafting(micro, parallel_head, monkeypatch):
    """The parallel chain's test has teeth: a verifier that resamples from p fails it on the same samples."""
    monkeypatch.setattr(verify_mod, "_residual", lambda p, q, x: p)
    s = sample(micro, parallel(micro, parallel_head, 1))
    assert_speculated(s, deep=False)
    assert chi2_pvalue(s.counts, micro.dist()) < ALPHA
