"""Prometheus metrics of one server, named like vLLM's (``vllm:spec_decode_*``) under ``specdec:``.

Each app owns a CollectorRegistry, so several apps in one process (tests) never
clash on the global registry. The scheduler thread updates the metrics; the
``/metrics`` route renders them. The same updates feed ``live`` (per-second
buckets for ``/dashboard``, see ``live.py``).
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from specdec.engine import StepResult
from specdec.server.live import LiveSeries

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
FINISH_REASONS = ("stop", "length", "abort", "error")


class ServerMetrics:
    """Every metric the server exports. Counter names get their ``_total`` suffix from prometheus_client."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str) -> None:
        disable_created_metrics()  # no *_created series beside each counter (process-wide, as in vLLM)
        self.registry = CollectorRegistry(auto_describe=True)
        r, p = self.registry, "specdec:"
        # Speculation, as vLLM's spec-decode metrics.
        self.num_drafts = Counter(f"{p}spec_decode_num_drafts", "Steps that verified a non-empty draft.", registry=r)
        self.num_draft_tokens = Counter(f"{p}spec_decode_num_draft_tokens", "Drafted tokens sent to the target.",
                                        registry=r)
        self.num_accepted_tokens = Counter(f"{p}spec_decode_num_accepted_tokens", "Drafted tokens kept.", registry=r)
        self.accepted_per_pos = Counter(
            f"{p}spec_decode_num_accepted_tokens_per_pos", "Drafts whose token at this position was kept.",
            ["position"], registry=r,
        )
        self.drafter_tokens = Counter(
            f"{p}spec_decode_drafter_tokens", "Drafted tokens by drafter (a chain's member) and outcome "
            "(accepted or rejected).", ["drafter", "outcome"], registry=r,
        )
        self.sequence_steps = Counter(
            f"{p}spec_decode_sequence_steps", "Steps of sequences with a drafter, by the speculation monitor's state "
            "after the step: on, off (paused: low acceptance or slower than plain), probe (re-measuring).",
            ["state"], registry=r,
        )
        self.draft_seconds = Counter(f"{p}spec_decode_draft_seconds", "Seconds spent drafting.", registry=r)
        self.verify_seconds = Counter(f"{p}spec_decode_verify_seconds",
                                      "Seconds spent in target passes (decode and verify).", registry=r)
        self.draft_budget = Gauge(f"{p}spec_decode_draft_budget",
                                  "Most tokens each sequence could draft in the latest step, K(batch).", registry=r)
        # Requests and tokens.
        self.requests = Counter(f"{p}request_success", "Finished requests by finish reason "
                                "(stop, length, abort = client left, error = failed).", ["finished_reason"],
                                registry=r)
        for reason in FINISH_REASONS:
            self.requests.labels(reason)
        self.prompt_tokens = Counter(f"{p}prompt_tokens", "Prefilled prompt tokens.", registry=r)
        self.generation_tokens = Counter(f"{p}generation_tokens", "Generated tokens.", registry=r)
        self.rejected = Counter(f"{p}request_rejected", "Requests refused because the queue was full (429).",
                                registry=r)
        # Scheduler state.
        self.waiting = Gauge(f"{p}num_requests_waiting", "Requests waiting for a KV cache slot.", registry=r)
        self.running = Gauge(f"{p}num_requests_running", "Requests being generated.", registry=r)
        self.batch_size = Gauge(f"{p}running_batch_size", "Sequences in the latest step.", registry=r)
        self.free_slots = Gauge(f"{p}kv_cache_free_slots", "Free KV cache slots (one per sequence).", registry=r)
        self.step_seconds = Histogram(f"{p}step_duration_seconds", "Wall time of one engine step (draft + verify).",
                                      buckets=STEP_BUCKETS, registry=r)
        self.ttft = Histogram(f"{p}time_to_first_token_seconds", "Arrival to first generated token.",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(f"{p}e2e_request_latency_seconds", "Arrival to finish.", buckets=LATENCY_BUCKETS,
                             registry=r)
        info = Gauge(f"{p}model_info", "The served model.", ["model_name"], registry=r)
        info.labels(model_name).set(1)
        self.live = LiveSeries()

    # -- updates from the scheduler thread -----------------------------------------------------
    def record_step(self, batch: int, budget: int, seconds: float, draft_seconds: float,
                    verify_seconds: float) -> None:
        self.batch_size.set(batch)
        self.draft_budget.set(budget)
        self.step_seconds.observe(seconds)
        self.draft_seconds.inc(draft_seconds)
        self.verify_seconds.inc(verify_seconds)
        self.live.record_step(batch, seconds, draft_seconds, verify_seconds)

    def record_result(self, step: StepResult) -> None:
        """One sequence's step: its ``num_accepted`` kept tokens are a prefix of its draft."""
        self.live.record_result(step.drafter, step.num_drafted, step.num_accepted, len(step.token_ids))
        if step.spec_state != "none":
            self.sequence_steps.labels(step.spec_state).inc()
        if step.num_drafted == 0:
            return
        self.num_drafts.inc()
        self.num_draft_tokens.inc(step.num_drafted)
        self.num_accepted_tokens.inc(step.num_accepted)
        for pos in range(step.num_accepted):
            self.accepted_per_pos.labels(str(pos)).inc()
        # Each accepted token counts for the drafter that proposed it (a merged tree mixes them).
        accepted = dict.fromkeys((name for name, _ in step.drafted_by), 0)
        for name in step.origins:
            accepted[name] = accepted.get(name, 0) + 1
        for name, drafted in step.drafted_by or ((step.drafter or "unknown", step.num_drafted),):
            kept = accepted.get(name, 0) if step.drafted_by else step.num_accepted
            self.drafter_tokens.labels(name, "accepted").inc(kept)
            self.drafter_tokens.labels(name, "rejected").inc(drafted - kept)

    def record_finish(self, reason: str, generated: int, latency: float) -> None:
        self.requests.labels(reason).inc()
        self.generation_tokens.inc(generated)
        self.e2e.observe(latency)

    def record_state(self, waiting: int, running: int, free_slots: int) -> None:
        self.waiting.set(waiting)
        self.running.set(running)
        self.free_slots.set(free_slots)
        self.live.record_waiting(waiting)

    def render(self) -> bytes:
        return generate_latest(self.registry)
