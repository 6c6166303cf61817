#!/usr/bin/env bash
# Runs every test suite and ends with one total line
# "N passed, N failed, N skipped". Skipped tests (cmocka skip(), pytest
# skips, and the GPU backend tests when this build has none or the machine
# no device) are counted apart, so a GPU-less run says what did not run.
# Unit tests are cmocka binaries in $BUILD/tests/test_*; integration tests
# are pytest files in tests/integration, run with Debian's interpreter
# (/usr/bin/python3, which has python3-pytest, -redis and -jsonschema).
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
passed=0 failed=0 skipped=0 failed_names=()

count() { # $1 = log file of a cmocka run; adds its counts
    local p f s
    p=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$1" | awk '{s+=$4} END {print s+0}')
    f=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$1" | awk '{s+=$4} END {print s+0}')
    s=$(grep -Eo '^\[  SKIPPED \] [0-9]+ test' "$1" | awk '{s+=$4} END {print s+0}')
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
}

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    log=$(mktemp)
    "$t" >"$log" 2>&1; rc=$?
    cat "$log"
    count "$log"
    if [ $rc -ne 0 ] && ! grep -q '^\[  FAILED  \]' "$log"; then
        failed=$((failed + 1)) # crashed before cmocka could report
    fi
    [ $rc -ne 0 ] && failed_names+=("$(basename "$t")")
    rm -f "$log"
done

# the CUDA op tests exist only in a CUDA=1 build: without them, their
# cases count as skipped rather than silently absent
for src in tests/backend/test_*.c; do
    [ -e "$src" ] || continue
    [ -x "$BUILD/tests/$(basename "$src" .c)" ] && continue
    n=$(grep -c 'cmocka_unit_test(' "$src")
    echo "$(basename "$src" .c): not built (make CUDA=1): $n tests skipped"
    skipped=$((skipped + n))
done

if ls tests/integration/test_*.py >/dev/null 2>&1 && [ "${SKIP_INTEGRATION:-0}" != 1 ]; then
    log=$(mktemp)
    BUILD="$BUILD" /usr/bin/python3 -m pytest -q tests/integration 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    p=$(grep -Eo '[0-9]+ passed' "$log" | tail -1 | awk '{print $1}')
    f=$(grep -Eo '[0-9]+ (failed|error)' "$log" | awk '{s+=$1} END {print s+0}')
    s=$(tail -1 "$log" | grep -Eo '[0-9]+ skipped' | awk '{print $1}')
    passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0})); skipped=$((skipped + ${s:-0}))
    if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then
        [ "${f:-0}" -eq 0 ] && failed=$((failed + 1))
        failed_names+=(pytest)
    fi
    rm -f "$log"
fi

[ ${#failed_names[@]} -gt 0 ] && echo "failing suites: ${failed_names[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] && [ ${#failed_names[@]} -eq 0 ] && [ "$passed" -gt 0 ]
