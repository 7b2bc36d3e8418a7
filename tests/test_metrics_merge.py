"""Merging replicas' Prometheus pages into one page labelled by replica."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from specdec.engine import StepResult
from specdec.server.metrics import ServerMetrics
from specdec.server.ray.metrics_merge import merge_expositions


def test_every_series_keeps_its_value_under_its_replica():
    a, b = ServerMetrics("m"), ServerMetrics("m")
    a.record_finish("stop", 5, 0.3)
    b.record_finish("length", 7, 1.2)
    a.record_result(StepResult(token_ids=[5, 6, 7], num_drafted=4, num_accepted=2, drafter="ngram",  # 2 of 4 kept
                               draft_seconds=0.0, pass_seconds=0.0, pass_rows=5, finish_reason=None))
    page = merge_expositions({"r1": a.render().decode(), "r2": b.render().decode()}).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(page) for s in f.samples}
    assert samples[("specdec:generation_tokens_total", (("replica", "r1"),))] == 5
    assert samples[("specdec:generation_tokens_total", (("replica", "r2"),))] == 7
    assert samples[("specdec:request_success_total", (("finished_reason", "length"), ("replica", "r2")))] == 1
    per_pos = "specdec:spec_decode_num_accepted_tokens_per_pos_total"
    assert samples[(per_pos, (("position", "1"), ("replica", "r1")))] == 1
    assert samples[("specdec:e2e_request_latency_seconds_count", (("replica", "r2"),))] == 1
    assert samples[("specdec:model_info", (("model_name", "m"), ("replica", "r1")))] == 1
    # One HELP/TYPE per family, not one per replica.
    assert page.count("# TYPE specdec:generation_tokens_total counter") == 1
    assert merge_expositions({}) == b""
