/* tests/unit/test_model.c - config parsing, weight binding errors, and the
 * CPU forward pass against tests/data/models/tiny-qwen3-a/reference.json
 * (llama.cpp F32 logits and greedy continuations), on every kernel path this
 * CPU has; BF16 against F32 on the same weights; batch and chunk invariance. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_rig.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "cpu/kernels.h"
#include "dtype.h"
#include "mkmodel.h"
#include "model.h"
#include "quant.h"
#include "safetensors.h"

static char model_dir[1024];
static cJSON *reference;

static int setup_ref(void **state)
{
    snprintf(model_dir, sizeof model_dir, "%s/models/tiny-qwen3-a", tu_data_dir());
    char path[1200];
    snprintf(path, sizeof path, "%s/reference.json", model_dir);
    reference = tu_read_json(path);
    return reference ? 0 : -1;
}

static int teardown_ref(void **state)
{
    cJSON_Delete(reference);
    return 0;
}

/* Every prompt: listed logits within 1e-3, and the 32-token greedy path. */
static void check_reference(const char *isa)
{
    if (cpu_isa_parse(isa) > (int)cpu_isa_detect()) {
        printf("  (skipping %s: this CPU lacks it)\n", isa);
        return;
    }
    struct rig r;
    rig_open(&r, model_dir, isa, 2, 512);
    int V = r.cfg->vocab;
    const cJSON *prompts = cJSON_GetObjectItem(reference, "prompts");
    const cJSON *p;
    int n_prompts = 0;
    cJSON_ArrayForEach(p, prompts)
    {
        int32_t ids[512], greedy[64];
        int n = tu_ids_from_json(cJSON_GetObjectItem(p, "ids"), ids, 512);
        int ng = tu_ids_from_json(cJSON_GetObjectItem(p, "greedy"), greedy, 64);
        float *lg = malloc((size_t)n * (size_t)V * sizeof(float));
        rig_step(&r, 0, ids, n, lg, NULL);
        const cJSON *pos = cJSON_GetObjectItem(p, "positions");
        const cJSON *rows = cJSON_GetObjectItem(p, "logits");
        double worst = 0;
        for (int k = 0; k < cJSON_GetArraySize(pos); k++) {
            int at = cJSON_GetArrayItem(pos, k)->valueint;
            const cJSON *row = cJSON_GetArrayItem(rows, k);
            for (int v = 0; v < V; v++) {
                double d = fabs(lg[(size_t)at * (size_t)V + (size_t)v] -
                                cJSON_GetArrayItem(row, v)->valuedouble);
                if (d > worst)
                    worst = d;
            }
        }
        if (worst > 1e-3)
            fail_msg("%s/%s: max |dlogit| %g > 1e-3", isa,
                     cJSON_GetObjectItem(p, "name")->valuestring, worst);
        /* greedy continuation, one token per step through the KV cache */
        int tok = argmax(lg + (size_t)(n - 1) * (size_t)V, V);
        for (int g = 0; g < ng; g++) {
            if (tok != greedy[g])
                fail_msg("%s/%s: greedy token %d is %d, reference %d", isa,
                         cJSON_GetObjectItem(p, "name")->valuestring, g, tok, greedy[g]);
            int32_t t = tok;
            rig_step(&r, n + g, &t, 1, lg, NULL);
            tok = argmax(lg, V);
        }
        free(lg);
        n_prompts++;
    }
    assert_int_equal(n_prompts, 6);
    rig_close(&r);
}

/* The backend's hidden state (be_ops.hidden, what an embedding is made
 * of) is the vocabulary product's input: the lm_head times it gives the
 * independent implementation's logits at every listed position. */
static void test_hidden_state(void **state)
{
    (void)state;
    struct rig r;
    rig_open(&r, model_dir, "auto", 2, 512);
    int V = r.cfg->vocab, H = r.cfg->hidden;
    const struct model_tensor *W = &model_get_weights(r.m)->lm_head;
    assert_int_equal(W->dtype, MODEL_F32); /* the reference checkpoint is F32 */
    assert_non_null(r.be->ops->hidden);
    float *h = malloc((size_t)H * sizeof *h);
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(reference, "prompts"))
    {
        int32_t ids[512];
        int n = tu_ids_from_json(cJSON_GetObjectItem(p, "ids"), ids, 512);
        float *lg = malloc((size_t)n * (size_t)V * sizeof(float));
        rig_step(&r, 0, ids, n, lg, NULL);
        const cJSON *pos = cJSON_GetObjectItem(p, "positions");
        const cJSON *rows = cJSON_GetObjectItem(p, "logits");
        for (int k = 0; k < cJSON_GetArraySize(pos); k++) {
            int at = cJSON_GetArrayItem(pos, k)->valueint;
            struct rl_err err = {0};
            assert_int_equal(r.be->ops->hidden(r.be->ctx, at, h, &err), 0);
            const cJSON *row = cJSON_GetArrayItem(rows, k);
            for (int v = 0; v < V; v++) {
                const float *w = (const float *)W->data + (size_t)v * (size_t)H;
                double dot = 0;
                for (int d = 0; d < H; d++)
                    dot += (double)w[d] * h[d];
                double ref = cJSON_GetArrayItem(row, v)->valuedouble;
                if (fabs(dot - ref) > 1e-3)
                    fail_msg("%s: position %d: lm_head . hidden = %g for token %d, reference %g",
                             cJSON_GetObjectItem(p, "name")->valuestring, at, dot, v, ref);
            }
        }
        /* a row the last forward did not produce is refused */
        struct rl_err err = {0};
        assert_int_not_equal(r.be->ops->hidden(r.be->ctx, n, h, &err), 0);
        free(lg);
    }
    free(h);
    rig_close(&r);
}

