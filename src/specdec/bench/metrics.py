"""Records: one JSON object per run (method or peer x workload x batch size x temperature), and summaries.

Speedups compare with specdec's plain decoding on the same workload, batch size
and temperature (peers: batch size 1). "Overall" sums tokens and seconds over
workloads before dividing, as Spec-Bench's overall column does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from specdec.bench.oracle import OracleResult, Walk
from specdec.drafters.registry import DraftResources

MIB = 1 << 20


def drafter_bytes(res: DraftResources) -> int | None:
    """Memory of the state drafters share across requests, where we know it (None: per-request only)."""
    return res.nbytes()


def acceptance_by_pos(accepted: list[int], drafted: list[int]) -> list[float]:
    """[i]: share of drafts reaching position i whose token i was kept (accepted may be the shorter list)."""
    accepted = list(accepted) + [0] * (len(drafted) - len(accepted))
    return [a / d if d else 0.0 for a, d in zip(accepted, drafted, strict=True)]


def sum_lists(lists: Iterable[list[int]]) -> list[int]:
    """Element-wise sum of lists of different lengths."""
    out: list[int] = []
    for values in lists:
        out.extend([0] * (len(values) - len(out)))
        for i, v in enumerate(values):
            out[i] += v
    return out


def cell_record(cell, baseline_tps: float | None, usd_per_hour: float) -> dict:
    """The results.jsonl record of one Cell (see bench.harness.Cell)."""
    s = cell.stats
    tps = s.new_tokens / s.seconds if s.seconds > 0 else 0.0
    by_pos = acceptance_by_pos(s.accepted_per_pos, s.drafted_per_pos)
    return {
        "kind": cell.kind,
        "method": cell.method,
        "workload": cell.workload,
        "batch_size": cell.batch_size,
        "temperature": cell.temperature,
        "requests": len(cell.output_ids),
        "new_tokens": s.new_tokens,
        "prompt_tokens": s.prompt_tokens,
        "seconds": round(s.seconds, 4),
        "tokens_per_s": round(tps, 3),
        "speedup": round(tps / baseline_tps, 4) if baseline_tps else None,
        # the same tokens over the time after prefill: llama-server's predicted_n / predicted_ms
        "prefill_seconds": round(s.prefill_seconds, 4),
        "decode_tokens_per_s": round(s.new_tokens / (s.seconds - s.prefill_seconds), 3)
        if s.seconds > s.prefill_seconds else None,
        # a decode step beside its target pass: what the step adds (drafting, verify, bookkeeping)
        "step_ms": round(1e3 * (s.seconds - s.prefill_seconds) / s.decode_passes, 3) if s.decode_passes else None,
        "pass_ms": round(1e3 * (s.target_seconds - s.prefill_seconds) / s.decode_passes, 3)
        if s.decode_passes else None,
        "target_forwards": s.target_forwards,
        "decode_passes": s.decode_passes,
        "tau": round(s.mean_accepted_len, 4) if cell.kind == "specdec" else None,
        "acceptance_rate": round(s.acceptance_rate, 4) if cell.kind == "specdec" else None,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "accepted_per_pos": list(s.accepted_per_pos),
        "drafted_per_pos": list(s.drafted_per_pos),
        "acceptance_by_pos": [round(x, 4) for x in by_pos],
        "draft_seconds": round(s.draft_seconds, 4),
        "target_seconds": round(s.target_seconds, 4),
        "draft_share": round(s.draft_seconds / s.seconds, 4) if s.seconds > 0 and cell.kind == "specdec" else None,
        "target_share": round(s.target_seconds / s.seconds, 4) if s.seconds > 0 and cell.kind == "specdec" else None,
        "peak_rss_bytes": cell.peak_rss_bytes,
        "kv_bytes": cell.kv_bytes,
        "drafter_bytes": cell.drafter_bytes,
        "usd_per_mtok": round(usd_per_hour / 3600 / tps * 1e6, 4) if tps > 0 else None,
        "greedy_mismatches": cell.mismatches,
    }


def cell_records(cells: Iterable, usd_per_hour: float) -> list[dict]:
    """Records for every cell, with speedups against the plain ('none') cell of the same setting."""
    cells = list(cells)
    plain = {(c.workload, c.batch_size, c.temperature): c.stats for c in cells
             if c.kind == "specdec" and c.method == "none"}
    out = []
    for c in cells:
        base = plain.get((c.workload, c.batch_size, c.temperature))
        base_tps = base.new_tokens / base.seconds if base is not None and base.seconds > 0 else None
        out.append(cell_record(c, base_tps, usd_per_hour))
    return out


def overall(records: Iterable[dict], workloads: list[str] | None = None) -> dict[tuple, dict]:
    """Per (method, batch, temperature): summed tokens/seconds/passes over workloads, and the speedup.

    The speedup divides summed tokens/s by plain's summed tokens/s over the same workloads.
    """
    sums: dict[tuple, dict] = defaultdict(lambda: defaultdict(float))
    for r in records:
        if r["kind"] not in ("specdec", "peer") or (workloads is not None and r["workload"] not in workloads):
            continue
        key = (r["method"], r["batch_size"], r["temperature"])
        acc = sums[key]
        for name in ("new_tokens", "seconds", "decode_passes", "draft_seconds", "target_seconds"):
            acc[name] += r[name]
        acc["prefill_seconds"] += r.get("prefill_seconds") or 0.0
        acc["kind"] = r["kind"]
        acc["workloads"] += 1
        acc.setdefault("names", []).append(r["workload"])
    out = {}
    for key, acc in sums.items():
        tps = acc["new_tokens"] / acc["seconds"] if acc["seconds"] else 0.0
        tau = acc["new_tokens"] / acc["decode_passes"] if acc["decode_passes"] else None
        out[key] = {"kind": acc["kind"], "new_tokens": int(acc["new_tokens"]), "seconds": acc["seconds"],
                    "tokens_per_s": tps, "tau": tau if acc["kind"] == "specdec" else None,
                    "decode_tokens_per_s": acc["new_tokens"] / (acc["seconds"] - acc["prefill_seconds"])
                    if acc["prefill_seconds"] and acc["seconds"] > acc["prefill_seconds"] else None,
                    "workloads": list(acc["names"]),
                    "draft_share": acc["draft_seconds"] / acc["seconds"] if acc["seconds"] else 0.0,
                    "target_share": acc["target_seconds"] / acc["seconds"] if acc["seconds"] else 0.0,
                    # a decode step beside its target pass, after prefill (as each record's step_ms / pass_ms)
                    "step_ms": 1e3 * (acc["seconds"] - acc["prefill_seconds"]) / acc["decode_passes"]
                    if acc["decode_passes"] else None,
                    "pass_ms": 1e3 * (acc["target_seconds"] - acc["prefill_seconds"]) / acc["decode_passes"]
                    if acc["decode_passes"] else None}
    for (_method, batch, temp), row in out.items():
        base = _plain_over(sums, batch if row["kind"] == "specdec" else 1, temp, row["workloads"])
        row["speedup"] = row["tokens_per_s"] / base if base else None
    return out


def _plain_over(sums: dict, batch: int, temp: float, names: list[str]) -> float | None:
    """Plain decoding's tokens/s summed over the same workloads (None if it misses any)."""
    acc = sums.get(("none", batch, temp))
    if acc is None or set(acc["names"]) != set(names):
        return None
    return acc["new_tokens"] / acc["seconds"] if acc["seconds"] else None


