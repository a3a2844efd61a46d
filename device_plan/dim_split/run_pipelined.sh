#!/usr/bin/env bash
# Device plan (branch exp/dim-split-prototype): the dim-split prototype's four variants, serial
# (kPipe 0) and pipelined (kPipe 1: QK(b + 1) under the exchange and softmax of b, O touched only
# after wait<0>; compiles without C75xx, spills 68-100 B), each with and without turns.
# From the repository root of this branch, nothing to carry. Prediction for kPipe 1: bounded by
# the exchange, ~2,700-4,500 cycles a tile (serial: ~5,800-6,600; the shipped loop ~3,670).
set -uo pipefail
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I templates -Xptxas -v -o /tmp/ds device_plan/dim_split/ds.cu 2>&1 | grep -E "C75|spill"
timeout 200 /tmp/ds | tee "$OUT/ds.txt"
