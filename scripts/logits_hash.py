"""CRC32 of a model's 1 / 3 / 8-token pass logits after a 300-token synthetic context: a kernel change that
should keep the bits keeps these (docs/performance.md quotes them per session).

    python scripts/logits_hash.py [--model qwen2.5-coder-1.5b]
"""

from __future__ import annotations

import argparse
import zlib

from specdec.bench.passes import probe_tokens, synthetic_context
from specdec.model import clib
from specdec.runners.base import SeqInput
from specdec.runners.load import load_runner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    args = ap.parse_args()
    runner, _ = load_runner(args.model)
    slot = runner.allocate()
    runner.run([SeqInput(slot, synthetic_context(runner, 300), all_logits=False)])
    hashes = []
    for width in (1, 3, 8):
        out = runner.run([SeqInput(slot, probe_tokens(runner, width))])
        hashes.append(f"{zlib.crc32(out.logits[0].numpy().tobytes()):08x}")
        runner.truncate(slot, 300)
    print(f"{args.model} ({clib.isa()} kernels): 1 / 3 / 8-token logits {' / '.join(hashes)}")


if __name__ == "__main__":
    main()
