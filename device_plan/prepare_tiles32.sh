#!/usr/bin/env bash
# Run in main's checkout: the four prepared arms of docs/perf/tiles32_h100.md section 3 under
# .ab/ (git-ignored), from the templates of 2e22076, each with its macros set; FlashMLA is not
# needed (a template A/B). Then, on the device: bash .ab/tiles32_ab.sh (carry .ab).
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
grep -qx '/.ab/' .git/info/exclude || echo '/.ab/' >> .git/info/exclude
mkdir -p .ab
for a in mp bn32ep mp3 bn32ep3; do
  rm -rf ".ab/$a"; mkdir -p ".ab/$a"; git archive 2e22076 templates jit_config.json | tar x -C ".ab/$a"
done
j2() { sed -i "s/^#define $2 .*\$/#define $2 $3/" ".ab/$1/templates/mla_decode.cu.j2"; }
for a in bn32ep bn32ep3; do j2 $a AITER_MLA_ALT_EARLY_QK 1; done
for a in mp mp3; do j2 $a AITER_MLA_ALT_KEYS 64; done
for a in mp3 bn32ep3; do j2 $a AITER_MLA_ALT_PART_WARPS 3; done
grep -H '^#define AITER_MLA_ALT_' .ab/*/templates/mla_decode.cu.j2
git show "${PLAN:-exp/alt-bn32}:device_plan/tiles32_ab.sh" > .ab/tiles32_ab.sh
