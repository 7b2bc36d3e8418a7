"""The draft -> verify -> commit loop, for one sequence or a batch of them.

State of a sequence between steps: the KV cache holds every committed token but
the newest one, the *root*. A step drafts tokens after the root, runs the root
and the draft through the target in one pass, lets the verifier keep a prefix
(plus one recovered or bonus token), and compacts the cache to the kept path.
Plain decoding is the same step with an empty draft.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from specdec.budget import DraftCost, plan_draft_lengths
from specdec.config import SamplingParams
from specdec.drafters.base import Drafter, DraftProposal
from specdec.errors import ContextOverflowError
from specdec.logprobs import LogprobsMode, TokenLogprob, output_logprobs, token_logprobs
from specdec.monitor import Mode, SpecMonitor, draft_sample
from specdec.pass_cost import acceptance_floor, pass_width
from specdec.processors import SequenceProcessors
from specdec.row_dist import inverse_temperature
from specdec.runners.base import ModelRunner, SeqInput
from specdec.sampling import make_generator
from specdec.stats import SpecStats
from specdec.tree import DraftTree
from specdec.verify import VerifyResult, verify, verify_argmax

# Prompt tokens per prefill pass of a sequence that asked for prompt logprobs: its [rows, V]
# float32 logits and their log-softmax stay near 2 x 256 x V x 4 bytes (100 MB at V = 49K).
PROMPT_LOGPROB_ROWS = 256


@dataclass
class SequenceState:
    """One sequence being generated: its tokens, cache slot, drafter, sampler and counters."""

    prompt_ids: list[int]
    params: SamplingParams
    drafter: Drafter | None = None
    should_stop: Callable[[list[int]], bool] | None = None  # e.g. a stop string was produced
    tokens: list[int] = field(default_factory=list)  # prompt + output: every committed token
    slot: int = -1
    generator: torch.Generator | None = None
    stats: SpecStats = field(default_factory=SpecStats)
    monitor: SpecMonitor = field(default_factory=SpecMonitor)  # recent alpha, tau, speedup; on/off (set by start)
    finish_reason: str | None = None  # "stop" or "length"
    processors: SequenceProcessors | None = None  # penalties, logit_bias, grammar, ... (None: none asked)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per output token, when params.logprobs is set
    prompt_logprobs: list[TokenLogprob | None] | None = None  # per prompt token (the first None), when asked
    draft_cost: DraftCost = field(default_factory=DraftCost)  # what its drafting costs a token (the plan's price)

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[len(self.prompt_ids) :]

    @property
    def num_output(self) -> int:
        return len(self.tokens) - len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Draft:
    seq: SequenceState
    proposal: DraftProposal
    cache_len: int  # the sequence's cache length before this pass
    drafter: str | None  # who proposed it (a chain's member), None without a draft
    seconds: float  # spent drafting
    catch_up: float  # the part of ``seconds`` spent catching up on the prompt (once a request)
    budget: int  # most tokens it was allowed (0: held off by the monitor or the cost of the batch)


@dataclass(frozen=True, kw_only=True)
class PassTiming:
    """How long the step's target pass took and how wide it was (shared by its sequences)."""

    seconds: float
    rows: int  # tokens run, over all sequences
    batch: int
    padded: bool  # every sequence got the widest one's rows
    plain_seconds_per_token: float | None  # what a plain pass of this batch costs per sequence, if measured

    def share(self, num_rows: int) -> float:
        """Seconds of the pass that fall to a sequence of ``num_rows`` rows (an equal part if padded)."""
        return self.seconds / self.batch if self.padded else self.seconds * num_rows / self.rows


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """What one step did for one sequence (callers read this, never diff ``SpecStats``)."""

    token_ids: list[int]  # committed by this step, cut at EOS / max_new_tokens
    num_drafted: int
    num_accepted: int  # drafted tokens kept (the recovered or bonus token not counted)
    drafter: str | None  # which drafter proposed the draft; None when nothing was drafted
    draft_seconds: float  # this sequence's drafting
    pass_seconds: float  # the target pass, shared by every sequence of the step
    pass_rows: int  # tokens that pass ran, over all sequences
    finish_reason: str | None
    # Drafted tokens past the accepted ones, which the target turned down (for a tree, the first
    # branch below the last accepted node): what a viewer shows struck through.
    rejected_ids: list[int] = field(default_factory=list)
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token of token_ids, when params.logprobs is set
    origins: tuple[str, ...] = ()  # per accepted token: the drafter that proposed it (trees may mix drafters)
    drafted_by: tuple[tuple[str, int], ...] = ()  # drafted tokens per drafter
    spec_state: str = "none"  # the sequence's monitor after the step: "on", "off", "probe"; "none": no drafter

    @classmethod
    def empty(cls, finish_reason: str | None) -> StepResult:
        """A step that committed nothing and ran no pass (a prompt whose prefill was all, tests)."""
        return cls(token_ids=[], num_drafted=0, num_accepted=0, drafter=None, draft_seconds=0.0,
                   pass_seconds=0.0, pass_rows=0, finish_reason=finish_reason)


