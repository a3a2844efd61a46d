#!/usr/bin/env bash
# Run in main's checkout: arms b3 (V halves as one 3-D TMA box a part) and b3e (b3 + QK before
# the take-over) under .ab/ (git-ignored), from the templates of b4feb79; then on the device:
# bash .ab/b3_ab.sh (carry .ab).
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
grep -qx '/.ab/' .git/info/exclude || echo '/.ab/' >> .git/info/exclude
mkdir -p .ab
for a in b3 b3e; do
  rm -rf ".ab/$a"; mkdir -p ".ab/$a"; git archive b4feb79 templates jit_config.json | tar x -C ".ab/$a"
done
sed -i 's/^#define AITER_MLA_ALT_EARLY_QK 0$/#define AITER_MLA_ALT_EARLY_QK 1/' .ab/b3e/templates/mla_decode.cu.j2
grep -H '^#define AITER_MLA_' .ab/b3*/templates/mla_decode.cu.j2
git show "${PLAN:-exp/tma-3d-boxes}:device_plan/b3_ab.sh" > .ab/b3_ab.sh
