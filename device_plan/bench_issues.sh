#!/usr/bin/env bash
# On the device (an H200 for the issues' targets): FlashMLA built, then aiter-mla bench beside it
# at issues 25-27's points only (the full scripts/h200_bench.sh sweep does not fit one call).
# Usage: bash .ab/bench_issues.sh COMMIT PART (carry .ab and .peer), PART 1 (bf16 and the short
# end) then 2 (fp8) as two calls on the warm machine (FlashMLA's build in /tmp is reused when
# it is still there). Results: $OUT/bench.tgz.
set -uo pipefail
COMMIT=${1:?commit measured}
PART=${2:?part 1 or 2}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
d=$OUT/bench; mkdir -p "$d"
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader | tee "$d/gpu.txt"
if ! PYTHONPATH=/tmp/flashmla_peer_build python3 -c "import flash_mla" 2>/dev/null; then
  bash .peer/flashmla/build.sh > "$d/flashmla_build.log" 2>&1; echo "== flashmla build rc=$?"
fi
export PYTHONPATH=/tmp/flashmla_peer_build:${PYTHONPATH:-}
run() {  # tag, then bench arguments
  local tag=$1; shift
  timeout 200 python3 -m aiter_mla bench "$@" -o "$d" --tag "$tag" --commit "$COMMIT" --no-progress \
    --no-jit-figures -j 16 > "$d/$tag.log" 2>&1
  echo "== $tag rc=$?"
  (cd "$OUT" && tar czf bench.tgz bench)   # after every sweep: a timeout keeps what finished
}
if [ "$PART" = 1 ]; then
  run issue25_bf16 -n 128,1 16,1 64,1 128,2 -d bf16 -kvd bf16 -b 64 128 256 -c 3200 8192 23333
  run issue27_short -n 128,1 -b 1 128 256 -c 21 64 256 512 1200
else
  run issue26_fp8 -n 128,1 -b 16 32 64 128 256 -c 1200 3200 5200 8192 23333
  run issue26_27_fp8 -n 16,1 64,1 64,2 128,2 -b 64 128 256 -c 3200 8192 23333
fi
python3 - "$d" <<'PY'
import json, glob, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/results_issue*.json")):
    for r in json.load(open(f))["rows"]:
        fm = (r.get("peers") or {}).get("flashmla_bf16")   # µs, same run
        ratio = r["us"] / fm if fm else float("nan")
        print(f"{r['heads']:3},{r['qlen']} {r['dtype']:4} b{r['batch']:<3} c{r['ctx']:<5} {r['us']:9.1f} us"
              f" frac {r.get('frac_floor', float('nan')):.2f} /FlashMLA {ratio:.2f}"
              f" seed {r.get('seed_mi355_us') or '-'} ok {r.get('ref_ok')}")
PY