static void test_reference_scalar(void **state) { check_reference("scalar"); }
static void test_reference_avx2(void **state) { check_reference("avx2"); }
static void test_reference_avx512(void **state) { check_reference("avx512bf16"); }

/* Several sequences in one step give the same bits as each alone, and a
 * prompt fed in chunks gives the same bits as in one piece. */
static void invariance_on(const char *dir, const char *isa)
{
    struct rig r;
    rig_open(&r, dir, isa, 2, 512);
    int V = r.cfg->vocab;
    enum { NS = 4 };
    int lens[NS] = {7, 33, 1, 20};
    int32_t ids[NS][40];
    uint32_t x = 12345;
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < lens[s]; i++) {
            x = x * 1103515245u + 12345u;
            ids[s][i] = (int32_t)((x >> 8) % (uint32_t)V);
        }
    float *alone = malloc((size_t)NS * (size_t)V * 4), *together = malloc((size_t)NS * (size_t)V * 4);
    float *all = malloc(40 * (size_t)V * 4);
    int32_t tables[NS][4];
    for (int s = 0; s < NS; s++) {
        for (int b = 0; b < 4; b++)
            tables[s][b] = s * 4 + b;
        rig_step(&r, 0, ids[s], lens[s], all, tables[s]);
        memcpy(alone + (size_t)s * (size_t)V, all + (size_t)(lens[s] - 1) * (size_t)V, (size_t)V * 4);
    }
    /* all four prompts in one step, into other blocks */
    struct be_seq seqs[NS];
    int32_t flat[128], t2[NS][4];
    int nt = 0;
    for (int s = 0; s < NS; s++) {
        for (int b = 0; b < 4; b++)
            t2[s][b] = 100 + s * 4 + b;
        seqs[s] = (struct be_seq){0, lens[s], t2[s], lens[s] - 1, 0};
        memcpy(flat + nt, ids[s], (size_t)lens[s] * 4);
        nt += lens[s];
    }
    struct be_batch b = {NS, seqs, nt, flat, NS, together};
    struct rl_err err = {0};
    assert_int_equal(r.be->ops->forward(r.be->ctx, &b, &err), 0);
    assert_memory_equal(alone, together, (size_t)NS * (size_t)V * 4);
    float *prefill1 = malloc((size_t)V * 4);
    memcpy(prefill1, alone + V, (size_t)V * 4);
    /* decode one more token for all four together vs sequence 1 alone */
    int32_t next[NS];
    for (int s = 0; s < NS; s++) {
        next[s] = argmax(together + (size_t)s * (size_t)V, V);
        seqs[s] = (struct be_seq){lens[s], 1, t2[s], 0, 0};
    }
    struct be_batch d = {NS, seqs, NS, next, NS, together};
    assert_int_equal(r.be->ops->forward(r.be->ctx, &d, &err), 0);
    rig_step(&r, lens[1], &next[1], 1, alone, tables[1]);
    assert_memory_equal(alone, together + V, (size_t)V * 4);
    /* chunked prefill of sequence 1 (33 tokens) in 5-token pieces */
    int32_t t3[4] = {200, 201, 202, 203};
    for (int at = 0; at < lens[1]; at += 5) {
        int n = lens[1] - at < 5 ? lens[1] - at : 5;
        rig_step(&r, at, ids[1] + at, n, all, t3);
        if (at + n == lens[1])
            assert_memory_equal(all + (size_t)(n - 1) * (size_t)V, prefill1, (size_t)V * 4);
    }
    rig_step(&r, lens[1], &next[1], 1, all, t3);
    assert_memory_equal(all, together + V, (size_t)V * 4);
    free(alone), free(together), free(all), free(prefill1);
    rig_close(&r);
}

static void test_batch_and_chunk_invariance(void **state) { invariance_on(model_dir, "auto"); }

/* The scalar, AVX2 and AVX-512 paths agree within float tolerance. */
static void test_paths_agree(void **state)
{
    const char *isas[] = {"scalar", "avx2", "avx512bf16"};
    float *ref = NULL;
    int32_t ids[33];
    const cJSON *p = cJSON_GetArrayItem(cJSON_GetObjectItem(reference, "prompts"), 2);
    int n = tu_ids_from_json(cJSON_GetObjectItem(p, "ids"), ids, 33);
    for (int i = 0; i < 3; i++) {
        if (cpu_isa_parse(isas[i]) > (int)cpu_isa_detect())
            continue;
        struct rig r;
        rig_open(&r, model_dir, isas[i], 1, 64);
        size_t sz = (size_t)n * (size_t)r.cfg->vocab;
        float *lg = malloc(sz * 4);
        rig_step(&r, 0, ids, n, lg, NULL);
        if (!ref) {
            ref = lg;
        } else {
            for (size_t k = 0; k < sz; k++)
                if (fabsf(lg[k] - ref[k]) > 1e-4f)
                    fail_msg("%s vs scalar: logit %zu differs by %g", isas[i], k, fabsf(lg[k] - ref[k]));
            free(lg);
        }
        rig_close(&r);
    }
    free(ref);
}

