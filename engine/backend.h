/* engine/backend.h - the one compute-backend interface.
 *
 * A backend owns everything that lives in compute memory: the weights (taken
 * from the host mapping once, at load), the activations, and the paged KV
 * cache pool. The host side (engine, scheduler, kv_cache bookkeeping) only
 * ever hands it block ids and token ids, and gets logits back. One forward()
 * call runs a whole batched step - every layer, every sequence - so a GPU
 * backend can launch it as one CUDA graph and a CPU backend can keep its
 * threads hot across layers.
 *
 * KV layout contract (shared by both backends, so the same block tables drive
 * either): the pool has n_blocks blocks of block_size token slots; token t of
 * a sequence lives in block block_table[t / block_size], slot t % block_size,
 * for every layer. What a block holds inside is the backend's business.
 *
 * Threading: a backend is driven by one thread at a time (the engine's owner
 * thread); it may parallelise inside a call. */
#ifndef RL_BACKEND_H
#define RL_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "model.h"

/* One sequence's share of a step. Positions are implicit: the new tokens
 * sit at positions n_past .. n_past + n_new - 1 (Qwen3 has no gaps). */
struct be_seq {
    int32_t n_past;              /* tokens already in the KV cache */
    int32_t n_new;               /* tokens computed in this step, >= 1 */
    const int32_t *block_table;  /* (ceil((n_past + n_new) / block_size)) */
    int32_t logits_from;         /* logits for new tokens [logits_from, n_new):
                                    n_new - 1 = last only, n_new = none, 0 = all */
    int32_t lora;                /* 0 = the base model; k = the adapter set in
                                    slot k by be_ops.lora_set */
};

struct be_batch {
    int32_t n_seqs;
    const struct be_seq *seqs;   /* (n_seqs) */
    int32_t n_tokens;            /* sum of n_new */
    const int32_t *tokens;       /* (n_tokens) seq 0's new tokens, then seq 1's... */
    int32_t n_logits;            /* sum of n_new - logits_from */
    float *logits;               /* (n_logits, n_vocab) out, caller-owned host
                                    memory, rows in token order */
};

enum be_kv_dtype { BE_KV_AUTO = 0, BE_KV_F32, BE_KV_BF16 };

/* Load progress: load() calls it as the weights are taken in, with the
 * bytes done so far and the bytes in all (the matrices the backend takes,
 * as the checkpoint stores them), at most once per progress_every bytes and
 * once more at the end (done == total). Loading a large checkpoint reads
 * tens of GB from disk, minutes that would otherwise pass in silence. It
 * runs on the loading thread; it must not call into the backend. */
typedef void (*be_progress_fn)(void *user, size_t done, size_t total);

struct be_options {
    int n_threads;        /* CPU: worker threads incl. the caller; 0 = all cores */
    const char *isa;      /* CPU: "auto", "avx512bf16", "avx2", "scalar"; NULL = auto */
    enum be_kv_dtype kv_dtype; /* AUTO: f32 for f32 checkpoints, else bf16 */
    int device;           /* CUDA: device ordinal */
    int mmap_weights;     /* CPU: 1 = run on the checkpoint's file mapping
                             (no copy, 4 KiB pages); 0 = copy the matrices
                             into 2 MiB pages at load (faster decode) */
    int kv_prefault;      /* CPU: touch every page of the KV pool at kv_init,
                             so steps never stop for a first-touch page
                             fault (each costs a 2 MiB zeroing) and the
                             memory is committed at start, not mid-request.
                             Serving and benchmarks want it; 0 leaves the
                             pages to fault in as blocks are first used
                             (tests, short-lived tools) */
    be_progress_fn progress;  /* NULL: none */
    void *progress_user;      /* handed to progress */
    size_t progress_every;    /* CPU: bytes between calls; 0 = 64 MiB
                                 (CUDA reports once per layer) */
    const char *sim_profile;  /* sim: the modelled device ("h200", "h100",
                                 "a100", "l40s"); NULL = h200 */
    const char *quantize;     /* CPU: "q8_0" = quantize the BF16/F16/F32
                                 matrices (and the embedding) to Q8_0 at
                                 load, as llama.cpp's Q8_0 files hold them,
                                 for the integer kernels (about half the
                                 bytes of BF16 per decode step); NULL or
                                 "none" = as the checkpoint has them */
    size_t kv_reserve_bytes;  /* CUDA: device memory kv_capacity leaves free
                                 (kv_reserve_mb); 0 = none */
};

/* What a backend hands back for one logits row (be_ops.set_row_wants). */
enum be_row_want { BE_ROW_FULL = 0, BE_ROW_ARGMAX = 1, BE_ROW_CANDS = 2 };
struct sample_cands; /* engine/sample.h */
struct lora_adapter; /* engine/lora.h */