def oracle_records(oracle_results: dict, pass_costs: list[float], context_len: int) -> list[dict]:
    """One record per workload (and 'overall') with oracle and per-drafter replay numbers."""
    recs = [{"kind": "pass_costs", "context_tokens": context_len,
             "seconds_by_width": [round(c, 6) for c in pass_costs]}]
    total = None
    items = list(oracle_results.items())
    if items:
        total = OracleResult(Walk(), {n: Walk() for n in items[0][1].drafters}, Walk())
        for _, res in items:
            total.plain.add(res.plain)
            total.oracle.add(res.oracle)
            for n, w in res.drafters.items():
                total.drafters[n].add(w)
        items.append(("overall", total))
    for workload, res in items:
        recs.append({
            "kind": "oracle", "workload": workload, "tokens": res.plain.tokens,
            "plain_passes": res.plain.passes, "oracle_passes": res.oracle.passes,
            "oracle_tau": round(res.oracle.tau, 4),
            "oracle_pass_speedup": round(res.pass_speedup(res.oracle), 4),
            "oracle_time_speedup": round(res.time_speedup(res.oracle), 4),
            "oracle_picks": dict(res.oracle.picks),
            "drafters": {n: {"passes": w.passes, "tau": round(w.tau, 4),
                             "pass_speedup": round(res.pass_speedup(w), 4),
                             "time_speedup": round(res.time_speedup(w), 4)}
                         for n, w in res.drafters.items()},
        })
    return recs
