#!/usr/bin/env bash
# Re-landing run for the 3-D V boxes (this branch = main + 0dceb87's kernel change).
# In main's checkout, with this branch merged (or checked out): copy the FlashMLA peer first
#   mkdir -p .peer && cp -r ../shared/peers/flashmla .peer/   (+ /.peer/ in .git/info/exclude)
# then on the device (carry [".peer"]): bash device_plan/land_v_box3d.sh COMMIT
# 1. the whole GPU suite with the pipeline spin limit (~290 s on an H100), test_large_pages's line;
# 2. aiter-mla bench beside FlashMLA at issue 25's bf16 points (~140 s with FlashMLA's build).
# Remove device_plan/ before the branch lands on main.
set -uo pipefail
C=${1:?commit measured}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader
t0=$(date +%s)
AITER_MLA_EXTRA_NVCC_FLAGS=-DAITER_MLA_MBAR_SPIN_LIMIT=20000000 timeout 360 \
  python3 -m pytest -q -rs -p no:cacheprovider op_tests > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/pytest.log"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head
d=$OUT/bench; mkdir -p "$d"
PYTHONPATH=/tmp/flashmla_peer_build python3 -c "import flash_mla" 2>/dev/null || bash .peer/flashmla/build.sh > "$d/flashmla_build.log" 2>&1
PYTHONPATH=/tmp/flashmla_peer_build:${PYTHONPATH:-} timeout 200 python3 -m aiter_mla bench -n 128,1 16,1 64,1 128,2 \
  -d bf16 -kvd bf16 -b 64 128 256 -c 3200 8192 23333 -o "$d" --tag landing_bf16 --commit "$C" --no-progress \
  --no-jit-figures -j 16 > "$d/bench.log" 2>&1; echo "bench rc=$?"
(cd "$OUT" && tar czf bench.tgz bench && rm -rf bench)
