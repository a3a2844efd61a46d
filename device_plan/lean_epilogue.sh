#!/usr/bin/env bash
# Device plan (branch exp/lean-epilogue): the GPU suite on this branch's templates (spin limit
# on, every variant prebuilt), then the short-end A/B against main. Run from main's checkout
# with this branch's templates copied to .ab/lean (git archive exp/lean-epilogue templates
# jit_config.json | tar -x -C .ab/lean); carry [".ab"]. About 9 minutes on an H100.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader
(export AITER_MLA_EXTRA_NVCC_FLAGS=-DAITER_MLA_MBAR_SPIN_LIMIT=20000000 AITER_MLA_TEMPLATES_DIR=$PWD/.ab/lean/templates
 python3 -m aiter_mla jit build --all -j 16 > "$OUT/build.log" 2>&1; echo "build rc=$?"
 t0=$(date +%s); timeout ${SUITE_S:-480} python3 -m pytest -q -rs -p no:cacheprovider op_tests > "$OUT/pytest.log" 2>&1
 echo "pytest rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head; tail -1 "$OUT/pytest.log")
timeout ${AB_S:-110} python3 scripts/template_ab.py --arm main= --arm lean=.ab/lean --rounds 3 -j 16 --check-requests 1 \
  --case "fp8 128,1 b1 c21" --case "fp8 128,1 b256 c21" --case "fp8 128,1 b64 c3200" --case "bf16 128,1 b1 c21" \
  --case "fp8 16,1 b256 c21" --case "fp8 16,1 b64 c3200" --case "fp8 16,1 b128 c8192" \
  -o "$OUT/ab" > "$OUT/ab.log" 2>&1; echo "ab rc=$?"; grep -E "^\| (fp8|bf16|case)" "$OUT/ab.log" | head -9
