"""out/report.md: Spec-Bench-leaderboard-style tables, oracle analysis, machine info and notes."""

from __future__ import annotations

from pathlib import Path

from specdec.bench import metrics
from specdec.bench.llama_cpp import NAME_PREFIX as LLAMA_CPP_ROW
from specdec.bench.workloads import TITLES

MIB = 1 << 20


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}×"


def _f(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _load(values) -> str:
    return "/".join(f"{v:.2f}" for v in values) if values else "?"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def _settings(records: list[dict]) -> list[tuple[float, int]]:
    """(temperature, batch size) pairs in run order."""
    seen: list[tuple[float, int]] = []
    for r in records:
        if r["kind"] == "specdec" and (r["temperature"], r["batch_size"]) not in seen:
            seen.append((r["temperature"], r["batch_size"]))
    return seen


def _rows_order(records: list[dict]) -> list[str]:
    names: list[str] = []
    for kind in ("specdec", "peer"):
        for r in records:
            if r["kind"] == kind and r["method"] not in names:
                names.append(r["method"])
    return names


def leaderboard(records: list[dict], temperature: float, batch: int) -> list[str]:
    runs = [r for r in records if r["temperature"] == temperature and r["batch_size"] == batch
            and r["kind"] in ("specdec", "peer")]
    workloads = list(dict.fromkeys(r["workload"] for r in runs if r["kind"] == "specdec"))
    totals = metrics.overall(runs, workloads)
    header = ["Method", *[TITLES.get(w, w) for w in workloads], "Overall", "τ (mean accepted)", "tok/s",
              "decode tok/s (after prefill)"]
    rows = []
    for name in _rows_order(runs):
        cells = {r["workload"]: r for r in runs if r["method"] == name}
        tot = totals.get((name, batch, temperature), {})
        rows.append([f"`{name}`", *[_x(cells[w]["speedup"]) if w in cells else "—" for w in workloads],
                     _x(tot.get("speedup")), _f(tot.get("tau")), _f(tot.get("tokens_per_s"), 1),
                     _f(tot.get("decode_tokens_per_s"), 1)])
    return _table(header, rows)


def throughput_table(records: list[dict], temperature: float, batch: int) -> list[str]:
    runs = [r for r in records if r["temperature"] == temperature and r["batch_size"] == batch
            and r["kind"] in ("specdec", "peer")]
    workloads = list(dict.fromkeys(r["workload"] for r in runs if r["kind"] == "specdec"))
    rows = []
    for name in _rows_order(runs):
        cells = {r["workload"]: r for r in runs if r["method"] == name}
        rows.append([f"`{name}`", *[_f(cells[w]["tokens_per_s"], 1) if w in cells else "—" for w in workloads]])
    return _table(["Method (tok/s)", *[TITLES.get(w, w) for w in workloads]], rows)


def decode_table(records: list[dict], temperature: float, batch: int) -> list[str]:
    """Decode tok/s (after prefill) over plain decoding's in the same workload: what speculation does to
    the decoding alone, where a short answer after a long prompt hides it under the prefill both share."""
    runs = [r for r in records if r["temperature"] == temperature and r["batch_size"] == batch
            and r["kind"] in ("specdec", "peer")]
    workloads = list(dict.fromkeys(r["workload"] for r in runs if r["kind"] == "specdec"))
    plain = {r["workload"]: r.get("decode_tokens_per_s") for r in runs if r["kind"] == "specdec"
             and r["method"] == "none"}
    rows = []
    for name in _rows_order(runs):
        cells = {r["workload"]: r.get("decode_tokens_per_s") for r in runs if r["method"] == name}
        rows.append([f"`{name}`", *[_x(cells[w] / plain[w]) if cells.get(w) and plain.get(w) else "—"
                                    for w in workloads]])
    return _table(["Method (decode ÷ plain's)", *[TITLES.get(w, w) for w in workloads]], rows)


def detail_table(records: list[dict], temperature: float, batch: int, usd_per_hour: float) -> list[str]:
    runs = [r for r in records if r["temperature"] == temperature and r["batch_size"] == batch
            and r["kind"] in ("specdec", "peer")]
    workloads = list(dict.fromkeys(r["workload"] for r in runs if r["kind"] == "specdec"))
    totals = metrics.overall(runs, workloads)
    header = ["Method", "acc. rate", "τ", "accept@1..4", "draft share", "verify share", "step / pass ms", "KV MiB",
              "drafter KiB", "peak RSS MiB", "$ / M tok"]
    rows = []
    for name in _rows_order(runs):
        mine = [r for r in runs if r["method"] == name]
        tot = totals.get((name, batch, temperature), {})
        drafted = sum(r["drafted"] for r in mine)
        acceptance_rate = sum(r["accepted"] for r in mine) / drafted if drafted else None
        rates = metrics.acceptance_by_pos(metrics.sum_lists(r["accepted_per_pos"] for r in mine),
                                          metrics.sum_lists(r["drafted_per_pos"] for r in mine))
        by_pos = " / ".join(f"{x:.2f}" for x in rates[:4]) or "—"
        tps = tot.get("tokens_per_s") or 0.0
        usd = f"{usd_per_hour / 3600 / tps * 1e6:.2f}" if tps else "—"
        kv = max((r["kv_bytes"] or 0 for r in mine), default=0)
        drafter = [r["drafter_bytes"] for r in mine if r["drafter_bytes"] is not None]
        is_spec = mine[0]["kind"] == "specdec"
        rows.append([
            f"`{name}`", _f(acceptance_rate) if is_spec and drafted else "—", _f(tot.get("tau")), by_pos,
            f"{tot['draft_share']:.1%}" if is_spec else "—", f"{tot['target_share']:.1%}" if is_spec else "—",
            f"{tot['step_ms']:.1f} / {tot['pass_ms']:.1f}" if is_spec and tot.get("step_ms") is not None else "—",
            f"{kv / MIB:.1f}" if kv else "—",
            f"{max(drafter) / 1024:.0f}" if drafter else "—",
            f"{max(r['peak_rss_bytes'] for r in mine) / MIB:.0f}", usd,
        ])
    return _table(header, rows)


def batch_table(records: list[dict], temperature: float) -> list[str]:
    runs = [r for r in records if r["temperature"] == temperature and r["kind"] == "specdec"]
    batches = sorted({r["batch_size"] for r in runs})
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    totals = metrics.overall(runs, workloads)
    rows = []
    for name in _rows_order(runs):
        row = [f"`{name}`"]
        for b in batches:
            tot = totals.get((name, b, temperature))
            row.append("—" if tot is None else f"{tot['tokens_per_s']:.1f} ({_x(tot['speedup'])})")
        rows.append(row)
    return _table(["Method: tok/s (speedup)", *[f"batch {b}" for b in batches]], rows)


def correctness_lines(records: list[dict]) -> list[str]:
    greedy = [r for r in records if r["kind"] in ("specdec", "peer") and r["temperature"] == 0.0]
    checked = [r for r in greedy if r["kind"] == "specdec" and r["method"] != "none"
               or r["kind"] == "specdec" and r["batch_size"] > 1]
    lines = [f"- specdec greedy outputs checked token for token against plain decoding (batch 1): "
             f"{sum(r['requests'] for r in checked)} outputs in {len(checked)} runs, "
             f"{sum(r['greedy_mismatches'] or 0 for r in checked)} mismatches (any mismatch fails the run)."]
    for name in _rows_order([r for r in greedy if r["kind"] == "peer"]):
        mine = [r for r in greedy if r["method"] == name and r["greedy_mismatches"] is not None]
        bad, total = sum(r["greedy_mismatches"] for r in mine), sum(r["requests"] for r in mine)
        lines.append(f"- peer `{name}`: {bad} of {total} greedy outputs differ from specdec plain decoding "
                     f"(reported, not fatal: different kernels can flip near-tied tokens).")
    return lines


def llama_cpp_lines(notes: list[str]) -> list[str]:
    """The llama.cpp rows' timing rule and their notes (decode speed, outputs equal to llama.cpp plain's)."""
    mine = [n for n in notes if n.startswith(LLAMA_CPP_ROW)]
    if not mine:
        return []
    return ["- `llama.cpp …` rows are timed by llama-server's own reported timings (prompt_ms + predicted_ms "
            "per request: prefill and decode, HTTP excluded), not by our clock. Per row:",
            *[f"  - {n}" for n in mine]]


def oracle_section(records: list[dict], real: list[dict]) -> list[str]:
    costs = next((r for r in records if r["kind"] == "pass_costs"), None)
    oracles = [r for r in records if r["kind"] == "oracle"]
    if costs is None or not oracles:
        return ["(no oracle analysis in this run: it needs greedy workloads and at least one drafting method)"]
    base = costs["seconds_by_width"][0]
    out = [
        "Every drafter replays specdec's plain greedy outputs: at each position it proposes given the true "
        "context, and we count how many of its tokens would be accepted. A drafter alone advances "
        "accepted + 1 tokens per target pass; the **oracle** picks the drafter with the most accepted tokens "
        "at every step (or no draft). Passes convert to time with the measured cost of a verify pass over "
        f"T tokens at {costs['context_tokens']} tokens of context, relative to a 1-token pass:",
        "",
        *_table([f"T={t}" for t in range(1, len(costs["seconds_by_width"]) + 1)],
                [[f"{c / base:.2f}" for c in costs["seconds_by_width"]]]),
        "",
        f"(1-token pass: {base * 1000:.1f} ms.)",
        "",
    ]
    names = list(oracles[0]["drafters"])
    real_by = {(r["method"], r["workload"]): r for r in real}
    totals = metrics.overall(real, [o["workload"] for o in oracles if o["workload"] != "overall"])

    def measured(name: str, workload: str) -> dict:
        if workload == "overall":
            return totals.get((name, 1, 0.0)) or {}
        return real_by.get((name, workload)) or {}

    rows = []
    for o in oracles:
        w = o["workload"]
        single = max(names, key=lambda n: o["drafters"][n]["time_speedup"])
        reals = {n: measured(n, w).get("speedup") for n in names}
        known = {n: v for n, v in reals.items() if v is not None}
        best = max(known, key=known.get) if known else None
        rows.append([
            "**Overall**" if w == "overall" else TITLES.get(w, w), str(o["tokens"]), _f(o["oracle_tau"]),
            _x(o["oracle_pass_speedup"]), _x(o["oracle_time_speedup"]),
            f"`{single}` {_x(o['drafters'][single]['time_speedup'])}",
            f"`{best}` {_x(known[best])}" if best else "—",
            f"{known[best] / o['oracle_time_speedup']:.0%}" if best and o["oracle_time_speedup"] else "—",
        ])
    out += _table(["Workload", "tokens", "oracle τ", "oracle speedup (passes)", "oracle speedup (time)",
                   "best single drafter (replay, time)", "best real method", "best real / oracle"], rows)
    overall_o = next(o for o in oracles if o["workload"] == "overall")
    picks = overall_o["oracle_picks"]
    num_picks = max(sum(picks.values()), 1)
    rows = []
    for n in names:
        d, m = overall_o["drafters"][n], measured(n, "overall")
        speedup = m.get("speedup")
        rows.append([f"`{n}`", _f(m.get("tau")), _f(d["tau"]), _x(speedup), _x(d["pass_speedup"]),
                     _x(d["time_speedup"]), _x(overall_o["oracle_time_speedup"]),
                     f"{speedup / overall_o['oracle_time_speedup']:.0%}"
                     if speedup and overall_o["oracle_time_speedup"] else "—",
                     f"{picks.get(n, 0) / num_picks:.0%}"])
    out += ["", "Each method against the oracle (all greedy workloads):", "",
            *_table(["Method", "τ measured", "τ replay", "speedup measured", "replay (passes)", "replay (time)",
                     "oracle (time)", "measured / oracle", "oracle picks it"], rows),
            "", f"The oracle drafts nothing on {picks.get('(none)', 0) / num_picks:.0%} of its passes. "
            "The gap between a method's measured speedup and the oracle's is what a per-step choice of drafter "
            "could still win; the gap between its replay (time) and measured speedups is overhead the cost "
            "model leaves out (Python bookkeeping, cache compaction, prefill, timing noise). τ replay differs "
            "from τ measured where a drafter's state depends on which steps it saw."]
    return out


def recommendations(records: list[dict]) -> list[str]:
    lines = []
    runs = [r for r in records if r["kind"] == "specdec" and r["batch_size"] == 1]
    for temp, w in dict.fromkeys((r["temperature"], r["workload"]) for r in runs):
        mine = [r for r in runs if r["workload"] == w and r["temperature"] == temp and r["method"] != "none"]
        if not mine:
            continue
        best = max(mine, key=lambda r: r["speedup"] or 0)
        verdict = ("speculation does not pay here: switch it off" if (best["speedup"] or 0) < 1.0
                   else f"use `{best['method']}`")
        lines.append(f"- {TITLES.get(w, w)} (T={temp:g}): best `{best['method']}` {_x(best['speedup'])} → {verdict}.")
    return lines


def sampled_lengths_caveat(settings: list[tuple[float, int]], ignore_eos: bool) -> list[str]:
    """What a sampled table's speedups mix, unless every answer ran to the limit: at T=0.7 one method's
    MT-bench answers were 113 tokens against plain's 148 over the same prompts (0.86x by tok/s, 0.96x by
    decode tok/s; 1.05x with --ignore-eos)."""
    if ignore_eos or not any(temp > 0 for temp, _ in settings):
        return []
    return ["Sampled answers (temperature > 0) end where their draws say, so a method's answers may be shorter or "
            "longer than plain's over the same prompts, and its speedup with prefill mixes speed with length: "
            "read the decode table, or rerun with `--ignore-eos` (every answer runs to the limit).", ""]


def render(records: list[dict], meta: dict, notes: list[str], plots: list[str]) -> str:
    m = meta["machine"]
    runs = [r for r in records if r["kind"] in ("specdec", "peer")]  # the rest: oracle and pass costs
    settings = _settings(runs)
    real = [r for r in runs if r["kind"] == "specdec" and r["batch_size"] == 1 and r["temperature"] == 0.0]
    out = [
        "# specdec bench report", "",
        "Command:", "", "```", meta["command"], "```", "",
        f"- Model: `{meta['model']}` ({meta['folder']}), dtype **{meta['dtype']}**, KV cache "
        f"{meta.get('kv_cache') or meta['dtype']}, device {meta['device']}, "
        f"weights {meta.get('weights', '?')}",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; AVX2 {m['avx2']}, AVX-512 "
        f"{m['avx512']}, AVX512-BF16 {m['avx512_bf16']}, AMX {m['amx']}; {m['os']}",
        f"- Software: specdec {meta.get('code', '?')}; Python {m['python']}, torch {m['torch']}, "
        f"transformers {m['transformers']}",
        f"- Workloads: {', '.join(f'{TITLES.get(w, w)} ({n} requests)' for w, n in meta['requests'].items())}; "
        f"max new tokens {meta['max_new_tokens']}{' (EOS ignored)' if meta.get('ignore_eos') else ''}; "
        f"at most {meta['limit'] or 'all'} conversations per workload, "
        f"{meta.get('max_turns') or 'all'} turns each"
        + (" (--quick)" if meta["quick"] else ""),
        f"- Draft budget: {meta['draft_n_max']} tokens per step; cost at ${meta['usd_per_hour']:g}/hour; "
        f"torch threads: specdec {meta['specdec_threads']}, peers {meta['peer_threads']}",
        f"- Wall time of the whole run: {meta['wall_seconds'] / 60:.1f} min; load average (1/5/15 min) "
        f"{_load(meta.get('load_before'))} before, {_load(meta.get('load_after'))} after "
        f"(other processes on the machine skew timings)", "",
        "Speedup = tokens/s ÷ specdec plain decoding (`none`) on the same workload, batch size and "
        "temperature; peers run at batch 1 on the same token ids and budget. Overall sums tokens and "
        "seconds over the table's workloads. τ = tokens committed per target pass. Token counts come "
        "from token ids on every side.", "",
        *sampled_lengths_caveat(settings, bool(meta.get("ignore_eos"))),
    ]
    for temp, batch in settings:
        out += [f"## Leaderboard: temperature {temp:g}, batch size {batch}", "",
                *leaderboard(runs, temp, batch), "", "Throughput (tokens/s):", "",
                *throughput_table(runs, temp, batch), "",
                "Decode speedup (decode tok/s after prefill ÷ specdec plain's, same workload):", "",
                *decode_table(runs, temp, batch), "",
                "Details (all workloads of this table):", "",
                *detail_table(runs, temp, batch, meta["usd_per_hour"]), ""]
    for temp in dict.fromkeys(t for t, _ in settings):
        if len({b for t, b in settings if t == temp}) > 1:
            out += [f"## Batch size scaling (temperature {temp:g})", "", *batch_table(runs, temp), ""]
    out += ["## Correctness", "", *correctness_lines(runs), *llama_cpp_lines(notes), "",
            "## Oracle analysis (temperature 0, batch 1)", "", *oracle_section(records, real), "",
            "## Recommendations", "", *recommendations(runs), ""]
    if plots:
        out += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    out += ["## Notes", "", *[f"- {n}" for n in notes if not n.startswith(LLAMA_CPP_ROW)], ""]
    return "\n".join(out)
