#!/usr/bin/env bash
# tests/gpu/bundle.sh - `make gpu-bundle`: everything a GPU machine needs to
# check the CUDA backend, in one folder that is carried there and never
# compiles anything on it (issue 25).
#
# The GPU machine has nvcc 13.0, cuBLAS and cudart, but none of the Debian
# -dev packages our C code needs and no package registry. So the CUDA
# flavour is built here (build-cuda/), its programs are stripped and copied
# with the non-CUDA shared libraries they load (hiredis, cJSON, libconfig,
# PCRE2, utf8proc, libmicrohttpd, libsystemd, cmocka, libedit and theirs),
# never cuBLAS/cudart/libstdc++ (the device's own must be used: its driver
# matches them). A Debian redis-server and redis-cli go along for the
# worker step. The tiny model and its reference travel as input files.
#
# The machine's CPUs also measure a Redis Cluster against one instance
# (issue 27 point 4: each redis-server on a core of its own, which this
# 2-core VM cannot give): the fleet soak's scripts go along in the repo's
# layout (tests/bench/), the Qwen3 tokenizer the sim workers load (gzipped:
# 11 MB as it is) and Debian's pure-Python redis client with its packaging
# dependency in py.zip (Python imports from a zip as it is),
# and wrap/ holds one shell wrapper per program that gives it the bundle's
# libraries, so that a script with wrap/ first on its PATH (and --build
# wrap) runs ours and Redis's while python3 keeps the machine's own.
#
# Checks: the folder is at most 48 MB; no program or library needs a glibc
# newer than 2.35 (an older base image on the device must still load them).
#
#   make gpu-bundle                  # -> gpu-bundle/
#   bash gpu-bundle/gpu_check.sh     # on the GPU machine (or here: a dry run)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${GPU_BUNDLE:-gpu-bundle}
BUILD=${BUILD:-build-cuda}
MAX_MB=48
GLIBC_MAX=2.35

progs="redlm redlm-worker redlm-dispatcher tests/test_backend_ops tests/bench_cuda"
for p in $progs; do
    [ -x "$BUILD/$p" ] || { echo "gpu-bundle: $BUILD/$p is missing (make CUDA=1 first)" >&2; exit 1; }
done
if [ "$(nm "$BUILD/redlm-worker" | grep -c ' T cuda_backend_create')" = 0 ]; then
    echo "gpu-bundle: $BUILD/redlm-worker has no CUDA backend in it" >&2
    exit 1
fi

rm -rf "$OUTDIR"
mkdir -p "$OUTDIR/bin" "$OUTDIR/lib" "$OUTDIR/data/models"
for p in $progs; do
    strip -o "$OUTDIR/bin/$(basename "$p")" "$BUILD/$p"
done
for p in redis-server redis-cli; do
    src=$(command -v "$p" || true)
    [ -n "$src" ] || { echo "gpu-bundle: $p not found (make deps)" >&2; exit 1; }
    cp -L "$src" "$OUTDIR/bin/$p"
done

# Shared libraries: what ldd resolves outside the C runtime and CUDA.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libpthread|libdl\.|librt\.|libresolv|libstdc\+\+|libgcc_s|libcuda|libcublas|libcudart|libnvidia)'
for b in "$OUTDIR"/bin/*; do
    ldd "$b" | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r name path; do
    if ! [[ "$name" =~ $skip ]]; then cp -L "$path" "$OUTDIR/lib/$name"; fi
done
strip --strip-unneeded "$OUTDIR"/lib/* 2>/dev/null || true

cp -r tests/data/models/tiny-qwen3-a "$OUTDIR/data/models/"
# a LoRA adapter for it (gpu_check's worker step serves it)
"$BUILD/redlm" mkmodel --lora-of tests/data/models/tiny-qwen3-a --lora-rank 8 --lora-std 0.1 \
    --out "$OUTDIR/data/lora-a" > /dev/null

# the cluster measurement's scripts, tokenizer, Python client and wrappers
mkdir -p "$OUTDIR/tests/bench" "$OUTDIR/data/qwen3-tokenizer" "$OUTDIR/wrap"
cp tests/bench/bench_fleet.py tests/bench/local_cluster.py tests/bench/cpucap.py \
   tests/bench/redis_probe.py "$OUTDIR/tests/bench/"
gzip -9 -c engine/tokenizers/qwen3/tokenizer.json > "$OUTDIR/data/qwen3-tokenizer/tokenizer.json.gz"
cp engine/tokenizers/qwen3/tokenizer_config.json "$OUTDIR/data/qwen3-tokenizer/"
/usr/bin/python3 - "$OUTDIR/py.zip" redis packaging <<'EOF' ||
import os, sys, zipfile, importlib
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:
    for m in sys.argv[2:]:
        d = os.path.dirname(importlib.import_module(m).__file__)
        for root, dirs, files in os.walk(d):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            for f in files:
                if f.endswith(".py") or f == "py.typed":
                    p = os.path.join(root, f)
                    z.write(p, os.path.relpath(p, os.path.dirname(d)))
EOF
    { echo "gpu-bundle: python3's redis or packaging module is missing (make deps)" >&2; exit 1; }
for p in redlm redlm-worker redlm-dispatcher redis-server redis-cli; do
    sed "s|NAME|$p|g" > "$OUTDIR/wrap/$p" <<'EOF'
#!/bin/sh
# NAME with the bundle's libraries (and the machine's CUDA ones), for it alone
d=$(cd "$(dirname "$0")/.." && pwd)
L=$d/lib
for c in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$c" ] && L=$L:$c; done
LD_LIBRARY_PATH=$L exec "$d/bin/NAME" "$@"
EOF
    chmod +x "$OUTDIR/wrap/$p"
done
cp tests/gpu/gpu_check.sh "$OUTDIR/gpu_check.sh"
git rev-parse --short HEAD > "$OUTDIR/commit" 2>/dev/null || echo unknown > "$OUTDIR/commit"

# glibc: the newest symbol version any file asks for
newest=$(for f in "$OUTDIR"/bin/* "$OUTDIR"/lib/*; do objdump -T "$f" 2>/dev/null; done |
         grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
if [ "$(printf '%s\n%s\n' "$newest" "$GLIBC_MAX" | sort -V | tail -1)" != "$GLIBC_MAX" ]; then
    echo "gpu-bundle: a file needs glibc $newest, newer than $GLIBC_MAX:" >&2
    for f in "$OUTDIR"/bin/* "$OUTDIR"/lib/*; do
        objdump -T "$f" 2>/dev/null | grep -q "GLIBC_$newest" && echo "  $f" >&2
    done
    exit 1
fi
mb=$(du -sm "$OUTDIR" | cut -f1)
if [ "$mb" -gt "$MAX_MB" ]; then
    echo "gpu-bundle: $OUTDIR is $mb MB, over $MAX_MB MB" >&2
    exit 1
fi
echo "gpu-bundle: $OUTDIR ready: $mb MB, newest glibc symbol $newest, $(ls "$OUTDIR/lib" | wc -l) libraries"
echo "  run on the GPU machine: bash $OUTDIR/gpu_check.sh   (logs and summary.json in \$OUT)"
