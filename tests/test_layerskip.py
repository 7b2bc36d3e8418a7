"""draft-layerskip: layer-subset passes, the target's cache around a draft, greedy identity, the
sampled distribution (the 4000-sample harness of test_lossless_sampling), the skip-set search,
bad input.

The models are tiny random Llamas whose "quiet" layers add little to the residual (their
output projections scaled down), so a draft that skips them is often right and sometimes
wrong: a test that passes by never accepting would prove nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import specdec.verify as verify_mod
from specdec.config import SamplingParams, SpecConfig, SpecType, parse_layer_list
from specdec.drafters.layerskip import LayerSkipDrafter, SkipSearch, initial_sets, label, layer_share, neighbours
from specdec.drafters.registry import DraftResources, adaptive_members
from specdec.engine import Engine, SequenceState
from specdec.runners.base import ModelRunner, SeqInput
from specdec.runners.load import load_runner
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

NUM_LAYERS, QUIET = 4, (1, 2, 3)  # the greedy model: layers 1-3 add little


def build_skippable(folder: Path, num_layers: int, quiet: tuple[int, ...], vocab: int, hidden: int,
                    seed: int = 0, quiet_scale: float = 0.15) -> Path:
    """A random Llama whose ``quiet`` layers' o_proj and down_proj are scaled by ``quiet_scale``."""
    return build_micro(folder, seed, hidden=hidden, num_layers=num_layers, vocab=vocab, head_dim=hidden // 2,
                       max_positions=128, quiet=quiet, quiet_scale=quiet_scale)


@pytest.fixture(scope="module")
def skippable(tmp_path_factory) -> Path:
    return build_skippable(tmp_path_factory.mktemp("skippable"), NUM_LAYERS, QUIET, vocab=512, hidden=32)


_RUNNERS: dict[tuple, ModelRunner] = {}


def runner_for(folder: Path, backend: str, quantization: str | None = None) -> ModelRunner:
    key = (folder, backend, quantization)
    if key not in _RUNNERS:
        _RUNNERS[key] = load_runner(str(folder), max_seq_len=96, num_slots=2, backend=backend,
                                    quantization=quantization)[0]
    return _RUNNERS[key]


def search(runner: ModelRunner, skipped=None, exit_after=None) -> SkipSearch:
    return SkipSearch(runner.num_layers, layer_share(runner), skipped, exit_after)


PROMPT_IDS = [5, 17, 99, 3, 250, 17, 99, 3, 41]

# -- the runner: layer subsets, and the target's cache around a draft ---------------------------------------


@pytest.mark.parametrize("backend", ["cpu-kernels", "torch"])
def test_a_rolled_back_draft_leaves_the_target_cache_bit_identical(skippable, backend):
    runner = runner_for(skippable, backend)
    slot = runner.allocate()
    try:
        runner.run([SeqInput(slot, PROMPT_IDS[:-1], all_logits=False)])
        length = runner.lengths[slot]
        runner.cache.k_all[:, slot, :, length:] = float("nan")  # stale entries: a write shows
        k_before, v_before = runner.cache.k_all[:, slot].clone(), runner.cache.v_all[:, slot].clone()
        drafter = LayerSkipDrafter(runner, search(runner, skipped=(1, 3)))
        drafter.bind_slot(slot)
        drafter.begin(PROMPT_IDS, SamplingParams(max_new_tokens=8))
        proposal = drafter.propose(PROMPT_IDS, 4)
        assert len(proposal) == 4 and runner.lengths[slot] == length
        k_after, v_after = runner.cache.k_all[:, slot], runner.cache.v_all[:, slot]
        # below the length: every layer untouched, bit for bit
        assert torch.equal(k_after[:, :, :length], k_before[:, :, :length])
        assert torch.equal(v_after[:, :, :length], v_before[:, :, :length])
        # after it: the draft wrote its 4 passes' K/V (root + 3 tokens) for the layers it ran only
        new = slice(length, length + 4)
        for layer in range(NUM_LAYERS):
            written = not k_after[layer, :, new].isnan().any()
            assert written == (layer not in (1, 3)), layer
            assert k_after[layer, :, length + 4 :].isnan().all()
    finally:
        runner.cache.k_all[:, slot].zero_()
        runner.free(slot)


@pytest.mark.parametrize("backend", ["cpu-kernels", "torch"])
def test_a_draft_pass_of_every_layer_equals_the_full_pass(skippable, backend):
    runner = runner_for(skippable, backend)
    slot = runner.allocate()
    try:
        runner.run([SeqInput(slot, PROMPT_IDS[:-1], all_logits=False)])
        length = runner.lengths[slot]
        full = runner.run([SeqInput(slot, PROMPT_IDS[-1:])]).logits[0]
        runner.truncate(slot, length)
        every = runner.run([SeqInput(slot, PROMPT_IDS[-1:])], layers=tuple(range(NUM_LAYERS))).logits[0]
        runner.truncate(slot, length)
        skipping = runner.run([SeqInput(slot, PROMPT_IDS[-1:])], layers=(0, 2)).logits[0]
        assert torch.equal(full, every)
        assert not torch.equal(full, skipping)
    finally:
        runner.free(slot)