class Engine:
    def __init__(
        self, runner: ModelRunner, draft_n_max: int = 8, draft_n_min: int = 0, plan_drafts: bool = True,
        min_acceptance: float = 0.4, logprobs_mode: LogprobsMode = LogprobsMode.RAW_LOGPROBS,
    ) -> None:
        self.runner = runner
        self.logprobs_mode = LogprobsMode(logprobs_mode)  # which values logprobs report (logprobs.py)
        self.draft_n_max = draft_n_max
        self.draft_n_min = draft_n_min
        # plan_drafts: each step's draft lengths follow from the measured cost of the batch's pass
        # (budget.py), and a sequence's monitor switches speculation off where it does not pay
        # (monitor.py). Off: every sequence with a drafter drafts up to the cap (tests that must draft).
        self.plan_drafts = plan_drafts
        self.min_acceptance = min_acceptance

    # -- lifecycle ---------------------------------------------------------------------------
    def check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_ids) >= self.runner.max_seq_len:
            raise ContextOverflowError(
                f"the prompt has {len(prompt_ids)} tokens but the context holds "
                f"{self.runner.max_seq_len}; shorten it or raise --max-model-len"
            )

    def start(self, seqs: list[SequenceState], prefill: bool = True) -> float:
        """Allocate cache slots and prefill every prompt but its last token (the first root).

        Returns the seconds of the prefill passes (0.0 when no prompt needed one). ``prefill=False``:
        only the slots and state; the caller prefills in steps of its choosing (``prefill``), as the
        server does to interleave a long prompt with other requests' decoding.
        """
        for seq in seqs:
            self.check_prompt(seq.prompt_ids)
            # a freed slot's cached start of this prompt is reused, unless the prompt's own passes are wanted:
            # its logprobs, or a drafter that reads the target's hidden states of every token
            reuse = seq.params.prompt_logprobs is None and not (seq.drafter is not None and seq.drafter.hidden_layers)
            seq.slot = self.runner.allocate(seq.prompt_ids[:-1] if reuse else ())
            seq.stats.prompt_tokens = len(seq.prompt_ids)
            seq.stats.cached_prompt_tokens = self.runner.lengths[seq.slot]
            seq.monitor = SpecMonitor(self.min_acceptance,
                                      switching=seq.drafter is None or not seq.drafter.switches_itself)
            if not seq.params.greedy:
                seq.generator = make_generator(seq.params.seed, self.runner.device)
            if seq.drafter is not None:
                seq.drafter.bind_slot(seq.slot)
                seq.drafter.begin(seq.prompt_ids, seq.params)
            if seq.params.prompt_logprobs is not None:
                seq.prompt_logprobs = [None]
            if seq.params.max_new_tokens == 0:  # scoring a prompt (echo, max_tokens 0): the prefill is all
                seq.finish_reason = "length"
        seconds = 0.0
        while prefill and not all(self.prefilled(s) for s in seqs):
            seconds += self.prefill(seqs)
        return seconds

    def prefilled(self, seq: SequenceState) -> bool:
        """Every prompt token but the last is in the cache."""
        return self.runner.lengths[seq.slot] >= len(seq.prompt_ids) - 1

    def prefill(self, seqs: list[SequenceState], max_tokens: int | None = None) -> float:
        """Cache the next prompt tokens of each sequence not yet prefilled: all the rest in one pass
        (``max_tokens`` None) or at most ``max_tokens``. A sequence scoring its prompt runs in
        PROMPT_LOGPROB_ROWS chunks: each pass's logits [chunk, V] are ranked and dropped, so memory
        stays bounded at any prompt length and n (fused rows: the same bits). Returns the seconds."""
        todo = [s for s in seqs if not self.prefilled(s)]
        plain = [s for s in todo if s.prompt_logprobs is None]
        seconds = self._prefill(plain, [self._next_chunk(s, max_tokens, all_logits=False) for s in plain])
        for s in todo:
            if s.prompt_logprobs is not None:
                rows = PROMPT_LOGPROB_ROWS if max_tokens is None else min(max_tokens, PROMPT_LOGPROB_ROWS)
                seconds += self._prefill([s], [self._next_chunk(s, rows)], self.runner.lengths[s.slot])
        return seconds

    def _next_chunk(self, seq: SequenceState, max_tokens: int | None, all_logits: bool = True) -> SeqInput:
        start = self.runner.lengths[seq.slot]
        end = len(seq.prompt_ids) - 1 if max_tokens is None else min(start + max_tokens, len(seq.prompt_ids) - 1)
        return SeqInput(seq.slot, seq.prompt_ids[start:end], all_logits=all_logits)

    def _prefill(self, seqs: list[SequenceState], inputs: list[SeqInput], start: int = 0) -> float:
        """One prefill pass of ``inputs`` (one per sequence); with all logits, the prompt logprobs
        of the tokens they predict (prompt tokens start + 1 on). Returns its seconds."""
        if not seqs:
            return 0.0
        layers = hidden_layers(seqs)
        out = self.runner.run(inputs, layers)
        for i, (s, logits) in enumerate(zip(seqs, out.logits, strict=True)):
            _observe(s, layers, out.hidden[i] if layers else [], None)
            s.stats.target_forwards += 1
            s.stats.prefill_seconds += out.seconds
            s.stats.target_seconds += out.seconds
            if inputs[i].all_logits:  # row i predicts prompt token start + i + 1
                targets = s.prompt_ids[start + 1 : start + 1 + len(inputs[i].token_ids)]
                s.prompt_logprobs.extend(token_logprobs(logits, targets, s.params.prompt_logprobs))
        return out.seconds

    def finish(self, seq: SequenceState) -> None:
        if seq.slot >= 0:
            self.runner.free(seq.slot, seq.tokens)
            seq.slot = -1
        if seq.drafter is not None:
            seq.drafter.end(seq.tokens)

    # -- one step ----------------------------------------------------------------------------
    def step(self, seqs: list[SequenceState], draft_budget: int | None = None) -> list[StepResult]:
        """Draft, verify and commit once for every running sequence; what each one got.

        draft_budget: at most this many drafted tokens per sequence this step (default
        ``draft_n_max``; the server's ``DraftBudget`` caps). Within it the engine plans.
        """
        cap = self.draft_n_max if draft_budget is None else min(draft_budget, self.draft_n_max)
        drafts = [self._draft(seq, k) for seq, k in zip(seqs, self._plan(seqs, cap), strict=True)]
        if self.runner.pads_batches:
            # A padded pass gives every row the widest one's width, and each row writes that many
            # cache entries: cut drafts so the padded width fits the fullest row's cache.
            room = min(self.runner.max_seq_len - d.cache_len for d in drafts)
            for d in drafts:
                d.proposal = d.proposal.truncate(room - 1)
        inputs = [
            SeqInput(d.seq.slot, [d.seq.tokens[-1], *d.proposal.token_ids], self._parents(d.proposal))
            for d in drafts
        ]
        layers = hidden_layers(seqs)
        argmax = all(_argmax_suffices(s) for s in seqs)
        blocks = [] if argmax else [_block_temperature(s) for s in seqs]
        out = self.runner.run(inputs, layers, argmax=argmax, path_only=argmax, blocks=blocks if any(blocks) else None)
        timing = self._measure([len(i.token_ids) for i in inputs], out.seconds)
        hidden = out.hidden if layers else [[] for _ in drafts]
        rows = out.argmax if out.argmax is not None else out.logits
        summed = out.blocks if out.blocks is not None else [None] * len(drafts)
        return [self._commit(d, r, h, layers, timing, b)
                for d, r, h, b in zip(drafts, rows, hidden, summed, strict=True)]

    def _measure(self, counts: list[int], seconds: float) -> PassTiming:
        """Time the pass into the runner's ``PassCost``, by the width it computed."""
        padded, cost = self.runner.pads_batches, self.runner.pass_cost
        cost.observe(pass_width(counts, padded), seconds)
        plain = cost.estimate(pass_width([1] * len(counts), padded))
        return PassTiming(seconds=seconds, rows=sum(counts), batch=len(counts), padded=padded,
                          plain_seconds_per_token=None if plain is None else plain / len(counts))

    def _plan(self, seqs: list[SequenceState], cap: int) -> list[int]:
        """Each sequence's draft budget: none while its monitor holds speculation off, else what
        pays at the batch's measured pass cost (``plan_drafts``; see ``budget.plan_draft_lengths``)."""
        if not self.plan_drafts:
            return [cap if s.drafter is not None else 0 for s in seqs]
        caps = [s.monitor.draft_cap(cap) if s.drafter is not None and s.monitor.allows_draft else 0 for s in seqs]
        alphas = [s.drafter.planned_alpha(s.monitor.alpha) if c else None for s, c in zip(seqs, caps, strict=True)]
        token_seconds = [s.draft_cost.per_token for s in seqs]
        return plan_draft_lengths(alphas, caps, self.runner.pass_cost, self.runner.pads_batches, token_seconds)

    def _draft(self, seq: SequenceState, k: int) -> Draft:
        cache_len = self.runner.lengths[seq.slot]
        room = min(
            k,
            seq.params.max_new_tokens - seq.num_output - 1,  # the bonus token needs a place too
            self.runner.max_seq_len - cache_len - 2,
        )
        proposal, seconds, catch_up = DraftProposal([]), 0.0, 0.0
        # n-min is decided twice, both times without looking at a sampled token (verify.py's rule):
        # before drafting, from the room alone; after, for deterministic drafts only. A draft with
        # q is verified however short it came out: its length follows its own tokens (p-min stops
        # where q after x1 is unsure, a grammar cuts after an invalid x1), so dropping it would
        # make whether x1 is verified depend on x1 (issue 22: q = (.5, .25, .25), p = (.2, .8, 0)
        # gave P(a) = .25, not .2). A deterministic draft is a function of the context, and the
        # verifier is exact given its tokens, so dropping it by length is safe.
        if seq.drafter is not None and room > 0 and room >= self.draft_n_min:
            # a request's first ask carries the drafter's setup (a draft model's prompt pass, whose
            # cost its runner may not know yet): all of it is catch-up, later ones what was predicted
            first = seq.stats.draft_asks == 0
            predicted = 0.0 if first else seq.drafter.catch_up_seconds(seq.tokens)
            t0 = time.perf_counter()
            proposal = seq.drafter.propose(seq.tokens, room)
            seconds = time.perf_counter() - t0
            catch_up = seconds if first else min(seconds, predicted)
            seq.stats.draft_seconds += seconds
            seq.stats.draft_asks += 1
            seq.draft_cost.observe(seconds - catch_up, len(proposal))
            if len(proposal) > room:
                raise RuntimeError(f"drafter {seq.drafter.name} proposed {len(proposal)} > {room} tokens")
            if not self.runner.supports_trees:
                proposal = proposal.first_path()
            if seq.processors is not None:
                proposal = seq.processors.cut(proposal)
            if len(proposal) < self.draft_n_min and proposal.probs is None:
                proposal = DraftProposal([])
            elif not proposal.drafter:
                proposal = replace(proposal, drafter=seq.drafter.name)
        return Draft(seq, proposal, cache_len, proposal.drafter if len(proposal) else None, seconds, catch_up, room)

    @staticmethod
    def _parents(proposal: DraftProposal) -> list[int] | None:
        return None if proposal.is_chain else [-1, *proposal.parents]

    def _commit(self, d: Draft, logits: torch.Tensor, hidden: list[torch.Tensor], layers: tuple[int, ...],
                timing: PassTiming, summed: tuple[np.ndarray, np.ndarray] | None = None) -> StepResult:
        """``logits``: the pass's [T, V] rows for this sequence, or their argmax [T] (``_argmax_suffices``);
        ``summed``: their softmax blocks where the runner summed them (``_block_temperature``)."""
        seq, stats = d.seq, d.seq.stats
        tree = d.proposal.to_tree(seq.tokens[-1])
        if logits.dim() == 1:
            result = verify_argmax(tree, logits.tolist())
        else:
            # Penalties and grammar masks act on each row with the drafted path before it as history.
            target = logits if seq.processors is None else seq.processors.apply(logits, tree, seq.tokens)
            result = verify(tree, target, seq.params, d.proposal.probs, seq.generator, summed)
        self.runner.commit(seq.slot, d.cache_len, result.path)
        _observe(seq, layers, hidden, result.path)
        new = self._truncate(seq, result.token_ids)
        if seq.processors is not None:
            # A complete grammar ends the output at once, in a plain step or mid-draft alike.
            new = new[: seq.processors.advance(new)]
            if seq.processors.finished:
                seq.finish_reason = "stop"
        logprobs: tuple[TokenLogprob, ...] = ()
        if seq.params.logprobs is not None:  # row path[i] predicted token_ids[i] (logprobs.py: which values)
            rows = result.path[: len(new)]
            logprobs = tuple(output_logprobs(logits[rows], target[rows], new, seq.params, self.logprobs_mode))
            seq.logprobs.extend(logprobs)
        seq.tokens.extend(new)
        if seq.drafter is not None:
            seq.drafter.accept(seq.tokens, result.num_accepted)
        stats.new_tokens += len(new)
        origins, drafted_by = self._account(d, tree, result, timing)
        if seq.finish_reason is None and seq.should_stop is not None and seq.should_stop(seq.output_ids):
            seq.finish_reason = "stop"
        if seq.finish_reason is None and self.runner.lengths[seq.slot] + 2 >= self.runner.max_seq_len:
            seq.finish_reason = "length"
        if seq.finished:
            stats.snapshot_windows(seq.monitor, seq.drafter.windows() if seq.drafter is not None else {})
        return StepResult(
            token_ids=new, num_drafted=len(d.proposal), num_accepted=result.num_accepted, drafter=d.drafter,
            draft_seconds=d.seconds, pass_seconds=timing.seconds, pass_rows=timing.rows,
            finish_reason=seq.finish_reason, rejected_ids=_rejected(tree, result.path[-1]), logprobs=logprobs,
            origins=origins, drafted_by=drafted_by,
            spec_state=seq.monitor.mode.value if seq.drafter is not None else "none",
        )

    def _account(self, d: Draft, tree: DraftTree, result: VerifyResult, timing: PassTiming) \
            -> tuple[tuple[str, ...], tuple[tuple[str, int], ...]]:
        """Count the step in the sequence's stats and monitor; who proposed each accepted token
        and how many tokens each drafter drafted."""
        seq, stats, num_drafted = d.seq, d.seq.stats, len(d.proposal)
        stats.target_forwards += 1
        stats.decode_passes += 1
        stats.decode_tokens += len(result.token_ids)
        stats.target_seconds += timing.seconds
        stats.spec_off_steps += int(seq.drafter is not None and seq.monitor.mode is Mode.OFF)
        if not num_drafted:
            if seq.drafter is not None:
                seq.monitor.observe(None, held=d.budget == 0)
            return (), ()
        origins = tuple(d.proposal.origin_of(node - 1) for node in result.path[1:])
        drafted_by = tuple(Counter(d.proposal.origin_of(i) for i in range(num_drafted)).items())
        stats.record_draft(num_drafted, result.num_accepted, drafted_by, origins)
        tested = result.num_accepted + int(bool(tree.children[result.path[-1]]))
        # judged against what a drafted token costs here, not a fixed 0.4 (adaptive's members are too)
        seq.monitor.min_acceptance = acceptance_floor(self.min_acceptance, self.runner.pass_cost,
                                                      seq.draft_cost.per_token)
        seq.monitor.observe(draft_sample(num_drafted, result.num_accepted, tested,
                                         d.seconds - d.catch_up + timing.share(tree.num_nodes),
                                         timing.plain_seconds_per_token))
        return origins, drafted_by

    def _truncate(self, seq: SequenceState, tokens: list[int]) -> list[int]:
        """Cut the step's tokens at EOS or max_new_tokens, setting the finish reason."""
        left = seq.params.max_new_tokens - seq.num_output
        if not seq.params.ignore_eos:
            for i, tok in enumerate(tokens[:left]):
                if tok in self.runner.eos_token_ids:
                    seq.finish_reason = "stop"
                    return tokens[: i + 1]
        if len(tokens) >= left:
            seq.finish_reason = "length"
        return tokens[:left]

    # -- to the end ----------------------------------------------------------------------------
    def run_batch(self, seqs: list[SequenceState],
                  on_step: Callable[[list[SequenceState], list[StepResult]], None] | None = None) -> float:
        """Run a static batch until every sequence finishes; return seconds spent in target passes.

        Each batched pass counts once (every sequence's own stats count it in full).
        Finished sequences leave the batch, and free their slot, at once. ``on_step(running, results)``
        sees each step's results (``LLM.generate`` collects token origins from them).
        """
        batch = StaticBatch(self, seqs)
        try:
            batch.start()
            while batch.running:
                batch.step(on_step)
            return batch.pass_seconds
        finally:
            batch.close()

    def generate(self, seq: SequenceState) -> Iterator[StepResult]:
        """Run ``seq`` alone until it finishes, yielding each step's result."""
        t0 = time.perf_counter()
        try:
            self.start([seq])
            while not seq.finished:
                result = self.step([seq])[0]
                seq.stats.seconds = time.perf_counter() - t0
                yield result
        finally:
            seq.stats.seconds = time.perf_counter() - t0
            self.finish(seq)


