#!/usr/bin/env bash
# Device plan (branch exp/early-qk-nomem): how much of the bf16 128-row loop is the hand-over
# chain? Four arms of the alternating loop, one same-process A/B (run from the repository root of
# this branch; nothing to carry): main; e = QK(b) before the take-over of b - 1 (the softmax of b
# under PV(b - 1); lost 1.14x with real copies, waiting for its stage); nomem = no KV copies
# (diagnostic: 0.89 at (128,1), 0.93-0.95 at (128,2) on 79a27bf); nomem_e = both.
# The fp8 cases (tile_pairs, warpgroup_works: the early-QK macro does not touch them, so e = main
# and nomem_e = nomem there) give the same memory-or-chain answer for issue 26.
# Prediction: nomem_e 0.60-0.75 if the hand-over chain is what bounds the step (tensor work
# ~2,170 cycles a tile against ~3,600), about nomem's figure if it is not. Outputs of the nomem
# arms are stale data by design (their check says NO); main and e must pass.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader
for arm in e nomem nomem_e; do rm -rf ".ab/$arm"; mkdir -p ".ab/$arm"; cp -r templates jit_config.json ".ab/$arm/"; done
for arm in e nomem_e; do sed -i 's/^#define AITER_MLA_ALT_EARLY_QK 0 /#define AITER_MLA_ALT_EARLY_QK 1 /' ".ab/$arm/templates/mla_decode.cu.j2"; done
for arm in nomem nomem_e; do sed -i 's/^#define AITER_MLA_ALT_NO_KV_COPY 0 /#define AITER_MLA_ALT_NO_KV_COPY 1 /' ".ab/$arm/templates/common/mla_decode_sm90_wgmma.cuh"; done
grep -c "EARLY_QK 1" .ab/e/templates/mla_decode.cu.j2 .ab/nomem_e/templates/mla_decode.cu.j2
grep -c "NO_KV_COPY 1" .ab/nomem/templates/common/mla_decode_sm90_wgmma.cuh .ab/nomem_e/templates/common/mla_decode_sm90_wgmma.cuh
r=$OUT/r; mkdir -p "$r"; t0=$(date +%s)
timeout 420 python3 scripts/template_ab.py --arm main= --arm e=.ab/e --arm nomem=.ab/nomem --arm nomem_e=.ab/nomem_e \
  --rounds 2 -j 16 --commit "$(git rev-parse --short HEAD 2>/dev/null || echo exp/early-qk-nomem)" \
  --case "bf16 128,1 b64 c3200" --case "bf16 128,1 b128 c8192" --case "bf16 128,2 b64 c8192" \
  --case "bf16 128,2 b128 c3200" --case "bf16 128,1 b1 c21" \
  --case "fp8 128,1 b64 c3200" --case "fp8 128,1 b128 c8192" --case "fp8 16,1 b128 c8192" -o "$r/ab" > "$r/ab.log" 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^\| (bf16|fp8)" "$r/ab.log" | head -16
