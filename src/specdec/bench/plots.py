"""PNG plots of the records (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specdec.bench import metrics  # noqa: E402
from specdec.bench.workloads import TITLES  # noqa: E402


def _first_setting(records: list[dict]) -> tuple[float, int]:
    """The first (temperature, batch size) run: the grid's first values."""
    r = next(r for r in records if r["kind"] == "specdec")
    return r["temperature"], r["batch_size"]


def speedup_by_workload(records: list[dict], path: Path) -> Path:
    temp, batch = _first_setting(records)
    runs = [r for r in records if r["kind"] in ("specdec", "peer") and r["temperature"] == temp
            and r["batch_size"] == batch]
    workloads = list(dict.fromkeys(r["workload"] for r in runs if r["kind"] == "specdec"))
    methods = list(dict.fromkeys(r["method"] for r in runs))
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(workloads)), 4.5))
    width = 0.8 / max(len(methods), 1)
    for i, m in enumerate(methods):
        by = {r["workload"]: r["speedup"] or 0.0 for r in runs if r["method"] == m}
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(workloads))]
        ax.bar(xs, [by.get(w, 0.0) for w in workloads], width, label=m)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(range(len(workloads)), [TITLES.get(w, w) for w in workloads], rotation=20)
    ax.set_ylabel("speedup vs plain (×)")
    ax.set_title(f"Speedup by method and workload (T={temp:g}, batch {batch})")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def speedup_vs_batch(records: list[dict], path: Path) -> Path:
    """Left: speedup over plain decoding at the same batch size; right: overall tokens/s."""
    temp, _ = _first_setting(records)
    runs = [r for r in records if r["kind"] == "specdec" and r["temperature"] == temp]
    totals = metrics.overall(runs, list(dict.fromkeys(r["workload"] for r in runs)))
    batches = sorted({r["batch_size"] for r in runs})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for m in dict.fromkeys(r["method"] for r in runs):
        points = sorted((b, t) for (name, b, _), t in totals.items() if name == m)
        xs = [b for b, _ in points]
        left.plot(xs, [t["speedup"] or 0.0 for _, t in points], marker="o", label=m)
        right.plot(xs, [t["tokens_per_s"] for _, t in points], marker="o", label=m)
    left.axhline(1.0, color="black", lw=0.8, ls="--")
    for ax, label in ((left, "speedup vs plain at the same batch size (×)"), (right, "tokens/s (all sequences)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        ax.set_xlabel("batch size")
        ax.set_ylabel(label)
    left.set_title(f"Speedup vs batch size (T={temp:g}, all workloads)")
    right.set_title("Throughput vs batch size")
    left.legend(fontsize=7)
    return _save(fig, path)


def time_breakdown(records: list[dict], path: Path) -> Path:
    """Milliseconds per generated token, split into target passes (verify), drafting and the rest."""
    temp, batch = _first_setting(records)
    runs = [r for r in records if r["kind"] == "specdec" and r["temperature"] == temp and r["batch_size"] == batch]
    totals = metrics.overall(runs, list(dict.fromkeys(r["workload"] for r in runs)))
    methods = list(dict.fromkeys(r["method"] for r in runs))
    per_token = [1000 * totals[(m, batch, temp)]["seconds"] / max(totals[(m, batch, temp)]["new_tokens"], 1)
                 for m in methods]
    verify = [t * totals[(m, batch, temp)]["target_share"] for t, m in zip(per_token, methods, strict=True)]
    draft = [t * totals[(m, batch, temp)]["draft_share"] for t, m in zip(per_token, methods, strict=True)]
    other = [max(0.0, t - d - v) for t, d, v in zip(per_token, draft, verify, strict=True)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.bar(methods, verify, label="verify (target passes, prefill included)")
    ax.bar(methods, draft, bottom=verify, label="draft")
    ax.bar(methods, other, bottom=[d + v for d, v in zip(draft, verify, strict=True)], label="other")
    ax.set_ylabel("ms per generated token")
    ax.set_title(f"Where the time goes (T={temp:g}, batch {batch}, all workloads)")
    ax.tick_params(axis="x", rotation=20)
    ax.legend(fontsize=8)
    return _save(fig, path)


def acceptance_by_position(records: list[dict], path: Path) -> Path:
    temp, batch = _first_setting(records)
    runs = [r for r in records if r["kind"] == "specdec" and r["temperature"] == temp and r["batch_size"] == batch]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in dict.fromkeys(r["method"] for r in runs if r["method"] != "none"):
        mine = [r for r in runs if r["method"] == m]
        rates = metrics.acceptance_by_pos(metrics.sum_lists(r["accepted_per_pos"] for r in mine),
                                          metrics.sum_lists(r["drafted_per_pos"] for r in mine))
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=m)
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafted at this position")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Acceptance by draft position (T={temp:g}, batch {batch})")
    ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(records: list[dict], out: Path) -> list[Path]:
    records = [r for r in records if r["kind"] in ("specdec", "peer")]
    if not any(r["kind"] == "specdec" for r in records):
        return []
    return [
        speedup_by_workload(records, out / "speedup_by_workload.png"),
        speedup_vs_batch(records, out / "speedup_vs_batch.png"),
        time_breakdown(records, out / "time_breakdown.png"),
        acceptance_by_position(records, out / "acceptance_by_position.png"),
    ]
