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
# Checks: the folder is at most 40 MB; no program or library needs a glibc
# newer than 2.35 (an older base image on the device must still load them).
#
#   make gpu-bundle                  # -> gpu-bundle/
#   bash gpu-bundle/gpu_check.sh     # on the GPU machine (or here: a dry run)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${GPU_BUNDLE:-gpu-bundle}
BUILD=${BUILD:-build-cuda}
MAX_MB=40
GLIBC_MAX=2.35

progs="redlm redlm-worker tests/test_backend_ops tests/bench_cuda"
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