@pytest.mark.parametrize("quantization", [None, "q4_1"])
def test_layers_before_the_first_skipped_one_compute_what_the_full_pass_does(skippable, quantization):
    """On the fused kernels (float and GGUF blocks) a draft's K/V and hidden states of layers 0..first
    skipped - 1 are bit-identical to the verify pass's: what a verify pass could reuse."""
    runner = runner_for(skippable, "cpu-kernels", quantization)
    slot = runner.allocate()
    try:
        runner.run([SeqInput(slot, PROMPT_IDS[:-1], all_logits=False)])
        length = runner.lengths[slot]
        chain = [PROMPT_IDS[-1], 7, 300]
        new = slice(length, length + len(chain))
        draft = runner.run([SeqInput(slot, chain)], hidden_layers=(0,), layers=(0, 3))  # layers 1 and 2 skipped
        k_draft, v_draft = runner.cache.k_all[0, slot, :, new].clone(), runner.cache.v_all[0, slot, :, new].clone()
        runner.truncate(slot, length)
        full = runner.run([SeqInput(slot, chain)], hidden_layers=(0,))
        assert torch.equal(draft.hidden[0][0], full.hidden[0][0])
        assert torch.equal(runner.cache.k_all[0, slot, :, new], k_draft)
        assert torch.equal(runner.cache.v_all[0, slot, :, new], v_draft)
        assert not torch.equal(draft.logits[0], full.logits[0])  # layers 1 and 2 did change the output
    finally:
        runner.free(slot)


def test_layer_indices_out_of_range_are_refused(skippable):
    runner = runner_for(skippable, "cpu-kernels")
    slot = runner.allocate()
    try:
        with pytest.raises(ValueError, match="layer indices must be in"):
            runner.run([SeqInput(slot, [5])], layers=(0, NUM_LAYERS))
    finally:
        runner.free(slot)


# -- greedy identity ----------------------------------------------------------------------------------------


def generate(runner: ModelRunner, drafter, n: int = 24) -> SequenceState:
    seq = SequenceState(PROMPT_IDS, SamplingParams(max_new_tokens=n, ignore_eos=True), drafter=drafter)
    for _ in Engine(runner, draft_n_max=4, plan_drafts=False).generate(seq):
        pass
    return seq


@pytest.mark.parametrize("backend", ["cpu-kernels", "cpu-kernels q4_1", "torch"])
@pytest.mark.parametrize("mode", ["skip", "exit", "auto"])
def test_greedy_identity(skippable, backend, mode):
    runner = runner_for(skippable, *backend.split())
    plain = generate(runner, None).output_ids
    pinned = dict(skip=dict(skipped=(1, 2)), exit=dict(exit_after=3), auto={})[mode]
    drafter = LayerSkipDrafter(runner, search(runner, **pinned))
    seq = generate(runner, drafter)
    assert seq.output_ids == plain
    assert seq.stats.drafted > 0 and seq.stats.accepted > 0, (seq.stats.drafted, seq.stats.accepted)
    assert 0 < seq.stats.acceptance_rate < 1  # accepted often, and rejected too
    # stats name the skip sets drafted with, with their acceptance
    used = {name for name in seq.stats.drafter_windows if name.startswith("draft-layerskip skip ")}
    assert used and sum(seq.stats.drafter_windows[n].drafted for n in used) == seq.stats.drafted
    if mode != "auto":
        assert used == {f"draft-layerskip {label((1, 2) if mode == 'skip' else (3,))}"}


def test_greedy_identity_through_resources_and_adaptive(skippable):
    """The registry builds it (the search shared by requests); adaptive asks it when the flags say so."""
    runner = runner_for(skippable, "cpu-kernels")
    plain = generate(runner, None).output_ids
    spec = SpecConfig(types=(SpecType.ADAPTIVE,), layerskip_exit=3, adaptive_layerskip=True)
    resources = DraftResources(spec, runner, tokenizer=None)
    drafter = resources.new_drafter()
    drafter.cost = None  # verify what members propose (pass costs on a busy machine may say not to)
    seq = generate(runner, drafter)
    assert seq.output_ids == plain
    assert seq.stats.drafted_by.get("draft-layerskip", 0) > 0 and seq.stats.accepted_by.get("draft-layerskip", 0) > 0
    assert resources.state(SpecType.DRAFT_LAYERSKIP).trials[(3,)].steps > 0


# -- the sampled distribution: 4000 samples, 5-token outputs, a broken verifier caught ------------------------


