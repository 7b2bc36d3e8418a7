"""How fast the interleaved products stream their weights, out of cache, by activation rows.

Each format gets COPIES separate matrices the size of Qwen2.5-Coder-1.5B's (Q4_K and Q5_K: ffn_gate 8960 x 1536;
Q6_K: ffn_down 1536 x 8960) or of the 0.5B's (Q5_0: ffn_gate 4864 x 896, Q8_0 the same shape; COPIES x 4
of them; Q5_1 likewise), random valid blocks packed as at load; one product of R activation rows
against each in turn is timed (best of 5) and compared with reading a buffer of the same size on every
core (the read floor of `specdec bench passes`). Build variants through the kernels' extra flags:

    python scripts/kernel_stream.py --rows 1,8 --copies 64
    python scripts/kernel_stream.py --rows 1,2,4,8 --copies 1 --group-rows both   # 8- against 16-row groups, in L3
    SPECDEC_QKERNELS_CFLAGS="-mno-avx512f" python scripts/kernel_stream.py        # the AVX2 (+VNNI) path
    SPECDEC_QKERNELS_CFLAGS="-DPF_AHEAD=1024" python scripts/kernel_stream.py     # another prefetch distance
    python scripts/kernel_stream.py --types Q5_K --group-rows plain               # GGUF's blocks against interleaved
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as T

from specdec.bench.passes import floor_reader
from specdec.model import clib, kernels
from specdec.model.quant import QuantMatrix

SHAPES = {T.Q4_K: (8960, 1536), T.Q5_K: (8960, 1536), T.Q6_K: (1536, 8960), T.Q5_0: (4864, 896), T.Q8_0: (4864, 896),
          T.Q5_1: (4864, 896)}
K_TYPES = (T.Q4_K, T.Q5_K, T.Q6_K)


def random_k_blocks(qtype: T, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Rows of valid K-quant blocks: random bits with small float16 scales (any bits are a valid block);
    the 32-value types from gguf's quantizer."""
    if qtype not in K_TYPES:
        return quants.quantize(rng.standard_normal((rows, k)).astype(np.float32), qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows, k // block, size), dtype=np.uint8)

    def scales() -> np.ndarray:
        return rng.uniform(1e-3, 1e-2, size=(rows, k // block)).astype(np.float16).view(np.uint8).reshape(rows, -1, 2)

    if qtype == T.Q6_K:
        data[:, :, 208:210] = scales()  # d
    else:
        data[:, :, 0:2], data[:, :, 2:4] = scales(), scales()  # d, dmin
    return data.reshape(rows, -1)


def best_seconds(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,8", help="activation rows per product (default 1,8)")
    ap.add_argument("--copies", type=int, default=64,
                    help="matrices per format (default 64: 509 / 723 MB; x 4 for Q5_0 / Q8_0: 384 / 593 MB)")
    ap.add_argument("--group-rows", choices=("8", "16", "both", "plain"), help="rows per interleaved group (default: "
                    "the kernels' own, clib.wide_groups; both: 8 and 16 alternated, three times, in one process; "
                    "plain: GGUF's blocks as they are against the kernels' own groups, alternated likewise)")
    ap.add_argument("--types", default=",".join(t.name for t in SHAPES), help="block types (default: all)")
    args = ap.parse_args()
    widths = {None: [None], "8": [False], "16": [True], "both": [False, True], "plain": ["plain", None]}
    widths = widths[args.group_rows]
    types = [T[name.strip()] for name in args.types.split(",")]
    clib.load_qkernels()
    rng = np.random.default_rng(0)
    print(f"kernels: {clib.isa()}")
    largest = 0
    for qtype in types:
        n, k = SHAPES[qtype]
        blocks = random_k_blocks(qtype, n, k, rng)
        copies = args.copies * (1 if qtype in K_TYPES else 4)
        layouts = {}
        for wide in widths:
            base = QuantMatrix.from_blocks(blocks, qtype, k)
            base = base if wide == "plain" else base.interleaved(wide=wide)
            layouts[wide] = [tuple(a.copy() for a in base.arrays()) for _ in range(copies)]
        sizes = {wide: sum(m[0].nbytes for m in mats) for wide, mats in layouts.items()}
        largest = max(largest, *sizes.values())
        for rows in (int(r) for r in args.rows.split(",")):
            x = rng.standard_normal((rows, k)).astype(np.float32)
            out = np.empty((rows, n), dtype=np.float32)
            best = dict.fromkeys(widths, float("inf"))
            for _ in range(3 if len(widths) > 1 else 1):
                for wide, mats in layouts.items():

                    def products(mats=mats, x=x, out=out) -> None:
                        for m in mats:
                            kernels.qmatmul(*m, x, out)

                    best[wide] = min(best[wide], best_seconds(products))
            for wide, sec in best.items():
                nbytes = sizes[wide]
                rate, macs = nbytes / sec / 1e9, rows * n * k * copies / sec / 1e9
                label = {None: "", "plain": " (GGUF's blocks)"}.get(wide, f" ({16 if wide else 8}-row groups)")
                print(f"{qtype.name} {rows} row(s){label}: {sec * 1e3:.1f} ms for {nbytes / 1e6:.0f} MB = {rate:.1f} "
                      f"GB/s, {macs:.0f} GMAC/s")

    floor = best_seconds(floor_reader(largest, torch.device("cpu")))
    print(f"read floor: {largest / floor / 1e9:.1f} GB/s ({largest / 1e6:.0f} MB on every core)")


if __name__ == "__main__":
    main()
