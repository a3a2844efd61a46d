#!/usr/bin/env bash
# One device call on the H200: the benchmark sweeps committed under docs/perf.
# Usage: bash scripts/h200_bench.sh COMMIT. Everything lands in $OUT/perf.tgz (the device tool
# brings back at most 8 files), a short summary is printed last. FlashMLA is built first when
# its peer folder is carried (FLASHMLA_PEER, default .peer/flashmla: see the peer's README), so
# every sweep times it in the same run; without it the sweeps say "flashmla: not importable".
set -uo pipefail
COMMIT=${1:?commit measured}
OUT=${OUT:-/tmp/aiter_mla_out}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
dest=$(mktemp -d)
peer=${FLASHMLA_PEER:-.peer/flashmla}
if [ -f "$peer/build.sh" ]; then
  bash "$peer/build.sh" >"$dest/flashmla_build.log" 2>&1; echo "== flashmla build rc=$?"
  export PYTHONPATH=/tmp/flashmla_peer_build:${PYTHONPATH:-}
fi
run() {  # tag, then bench arguments
  local tag=$1; shift
  python3 -m aiter_mla bench "$@" -o "$dest" --tag "$tag" --commit "$COMMIT" --no-progress -j 16 \
    >"$dest/bench_$tag.log" 2>&1
  echo "== $tag rc=$?"
  tar czf "$OUT/perf.tgz" -C "$dest" .   # after every sweep: a timeout keeps what finished
}
run n128_q1                                   # the seed's default sweep, with JIT figures
run n16_q1 -n 16,1 --no-jit-figures
run n64_q1 -n 64,1 --no-jit-figures
run n128_q1_bf16 -n 128,1 -d bf16 -kvd bf16 --no-jit-figures
run n16_q1_bf16 -n 16,1 -d bf16 -kvd bf16 --no-jit-figures
run n64_q1_bf16 -n 64,1 -b 64 128 256 -c 3200 8192 23333 -d bf16 -kvd bf16 --no-jit-figures
run n128_q2 -n 128,1 128,2 -b 64 128 256 -c 3200 8192 --no-jit-figures
run n128_q2_bf16 -n 128,1 128,2 -b 64 128 256 -c 3200 8192 -d bf16 -kvd bf16 --no-jit-figures
tar czf "$OUT/perf.tgz" -C "$dest" .
for tag in n128_q1 n16_q1 n64_q1 n128_q1_bf16 n16_q1_bf16 n64_q1_bf16 n128_q2 n128_q2_bf16; do
  echo "== $tag"; grep -E "^ +(1|64|128|256) +(21|3200|8192|23333) " "$dest/bench_$tag.log" | head -16
done
