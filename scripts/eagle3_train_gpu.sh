#!/usr/bin/env bash
# Self-distil and train a drafter for a target on a CUDA machine (prepared for a session that is lent
# one; nothing depends on it). Features then come from the dequantised float model (the GGUF blocks run
# on the CPU kernels only), a small mismatch with CPU inference.
#   bash scripts/eagle3_train_gpu.sh [eagle3|parallel|mtp] [OUT_DIR] [SAMPLES] [STEPS]
#     eagle3    an EAGLE-3 head (--spec-type eagle3 --spec-model OUT_DIR)
#     parallel  a P-EAGLE head, K = ${PARALLEL_K:-4} (add --spec-parallel-drafting)
#     mtp       an MTP module (--spec-type draft-mtp --spec-model OUT_DIR); DATA_DIR=an eagle3 run's
#               OUT_DIR/data reuses that collection
# TARGET=model (default: the default model, SmolLM2-135M-Instruct; e.g. qwen2.5-coder-1.5b).
set -euo pipefail
METHOD=eagle3
case "${1:-}" in eagle3|parallel|mtp) METHOD=$1; shift ;; esac
OUT_DIR=${1:-$METHOD-smollm2-gpu}
SAMPLES=${2:-20000}
STEPS=${3:-4000}
args=(--device cuda --out "$OUT_DIR" --samples "$SAMPLES" --steps "$STEPS" --batch-size 64 --batch-tokens 8192
      --eval-every 250)
[ -n "${TARGET:-}" ] && args+=(--target "$TARGET")
[ -n "${DATA_DIR:-}" ] && args+=(--data-dir "$DATA_DIR")
case "$METHOD" in
    eagle3)   python -m specdec.cli train eagle3 "${args[@]}" ;;
    parallel) python -m specdec.cli train eagle3 --parallel "${PARALLEL_K:-4}" "${args[@]}" ;;
    mtp)      python -m specdec.cli train mtp "${args[@]}" ;;
esac
cat "$OUT_DIR/metrics.jsonl"
