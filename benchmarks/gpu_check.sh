#!/usr/bin/env bash
# GPU check of the torch CP engine on one lent GPU (H200). Prepared for the integrator; not run on CPU hosts.
#   benchmarks/gpu_check.sh [extra gpu_check.py args]
# Writes $OUT/gpu_check/ (or out/gpu_check/ without $OUT): gpu.txt, correctness.json, profile_samples.csv
# (the columns of `vertumnus profile`'s samples), summary.json (incl. a degree-1 fit). Stays under 5 min.
# Fit the samples into a profile on the same host:
#   vertumnus profile --from-samples out/gpu_check/profile_samples.csv --config configs/h200x8-example.yaml \
#     --engine torch --degrees 1 --trace '' --out configs/profiles/h200-torch-c1.yaml
# Qwen3-30B-A3B shape (all 48 layers, 128 experts top-8, random bf16 weights, R 1K-64K x P 0 / 16K):
#   benchmarks/gpu_check.sh --model qwen3-30b-a3b --repeats 2
# CPU dry run of the same code path (what the test suite runs; add --model qwen3-30b-a3b for the MoE one):
#   python benchmarks/gpu_check.py --device cpu --small --repeats 1 --out /tmp/gpu_check
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${OUT:-out}/gpu_check"
mkdir -p "$DIR"

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for c in .venv/bin/python python3 python; do
    if command -v "$c" >/dev/null 2>&1 &&
       "$c" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
      PY="$c"
      break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "gpu_check: no python with a CUDA-enabled torch found (set PYTHON=...)" >&2
  exit 2
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$DIR/gpu.txt" || true
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$DIR/gpu.txt"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout 280 "$PY" benchmarks/gpu_check.py --out "$DIR" "$@" \
  2>&1 | tee "$DIR/log.txt"
exit "${PIPESTATUS[0]}"
