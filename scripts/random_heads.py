"""Untrained drafters at a target's shapes: an EAGLE-3 head, a P-EAGLE head (K = 4) and an MTP module.

    python scripts/random_heads.py --model qwen2.5-coder-1.5b --out DIR   # DIR/seq, DIR/par, DIR/mtp

What a draft step costs does not depend on the weights, so these price sequential, parallel and MTP
drafting on a target no head was trained for (scripts/head_draft_cost.py; they keep ~no tokens).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from specdec.model.eagle_checkpoint import save_head, tokenizer_hash
from specdec.model.eagle_head import EagleHead, EagleHeadConfig
from specdec.runners.load import load_runner
from specdec.text import load_tokenizer
from specdec.train.mtp import MtpIO, new_mtp_head
from specdec.train.recipes import init_from_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    args = ap.parse_args()
    out = Path(args.out)
    runner, folder = load_runner(args.model, max_seq_len=512, num_slots=1)
    tokenizer = load_tokenizer(folder)
    for k, name in ((0, "seq"), (4, "par")):
        config = EagleHeadConfig.for_target(runner.config, args.draft_vocab, verifier_name=args.model or "default",
                                            parallel_tokens=k)
        config = replace(config, verifier={**config.verifier, "tokenizer_hash": tokenizer_hash(tokenizer)})
        head = EagleHead(config)
        head.set_vocab(torch.arange(config.draft_vocab_size))
        init_from_target(head, runner)
        save_head(head, out / name)
    MtpIO(json.loads((folder / "config.json").read_text())).save(new_mtp_head(runner), out / "mtp")
    print(f"wrote {out}/seq, {out}/par, {out}/mtp")


if __name__ == "__main__":
    main()
