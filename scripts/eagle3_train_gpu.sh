#!/usr/bin/env bash
# Self-distil and train an EAGLE-3 head for the default model on a CUDA machine (prepared for a
# session that is lent one; not yet run). Features then come from the dequantised float model
# (the GGUF blocks run on the CPU kernels only), a small mismatch with CPU inference.
#   bash scripts/eagle3_train_gpu.sh [OUT_DIR] [SAMPLES] [STEPS]
set -euo pipefail
OUT_DIR=${1:-eagle3-smollm2-gpu}
SAMPLES=${2:-20000}
STEPS=${3:-4000}
python -m specdec.cli train eagle3 --device cuda --out "$OUT_DIR" --samples "$SAMPLES" --steps "$STEPS" \
    --batch-size 64 --batch-tokens 8192 --eval-every 250
cat "$OUT_DIR/metrics.jsonl"
