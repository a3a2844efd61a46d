#!/usr/bin/env bash
# Device plan (branch exp/score-pv): the A/B of main's fp8 tile_pairs loop against this
# branch's experimental score_pv loop (one scorer warpgroup, two PV warpgroups, 512 threads;
# templates/common/mla_decode_sm90_score_pv.cuh), then the fp8 decode tests on this branch's
# tree with a bounded mbarrier spin (a protocol bug then traps instead of hanging; the named
# barriers P_full / P_empty / F cannot trap, so the suite's own timeout is the backstop).
# Run from main's checkout with the branch's tree in .ab/spv
# (rm -rf .ab/spv && mkdir -p .ab/spv && git archive exp/score-pv | tar -x -C .ab/spv); carry [".ab"].
# The branch renders score_pv for the fp8 variants main renders as mainloop=tile_pairs at
# block_m 64 / 128, page_size >= 64, mask none; every other variant's source is main's.
# Predictions (proto/score_pv/README.md on exp/score-pv-design, H100; not measured): 1,450-1,650
# cycles a tile against tile_pairs' ~2,550: spv / main
#   fp8 128,1 b64 c3200   51-57 us against ~74.6 (0.68-0.77)
#   fp8 128,1 b64 c8192   110-124 us (0.83-0.93 of main's time at the same floor)
#   fp8 128,1 b128 c8192  about b64 c8192's ratio, 0.85-0.95 (twice the works, HBM closer)
#   fp8 128,1 b1 c21      0.95-1.10 (one tile a work: the epilogue and fill dominate; the 512-thread
#                         CTA and the PV warpgroups' 2-row split merge may cost a little)
# Accuracy: round 0's check against float64 must pass in both arms (CHECK_TOL); spv's output
# differs from main's (exact per-tile softmax instead of the pair's max) by rounding noise.
# Go / no-go as the README's: spv's per-tile slope <= 1,800 cycles (b64 c3200 <= ~60 us).
set -uo pipefail
export PYTHONUNBUFFERED=1
MAIN_COMMIT=0fd3dd232b9c4ddafa68b2df88761cba08a1241f
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader
C=()
for c in "fp8 128,1 b64 c3200" "fp8 128,1 b64 c8192" "fp8 128,1 b128 c8192" "fp8 128,1 b1 c21"; do C+=(--case "$c"); done
timeout 330 python3 scripts/template_ab.py --arm main= --arm spv=.ab/spv --rounds 3 -j 16 --check-requests 2 \
  --commit "$MAIN_COMMIT" "${C[@]}" -o "$OUT/spv" > "$OUT/spv.log" 2>&1
echo "ab rc=$?"; grep -E "^\| (fp8|bf16|case)" "$OUT/spv.log" | head -24; grep -iE "error|trap|fail" "$OUT/spv.log" | head -5
(cd .ab/spv && python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
 export AITER_MLA_EXTRA_NVCC_FLAGS=-DAITER_MLA_MBAR_SPIN_LIMIT=20000000
 timeout ${SUITE_S:-230} python3 -m pytest -q -p no:cacheprovider op_tests/test_mla_persistent.py -k fp8 \
   > "$OUT/pytest.log" 2>&1
 echo "pytest rc=$?"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head; tail -1 "$OUT/pytest.log")
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1   # main again
