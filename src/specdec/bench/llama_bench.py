"""llama.cpp's ``llama-bench`` beside ``specdec bench passes --llama-bench``: the same GGUF file and thread count,
each pass width as llama-bench's ppN after the same context (``-d``), the prefill as ppN into an empty cache.

llama-bench times a batch of N prompt tokens (its ppN) after ``-d`` tokens already in the cache: what a verify pass
of N tokens is, and with N = 1 a decode step's pass without sampling. The binary: ``$SPECDEC_LLAMA_BENCH``, else the
newest build of ``scripts/build_llama_cpp.sh``, else PATH (``llama_cpp.find_binary``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from specdec.bench.llama_cpp import find_binary, repack_safe
from specdec.bench.machine import cpu_info
from specdec.errors import UsageError

TIMEOUT_S = 1800.0


def find_llama_bench() -> Path | None:
    return find_binary("llama-bench", "SPECDEC_LLAMA_BENCH")


def command(binary: Path, gguf: Path, threads: int, widths: list[int], depth: int, repetitions: int,
            repack: bool = True) -> list[str]:
    """e.g. [llama-bench, -m, x.gguf, -t, 2, -p, 1,8, -n, 0, -d, 300, -r, 9, -o, json]: prompt batches only
    (``repack`` False: its weights not repacked, ``llama_cpp.repack_safe``)."""
    return [str(binary), "-m", str(gguf), "-t", str(threads), "-p", ",".join(map(str, widths)), "-n", "0",
            "-d", str(depth), "-r", str(repetitions), "-o", "json", *(() if repack else ("--repack", "0"))]


def batch_ms(report: list[dict]) -> dict[tuple[int, int], float]:
    """llama-bench's JSON report -> the mean ms of each prompt test, keyed by (tokens, depth)."""
    return {(int(t["n_prompt"]), int(t["n_depth"])): t["avg_ns"] / 1e6 for t in report
            if int(t["n_gen"]) == 0 and int(t["n_prompt"]) > 0}


def run(binary: Path, gguf: Path, threads: int, widths: list[int], depth: int, prefill: int | None,
        repetitions: int) -> dict:
    """llama-bench's ms for each width after ``depth`` tokens and for ``prefill`` tokens into an empty cache:
    {"build": int, "pass_ms": {width: ms}, "prefill_ms": ms or None, "repack": bool}. UsageError (one line) when
    it fails."""
    repack = repack_safe(cpu_info())
    runs = [(widths, depth)] + ([([prefill], 0)] if prefill else [])
    timed: dict[tuple[int, int], float] = {}
    build = None
    for ns, d in runs:
        cmd = command(binary, gguf, threads, ns, d, repetitions, repack)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
            report = json.loads(done.stdout) if done.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
            raise UsageError(f"llama-bench failed ({' '.join(cmd)}): {exc}") from None
        if not report:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise UsageError(f"llama-bench failed with exit code {done.returncode} ({' '.join(cmd)}): {tail}")
        timed |= batch_ms(report)
        build = report[0].get("build_number", build)
    missing = [n for ns, d in runs for n in ns if (n, d) not in timed]
    if missing:
        raise UsageError(f"llama-bench reported no pp{missing[0]} test ({binary})")
    return {"build": build, "pass_ms": {w: timed[(w, depth)] for w in widths},
            "prefill_ms": timed[(prefill, 0)] if prefill else None, "repack": repack}
