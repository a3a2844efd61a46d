#!/usr/bin/env bash
# Device plan (branch exp/rows-split): the rows-split fp8 loop against tile_pairs, and
# warpgroup_works' compute rate with no KV copies.
#
# Prepare on the workstation, in main's checkout (.ab is git-ignored; carry [".ab"]):
#   mkdir -p .ab/rsplit && git archive exp/rows-split templates jit_config.json | tar -x -C .ab/rsplit
#   mkdir -p .ab/rsplit_t && git archive exp/rows-split templates jit_config.json | tar -x -C .ab/rsplit_t
#   sed -i 's/^#define AITER_MLA_ROWS_SPLIT_TURNS 0 /#define AITER_MLA_ROWS_SPLIT_TURNS 1 /' .ab/rsplit_t/templates/mla_decode.cu.j2
#   cp -r .ab/rsplit_t .ab/rsplit_t6 && sed -i 's/kQkChunk = 3; /kQkChunk = 6; /' .ab/rsplit_t6/templates/common/mla_decode_sm90_warpgroup_works.cuh
#   mkdir -p .ab/eqk_nomem && git archive exp/early-qk-nomem templates jit_config.json | tar -x -C .ab/eqk_nomem
#   sed -i 's/^#define AITER_MLA_ALT_NO_KV_COPY 0 /#define AITER_MLA_ALT_NO_KV_COPY 1 /' .ab/eqk_nomem/templates/common/mla_decode_sm90_wgmma.cuh
#   cp device_plan/rows_split.sh .ab/   (from this branch), then run: bash .ab/rows_split.sh
#
# 1. correctness first: the fp8 decode tests with the branch's templates (every fp8 tile_pairs
#    variant renders the rows-split loop there), with the spin limit (a hang traps); the
#    tile_pairs stack guard (96 B; the rows-split build has 152-184 B) is left out;
#    then the same for rst (the rows split with turns: the warpgroups issue QK, QK, PV, PV, ...
#    in turn through named barriers 9 and 10, so one's softmax runs under the other's MMAs);
# 2. the A/B, without the spin limit (it makes tile_pairs 2.8x slower): main / rs / rst / rst6
#    (turns, QK promoted every 6 k-steps as tile_pairs is: 3 drains a tile instead of 6; LSE
#    error ~1.4e-3 against the 2e-3 bound, as tile_pairs) / nomem.
#    nomem's (16,1) and (32,1) rows are warpgroup_works with no KV copies: the per-tile compute
#    rate of two independent 32-row warpgroups, which is what rs runs on one shared ring.
# Prediction (docs/perf/notes.md, "Rows split"): rs at 0.75-0.87 of main's time at fp8 (128,1)
# b >= 64, ctx >= 3200 (per-tile chain ~1,850 cycles a warpgroup, smem ~1,600 cycles a tile,
# against ~2,500-3,000 today); slower than main if the shared-memory reads of both warpgroups
# (~204 KB a tile) do not overlap.
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
for arm in rsplit rsplit_t rsplit_t6; do
  t0=$(date +%s)
  AITER_MLA_TEMPLATES_DIR=$PWD/.ab/$arm/templates AITER_MLA_EXTRA_NVCC_FLAGS=-DAITER_MLA_MBAR_SPIN_LIMIT=20000000 \
    timeout ${T_S:-150} python3 -m pytest -q -x -p no:cacheprovider op_tests/test_mla_persistent.py op_tests/test_engine_api.py \
    -k "fp8 and not builds_with_wgmma" > "$OUT/${arm}_pytest.log" 2>&1
  echo "$arm pytest rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/${arm}_pytest.log")"; grep -E "^FAILED|^ERROR" "$OUT/${arm}_pytest.log" | head -5
done
r=$OUT/r; mkdir -p "$r"; t0=$(date +%s)
timeout ${AB_S:-240} python3 scripts/template_ab.py --arm main= --arm rs=.ab/rsplit --arm rst=.ab/rsplit_t --arm rst6=.ab/rsplit_t6 --arm nomem=.ab/eqk_nomem \
  --rounds 2 -j 16 --check-requests 1 --commit "main + exp/rows-split" \
  --case "fp8 128,1 b64 c3200" --case "fp8 128,1 b128 c8192" --case "fp8 64,1 b128 c8192" --case "fp8 128,1 b128 c21" \
  --case "fp8 16,1 b128 c8192" --case "fp8 32,1 b128 c8192" -o "$r/ab" > "$r/ab.log" 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s"
grep -E "^\| (fp8|case)" "$r/ab.log" | head -20
