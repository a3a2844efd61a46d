#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader
r=$OUT/r; mkdir -p "$r"
timeout 300 python3 scripts/template_ab.py --arm main= --arm mp=.ab/mp --arm bn32ep=.ab/bn32ep --arm mp3=.ab/mp3 --arm bn32ep3=.ab/bn32ep3 \
  --rounds 2 -j 16 --commit febac69 \
  --case "bf16 128,1 b64 c3200" --case "bf16 128,1 b128 c8192" --case "bf16 128,1 b1 c21" \
  --case "bf16 128,1 b128 c21" --case "bf16 16,1 b128 c8192" \
  \
  -o "$r/ab" 2>&1 | tee "$r/ab.log" | grep -E "^\| bf16|rror|FAIL" | tail -40
timeout 100 python3 scripts/phase_budget.py --templates .ab/bn32ep --case "bf16 128,1 b128 c8192" -j 16 -o $r/pb > $r/pb.log 2>&1
grep -E "consumer wg0|qk|handover|produce_|total" $r/pb.log | head -14
