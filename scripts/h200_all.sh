#!/usr/bin/env bash
# The session's closing device call: the tests, the measuring tools, optionally the JIT and
# metadata figures, then the bench sweeps. Usage: bash scripts/h200_all.sh COMMIT. Logs and
# results go into $OUT/all.tgz; the exit status is 1 when the test run failed (the tools and
# the sweeps still run and are saved); a tool's failure is reported, not the exit status.
#   Tests: the whole op_tests suite, once (the decode main loops are score_pv for fp8 at 64 or
#   128 rows with pages >= 64 and no mask, tile_pairs for the other fp8 shapes above 32 rows,
#   warpgroup_works for fp8 at <= 32 rows, alternating for bf16), on the build users get:
#   the pipeline spin limit (-DAITER_MLA_MBAR_SPIN_LIMIT) makes ptxas serialise every wgmma
#   and spill, so it would test another schedule. TEST_LIMIT's timeout ends a hang instead.
#   SPIN=1      the tests on the spin-limit build (a hang then names its barrier with a trap).
#   Tools (60 s each): scripts/template_ab.py, the repository's templates against a copy of
#   them in another folder, on one case, 2 rounds;
#   scripts/phase_budget.py on one case (the -DAITER_MLA_PHASE_STAMPS build).
#   FIGURES=1    also re-measure the metadata and JIT figures (unchanged kernels: skip to save
#                device time).
#   TOOLS=0      skip the two tools (the tests alone then have ~560 s of one call's 600).
#   TEST_LIMIT=s the tests' time limit (default 480 s; on an H100 a 440 s limit stopped the suite
#                at about 95%, with FlashMLA building alongside).
#   BENCH=0      skip the sweeps (run scripts/h200_bench.sh in a second call when the tests and
#                the sweeps do not fit one call's 10 minutes).
set -uo pipefail
COMMIT=${1:?commit measured}
OUT=${OUT:-/tmp/aiter_mla_out}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
logs=$(mktemp -d)
DBG=""
[ "${SPIN:-0}" = 1 ] && DBG=-DAITER_MLA_MBAR_SPIN_LIMIT=20000000   # a pipeline bug traps instead of hanging
AITER_MLA_EXTRA_NVCC_FLAGS=$DBG python3 -m aiter_mla jit build --all -j 16 \
  >"$logs/build.log" 2>&1   # the tests' variants, built in parallel first
AITER_MLA_EXTRA_NVCC_FLAGS=$DBG timeout "${TEST_LIMIT:-480}" python3 -m pytest -q -rs -p no:cacheprovider op_tests \
  >"$logs/pytest.log" 2>&1
rc_tests=$?
echo "== pytest rc=$rc_tests"; tail -4 "$logs/pytest.log"
# the measuring tools: reported, but only the tests' rc decides the exit status
# the second arm is a copy of the templates in another folder: the device's copy of .git holds
# the session's first commit, not this one, so a git:HEAD arm would time an older tree
if [ "${TOOLS:-1}" != 0 ]; then
cp -r templates "$logs/templates_copy"
timeout 60 python3 scripts/template_ab.py --arm base= --arm "copy=$logs/templates_copy" \
  --case "fp8 128,1 b64 c3200" --rounds 2 --commit "$COMMIT" -o "$logs/ab" >"$logs/template_ab.log" 2>&1
echo "== ab rc=$?"; grep -E "^\| fp8 " "$logs/template_ab.log" | head -3
timeout 60 python3 scripts/phase_budget.py --case "fp8 128,1 b64 c3200" --commit "$COMMIT" -o "$logs/phase_budget" \
  >"$logs/phase_budget.log" 2>&1
echo "== phase_budget rc=$?"; tail -3 "$logs/phase_budget.log"
fi
if [ "${FIGURES:-0}" = 1 ]; then
  timeout 90 python3 op_tests/bench_metadata.py >"$logs/metadata_bench.log" 2>&1; echo "== metadata rc=$?"
  timeout 60 python3 -m aiter_mla.jit.measure --out docs/perf >"$logs/jit_measure.log" 2>&1; echo "== jit rc=$?"
  cp docs/perf/jit.* docs/perf/metadata_h200.* "$logs/" 2>/dev/null
fi
tar czf "$OUT/tests.tgz" -C "$logs" .   # in case the sweeps run out of time
if [ "${BENCH:-1}" != 0 ]; then
  OUT=$logs timeout 280 bash scripts/h200_bench.sh "$COMMIT" >"$logs/bench_summary.log" 2>&1
  echo "== bench rc=$?"
fi
tar czf "$OUT/all.tgz" -C "$logs" .
[ -f "$logs/bench_summary.log" ] && grep -E "^==|^ +(64|128) +(3200|8192) " "$logs/bench_summary.log" | head -40
# A failed test fails the call (the tools and the sweeps above still ran and were saved).
[ "$rc_tests" = 0 ] || { echo "== TESTS FAILED (rc=$rc_tests)"; exit 1; }