/* ---- checkpoints written here: BF16 copy, broken copies ---- */

static char tmpdir[256];

static void write_text(const char *dir, const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Copies the tiny model to dir with every tensor in `dt` (F32 or BF16),
 * optionally renaming one tensor or changing one shape, to make bad ones. */
static void copy_model(const char *dir, enum st_dtype dt, const char *rename_from,
                       const char *rename_to, const char *drop)
{
    struct rl_err err = {0};
    struct st_file *src;
    assert_int_equal(st_open(&src, model_dir, &err), 0);
    struct st_writer *w;
    assert_int_equal(st_writer_create(&w, &err), 0);
    int n = st_n_tensors(src);
    void **bufs = calloc((size_t)n, sizeof *bufs);
    for (int i = 0; i < n; i++) {
        const struct st_tensor *t = st_get(src, i);
        if (drop && !strcmp(t->name, drop))
            continue;
        const char *name = rename_from && !strcmp(t->name, rename_from) ? rename_to : t->name;
        size_t ne = t->n_bytes / 4;
        const void *data = t->data;
        if (dt == ST_BF16) {
            uint16_t *b = malloc(ne * 2);
            for (size_t k = 0; k < ne; k++) {
                float f;
                memcpy(&f, (const char *)t->data + 4 * k, 4);
                b[k] = f32_to_bf16(f);
            }
            bufs[i] = b;
            data = b;
        }
        assert_int_equal(st_writer_add(w, name, dt, t->n_dims, t->shape, data, &err), 0);
    }
    mkdir(dir, 0755);
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_writer_write(w, path, &err))
        fail_msg("write: %s", err.msg);
    st_writer_free(w);
    for (int i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    st_close(src);
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    size_t cfg_len = 0;
    char *cfg = tu_slurp(path, &cfg_len);
    if (dt == ST_BF16) { /* "float32" -> "bfloat16": one byte longer */
        cfg = realloc(cfg, cfg_len + 2);
        assert_non_null(cfg);
        char *at = strstr(cfg, "\"float32\"");
        assert_non_null(at);
        memmove(at + 10, at + 9, strlen(at + 9) + 1);
        memcpy(at, "\"bfloat16\"", 10);
    }
    write_text(dir, "config.json", cfg);
    free(cfg);
}

static int setup_tmp(void **state)
{
    if (tu_tmpdir(tmpdir, sizeof tmpdir, "test-model"))
        return -1;
    return setup_ref(state);
}

static int teardown_tmp(void **state)
{
    int rc = tu_rmtree(tmpdir);
    return teardown_ref(state) ? -1 : rc;
}

/* BF16 copy vs F32 original, teacher-forced along the reference's greedy
 * path: top-1 agrees where the F32 margin exceeds 0.1, top logits within
 * 0.15. */
static void test_bf16_vs_f32(void **state)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/bf16", tmpdir);
    copy_model(dir, ST_BF16, NULL, NULL, NULL);
    struct rig f, h;
    rig_open(&f, model_dir, "auto", 2, 512);
    rig_open(&h, dir, "auto", 2, 512);
    int V = f.cfg->vocab, checked = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(reference, "prompts"))
    {
        int32_t ids[400];
        int n = tu_ids_from_json(cJSON_GetObjectItem(p, "ids"), ids, 400);
        int ng = tu_ids_from_json(cJSON_GetObjectItem(p, "greedy"), ids + n, 400 - n);
        int tot = n + ng;
        float *a = malloc((size_t)tot * (size_t)V * 4), *b = malloc((size_t)tot * (size_t)V * 4);
        rig_step(&f, 0, ids, tot, a, NULL);
        rig_step(&h, 0, ids, tot, b, NULL);
        for (int t = n - 1; t < tot; t++) {
            const float *ra = a + (size_t)t * (size_t)V, *rb = b + (size_t)t * (size_t)V;
            int ta = argmax(ra, V), tb = argmax(rb, V);
            float second = -INFINITY;
            for (int v = 0; v < V; v++)
                if (v != ta && ra[v] > second)
                    second = ra[v];
            if (ra[ta] - second > 0.1f && ta != tb)
                fail_msg("position %d: bf16 top-1 %d, f32 top-1 %d (margin %g)", t, tb, ta,
                         ra[ta] - second);
            if (fabsf(ra[ta] - rb[ta]) > 0.15f)
                fail_msg("position %d: top logit %g (f32) vs %g (bf16)", t, ra[ta], rb[ta]);
            checked++;
        }
        free(a), free(b);
    }
    assert_true(checked > 150);
    rig_close(&f), rig_close(&h);
}

/* The same on a BF16 checkpoint, on every path this CPU has: the AVX-512
 * path repacks BF16 matrices into panels (gemm_bf16p), whose prefill
 * (K-chunked) and decode loops must still agree bit for bit. */
