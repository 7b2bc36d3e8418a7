"""Ray Serve request router with conversation affinity (the policy itself is ``affinity.py``).

Ray calls ``choose_replicas`` for each request and tries the ranks it returns in order, taking
within a rank the replica with the shortest queue that still accepts work (queue below
``max_ongoing_requests``, the replica's KV cache slots). So a conversation's replica gets its next
turn while it has a free slot, and otherwise the least-loaded replica does. The router runs in
the ingress process; ``on_request_routed`` records where each conversation went.

No FIFOMixin: its matching hands a chosen replica to the oldest waiting request, which would
send one conversation's turn to the replica picked for another.
"""

from __future__ import annotations

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from specdec.server.ray.affinity import AffinityKey, AffinityTable


def request_key(pending: PendingRequest | None) -> AffinityKey | None:
    """The key the ingress passed as ``forward.remote(request, affinity=key)``."""
    if pending is None:
        return None
    key = pending.kwargs.get("affinity")
    return key if isinstance(key, AffinityKey) else None


class AffinityRouter(RequestRouter):
    def initialize_state(self, max_sessions: int = 100_000, max_prompt_chars: int = 8_000_000, **_kwargs) -> None:
        self.table = AffinityTable(max_sessions, max_prompt_chars)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if pending_request is not None:
            # Every rank we return already holds all candidates: back off before the next round.
            pending_request.routing_context.should_backoff = True
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        ranks = self.table.rank(request_key(pending_request), list(by_id))
        return [[by_id[i] for i in rank] for rank in ranks]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        self.table.record(request_key(pending_request), replica_id.unique_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.table.forget_replicas([replica_id.unique_id])

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        before = {r.unique_id for r in self.curr_replicas}
        super().update_replicas(replicas)
        self.table.forget_replicas(before - {r.unique_id for r in self.curr_replicas})