struct be_ops {
    const char *name;
    /* required: take the weights (host memory valid only during the call)
     * and size activations for up to max_tokens tokens per step. */
    int (*load)(void *ctx, const struct model_config *cfg,
                const struct model_weights *w, int max_tokens,
                struct rl_err *err);
    /* required: bytes one KV block takes, for sizing the pool from a budget. */
    size_t (*kv_block_bytes)(void *ctx, int block_size);
    /* required: (re)allocates the KV pool; earlier contents are lost. */
    int (*kv_init)(void *ctx, int n_blocks, int block_size, struct rl_err *err);
    /* required: one batched forward step; writes batch->logits. */
    int (*forward)(void *ctx, const struct be_batch *batch, struct rl_err *err);
    /* optional: copies the first n_tokens slots of block src into dst
     * (copy-on-write of a shared, partly filled block). */
    int (*kv_copy)(void *ctx, int32_t dst, int32_t src, int n_tokens,
                   struct rl_err *err);
    /* optional: where the forward steps since the last call spent their
     * wall time, per phase, as one JSON object ({"attn_ms": 12.5, ...})
     * written into out (n bytes, NUL-terminated), then zeroes the counters.
     * For benchmarks and tuning; returns the length, or -1 on truncation. */
    int (*profile)(void *ctx, char *out, size_t n);
    /* optional: a one-line description ("cpu avx512bf16, 2 threads"). */
    const char *(*describe)(void *ctx);
    /* required */
    void (*free)(void *ctx);
    /* optional: the next forward()'s constraint masks, masks[r] for logits
     * row r (n_rows of them; NULL rows, or masks NULL, unconstrained):
     * (vocab + 31) / 32 words, bit id % 32 of word id / 32 set = allowed.
     * Valid until that forward returns. The backend may set the disallowed
     * entries to -inf before it hands the rows back (CUDA does, on the
     * device, so a device-side sampler sees the constraint); the engine
     * masks again before sampling, so a backend without it (CPU) is
     * equally right. Never given for a row whose raw logprobs are wanted. */
    int (*set_masks)(void *ctx, const uint32_t *const *masks, int n_rows, struct rl_err *err);
    /* optional (last, so positional initializers of the slots above still
     * fit): bytes of device memory left for the KV pool after the weights
     * (sim: the modelled device's), used when the engine is given no KV
     * budget; 0 = unknown (the engine's default applies). */
    size_t (*kv_capacity)(void *ctx);

    /* ---- optional, issue 25: rows the host need not see whole ----
     * set_row_wants: what the next forward() hands back per logits row,
     * wants[r] for r < n_rows (that forward's n_logits; NULL = every row
     * whole): BE_ROW_FULL writes the row into batch->logits as always;
     * BE_ROW_ARGMAX and BE_ROW_CANDS leave it there unwritten and give the
     * row's best entry (n = 1) or its SAMPLE_CANDS best (engine/sample.h)
     * through row_cands(). A backend that cannot serve a step that way sets
     * entries back to BE_ROW_FULL during forward(); the caller reads wants
     * after it. Valid until that forward returns. */
    int (*set_row_wants)(void *ctx, uint8_t *wants, int n_rows, struct rl_err *err);
    /* the last forward's sets, (n_logits) entries, meaningful for the rows
     * served as ARGMAX / CANDS; owned by the backend, valid until the next
     * forward() */
    const struct sample_cands *(*row_cands)(void *ctx);
    /* copies logits row `row` of the last forward (as the device left it,
     * constraint masks applied) into out (vocab floats): for a row whose
     * set could not prove the sampler's answer. Valid until the next
     * forward() */
    int (*fetch_row)(void *ctx, int row, float *out, struct rl_err *err);
    /* page-locked host memory for batch->logits (the copy then runs at
     * full speed without staging); NULL when it cannot; host_free frees it */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);

    /* optional: copies the final-normed hidden state (cfg->hidden floats,
     * the input of the vocabulary product) of logits row `row` of the last
     * forward into out: an embedding (Qwen3-Embedding's last-token
     * pooling). Valid until the next forward(); without it the engine
     * refuses embedding requests */
    int (*hidden)(void *ctx, int row, float *out, struct rl_err *err);

    /* optional: puts adapter a (engine/lora.h) in slot k, 1 <= k <=
     * LORA_MAX_ADAPTERS, for the sequences whose be_seq.lora is k; a NULL
     * empties the slot. The backend may keep pointers into a (the caller
     * keeps it alive and unchanged until the slot is emptied or the
     * backend freed) or copy it to its own memory. Without it the engine
     * refuses adapters */
    int (*lora_set)(void *ctx, int slot, const struct lora_adapter *a, struct rl_err *err);
};


struct backend {
    const struct be_ops *ops;
    void *ctx;
};

/* Creates backend `name` ("cpu", "sim", or "cuda" when built with CUDA=1). The
 * caller owns *out and frees it with be_free(). */
int be_create(struct backend **out, const char *name,
              const struct be_options *opt, struct rl_err *err);
void be_free(struct backend *be);

/* Each implementation's constructor (be_create picks one). */
int cpu_backend_create(struct backend **out, const struct be_options *opt,
                       struct rl_err *err);
int sim_backend_create(struct backend **out, const struct be_options *opt,
                       struct rl_err *err); /* engine/sim/sim.h */
#ifdef REDLM_CUDA
int cuda_backend_create(struct backend **out, const struct be_options *opt,
                        struct rl_err *err);
#endif

#endif