static void test_bf16_invariance(void **state)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/bf16inv", tmpdir);
    copy_model(dir, ST_BF16, NULL, NULL, NULL);
    const char *isas[] = {"scalar", "avx2", "avx512bf16"};
    for (int i = 0; i < 3; i++)
        if (cpu_isa_parse(isas[i]) <= (int)cpu_isa_detect())
            invariance_on(dir, isas[i]);
}

/* Quantized checkpoints through the model maker, random weights: a Q8_0
 * GGUF and an AWQ (group 64) checkpoint of the tiny shape, and a Q4_K_M
 * GGUF with 256-wide dims (K-quant blocks; Q6_K for v, down and the tied
 * embedding in its 6-bit layers). */
static void quant_copy(char *dir, size_t n, const char *name, enum mk_dtype dt)
{
    snprintf(dir, n, "%s/%s", tmpdir, name);
    struct mk_opts o;
    mk_opts_init(&o);
    o.out_dir = dir;
    o.dtype = dt;
    if (dt == MK_Q4_K_M) { /* random weights, dims in whole super-blocks */
        o.hidden = 256, o.intermediate = 512, o.n_layers = 3, o.n_heads = 4, o.n_kv_heads = 2;
        o.head_dim = 64, o.vocab = 768, o.tied = 1, o.seed = 7;
    } else {
        o.awq_group = 64;
        o.seed = 3;
    }
    struct rl_err err = {0};
    if (mk_write(&o, NULL, &err))
        fail_msg("mkmodel %s: %s", name, err.msg);
}

/* Batch and chunk invariance with quantized weights, on every path this
 * CPU has: activations are quantized per row and every product is one
 * integer-then-f32 recipe per output (engine/cpu/qgemm.h), so a row's
 * logits must not depend on the batch, the chunking or the tiles (the
 * AVX-512 path packs the weights into VNNI panels, prefill and decode
 * take different tiles). */
static void test_quant_invariance(void **state)
{
    static const struct {
        const char *name;
        enum mk_dtype dt;
    } qs[] = {{"q8_0", MK_Q8_0}, {"awq", MK_AWQ}, {"q4km", MK_Q4_K_M}};
    const char *isas[] = {"scalar", "avx2", "avx512bf16"};
    for (size_t q = 0; q < sizeof qs / sizeof *qs; q++) {
        char dir[400];
        quant_copy(dir, sizeof dir, qs[q].name, qs[q].dt);
        for (int i = 0; i < 3; i++)
            if (cpu_isa_parse(isas[i]) <= (int)cpu_isa_detect())
                invariance_on(dir, isas[i]);
    }
}

/* be_options.quantize = "q8_0" (redlm --quantize q8_0, worker quantize =
 * "q8_0"): the float matrices become Q8_0 at load. The logits equal, bit for
 * bit, those of the same backend given Q8_0 weights quantized here with
 * quant.c's reference quantizer (the embedding too), so the load quantizes
 * exactly as a Q8_0 file would hold the weights; the greedy top-1 of the
 * reference prompts agrees with the F32 model's wherever its margin
 * exceeds 0.3; an unknown name is refused. */
