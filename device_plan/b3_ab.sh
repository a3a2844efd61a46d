#!/usr/bin/env bash
# Usage: bash .ab/b3_ab.sh COMMIT. A/B: main, b3 = V halves as one 3-D TMA box a part (3 copies a tile instead of 9), b3e = b3 +
# QK before the take-over; stamps of b3 and b3e.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader
r=$OUT/r; mkdir -p "$r"
timeout 180 python3 scripts/template_ab.py --arm main= --arm b3=.ab/b3 --arm b3e=.ab/b3e \
  --rounds 2 -j 16 --commit "${1:-main}" \
  --case "bf16 128,1 b64 c3200" --case "bf16 128,1 b128 c8192" --case "bf16 128,1 b1 c21" \
  --case "bf16 128,1 b128 c21" --case "bf16 16,1 b128 c8192" --case "bf16 64,1 b128 c8192" \
  -o "$r/ab" > "$r/ab.log" 2>&1; echo "ab rc=$?"
grep -E "^\| bf16|rror|FAIL" "$r/ab.log" | head -8
for a in b3; do
  timeout 60 python3 scripts/phase_budget.py --templates .ab/$a --case "bf16 128,1 b128 c8192" -j 16 -o $r/pb_$a > $r/pb_$a.log 2>&1
  echo "== stamps $a"; grep -E "consumer wg0|qk|handover|produce_|kv_wait|total" $r/pb_$a.log | head -14
done
for a in b3e; do
  timeout 60 python3 scripts/phase_budget.py --templates .ab/$a --case "bf16 128,1 b128 c8192" -j 16 -o $r/pb_$a > $r/pb_$a.log 2>&1
  echo "== stamps $a"; grep -E "consumer wg0|qk|handover|produce_|kv_wait|total" $r/pb_$a.log | head -14
done
