"""Per Spec-Bench group tau / speedup table from `specdec bench` results (docs/performance.md, EAGLE-3).

    python scripts/spec_bench_groups.py tree=docs/bench-eagle3-tree/results.jsonl \\
                                      chain=docs/bench-eagle3-chain/results.jsonl

Each cell is tau / speedup at batch 1, temperature 0. The overall speedup weighs each group's
plain-decoding time by the method's token count; accept@d = accepted / drafted at depth d, summed
over the groups. `none` is printed once, from the first file.
"""

from __future__ import annotations

import json
import sys

GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
DEPTHS = 5


def table_rows(label: str, path: str, with_plain: bool) -> list[str]:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows = [r for r in rows if r["kind"] == "specdec" and r["batch_size"] == 1 and r["temperature"] == 0]
    plain = {r["workload"]: r for r in rows if r["method"] == "none"}
    out = []
    for method in dict.fromkeys(r["method"] for r in rows):
        if method == "none" and not with_plain:
            continue
        mine = {r["workload"]: r for r in rows if r["method"] == method}
        cells = [f"{mine[g]['tau']:.2f} / {mine[g]['speedup']:.2f}×" if g in mine else "—" for g in GROUPS]
        tokens = sum(r["new_tokens"] for r in mine.values())
        seconds = sum(r["seconds"] for r in mine.values())
        plain_seconds = sum(plain[g]["seconds"] * r["new_tokens"] / plain[g]["new_tokens"] for g, r in mine.items())
        passes = sum(r["decode_passes"] for r in mine.values())
        per_depth = []
        for d in range(DEPTHS):
            accepted = sum(r["accepted_per_pos"][d] for r in mine.values() if len(r["accepted_per_pos"]) > d)
            drafted = sum(r["drafted_per_pos"][d] for r in mine.values() if len(r["drafted_per_pos"]) > d)
            if drafted:
                per_depth.append(f"{accepted / drafted:.2f}")
        draft_share = sum(r["draft_seconds"] for r in mine.values()) / seconds
        name = method if method == "none" else f"{method} ({label})"
        summary = [f"{tokens / passes:.2f}", f"{plain_seconds / seconds:.2f}×", " / ".join(per_depth) or "—",
                   f"{100 * draft_share:.1f}%"]
        out.append(f"| `{name}` | " + " | ".join(cells + summary) + " |")
    return out


def main() -> int:
    print("| Method | " + " | ".join(GROUPS) + " | Overall τ | Overall speedup | accept@1..5 | draft share |")
    print("|---|" + "---|" * (len(GROUPS) + 4))
    for i, arg in enumerate(sys.argv[1:]):
        label, path = arg.split("=", 1)
        print("\n".join(table_rows(label, path, with_plain=i == 0)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
