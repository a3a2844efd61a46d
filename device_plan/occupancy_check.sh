#!/usr/bin/env bash
# On the device: bf16 at <= 32 rows gets 2 work lists per SM (arch.occupancy), so `alternating`
# launches 264 CTAs of ~225 KB shared memory: two waves on 132 SMs. CU_NUM=66 gives the same
# loop 132 lists (one wave, fewer KV splits) with no code change. Same run, both orders.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
r=$OUT/occ; mkdir -p "$r"
run() {  # tag, then env assignments
  local tag=$1; shift
  env "$@" timeout 150 python3 -m aiter_mla bench -n 16,1 -d bf16 -kvd bf16 -b 64 128 256 -c 3200 8192 \
    --no-peers --no-jit-figures --no-progress -j 16 -o "$r" --tag "$tag" > "$r/$tag.log" 2>&1
  echo "== $tag rc=$?"
}
run lists264_a PYTHONUNBUFFERED=1
run lists132_a CU_NUM=66
run lists132_b CU_NUM=66
run lists264_b PYTHONUNBUFFERED=1
python3 - "$r" <<'PY'
import json, sys, statistics
r = sys.argv[1]
def rows(tag):
    return {(x["heads"], x["batch"], x["ctx"]): x["us"] for x in json.load(open(f"{r}/results_{tag}.json"))["rows"]}
a = [rows("lists264_a"), rows("lists264_b")]; b = [rows("lists132_a"), rows("lists132_b")]
print("heads batch ctx | 264 lists us | 132 lists us | 132/264")
for k in sorted(a[0]):
    x = statistics.median([t[k] for t in a]); y = statistics.median([t[k] for t in b])
    print(f"{k[0]:5} {k[1]:5} {k[2]:5} | {x:10.1f} | {y:10.1f} | {y / x:.3f}")
PY
cd "$OUT" && tar czf occ.tgz occ
