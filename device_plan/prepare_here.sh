#!/usr/bin/env bash
# Run in main's checkout: the A/B arms and the scripts under .ab/, FlashMLA under .peer/.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
grep -qx '/.ab/' .git/info/exclude || echo '/.ab/' >> .git/info/exclude
grep -qx '/.peer/' .git/info/exclude || echo '/.peer/' >> .git/info/exclude
rm -rf .ab && mkdir -p .ab
arm() {  # name, ref
  mkdir -p ".ab/$1" && git archive "$2" templates jit_config.json | tar x -C ".ab/$1"
}
# commits, not branch names: main's history holds them (merged "ours") even where a checkout
# carries main alone
arm wl 690aeb5      # exp/work-prefetch-lanes
arm wl2 b8f3e3d     # exp/work-prefetch-lanes-lens
arm dpv bdba197     # exp/tile-pairs-deferred-pv (its templates; later commits are this plan)
arm dpve bdba197
arm fi be37937      # exp/tile-pairs-frag-interleave
arm fiwl2 5203779   # exp/frag-interleave-and-prefetch
arm wl2m 0f6bc2b    # exp/work-prefetch-lanes-lens-on-main: wl2 on main, tile_pairs only (landable)
sed -i 's/^#define AITER_MLA_TILE_PAIRS_LATE_FRAGMENTS 1$/#define AITER_MLA_TILE_PAIRS_LATE_FRAGMENTS 0/' \
  .ab/dpve/templates/common/mla_decode_sm90_tile_pairs.cuh
grep -q 'LATE_FRAGMENTS 0' .ab/dpve/templates/common/mla_decode_sm90_tile_pairs.cuh
plan=${PLAN:-exp/tile-pairs-deferred-pv}   # or the plan commit named in docs/perf/notes.md
for f in ab_arms.sh suite.sh occupancy_check.sh bench_issues.sh; do git show "$plan:device_plan/$f" > ".ab/$f"; done
[ -d .peer/flashmla ] || { mkdir -p .peer && cp -r ../shared/peers/flashmla .peer/; }
du -sh .ab .peer
