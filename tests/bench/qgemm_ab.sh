#!/usr/bin/env bash
# The quantized products of a base commit against this working tree's
# engine/cpu/qgemm_avx512.c, in one process, alternating (qgemm_ab.c):
# before/after figures that share the machine's load. Builds the base
# commit's library in a temporary worktree (a few minutes on 2 cores).
#   bash tests/bench/qgemm_ab.sh [BASE] [THREADS]   (BASE: default e36fd8c,
#   the commit before issue 28's q28 kernel work)
set -euo pipefail
BASE=${1:-e36fd8c}
THREADS=${2:-2}
cd "$(dirname "$0")/../.."
T=$(mktemp -d)
trap 'git worktree remove --force "$T/base" >/dev/null 2>&1 || true; rm -rf "$T"' EXIT
git worktree add -q --detach "$T/base" "$BASE"
make -C "$T/base" -j2 build/libredlm_engine.a build/libredlm_common.a >/dev/null
CF="-O2 -std=c11 -D_GNU_SOURCE -pthread -iquote . -iquote common -iquote engine"
cc $CF -Dcpu_gemm_q_avx512=new_gemm_q_avx512 -c engine/cpu/qgemm_avx512.c -o "$T/new.o"
cc $CF -o "$T/qgemm_ab" tests/bench/qgemm_ab.c "$T/new.o" "$T/base/build/libredlm_engine.a" \
    "$T/base/build/libredlm_common.a" -lhiredis -lconfig -lcjson -lpcre2-8 -lutf8proc -lm
echo "# base $BASE against $(git rev-parse --short HEAD) (+ working tree), $THREADS threads, load $(cut -d' ' -f1-3 /proc/loadavg)"
for f in q8_0 q4_k q6_k awq; do
    for s in "2048 1024" "3072 1024" "1024 3072"; do
        for M in 1 16 512; do "$T/qgemm_ab" $f $s $M "$THREADS"; done
    done
    "$T/qgemm_ab" $f 151936 1024 1 "$THREADS"
done
echo "# load $(cut -d' ' -f1-3 /proc/loadavg)"
