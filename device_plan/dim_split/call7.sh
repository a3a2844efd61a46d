#!/usr/bin/env bash
set -uo pipefail
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
(cd .ab/dsmem && nvcc -O3 -arch=sm_90a -std=c++17 -o xchg xchg.cu && timeout 60 ./xchg) > "$OUT/xchg.txt" 2>&1
echo "xchg rc=$?"; cat "$OUT/xchg.txt"
(cd .ab/dimsplit && nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I../../templates -o ds ds.cu && timeout 150 ./ds) > "$OUT/ds.txt" 2>&1; echo "ds rc=$?"; cat "$OUT/ds.txt"
