#!/usr/bin/env bash
# A/B of this branch's bf16 `alternating` arm (a warp skips O's rescale when all 16 of its rows
# have factor 1) against main, same process. In main's checkout: copy this branch's templates
# and config to .ab/skr (git-ignored, carried), then on the device (carry [".ab"]):
#   bash .ab/skip_rescale_ab.sh COMMIT
# Prediction: 1-3% faster at (128,1) ctx >= 3200 (~130 FMUL cycles on the hand-over chain,
# skipped on about half of the tiles), none at ctx 21; outputs bit-identical to main's.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader
r=$OUT/r; mkdir -p "$r"
timeout 300 python3 scripts/template_ab.py --arm main= --arm skr=.ab/skr --rounds 3 -j 16 --commit "${1:-main}" \
  --case "bf16 128,1 b64 c3200" --case "bf16 128,1 b128 c8192" --case "bf16 128,1 b256 c23333" \
  --case "bf16 128,1 b1 c21" --case "bf16 128,2 b64 c8192" --case "bf16 64,1 b64 c3200" \
  --case "bf16 16,1 b128 c8192" -o "$r/ab" > "$r/ab.log" 2>&1; echo "ab rc=$?"
grep -E "^\| bf16|rror|FAIL" "$r/ab.log" | head -20
