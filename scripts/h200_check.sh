#!/usr/bin/env bash
# One device call on the H200: install, every test (GPU ones included), the JIT figures and the
# metadata timings. Logs go under $OUT (the device tool brings them back); a short table last.
set -uo pipefail
OUT=${OUT:-/tmp/aiter_mla_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || {
  echo "install failed"; tail -20 "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$OUT/gpu.txt" 2>&1
# Warm every decode variant the tests use in parallel (16 cores) before the tests time out on builds.
python3 -m aiter_mla jit build --all -j 16 >"$OUT/build.log" 2>&1
python3 -m pytest -q -rs -p no:cacheprovider op_tests "$@" >"$OUT/pytest.log" 2>&1
rc=$?
AITER_ENABLE_EXPERIMENTAL=1 python3 -m pytest -q -p no:cacheprovider op_tests/test_mla_persistent.py \
  op_tests/test_mla_metadata.py >"$OUT/pytest_experimental.log" 2>&1
rc2=$?
python3 -m aiter_mla.jit.measure --out docs/perf >"$OUT/jit_measure.log" 2>&1
python3 op_tests/bench_metadata.py >"$OUT/metadata_bench.log" 2>&1
cp docs/perf/jit.md docs/perf/jit.json docs/perf/metadata_h200.md docs/perf/metadata_h200.json "$OUT/" 2>/dev/null
echo "== pytest (rc=$rc)"; tail -25 "$OUT/pytest.log"
echo "== pytest experimental (rc=$rc2)"; tail -3 "$OUT/pytest_experimental.log"
echo "== metadata bench"; tail -8 "$OUT/metadata_bench.log"
echo "== jit measure"; tail -8 "$OUT/jit_measure.log"
