"""Oracle analysis: how fast would decoding be if the best drafter were picked at every step?

We replay the plain greedy output of each request. At every position ``i`` of
the output, every drafter proposes given the true context (prompt + output[:i]),
and we log how many of its tokens would be accepted: the longest proposal path
that matches the true continuation output[i:]. From these per-position logs:

- a drafter alone advances ``accepted + 1`` tokens per target pass;
- the *oracle* picks, at each step, the drafter with the most accepted tokens
  (ties: the smaller proposal, i.e. the cheaper verify pass; not drafting at all
  is always an option);
- plain decoding needs one pass per output token.

Passes convert to time with measured pass costs: ``cost[T]`` is the seconds of a
target pass over T tokens (the root plus T - 1 drafted), plus each chosen
proposal's own drafting time.

Worked example: output of 6 tokens, two drafters, logs as (drafted, accepted)::

    position:   0      1      2      3      4      5
    A:        (2,2)  (0,0)  (0,0)  (2,0)  (2,1)  (0,0)
    B:        (1,1)  (4,3)  (0,0)  (4,2)  (0,0)  (0,0)

    A alone: i=0 +3, i=3 +1, i=4 +2          -> 3 passes
    B alone: i=0 +2, i=2 +1, i=3 +3          -> 3 passes
    oracle:  i=0 A +3, i=3 B +3              -> 2 passes, tau 3.0, 3x fewer passes than plain (6)
    with pass costs 1.0 s (1 token), 1.2 s (3 tokens), 1.5 s (5 tokens) and no drafting time:
    plain 6.0 s, oracle 1.2 + 1.5 = 2.7 s -> time speedup 6 / 2.7 = 2.22x
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from specdec.config import SamplingParams
from specdec.drafters.base import Drafter, DraftProposal

NO_DRAFT = "(none)"


@dataclass(frozen=True)
class StepLog:
    """One drafter asked at one output position."""

    drafted: int  # proposal size: the verify pass would run drafted + 1 tokens
    accepted: int  # proposal tokens on the longest path matching the true continuation
    seconds: float = 0.0  # time the proposal took


SKIP = StepLog(0, 0, 0.0)

# logs[drafter][request][position]
Logs = Mapping[str, Sequence[Sequence[StepLog]]]


def accepted_length(proposal: DraftProposal, truth: Sequence[int]) -> int:
    """Length of the longest proposal path that equals a prefix of ``truth``.

    The proposal is walked as a tree (a chain is a tree) from the root, taking at
    each depth the child that holds the true token.

    Example: chain [5, 6, 9] vs truth [5, 6, 7] -> 2; tree token_ids [5, 8, 6],
    parents [0, 0, 1] (5 and 8 under the root, 6 under 5) vs [5, 6, 7] -> 2.
    """
    tree = proposal.to_tree(root=-1)  # the root's token is never compared

    def true_child(node: int) -> int | None:
        depth = tree.depths[node]  # = the tokens matched so far
        return tree.child_with(node, truth[depth]) if depth < len(truth) else None

    return len(tree.walk(true_child)) - 1


def pass_cost(costs: Sequence[float], width: int) -> float:
    """Seconds of a pass over ``width`` tokens; costs[T - 1] is measured for T = 1..len(costs).

    Past the measured widths, extrapolate linearly from the last two points.
    """
    if width <= len(costs):
        return costs[width - 1]
    if len(costs) == 1:
        return costs[0] * width
    slope = costs[-1] - costs[-2]
    return costs[-1] + slope * (width - len(costs))


@dataclass
class Walk:
    """Decoding one request by a policy: passes, modelled seconds, and which drafter each pass used."""

    tokens: int = 0
    passes: int = 0
    seconds: float = 0.0
    picks: dict[str, int] = field(default_factory=dict)

    def add(self, other: Walk) -> None:
        self.tokens += other.tokens
        self.passes += other.passes
        self.seconds += other.seconds
        for k, v in other.picks.items():
            self.picks[k] = self.picks.get(k, 0) + v

    @property
    def tau(self) -> float:
        """Tokens per target pass."""
        return self.tokens / self.passes if self.passes else 0.0


def walk(steps: Mapping[str, Sequence[StepLog]], num_tokens: int, costs: Sequence[float]) -> Walk:
    """Decode ``num_tokens`` choosing, at each step, the best of ``steps`` (one log per drafter).

    With one drafter this is that drafter alone; with several it is the oracle.
    Not drafting (width 1) is always an option, so a useless draft is never paid for.
    """
    out = Walk(tokens=num_tokens)
    i = 0
    while i < num_tokens:
        name, best = NO_DRAFT, SKIP
        for cand_name, log in steps.items():
            step = log[i]
            if (step.accepted, -step.drafted) > (best.accepted, -best.drafted):
                name, best = cand_name, step
        out.passes += 1
        out.seconds += pass_cost(costs, best.drafted + 1) + best.seconds
        out.picks[name] = out.picks.get(name, 0) + 1
        i += min(best.accepted + 1, num_tokens - i)
    return out


@dataclass
class OracleResult:
    """Totals over requests. Speedups are vs plain decoding (one pass per token)."""

    plain: Walk
    drafters: dict[str, Walk]
    oracle: Walk

    def pass_speedup(self, walk_: Walk) -> float:
        return self.plain.passes / walk_.passes if walk_.passes else 0.0

    def time_speedup(self, walk_: Walk) -> float:
        return self.plain.seconds / walk_.seconds if walk_.seconds else 0.0


def analyse(logs: Logs, num_tokens: Sequence[int], costs: Sequence[float]) -> OracleResult:
    """Per-drafter and oracle walks over every request; ``num_tokens[r]`` is request r's output length."""
    plain, oracle = Walk(), Walk()
    drafters = {name: Walk() for name in logs}
    for r, n in enumerate(num_tokens):
        per_request = {name: logs[name][r] for name in logs}
        for name, log in per_request.items():
            if len(log) != n:
                raise ValueError(f"drafter {name}, request {r}: {len(log)} steps logged for {n} tokens")
            drafters[name].add(walk({name: log}, n, costs))
        plain.add(walk({}, n, costs))
        oracle.add(walk(per_request, n, costs))
    return OracleResult(plain, drafters, oracle)


