"""Several replicas' Prometheus pages -> one page, each series labelled with its replica.

Labelled rather than summed, so a dashboard sees both the whole (``sum without (replica)``)
and a replica that lags (its acceptance rate, its queue). The Ray ingress serves the result
on ``/metrics``.

    merge_expositions({"a1": 'specdec:generation_tokens_total 5\\n', "b2": ...})
    -> 'specdec:generation_tokens_total{replica="a1"} 5.0\\n...'
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families


class _Families:
    """A collector that yields fixed metric families (prometheus_client renders them)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self):
        return iter(self.families)


def merge_expositions(pages: Mapping[str, str], label: str = "replica") -> bytes:
    """Prometheus text pages by replica id -> one page whose samples carry ``label="<id>"``."""
    merged: dict[str, Metric] = {}
    for replica, text in sorted(pages.items()):
        for family in text_string_to_metric_families(text):
            out = merged.get(family.name)
            if out is None:
                out = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            for s in family.samples:
                out.add_sample(s.name, {**s.labels, label: replica}, s.value, s.timestamp, s.exemplar)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(merged.values())))
    return generate_latest(registry)