static void test_quantize_at_load(void **state)
{
    struct model *m;
    struct rl_err err = {0};
    assert_int_equal(model_load(&m, model_dir, &err), 0);
    const struct model_config *cfg = model_get_config(m);
    const struct model_weights *w = model_get_weights(m);
    /* the hand-quantized copy */
    struct model_weights qw = *w;
    struct model_layer *ql = malloc((size_t)cfg->n_layers * sizeof *ql);
    memcpy(ql, w->layers, (size_t)cfg->n_layers * sizeof *ql);
    qw.layers = ql;
    void *bufs[2 + 7 * 8];
    int nb = 0;
    for (int l = -1; l < cfg->n_layers; l++) {
        struct model_tensor *ts[7];
        int n = 1;
        if (l < 0) {
            ts[0] = &qw.embed;
        } else {
            struct model_layer *S = &ql[l];
            struct model_tensor *ls[7] = {&S->wq, &S->wk, &S->wv, &S->wo, &S->w_gate, &S->w_up, &S->w_down};
            memcpy(ts, ls, sizeof ls);
            n = 7;
        }
        for (int i = 0; i < n; i++) {
            size_t rb = quant_row_bytes(MODEL_Q8_0, ts[i]->cols);
            uint8_t *q = malloc(rb * (size_t)ts[i]->rows);
            for (int64_t r = 0; r < ts[i]->rows; r++)
                assert_int_equal(quant_quantize_row(MODEL_Q8_0, (const float *)ts[i]->data + r * ts[i]->cols,
                                                    q + (size_t)r * rb, ts[i]->cols), 0);
            ts[i]->dtype = MODEL_Q8_0;
            ts[i]->data = q;
            bufs[nb++] = q;
        }
    }
    assert_true(cfg->tied);
    qw.lm_head = qw.embed;
    int V = cfg->vocab;
    const char *isas[] = {"scalar", "avx2", "avx512bf16"};
    for (int k = 0; k < 3; k++) {
        if (cpu_isa_parse(isas[k]) > (int)cpu_isa_detect())
            continue;
        struct backend *a, *b;
        struct be_options oa = {.n_threads = 2, .isa = isas[k], .quantize = "q8_0"};
        struct be_options ob = {.n_threads = 2, .isa = isas[k]};
        assert_int_equal(be_create(&a, "cpu", &oa, &err), 0);
        assert_int_equal(be_create(&b, "cpu", &ob, &err), 0);
        assert_int_equal(a->ops->load(a->ctx, cfg, w, 512, &err), 0);
        assert_int_equal(b->ops->load(b->ctx, cfg, &qw, 512, &err), 0);
        assert_int_equal(a->ops->kv_init(a->ctx, 64, 16, &err), 0);
        assert_int_equal(b->ops->kv_init(b->ctx, 64, 16, &err), 0);
        const cJSON *p;
        int confident = 0;
        cJSON_ArrayForEach(p, cJSON_GetObjectItem(reference, "prompts"))
        {
            int32_t ids[512], table[64];
            int n = tu_ids_from_json(cJSON_GetObjectItem(p, "ids"), ids, 512);
            assert_true(n <= 512);
            for (int i = 0; i < 64; i++)
                table[i] = i;
            float *la = malloc((size_t)n * V * 4), *lb = malloc((size_t)n * V * 4);
            struct be_seq s = {0, n, table, 0, 0};
            struct be_batch ba = {1, &s, n, ids, n, la}, bb = {1, &s, n, ids, n, lb};
            if (a->ops->forward(a->ctx, &ba, &err))
                fail_msg("forward: %s", err.msg);
            assert_int_equal(b->ops->forward(b->ctx, &bb, &err), 0);
            assert_memory_equal(la, lb, (size_t)n * V * 4);
            /* the reference's last-position logits: top-1 where it is sure */
            const cJSON *rows = cJSON_GetObjectItem(p, "logits"), *pos = cJSON_GetObjectItem(p, "positions");
            for (int q = 0; q < cJSON_GetArraySize(pos); q++) {
                int at = cJSON_GetArrayItem(pos, q)->valueint;
                const cJSON *row = cJSON_GetArrayItem(rows, q);
                int best = 0;
                double b1 = -1e30, b2 = -1e30;
                for (int v = 0; v < V; v++) {
                    double x = cJSON_GetArrayItem(row, v)->valuedouble;
                    if (x > b1)
                        b2 = b1, b1 = x, best = v;
                    else if (x > b2)
                        b2 = x;
                }
                if (b1 - b2 > 0.3) {
                    confident++;
                    if (argmax(la + (size_t)at * V, V) != best)
                        fail_msg("%s: position %d: Q8_0 top-1 %d, F32 reference %d (margin %.3f)", isas[k], at,
                                 argmax(la + (size_t)at * V, V), best, b1 - b2);
                }
            }
            free(la), free(lb);
        }
        assert_true(confident > 0);
        be_free(a), be_free(b);
    }
    struct backend *bad;
    struct be_options ox = {.quantize = "q4"};
    assert_int_equal(be_create(&bad, "cpu", &ox, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "q4"));
    for (int i = 0; i < nb; i++)
        free(bufs[i]);
    free(ql);
    model_free(m);
}

static void expect_load_error(const char *dir, int code, const char *needle)
{
    struct model *m = NULL;
    struct rl_err err = {0};
    int rc = model_load(&m, dir, &err);
    if (rc != -code || !strstr(err.msg, needle))
        fail_msg("expected %s with \"%s\", got %d: %s", rl_code_name(code), needle, rc, err.msg);
    assert_null(m);
}

