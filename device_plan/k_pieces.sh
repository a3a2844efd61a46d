#!/usr/bin/env bash
# Device plan (branch exp/k-pieces): the A/B of main's scheduler kernel against this branch's
# (uniform batches spread over k = N / B lists each), then the metadata and decode tests on
# this branch's tree (its reference and checker: the GPU tests compare the kernel with them).
# Run from main's checkout with the branch's tree in .ab/kp
# (rm -rf .ab/kp && mkdir -p .ab/kp && git archive exp/k-pieces | tar -x -C .ab/kp); carry [".ab"].
# Predicted kp / main (H100, 2026-12-06): bf16 (16,1) b64 c3200 0.93-0.97, c8192 0.97-0.99,
# c23333 ~1.0; (64,1) b64 c3200 0.93-0.97; fp8 (16,1) b64 c3200 0.90-0.95, c8192 0.95-0.98,
# b128 c3200 0.92-0.96, c8192 0.96-0.99; fp8 (128,1) b4 / b16 / b32 c8192 0.97-1.0 (b4 may lose:
# 9 tiles a list against 8, for 3 fewer two-work lists).
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader
C=()
for c in "bf16 16,1 b64 c3200" "bf16 16,1 b64 c8192" "bf16 16,1 b64 c23333" "bf16 64,1 b64 c3200" \
         "fp8 16,1 b64 c3200" "fp8 16,1 b64 c8192" "fp8 16,1 b128 c3200" "fp8 16,1 b128 c8192" \
         "fp8 128,1 b4 c8192" "fp8 128,1 b16 c8192" "fp8 128,1 b32 c8192"; do C+=(--case "$c"); done
timeout 330 python3 scripts/template_ab.py --arm main= --arm kp=.ab/kp --rounds 3 -j 16 --check-requests 2 \
  "${C[@]}" -o "$OUT/kp" > "$OUT/kp.log" 2>&1
echo "ab rc=$?"; grep -E "^\| (fp8|bf16|case)" "$OUT/kp.log" | head -24
(cd .ab/kp && python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
 export AITER_MLA_EXTRA_NVCC_FLAGS=-DAITER_MLA_MBAR_SPIN_LIMIT=20000000
 python3 -m aiter_mla jit build --all -j 16 > "$OUT/build.log" 2>&1; echo "build rc=$?"
 timeout ${SUITE_S:-230} python3 -m pytest -q -p no:cacheprovider op_tests/test_mla_metadata.py \
   op_tests/test_engine_api.py > "$OUT/pytest.log" 2>&1
 echo "pytest rc=$?"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head; tail -1 "$OUT/pytest.log")
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1   # main again
