#!/usr/bin/env bash
# On the device: the whole GPU suite with an arm's templates (a pipeline bug traps, not hangs).
set -uo pipefail
arm=${1:?arm name under .ab}
export PYTHONUNBUFFERED=1 AITER_MLA_TEMPLATES_DIR=$PWD/.ab/$arm/templates
export AITER_MLA_EXTRA_NVCC_FLAGS=-DAITER_MLA_MBAR_SPIN_LIMIT=20000000
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
python3 -m aiter_mla jit build --all -j 16 > "$OUT/build.log" 2>&1; echo "build rc=$?"
timeout 500 python3 -m pytest -q -rs -p no:cacheprovider op_tests > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -5 "$OUT/pytest.log"
