/* engine/cuda/prof.cu - where a step's time goes, op by op.
 *
 * The benchmark (tests/bench/bench_cuda.c) asks for it on an eager step
 * (graphs off): the backend marks the stream after each op with a CUDA
 * event tagged by the op's kind, and after the step's synchronisation the
 * time between consecutive marks is added to that kind. Events cost a few
 * microseconds each on the stream, so the figures are for finding the
 * largest share, not for the step's period (bench_cuda measures that with
 * graphs on). Off by default: a NULL profiler makes every call a no-op. */
#include <stdlib.h>
#include <string.h>

#include "ops.cuh"

#define PROF_MARKS 2048

struct cu_prof {
    cudaEvent_t ev[PROF_MARKS];
    int kind[PROF_MARKS];
    int n, n_ev;
    double ms[CU_PROF_KINDS];
    long count[CU_PROF_KINDS];
};

static const char *const kind_names[CU_PROF_KINDS] = {"embed", "qkv", "rope", "attn", "o", "norm",
                                                      "gate_up", "swiglu", "down", "lm_head", "sample"};

const char *cu_prof_kind_name(int k) { return k >= 0 && k < CU_PROF_KINDS ? kind_names[k] : "?"; }

int cu_prof_create(struct cu_prof **out, struct rl_err *err)
{
    struct cu_prof *p = (struct cu_prof *)calloc(1, sizeof *p);
    if (!p)
        return rl_errf(err, RL_ENOMEM, "cuda profiler: out of memory");
    for (int i = 0; i < PROF_MARKS; i++) {
        if (cudaEventCreate(&p->ev[i]) != cudaSuccess) {
            cu_prof_free(p);
            return rl_errf(err, RL_EBACKEND, "cuda profiler: cudaEventCreate failed");
        }
        p->n_ev++;
    }
    *out = p;
    return 0;
}

void cu_prof_free(struct cu_prof *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n_ev; i++)
        cudaEventDestroy(p->ev[i]);
    free(p);
}

void cu_prof_begin(struct cu_prof *p, cudaStream_t st)
{
    if (!p)
        return;
    p->n = 0;
    cudaEventRecord(p->ev[0], st);
    p->kind[0] = -1;
    p->n = 1;
}

void cu_prof_mark(struct cu_prof *p, int kind, cudaStream_t st)
{
    if (!p || p->n >= PROF_MARKS)
        return;
    cudaEventRecord(p->ev[p->n], st);
    p->kind[p->n++] = kind;
}

/* After the stream has synchronised: adds the step's intervals. */
void cu_prof_collect(struct cu_prof *p)
{
    if (!p)
        return;
    for (int i = 1; i < p->n; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]) == cudaSuccess) {
            p->ms[p->kind[i]] += ms;
            p->count[p->kind[i]]++;
        }
    }
    p->n = 0;
}

void cu_prof_read(struct cu_prof *p, double *ms, int reset)
{
    for (int k = 0; k < CU_PROF_KINDS; k++)
        ms[k] = p ? p->ms[k] : 0.0;
    if (p && reset) {
        memset(p->ms, 0, sizeof p->ms);
        memset(p->count, 0, sizeof p->count);
    }
}