@pytest.fixture(scope="module")
def micro3(tmp_path_factory) -> Micro:
    """The harness's micro model with 3 layers, 1 and 2 quiet: skipping layer 1, or exiting after
    layer 2, drafts close to the target."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = build_skippable(tmp_path_factory.mktemp("micro3"), 3, (1, 2), vocab=32, hidden=16, quiet_scale=0.3)
    target = load_runner(str(folder), max_seq_len=16, num_slots=BATCH, backend="torch")[0]
    yield Micro(target, target, {}, DraftQ(target))
    torch.set_num_threads(threads)


def layerskip(micro: Micro, **pinned):
    shared = SkipSearch(micro.target.num_layers, layer_share(micro.target), **pinned)
    return lambda: LayerSkipDrafter(micro.target, shared)


def test_skip_mode_keeps_the_distribution(micro3):
    s = sample(micro3, layerskip(micro3, skipped=(1,)))
    assert_lossless(s, micro3.dist())


@pytest.mark.slow  # 15 s; skip mode's 4000-sample test stays in the default suite
def test_early_exit_with_p_min_keeps_the_distribution(micro3):
    """Exit after layer 2 (layer 2 skipped), the chain stopped where q is unsure: its length follows
    its own tokens, so a short sampled chain must be verified all the same (n-min 2 would drop it)."""
    shared = SkipSearch(3, layer_share(micro3.target), exit_after=2)
    s = sample(micro3, lambda: LayerSkipDrafter(micro3.target, shared, p_min=0.35), draft_n_min=2)
    assert_lossless(s, micro3.dist())


@pytest.mark.slow  # 15-50 s; the default suite shows the same harness catching it with a draft model's chains
def test_harness_catches_resampling_from_p_with_layerskip(micro3, monkeypatch):
    monkeypatch.setattr(verify_mod, "_residual", lambda p, q, x: p)
    s = sample(micro3, layerskip(micro3, skipped=(1,)))
    assert_speculated(s)
    assert chi2_pvalue(s.counts, micro3.dist()) < ALPHA


# -- the skip-set search ------------------------------------------------------------------------------------


def drive(search: SkipSearch, acceptance: dict[tuple[int, ...], float], steps: int) -> list[tuple[int, ...]]:
    """Feed the search drafts of 4 tokens, each set accepted as ``acceptance`` says (default 0.5)."""
    used = []
    for _ in range(steps):
        s = search.current
        used.append(s)
        search.record(s, 4, round(4 * acceptance.get(s, 0.5)))
    return used


def test_search_tries_the_initial_sets_then_neighbours_of_the_best_and_settles():
    sets = initial_sets(12)
    assert sets[0] == (4, 6, 8) and all(0 < len(s) < 12 for s in sets) and len(set(sets)) == len(sets)
    good = sets[2]
    search = SkipSearch(12, 1 / 14, trial_steps=2)
    used = drive(search, {good: 1.0}, 200)
    order = list(dict.fromkeys(used))
    assert order[: len(sets)] == sets  # each initial set had its trial, in order
    assert order[len(sets)] == neighbours(good, 12)[0]  # then the greedy moves from the best
    assert search.best == good and used[-20:] == [good] * 20  # settled on it
    again = SkipSearch(12, 1 / 14, trial_steps=2)
    assert drive(again, {good: 1.0}, 200) == used  # deterministic given the counts


def test_search_prefers_cheaper_drafts_at_equal_acceptance():
    search = SkipSearch(12, 1 / 14, trial_steps=2)
    drive(search, {}, 300)  # every set accepted alike: skipping more layers is cheaper
    assert len(search.best) == max(len(s) for s in search.trials)


def test_pinned_sets_never_move():
    search = SkipSearch(12, 1 / 14, skipped=(5, 3), trial_steps=1)
    assert set(drive(search, {}, 20)) == {(3, 5)}
    assert SkipSearch(12, 1 / 14, exit_after=9).current == (9, 10, 11)


# -- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,message", [
    (dict(skipped=(0, 12)), "this model has layers 0-11"),
    (dict(skipped=tuple(range(12))), "skips every layer"),
    (dict(exit_after=12), "must be in \\[1, 11\\]"),
])
def test_bad_skip_sets_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SkipSearch(12, 1 / 14, **kwargs)


def test_bad_flags_are_refused():
    with pytest.raises(ValueError, match="not both"):
        SpecConfig(types=(SpecType.DRAFT_LAYERSKIP,), layerskip_layers=(1,), layerskip_exit=2)
    with pytest.raises(ValueError, match="comma list of layer indices"):
        parse_layer_list("1,x")
    assert parse_layer_list("auto") is None and parse_layer_list("5, 3,5") == (3, 5)
    with pytest.raises(ValueError, match="2 or more layers"):
        SkipSearch(1, 0.5)


def test_adaptive_asks_layerskip_only_when_its_flags_are_given():
    assert SpecType.DRAFT_LAYERSKIP not in adaptive_members(SpecConfig())
    assert SpecType.DRAFT_LAYERSKIP in adaptive_members(SpecConfig(layerskip_layers=(3,), adaptive_layerskip=True))
