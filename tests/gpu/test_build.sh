#!/usr/bin/env bash
# tests/gpu/test_build.sh - the CUDA flavour's build rules (issue 25 point 2),
# checked without a GPU: needs nvcc. Run by .ci/run after `make CUDA=1`.
#   1. the CUDA binaries hold the CUDA backend (nm finds cuda_backend_create);
#   2. a .cu object depends on the headers it includes: after touching
#      engine/model.h, `make -n` recompiles the .cu objects too;
#   3. one build folder holds one flavour: `make CUDA=1` into a CPU build's
#      folder stops with a clear error instead of mixing objects.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/local/cuda/bin"
B=${BUILD_CUDA:-build-cuda}
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }

make -s CUDA=1 BUILD="$B" "$B/redlm-worker" >/dev/null || { echo "FAIL: make CUDA=1"; exit 1; }
if [ "$(nm "$B/redlm-worker" | grep -c ' T cuda_backend_create')" -gt 0 ]; then
    ok "$B/redlm-worker holds the CUDA backend"
else bad "$B/redlm-worker has no cuda_backend_create"; fi

n=$(make -n CUDA=1 BUILD="$B" -W engine/model.h "$B/redlm-worker" | grep -c 'nvcc .*engine/cuda/.*\.cu')
if [ "$n" -gt 0 ]; then ok "touching engine/model.h recompiles $n .cu objects"
else bad "engine/model.h changed but no .cu object would be recompiled"; fi

tmp=$(mktemp -d)
mkdir -p "$tmp/b" && echo cpu > "$tmp/b/.flavour"
if msg=$(make -n CUDA=1 BUILD="$tmp/b" all 2>&1); then
    bad "make CUDA=1 into a CPU build folder was accepted"
elif echo "$msg" | grep -q 'holds a cpu build'; then ok "a CUDA build into a CPU folder stops: $(echo "$msg" | grep -o 'holds a cpu build[^:]*')"
else bad "unexpected error: $msg"; fi
rm -rf "$tmp"
[ "$fail" = 0 ] && echo "test_build: all passed" || echo "test_build: FAILED"
exit $fail