class StaticBatch:
    """A static batch run a step at a time (``Engine.run_batch``'s loop), for a caller that takes turns
    between batches: the bench steps every method's batch in turn, so the machine's drift meets them alike."""

    def __init__(self, engine: Engine, seqs: list[SequenceState]) -> None:
        self.engine, self.seqs = engine, seqs
        self.running: list[SequenceState] = []
        self.pass_seconds = 0.0  # each batched pass once

    def start(self) -> None:
        """Slots and prefill (``Engine.start``)."""
        self.pass_seconds += self.engine.start(self.seqs)
        self.running = [s for s in self.seqs if not s.finished]

    def step(self, on_step: Callable[[list[SequenceState], list[StepResult]], None] | None = None) -> None:
        """One step of the running sequences; the finished ones leave and free their slot at once."""
        results = self.engine.step(self.running)
        self.pass_seconds += results[0].pass_seconds
        if on_step is not None:
            on_step(self.running, results)
        for s in self.running:
            if s.finished:
                self.engine.finish(s)
        self.running = [s for s in self.running if not s.finished]

    def close(self) -> None:
        """Free every slot still held (a batch stopped early, or by an error)."""
        for s in self.seqs:
            if s.slot >= 0:
                self.engine.finish(s)


def _rejected(tree: DraftTree, node: int) -> list[int]:
    """Token ids of the drafted branch below ``node`` (first children down): the rejected continuation.

    Example: chain [r, a, b, c] with a kept (node 1) -> [b, c]; every token kept -> [].
    """
    out = []
    while tree.children[node]:
        node = tree.children[node][0]
        out.append(tree.tokens[node])
    return out