static void test_bad_checkpoints(void **state)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/missing", tmpdir);
    copy_model(dir, ST_F32, NULL, NULL, "model.layers.2.mlp.up_proj.weight");
    expect_load_error(dir, RL_EFORMAT, "missing tensor \"model.layers.2.mlp.up_proj.weight\"");
    snprintf(dir, sizeof dir, "%s/extra", tmpdir);
    copy_model(dir, ST_F32, "model.layers.1.self_attn.q_norm.weight",
               "model.layers.1.self_attn.q_norm.bias", NULL);
    expect_load_error(dir, RL_EFORMAT, "missing tensor \"model.layers.1.self_attn.q_norm.weight\"");
    /* a config that disagrees with the tensor shapes */
    snprintf(dir, sizeof dir, "%s/shape", tmpdir);
    copy_model(dir, ST_F32, NULL, NULL, NULL);
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    char *cfg = tu_slurp(p, NULL);
    char *at = strstr(cfg, "\"intermediate_size\": 384");
    assert_non_null(at);
    memcpy(at, "\"intermediate_size\": 256", 24);
    write_text(dir, "config.json", cfg);
    free(cfg);
    expect_load_error(dir, RL_EFORMAT, "has shape [384, 128], config says [256, 128]");
    /* unexpected tensor */
    snprintf(dir, sizeof dir, "%s/unexpected", tmpdir);
    copy_model(dir, ST_F32, "model.layers.3.mlp.up_proj.weight", "model.layers.3.mlp.up_proj.weight", NULL);
    {
        struct rl_err err = {0};
        struct st_file *src;
        assert_int_equal(st_open(&src, dir, &err), 0);
        struct st_writer *w;
        assert_int_equal(st_writer_create(&w, &err), 0);
        for (int i = 0; i < st_n_tensors(src); i++) {
            const struct st_tensor *t = st_get(src, i);
            assert_int_equal(st_writer_add(w, t->name, t->dtype, t->n_dims, t->shape, t->data, &err), 0);
        }
        float junk[4] = {0};
        int64_t shp[1] = {4};
        assert_int_equal(st_writer_add(w, "model.layers.0.mlp.extra.weight", ST_F32, 1, shp, junk, &err), 0);
        char out[512];
        snprintf(out, sizeof out, "%s/model2.safetensors", dir);
        assert_int_equal(st_writer_write(w, out, &err), 0);
        st_writer_free(w);
        st_close(src);
        char to[600];
        snprintf(to, sizeof to, "%s/model.safetensors", dir);
        assert_int_equal(rename(out, to), 0);
    }
    expect_load_error(dir, RL_EFORMAT, "unexpected tensor \"model.layers.0.mlp.extra.weight\"");
    /* no config at all */
    snprintf(dir, sizeof dir, "%s/noconfig", tmpdir);
    mkdir(dir, 0755);
    expect_load_error(dir, RL_EIO, "config.json");
    /* a folder above the checkpoint says what it should hold */
    expect_load_error(dir, RL_EIO, "has no config.json: expected a Hugging Face Qwen3 checkpoint directory");
    /* a .gguf file is read as GGUF (this one is cut short), any other
     * file is named as such, never "config.json: Not a directory" */
    char file[600];
    snprintf(file, sizeof file, "%s/Qwen3-0.6B-Q8_0.gguf", tmpdir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs("GGUF", f);
    fclose(f);
    expect_load_error(file, RL_EFORMAT, "Qwen3-0.6B-Q8_0.gguf: file is 4 bytes, shorter than the GGUF header");
    snprintf(file, sizeof file, "%s/noconfig/weights.bin", tmpdir);
    f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    expect_load_error(file, RL_EFORMAT, "is a file, not a directory; expected");
}

/* ---- quantized checkpoints: what the loaders refuse, by name ---- */

/* Replaces the first `from` in file path by `to` (same length). */
static void patch_file(const char *path, const char *from, const char *to)
{
    size_t len = 0;
    char *b = tu_slurp(path, &len);
    assert_non_null(b);
    assert_int_equal(strlen(from), strlen(to));
    char *at = memmem(b, len, from, strlen(from));
    if (!at)
        fail_msg("%s: no \"%s\"", path, from);
    memcpy(at, to, strlen(to));
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, len, f), len);
    fclose(f);
    free(b);
}

static void make_quant(const char *out, enum mk_dtype dt)
{
    struct mk_opts o;
    struct rl_err err = {0};
    mk_opts_init(&o);
    o.hidden = 256, o.intermediate = 256, o.n_layers = 2, o.n_heads = 2, o.n_kv_heads = 1;
    o.head_dim = 128, o.vocab = 64, o.dtype = dt, o.out_dir = out;
    if (mk_write(&o, NULL, &err))
        fail_msg("mk_write %s: %s", out, err.msg);
}

/* What /api/show says of the weights: llama.cpp's file type name of a
 * GGUF (every mix the maker writes), FP8 / AWQ / the dtype for
 * safetensors; and the parameter count of the real Qwen3-0.6B shape
 * (0.44 B without the tied embedding, as Qwen's card says). */
