/* engine/cpu/machine.h - measured limits of this machine, for rooflines.
 *
 * The benchmark (and anyone sizing work) compares kernel speed against what
 * the hardware can do here and now, on the threads of a given pool: memory
 * read bandwidth and the in-register peak of the dot-product instructions.
 * Each call takes from a fraction of a second to a few seconds and runs on
 * every thread of the pool; call from the pool's owner thread. */
#ifndef RL_CPU_MACHINE_H
#define RL_CPU_MACHINE_H

#include <stddef.h>

#include "cpu/kernels.h"
#include "cpu/pool.h"

/* Read bandwidth in GB/s (1e9 bytes/s): every thread of p sums its share of
 * a freshly allocated, touched buffer of `bytes` (0 = 1 GiB; use many times
 * the last-level cache), best of a few passes, with the widest loads the CPU
 * has. Returns a negative value when the buffer cannot be allocated. */
double cpu_measure_read_bw(struct cpu_pool *p, size_t bytes);

/* Peak GFLOP/s of vdpbf16ps on every thread of p, operands in registers
 * (one instruction = 32 multiply-adds = 64 flop per 512-bit vector).
 * 0 when k (NULL = the detected table) has no BF16 dot product. */
double cpu_measure_bf16_peak(struct cpu_pool *p, const struct cpu_kernels *k);

/* Peak GFLOP/s of f32 FMA at k's vector width on every thread of p
 * (scalar table: a plain C multiply-add loop). NULL k = detected table. */
double cpu_measure_f32_peak(struct cpu_pool *p, const struct cpu_kernels *k);

#endif
