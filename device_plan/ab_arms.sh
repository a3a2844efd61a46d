#!/usr/bin/env bash
# On the device: main's templates against the arms under .ab/, one process, 2 rounds.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader
r=$OUT/r; mkdir -p "$r"
timeout 540 python3 scripts/template_ab.py --arm main= --arm wl2=.ab/wl2 \
  --arm dpv=.ab/dpv --arm dpve=.ab/dpve --arm fi=.ab/fi --arm fiwl2=.ab/fiwl2 --arm wl2m=.ab/wl2m --rounds 2 -j 16 \
  --case "fp8 128,1 b256 c21" --case "fp8 128,1 b128 c21" --case "fp8 128,1 b1 c21" \
  --case "fp8 128,1 b64 c3200" --case "fp8 128,1 b128 c8192" --case "fp8 16,1 b64 c3200" \
  --case "bf16 128,1 b128 c21" --case "bf16 128,1 b64 c3200" \
  -o "$r/ab" 2>&1 | tee "$r/ab.log" | grep -E "^\||rc|error|Error" | tail -60
cd "$OUT" && tar czf r.tgz r
