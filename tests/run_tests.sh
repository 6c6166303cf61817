#!/usr/bin/env bash
# Runs every test suite and ends with one total line "N passed, N failed".
# Unit tests are cmocka binaries in $BUILD/tests/test_*; integration tests
# are pytest files in tests/integration, run with Debian's interpreter
# (/usr/bin/python3, which has python3-pytest, -redis and -jsonschema).
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
passed=0 failed=0 failed_names=()

count() { # $1 = log file of a cmocka run; adds its counts
    local p f
    p=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$1" | awk '{s+=$4} END {print s+0}')
    f=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$1" | awk '{s+=$4} END {print s+0}')
    passed=$((passed + p)); failed=$((failed + f))
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

if ls tests/integration/test_*.py >/dev/null 2>&1 && [ "${SKIP_INTEGRATION:-0}" != 1 ]; then
    log=$(mktemp)
    BUILD="$BUILD" /usr/bin/python3 -m pytest -q tests/integration 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    p=$(grep -Eo '[0-9]+ passed' "$log" | tail -1 | awk '{print $1}')
    f=$(grep -Eo '[0-9]+ (failed|error)' "$log" | awk '{s+=$1} END {print s+0}')
    passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0}))
    if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then
        [ "${f:-0}" -eq 0 ] && failed=$((failed + 1))
        failed_names+=(pytest)
    fi
    rm -f "$log"
fi

[ ${#failed_names[@]} -gt 0 ] && echo "failing suites: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ ${#failed_names[@]} -eq 0 ] && [ "$passed" -gt 0 ]
