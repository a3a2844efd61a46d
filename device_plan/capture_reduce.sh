#!/usr/bin/env bash
# Landing run for exp/capture-takes-reduce (a fused launch's args keep the chained reduce; the
# decode entry point takes it when cudaStreamIsCapturing says the stream is being captured).
# In main's checkout with this branch checked out, and main's own tree copied for the host-time
# baseline:  rm -rf .ab/base && mkdir -p .ab/base && git archive main | tar x -C .ab/base
# then on the device (carry [".ab"]): bash device_plan/capture_reduce.sh
# 1. the new test and every capture / split-merge / reduce / host-path test (~2-3 min);
# 2. host µs per warm call (the entry point now copies the args and asks the capture status on
#    every fused launch): main's tree, then this one, same machine. Prediction: +0.05-0.2 µs on
#    mla_decode_fwd's no_alloc figure, none elsewhere.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv,noheader
t0=$(date +%s)
AITER_MLA_EXTRA_NVCC_FLAGS=-DAITER_MLA_MBAR_SPIN_LIMIT=20000000 timeout 300 python3 -m pytest -q -rs -p no:cacheprovider \
  op_tests/test_mla_persistent.py op_tests/test_mla_reduce.py op_tests/test_host_path.py \
  -k "capture or graph or split_merge or reduce or host" > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/pytest.log"; grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head
for tree in .ab/base .; do
  (cd "$tree" && timeout 120 python3 -m aiter_mla.bench.host_time > "$OUT/host_$(basename "$(realpath "$tree")").txt" 2>&1)
  echo "== host time, $tree"; tail -12 "$OUT/host_$(basename "$(realpath "$tree")").txt"
done
