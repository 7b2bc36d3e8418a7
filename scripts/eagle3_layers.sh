#!/usr/bin/env bash
# Which target layers should an EAGLE-3 head read? One self-distilled collection that caches the
# states of every candidate layer, then one head per choice with the same data, vocabulary, seed
# and steps; prints validation tau / acceptance by step for each (the trainer's own validation).
#   bash scripts/eagle3_layers.sh OUT_DIR [SAMPLES] [STEPS]
set -euo pipefail
OUT_DIR=${1:?usage: scripts/eagle3_layers.sh OUT_DIR [SAMPLES] [STEPS]}
SAMPLES=${2:-240}
STEPS=${3:-150}
CHOICES="1,14,26 7,15,23 20,24,28 26"  # EAGLE-3's low/mid/high (the default), evenly spread, high only, one
SUPERSET=1,7,14,15,20,23,24,26,28
specdec() { python -m specdec.cli "$@"; }
specdec train eagle3 --out "$OUT_DIR/collect" --samples "$SAMPLES" --steps 0 --layers "$SUPERSET"
for layers in $CHOICES; do
    run="$OUT_DIR/layers-${layers//,/-}"
    mkdir -p "$run"
    ln -sfn "$(realpath "$OUT_DIR/collect/data")" "$run/data"
    [ -f "$run/metrics.jsonl" ] || specdec train eagle3 --out "$run" --samples "$SAMPLES" --steps "$STEPS" \
        --eval-every 50 --layers "$layers"
done
python - "$OUT_DIR" $CHOICES <<'PY'
import json, sys
from pathlib import Path
out, choices = Path(sys.argv[1]), sys.argv[2:]
print("| layers read | validation tau by step | acceptance 1-4 (last) | training tokens |")
print("|---|---|---|---:|")
for layers in choices:
    rows = [json.loads(x) for x in (out / f"layers-{layers.replace(',', '-')}" / "metrics.jsonl").read_text().splitlines()]
    curve = " / ".join(f"{r['step']}: {r['tau']:.3f}" for r in rows)
    print(f"| {layers} | {curve} | {' / '.join(f'{a:.3f}' for a in rows[-1]['acceptance'])} | {rows[-1]['train_tokens']} |")
PY
