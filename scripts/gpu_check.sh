#!/usr/bin/env bash
# The CUDA checks, for a machine with a GPU (e.g. the `device` tool): the cuda-marked tests
# and `specdec bench passes` on the GPU. Needs the venv of `make install` (or its packages).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
$PY -m pytest -q -m cuda tests/test_cuda.py
$PY -m specdec.cli bench passes --device cuda --rounds 9
$PY -m specdec.cli bench passes --device cuda --dtype bfloat16 --rounds 9