def replay(
    drafter: Drafter,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    max_new_tokens: int,
    draft_n_max: int,
) -> list[StepLog]:
    """Ask ``drafter`` for a proposal at every position of the true output; log what would be accepted.

    The proposal budget matches the engine's (``draft_n_max``, and room for the
    bonus token before max_new_tokens). After each position the drafter hears
    ``accept`` with the accepted count, as if its draft had been verified, then
    sees the next true token. ``end`` is called with the whole sequence, so
    cross-request caches (suffix) fill as they do in a real run.
    """
    context = list(prompt_ids)
    drafter.begin(context, SamplingParams(max_new_tokens=max_new_tokens))
    logs = []
    for i, true in enumerate(output_ids):
        room = min(draft_n_max, max_new_tokens - i - 1)
        step = SKIP
        if room > 0:
            t0 = time.perf_counter()
            proposal = drafter.propose(context, room)
            seconds = time.perf_counter() - t0
            step = StepLog(len(proposal), accepted_length(proposal, output_ids[i:]), seconds)
        context.append(true)
        drafter.accept(context, step.accepted)
        logs.append(step)
    drafter.end(context)
    return logs


def replay_all(
    new_drafters: Mapping[str, Callable[[], Drafter]],
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    max_new_tokens: int,
    draft_n_max: int,
    progress: Callable[[], None] | None = None,
) -> dict[str, list[list[StepLog]]]:
    """logs[name][request] for every drafter over every (prompt_ids, output_ids), in request order."""
    logs: dict[str, list[list[StepLog]]] = {name: [] for name in new_drafters}
    for prompt_ids, output_ids in requests:
        for name, make in new_drafters.items():
            logs[name].append(replay(make(), prompt_ids, output_ids, max_new_tokens, draft_n_max))
        if progress is not None:
            progress()
    return logs