def _argmax_suffices(seq: SequenceState) -> bool:
    """Whether verifying ``seq`` reads nothing of the target's logits but each row's argmax: greedy, no
    logprobs, no processors (penalties, grammar, bias). Then the runner need not write [T, V] floats."""
    return seq.params.greedy and seq.params.logprobs is None and seq.processors is None


def _block_temperature(seq: SequenceState) -> float:
    """The inverse temperature at which the runner's LM head should sum the sequence's rows' softmax blocks for its
    verifier (``row_dist``), 0 where the verifier reads none: greedy, or processors (they change the logits after the
    pass)."""
    if seq.params.greedy or seq.processors is not None:
        return 0.0
    return float(inverse_temperature(seq.params.temperature))


def hidden_layers(seqs: list[SequenceState]) -> tuple[int, ...]:
    """Target layers any of these sequences' drafters reads (sorted, the final state last: the
    order ``ModelRunner.run`` returns them in)."""
    wanted = {i for s in seqs if s.drafter is not None for i in s.drafter.hidden_layers}
    return tuple(sorted(wanted - {-1})) + ((-1,) if -1 in wanted else ())


def _observe(seq: SequenceState, layers: tuple[int, ...], hidden: list[torch.Tensor], rows: list[int] | None) -> None:
    """Hand a drafter that reads hidden states the ones of the tokens the target just cached."""
    if seq.drafter is None or not seq.drafter.hidden_layers or not hidden:
        return
    seq.drafter.observe({i: (h if rows is None else h[rows]) for i, h in zip(layers, hidden, strict=True)})
