#!/usr/bin/env bash
# The accelerator rows in one prepared call (the device tool's machine): (c) the ViT-B headline and its
# compile time, (f) sweep vs matmul bound, (g) 16 seeds and 3 λ × 16 seeds in one program against one
# restart (issue 20's GPU targets), (h) the gated operator at d up to 4096 (issue 23).
# Writes results_gpu.json under $OUT (the device tool's output folder) or benchmarks/.
set -euo pipefail
cd "$(dirname "$0")/.."
pip install -q -e . >/dev/null
python benchmarks/run.py --only cfgh --out "${OUT:-benchmarks}/results_gpu.json"
# Grouped compression against one block at a time (issue 44): 6 blocks of the ViT study's shape.
python benchmarks/grouped.py --out "${OUT:-benchmarks}/grouped_gpu.json"
