#!/usr/bin/env bash
# First GPU measurements of the fp8 alternating loop (branch exp/fp8-alternating) against main,
# in one device call. Usage: bash scripts/h200_fp8_alternating.sh BRANCH_COMMIT MAIN_COMMIT
# Needs, carried: .peer (the FlashMLA peer folder, as scripts/h200_bench.sh takes it) and .ab/main (a checkout
# of main: `git worktree add .ab/main main`, with /.ab/ in .git/info/exclude).
# Run the GPU suite first, in its own call (tests of this branch: every fp8 shape runs the
# alternating loop here): BENCH=0 bash scripts/h200_all.sh BRANCH_COMMIT
# This call: 1. FlashMLA build; 2. the FMA-pipe exp2 A/B (template_ab, this tree against a copy
# with kFmaEvery 0); 3. the same sweeps in this checkout and in main's, each with FlashMLA: fp8,
# and bf16 at the short end (the edge tiles' skipped MMAs change bf16 too).
set -uo pipefail
BR=${1:?branch commit}; MAIN=${2:?main commit}
OUT=${OUT:-/tmp/aiter_mla_out}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
dest=$(mktemp -d)
bash .peer/flashmla/build.sh >"$dest/flashmla_build.log" 2>&1; echo "== flashmla build rc=$?"
export PYTHONPATH=/tmp/flashmla_peer_build:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv >"$dest/gpu.csv"
mkdir -p "$dest/nofma" && cp -r templates "$dest/nofma/templates" && cp jit_config.json "$dest/nofma/"
sed -i 's/constexpr int kFmaEvery = C::kFp8 ? 5 : 0;/constexpr int kFmaEvery = 0;/' \
  "$dest/nofma/templates/common/mla_decode_sm90_alternating.cuh"
timeout 120 python3 scripts/template_ab.py --arm fma= --arm "nofma=$dest/nofma" --rounds 2 --commit "$BR" \
  --case "fp8 128,1 b64 c3200" --case "fp8 128,1 b128 c8192" -o "$dest/ab_fma" \
  >"$dest/ab_fma.log" 2>&1; echo "== ab fma rc=$?"; grep -E "^\| fp8" "$dest/ab_fma.log"
sweeps() {  # checkout dir, tag prefix, commit
  (cd "$1" && PYTHONPATH=$PWD:$PYTHONPATH python3 -c "import aiter_mla; print('$2 imports', aiter_mla.__file__)" \
     >>"$dest/imports.log" 2>&1
   for s in "n128:-n 128,1 -b 64 128 256 -c 3200 5200 8192 23333" \
            "short:-n 128,1 -b 1 128 256 -c 21 64 256 512 1200" \
            "n16:-n 16,1 -b 64 128 256 -c 3200 8192 23333" \
            "bf16_short:-n 128,1 -b 1 128 -c 21 256 1200 3200 -d bf16 -kvd bf16"; do
     tag=${s%%:*}; args=${s#*:}
     PYTHONPATH=$PWD:$PYTHONPATH timeout 90 python3 -m aiter_mla bench $args -o "$dest" --tag "$2_$tag" \
       --commit "$3" --no-progress --no-jit-figures -j 16 >"$dest/bench_$2_$tag.log" 2>&1
     echo "== $2 $tag rc=$?"
   done)
  tar czf "$OUT/fp8alt.tgz" -C "$dest" .
}
sweeps . alt "$BR"
sweeps .ab/main main "$MAIN"
for t in n128 short n16 bf16_short; do for a in alt main; do
  echo "== $a $t"; grep -E "^ +(1|64|128|256) +(21|64|256|512|1200|3200|5200|8192|23333) " "$dest/bench_${a}_$t.log" | head -16
done; done
