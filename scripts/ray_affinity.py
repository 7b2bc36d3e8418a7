"""Acceptance with and without conversation affinity on Ray Serve: the agentic multi-turn workload
on N replicas (suffix drafting), once with specdec's affinity router and once with Ray Serve's
default power-of-two-choices router. Prints a markdown table.

    PYTHONPATH=src .venv/bin/python scripts/ray_affinity.py                   # default model, 2 replicas
    PYTHONPATH=src .venv/bin/python scripts/ray_affinity.py --max-tokens 48 --spec-type suffix --replicas 2

The workload runs turn by turn (turn 1 of every conversation, then turn 2, ...; ``--copies`` of each
conversation, ``--concurrency`` requests in flight), so between two turns of a conversation the
replicas serve others, as while an agent runs a tool. Each request sends its conversation id as
``user``, in both runs; only the router differs. With ``--same-user`` the copies are one user
repeating the episode (copy 2 after copy 1, same ``user``): there the suffix cache of earlier
requests, which lives in one replica, can pay. Counts come from each response's
``spec_decode`` (token ids counted by the server, never re-tokenised text). Greedy decoding is
lossless, so both runs must produce the same answers: the script counts the ones that differ.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace

import httpx
import ray
from ray import serve

from specdec.bench.workloads import Conversation, load_workload
from specdec.budget import DraftBudget
from specdec.config import SpecConfig, parse_spec_types
from specdec.server.ray.deployment import APP_NAME, REPLICA_HEADER, build_app
from specdec.server.ray.options import RayDeployment, ReplicaSettings, Scale


@dataclass(frozen=True)
class Episode:
    """One run of a conversation (its id names the copy) by one user."""

    conv: Conversation
    user: str


@dataclass
class Turn:
    conversation: str
    index: int
    replica: str
    answer: str
    drafted: int
    accepted: int
    drafts: int
    tokens: int


async def one_turn(client: httpx.AsyncClient, url: str, ep: Episode, k: int, answers: list[str],
                   max_tokens: int) -> Turn:
    body = {"messages": ep.conv.messages(k, answers), "max_tokens": max_tokens, "temperature": 0, "user": ep.user}
    r = await client.post(url + "/v1/chat/completions", json=body)
    r.raise_for_status()
    data = r.json()
    spec = data["spec_decode"]
    return Turn(ep.conv.id, k, r.headers[REPLICA_HEADER], data["choices"][0]["message"]["content"], spec["drafted"],
                spec["accepted"], spec["drafts"], data["usage"]["completion_tokens"])


async def run_rounds(url: str, episodes: list[Episode], max_tokens: int, concurrency: int) -> list[Turn]:
    """Turn k of every conversation, then turn k + 1: between two turns of one conversation the
    replicas serve the others (as while an agent runs its tool), so load alone does not bring
    a conversation back to the replica it left."""
    answers: dict[str, list[str]] = {ep.conv.id: [] for ep in episodes}
    gate = asyncio.Semaphore(concurrency)
    turns: list[Turn] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0)) as client:
        async def turn(ep: Episode, k: int) -> Turn:
            async with gate:
                return await one_turn(client, url, ep, k, answers[ep.conv.id], max_tokens)

        for k in range(max(len(ep.conv.turns) for ep in episodes)):
            live = [ep for ep in episodes if k < len(ep.conv.turns)]
            done = await asyncio.gather(*(turn(ep, k) for ep in live))
            for ep, t in zip(live, done, strict=True):
                answers[ep.conv.id].append(t.answer)
            turns += done
    return turns


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_mode(d: RayDeployment, phases: list[list[Episode]], max_tokens: int,
             concurrency: int) -> tuple[list[Turn], float]:
    """All phases, one after another, on a fresh local cluster with deployment ``d``."""
    port = free_port()
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, d.scale.max_replicas), include_dashboard=False,
             log_to_driver=False, logging_level="WARNING")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=d.logging_config)
        serve.run(build_app(d), name=APP_NAME, route_prefix="/")
        url = f"http://127.0.0.1:{port}"

        t0 = time.perf_counter()
        turns = [t for phase in phases for t in asyncio.run(run_rounds(url, phase, max_tokens, concurrency))]
        return turns, time.perf_counter() - t0
    finally:
        serve.shutdown()
        ray.shutdown()


def summary(turns: list[Turn], wall: float) -> dict:
    drafted, accepted = sum(t.drafted for t in turns), sum(t.accepted for t in turns)
    drafts, tokens = sum(t.drafts for t in turns), sum(t.tokens for t in turns)
    later = [t for t in turns if t.index > 0]
    previous = {(t.conversation, t.index): t.replica for t in turns}
    stayed = sum(previous[(t.conversation, t.index - 1)] == t.replica for t in later)
    per_replica = sorted(Counter(t.replica for t in turns).values(), reverse=True)
    return dict(requests=len(turns), tokens=tokens, drafted=drafted, accepted=accepted,
                acceptance=accepted / drafted if drafted else 0.0,
                mean_accepted_len=1 + accepted / drafts if drafts else 1.0,
                stayed=f"{stayed}/{len(later)}", split="/".join(map(str, per_replica)), wall=wall)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--spec-type", default="suffix")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--workload", default="agentic")
    p.add_argument("--copies", type=int, default=2, help="each conversation runs this many times (other ids)")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight at once")
    p.add_argument("--same-user", action="store_true",
                   help="the copies of a conversation are one user repeating the episode: copy 2 starts after "
                        "copy 1 ended, under the same user id (default: distinct users, all copies in the same rounds)")
    args = p.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    spec = SpecConfig(types=parse_spec_types(args.spec_type))
    convs = load_workload(args.workload).conversations
    copies = [[replace(c, id=f"{c.id}#{i}") for c in convs] for i in range(args.copies)]
    if args.same_user:  # copy i + 1 after copy i, each under its conversation's one user id
        phases = [[Episode(c, c.id.split("#")[0]) for c in copy] for copy in copies]
    else:
        phases = [[Episode(c, c.id) for copy in copies for c in copy]]
    replica = ReplicaSettings(args.model, spec, DraftBudget(spec.draft_n_max, spec.draft_n_max),
                              max_model_len=args.max_model_len, max_batch_size=args.concurrency)
    base = RayDeployment(replica, Scale(args.replicas, args.replicas))
    results, answers = {}, {}
    for label, affinity in (("affinity", True), ("power of two choices", False)):
        turns, wall = run_mode(replace(base, affinity=affinity), phases, args.max_tokens, args.concurrency)
        results[label] = summary(turns, wall)
        answers[label] = {(t.conversation, t.index): t.answer for t in turns}
        print(f"[bench] {label}: {results[label]}", file=sys.stderr, flush=True)
    differ = sum(answers["affinity"][k] != v for k, v in answers["power of two choices"].items())
    print("| router | requests | requests per replica | turn on previous turn's replica | tokens | drafted "
          "| accepted | acceptance | mean accepted len | wall (s) |\n|---|---|---|---|---|---|---|---|---|---|")
    for label, r in results.items():
        print(f"| {label} | {r['requests']} | {r['split']} | {r['stayed']} | {r['tokens']} | {r['drafted']} | "
              f"{r['accepted']} | {r['acceptance']:.3f} | {r['mean_accepted_len']:.2f} | {r['wall']:.0f} |")
    print(f"\nanswers that differ between the runs: {differ} of {len(answers['affinity'])}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
