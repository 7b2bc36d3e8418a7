"""One attention job (sd_attend) built from two source trees, alternated in one process: a change to
qkernels_attention.h measured on the part it changes, with its bits compared.

    python scripts/attention_ab.py OLD_DIR NEW_DIR [--rows 1,8] [--keys 300,512] [--caches 256] [--cflags ...]

Each dir holds qkernels.c and its headers (e.g. a `git worktree` of the old commit's src/specdec/model).
A job is ``rows`` query rows of a 6-head group (Qwen2.5-Coder-1.5B's: 6 query heads a KV head, 128 dims)
against ``keys`` float16 cache rows, the rows seeing the keys causally as a verify pass's do. With
``--caches N`` every call reads the next of N caches (out of memory, as in a pass, where the weights evict
each layer's cache between passes); 1 keeps one cache in L1/L2. Median of 15 alternated rounds of 300 calls.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from specdec.model.clib import FLAGS

GROUP, DIM = 6, 128
_ARGS = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_double, ctypes.c_void_p, ctypes.c_void_p,
         ctypes.c_void_p, ctypes.c_void_p]


def build(source_dir: str, out: Path, cflags: list[str]):
    subprocess.run(["cc", *FLAGS, *cflags, f"{source_dir}/qkernels.c", "-o", str(out), "-lm"], check=True)
    fn = ctypes.CDLL(str(out)).sd_attend
    fn.restype, fn.argtypes = None, _ARGS
    return fn


def job(fn, rows: int, n_keys: int, caches: int, rng: np.random.Generator):
    """A call that runs the job against the next cache, and its outputs (top, total, acc)."""
    n = rows * GROUP
    q = rng.standard_normal((n, DIM)).astype(np.float32)
    keys = rng.standard_normal((caches, n_keys, DIM)).astype(np.float16).view(np.int16)
    values = rng.standard_normal((caches, n_keys, DIM)).astype(np.float16).view(np.int16)
    seen = np.ones((rows, n_keys), np.uint8)
    for r in range(rows):
        seen[r, n_keys - rows + r + 1:] = 0
    scores = np.zeros((n, (n_keys + 7) // 8 * 8), np.float32)
    top, total, acc = np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros((n, DIM), np.float32)
    calls = itertools.cycle([
        (q.ctypes.data, n, GROUP, DIM, keys[c].ctypes.data, values[c].ctypes.data, 2, n_keys, seen.ctypes.data,
         DIM ** -0.5, scores.ctypes.data, top.ctypes.data, total.ctypes.data, acc.ctypes.data)
        for c in range(caches)])
    held = (q, keys, values, seen, scores)  # the arrays the pointers point into

    def call() -> None:
        fn(*next(calls))

    call.held = held
    return call, (top, total, acc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--keys", default="300,512")
    ap.add_argument("--caches", type=int, default=256)
    ap.add_argument("--cflags", default="", help='extra compiler flags for both, e.g. "-mno-avx512f"')
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fns = {name: build(d, Path(tmp) / f"{name}.so", args.cflags.split())
               for name, d in (("old", args.old), ("new", args.new))}
        print("| rows | keys | old us | new us | new / old | same bits |")
        print("|---:|---:|---:|---:|---:|---|")
        for rows in map(int, args.rows.split(",")):
            for n_keys in map(int, args.keys.split(",")):
                jobs = {name: job(fn, rows, n_keys, args.caches, np.random.default_rng(0)) for name, fn in fns.items()}
                for call, _ in jobs.values():
                    call()
                same = all(np.array_equal(a, b) for a, b in zip(jobs["old"][1], jobs["new"][1], strict=True))
                times: dict[str, list[float]] = {name: [] for name in jobs}
                for _ in range(15):
                    for name, (call, _) in jobs.items():
                        t0 = time.perf_counter()
                        for _ in range(300):
                            call()
                        times[name].append((time.perf_counter() - t0) / 300 * 1e6)
                old, new = (float(np.median(times[k])) for k in ("old", "new"))
                print(f"| {rows} | {n_keys} | {old:.1f} | {new:.1f} | {new / old:.3f} | {same} |")


if __name__ == "__main__":
    main()
