#!/usr/bin/env bash
# The CUDA checks, for a machine with a GPU (e.g. the `device` tool): the cuda-marked tests, then
# `specdec bench passes` on the GPU (float32 and bfloat16). Needs specdec's packages (the venv of
# `make install`; elsewhere PY=python3 with PYTHONPATH=src). A machine without the default model's
# package sets SPECDEC_TEST_TOKENIZER to a folder with its config and tokenizer, and SHAPE to a model
# folder's config + tokenizer (no weights): the passes are then timed on random weights of that shape
# (a pass's time does not depend on the weights' values).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
$PY -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda.py
# Every tiny model lands on the GPU there by default: the lossless suites run on CUDA (their tests of the
# default model error without its package; rows computed on CUDA are not bit-identical to one-token passes,
# so a greedy test can differ at a near-tie: read failures, do not expect none). On the H200 the first two
# files took longer than 170 s at 8 jobs: give LOSSLESS_SECONDS what the lease allows.
timeout "${LOSSLESS_SECONDS:-300}" $PY -m pytest -q -p no:cacheprovider -n "${JOBS:-8}" -rfE --tb=line \
    tests/test_lossless.py tests/test_lossless_sampling.py tests/test_lossless_sampling_processors.py || true
MODEL=()
if [ -n "${SHAPE:-}" ]; then
    $PY - "$SHAPE" /tmp/shape-model <<'PYEOF'
import shutil, sys
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
shape, out = Path(sys.argv[1]), Path(sys.argv[2])
config = AutoConfig.from_pretrained(shape)
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
for f in shape.iterdir():
    if f.name != "config.json":
        shutil.copy(f, out / f.name)
print(f"random {config.model_type} at {shape.name}'s shape: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters")
PYEOF
    MODEL=(--model /tmp/shape-model)
fi
$PY -m specdec.cli bench passes "${MODEL[@]}" --device cuda --rounds 9 --prefill 512
$PY -m specdec.cli bench passes "${MODEL[@]}" --device cuda --dtype bfloat16 --rounds 9 --prefill 512