static void test_quant_label(void **state)
{
    (void)state;
    static const struct {
        enum mk_dtype dt;
        const char *label;
    } cases[] = {{MK_Q8_0, "Q8_0"},     {MK_Q4_K_M, "Q4_K_M"},   {MK_Q5_K_M, "Q5_K_M"}, {MK_Q6_K, "Q6_K"},
                 {MK_Q4_0, "Q4_0"},     {MK_Q4_1, "Q4_1"},       {MK_Q5_0, "Q5_0"},     {MK_Q5_1, "Q5_1"},
                 {MK_Q2_K, "Q2_K"},     {MK_Q3_K_M, "Q3_K_M"},   {MK_IQ4_NL, "IQ4_NL"}, {MK_IQ4_XS, "IQ4_XS"},
                 {MK_BF16, "BF16"},     {MK_F32, "F32"},         {MK_FP8, "FP8"},       {MK_AWQ, "AWQ"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char p[600], label[24];
        snprintf(p, sizeof p, "%s/label-%s%s", tmpdir, mk_dtype_name(cases[i].dt),
                 mk_dtype_is_gguf(cases[i].dt) ? ".gguf" : "");
        make_quant(p, cases[i].dt);
        struct model *m;
        struct rl_err err = {0};
        if (model_load(&m, p, &err))
            fail_msg("%s: %s", p, err.msg);
        model_quant_label(m, label, sizeof label);
        if (strcmp(label, cases[i].label))
            fail_msg("%s: labelled %s", mk_dtype_name(cases[i].dt), label);
        model_free(m);
    }
    struct model_config c = {.hidden = 1024, .intermediate = 3072, .n_layers = 28, .n_heads = 16,
                             .n_kv_heads = 8, .head_dim = 128, .vocab = 151936, .tied = 1};
    assert_int_equal(model_n_params(&c), 596049920);
    assert_int_equal(model_n_params(&c) - (int64_t)c.vocab * c.hidden, 440467456);
}

static void test_bad_quantized(void **state)
{
    char p[600];
    /* GGUF: a tensor type redlm does not read is named with the file and
     * tensor (Q8_0 relabelled IQ2_XXS: the reader does not size it, the
     * loader refuses it) */
    snprintf(p, sizeof p, "%s/iq2.gguf", tmpdir);
    make_quant(p, MK_Q8_0);
    char from[64] = "blk.1.attn_k.weight";
    {
        size_t len = 0;
        char *b = tu_slurp(p, &len);
        char *at = memmem(b, len, from, strlen(from));
        assert_non_null(at);
        at += strlen(from) + 4 + 2 * 8; /* n_dims, ne[0], ne[1]: then the type */
        assert_int_equal((uint8_t)at[0], 8);
        at[0] = 16; /* IQ2_XXS */
        FILE *f = fopen(p, "wb");
        fwrite(b, 1, len, f);
        fclose(f);
        free(b);
    }
    expect_load_error(p, RL_EUNSUPPORTED, "iq2.gguf: tensor \"blk.1.attn_k.weight\" has type IQ2_XXS, which redlm does not read");
    /* another architecture */
    snprintf(p, sizeof p, "%s/llama.gguf", tmpdir);
    make_quant(p, MK_Q4_K_M);
    patch_file(p, "qwen3", "llama");
    expect_load_error(p, RL_EUNSUPPORTED, "general.architecture \"llama\" is not supported");
    /* a missing tensor, and a metadata key of the wrong type */
    snprintf(p, sizeof p, "%s/missing.gguf", tmpdir);
    make_quant(p, MK_Q8_0);
    patch_file(p, "blk.1.ffn_up.weight", "blk.1.ffn_xx.weight");
    expect_load_error(p, RL_EFORMAT, "missing tensor \"blk.1.ffn_up.weight\"");
    snprintf(p, sizeof p, "%s/blockcount.gguf", tmpdir);
    make_quant(p, MK_Q8_0);
    {
        /* qwen3.block_count's value type uint32 (4) -> float32 (6) */
        size_t len = 0;
        char *b = tu_slurp(p, &len);
        char *at = memmem(b, len, "qwen3.block_count", 17);
        assert_non_null(at);
        at[17] = 6;
        FILE *f = fopen(p, "wb");
        fwrite(b, 1, len, f);
        fclose(f);
        free(b);
    }
    expect_load_error(p, RL_EFORMAT, "metadata \"qwen3.block_count\" is float32, not an integer");
    /* a directory holding one GGUF loads it; holding two, asks which */
    snprintf(p, sizeof p, "%s/ggdir", tmpdir);
    mkdir(p, 0755);
    snprintf(from, sizeof from, "/model.gguf");
    char f1[700];
    snprintf(f1, sizeof f1, "%s/a.gguf", p);
    make_quant(f1, MK_Q8_0);
    struct model *m;
    struct rl_err err = {0};
    if (model_load(&m, p, &err))
        fail_msg("%s: %s", p, err.msg);
    assert_int_equal(model_get_config(m)->hidden, 256);
    assert_non_null(model_get_gguf(m));
    model_free(m);
    snprintf(f1, sizeof f1, "%s/b.gguf", p);
    make_quant(f1, MK_Q8_0);
    expect_load_error(p, RL_EINVAL, "holds several GGUF files");
    /* AWQ: the config's bits and version, a missing qzeros, a wrong dtype */
    static const struct {
        const char *file, *from, *to;
        int code;
        const char *needle;
    } awq[] = {
        {"config.json", "\"bits\":\t4", "\"bits\":\t8", RL_EUNSUPPORTED, "quantization_config.bits\" = 8"},
        {"config.json", "\"gemm\"", "\"gemv\"", RL_EUNSUPPORTED, "quantization_config.version\" = gemv"},
        {"model.safetensors", "layers.1.mlp.up_proj.qzeros", "layers.1.mlp.up_proj.qzeroz", RL_EFORMAT,
         "missing tensor \"model.layers.1.mlp.up_proj.qzeros\""},
        {"model.safetensors", "\"I32\"", "\"F32\"", RL_EUNSUPPORTED, "has dtype F32; AWQ's qweight is I32"},
    };
    for (size_t i = 0; i < sizeof awq / sizeof awq[0]; i++) {
        snprintf(p, sizeof p, "%s/awq%zu", tmpdir, i);
        make_quant(p, MK_AWQ);
        char fp[700];
        snprintf(fp, sizeof fp, "%s/%s", p, awq[i].file);
        patch_file(fp, awq[i].from, awq[i].to);
        expect_load_error(p, awq[i].code, awq[i].needle);
    }
    snprintf(p, sizeof p, "%s/awq_ok", tmpdir);
    make_quant(p, MK_AWQ);
    assert_int_equal(model_load(&m, p, &err), 0);
    assert_int_equal(model_get_config(m)->awq_group, 128);
    assert_int_equal(model_get_weights(m)->layers[0].wq.dtype, MODEL_AWQ4);
    assert_int_equal(model_get_weights(m)->layers[0].wq.awq_group, 128);
    assert_null(model_get_gguf(m));
    model_free(m);
}

struct cfg_case {
    const char *json;
    int code;
    const char *needle;
};

static void test_config_cases(void **state)
{
#define BASE "\"model_type\": \"qwen3\", \"hidden_size\": 64, \"intermediate_size\": 128, " \
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, " \
             "\"vocab_size\": 100"
    static const struct cfg_case cases[] = {
        {"{" BASE "}", 0, ""},
        {"{" BASE ", \"head_dim\": 32}", 0, ""},
        {"not json", RL_EFORMAT, "not valid JSON"},
        {"[1]", RL_EFORMAT, "top level must be an object"},
        {"{\"model_type\": \"llama\"}", RL_EUNSUPPORTED, "\"model_type\" = \"llama\""},
        {"{\"model_type\": \"qwen3\", \"hidden_size\": 64}", RL_EFORMAT, "\"intermediate_size\""},
        {"{" BASE ", \"head_dim\": 31}", RL_EFORMAT, "\"head_dim\" = 31"},
        {"{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"intermediate_size\": 128, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 3, "
         "\"vocab_size\": 100}", RL_EFORMAT, "not a multiple"},
        {"{" BASE ", \"rms_norm_eps\": \"x\"}", RL_EFORMAT, "\"rms_norm_eps\" must be a number"},
        {"{\"model_type\": \"qwen3\", \"hidden_size\": 64.5}", RL_EFORMAT,
         "\"hidden_size\" must be an integer"},
        {"{" BASE ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2}}", RL_EUNSUPPORTED,
         "\"rope_scaling.rope_type\" = \"linear\""},
        {"{" BASE ", \"rope_scaling\": {\"rope_type\": \"yarn\"}}", RL_EFORMAT, "factor"},
        {"{" BASE ", \"quantization_config\": {\"quant_method\": \"gptq\"}}", RL_EUNSUPPORTED,
         "\"quantization_config.quant_method\""},
        {"{" BASE ", \"quantization_config\": {\"quant_method\": \"fp8\"}}", RL_EFORMAT,
         "weight_block_size"},
        {"{" BASE ", \"torch_dtype\": \"int8\"}", RL_EUNSUPPORTED, "\"torch_dtype\""},
        {"{" BASE ", \"use_sliding_window\": true}", RL_EUNSUPPORTED, "use_sliding_window"},
        {"{" BASE ", \"tie_word_embeddings\": 1}", RL_EFORMAT, "tie_word_embeddings"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct model_config c;
        struct rl_err err = {0};
        int rc = model_parse_config(&c, cases[i].json, "config.json", &err);
        if (rc != -cases[i].code || (rc && !strstr(err.msg, cases[i].needle)))
            fail_msg("case %zu: want %s \"%s\", got %d \"%s\"", i, rl_code_name(cases[i].code),
                     cases[i].needle, rc, err.msg);
    }
    /* YaRN as Qwen3's long-context guide writes it */
    struct model_config c;
    struct rl_err err = {0};
    assert_int_equal(model_parse_config(&c, "{" BASE ", \"rope_scaling\": {\"rope_type\": \"yarn\", "
                                        "\"factor\": 4.0, \"original_max_position_embeddings\": 32768}}",
                                        "config.json", &err), 0);
    assert_true(fabsf(c.yarn_factor - 4.0f) < 1e-6f);
    assert_int_equal(c.yarn_orig_max_pos, 32768);
    assert_true(fabsf(c.yarn_attn_factor - (0.1f * logf(4.0f) + 1.0f)) < 1e-6f);
    assert_int_equal(c.head_dim, 16);

    /* rotary frequencies: the fastest dimensions keep their frequency, the
     * slowest are interpolated by the factor, the ramp is monotone */
    c.head_dim = 128;
    c.rope_theta = 1e6f;
    float f[64], ms;
    model_rope_inv_freq(&c, f, &ms);
    assert_true(fabsf(ms - (0.1f * logf(4.0f) + 1.0f)) < 1e-6f);
    assert_true(f[0] == 1.0f);
    assert_true(fabs(f[63] - 1.0 / (4.0 * pow(1e6, 126.0 / 128))) < 1e-12);
    for (int i = 1; i < 64; i++)
        assert_true(f[i] < f[i - 1]);
    c.yarn_factor = 0;
    model_rope_inv_freq(&c, f, &ms);
    assert_true(ms == 1.0f);
    assert_true(fabs(f[63] - 1.0 / pow(1e6, 126.0 / 128)) < 1e-12);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_cases),
        cmocka_unit_test(test_reference_scalar),
        cmocka_unit_test(test_reference_avx2),
        cmocka_unit_test(test_reference_avx512),
        cmocka_unit_test(test_hidden_state),
        cmocka_unit_test(test_paths_agree),
        cmocka_unit_test(test_batch_and_chunk_invariance),
        cmocka_unit_test(test_bf16_vs_f32),
        cmocka_unit_test(test_bf16_invariance),
        cmocka_unit_test(test_quant_invariance),
        cmocka_unit_test(test_quantize_at_load),
        cmocka_unit_test(test_bad_checkpoints),
        cmocka_unit_test(test_bad_quantized),
        cmocka_unit_test(test_quant_label),
    };
    return cmocka_run_group_tests_name("model", tests, setup_tmp, teardown_tmp);
}
