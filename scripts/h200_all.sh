#!/usr/bin/env bash
# The session's closing device call: every test, the JIT and metadata figures, then the bench
# sweeps. Usage: bash scripts/h200_all.sh COMMIT. Logs and results go into $OUT/all.tgz.
set -uo pipefail
COMMIT=${1:?commit measured}
OUT=${OUT:-/tmp/aiter_mla_out}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
logs=$(mktemp -d)
python3 -m aiter_mla jit build --all -j 16 >"$logs/build.log" 2>&1
# Tests with the mbarrier spin limit compiled in: a pipeline bug traps instead of hanging.
AITER_MLA_EXTRA_NVCC_FLAGS=-DAITER_MLA_MBAR_SPIN_LIMIT=20000000 timeout 300 \
  python3 -m pytest -q -rs -p no:cacheprovider op_tests >"$logs/pytest.log" 2>&1
echo "== pytest rc=$?"; tail -4 "$logs/pytest.log"
AITER_ENABLE_EXPERIMENTAL=1 AITER_MLA_EXTRA_NVCC_FLAGS=-DAITER_MLA_MBAR_SPIN_LIMIT=20000000 \
  timeout 120 python3 -m pytest -q -p no:cacheprovider op_tests/test_mla_persistent.py \
  op_tests/test_mla_metadata.py >"$logs/pytest_experimental.log" 2>&1
echo "== pytest experimental rc=$?"; tail -1 "$logs/pytest_experimental.log"
timeout 90 python3 op_tests/bench_metadata.py >"$logs/metadata_bench.log" 2>&1; echo "== metadata rc=$?"
timeout 60 python3 -m aiter_mla.jit.measure --out docs/perf >"$logs/jit_measure.log" 2>&1; echo "== jit rc=$?"
cp docs/perf/jit.* docs/perf/metadata_h200.* "$logs/" 2>/dev/null
tar czf "$OUT/tests.tgz" -C "$logs" .   # in case the sweeps run out of time
OUT=$logs timeout 200 bash scripts/h200_bench.sh "$COMMIT" >"$logs/bench_summary.log" 2>&1
echo "== bench rc=$?"
tar czf "$OUT/all.tgz" -C "$logs" .
grep -E "batch|256 +(21|23333) |^==" "$logs/metadata_bench.log" | tail -6
tail -3 "$logs/jit_measure.log"
cat "$logs/bench_summary.log" | grep -E "^==|^ +(64|128) +(3200|8192) " | head -40
