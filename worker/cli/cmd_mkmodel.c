/* worker/cli/cmd_mkmodel.c - `redlm mkmodel`: writes a random-weight Qwen3
 * checkpoint of a preset or custom shape, or converts one (--from) to
 * another dtype. Flags are read in two passes so that --shape sets the base
 * and every other flag overrides it, whatever the order. The work is
 * mk_write() in engine/mkmodel.c; this file is only argument handling. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "modelref.h"
#include "cli_util.h"
#include "cmds.h"
#include "mklora.h"
#include "mkmodel.h"

static void usage(FILE *f)
{
    fputs("usage: redlm mkmodel --out DIR [options]\n"
          "  Writes a Hugging Face Qwen3 checkpoint with random weights (or converts one).\n"
          "  --shape NAME        tiny (default), qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b,\n"
          "                      qwen3-14b, qwen3-32b; the flags below override its fields\n"
          "  --hidden N --intermediate N --layers N --heads N --kv-heads N --head-dim N\n"
          "  --vocab N --tied | --untied\n"
          "  --dtype f32|bf16|fp8|awq|q8_0|q4_k_m|q5_k_m|q6_k|q4_0|q4_1|q5_0|q5_1|q2_k|\n"
          "          q3_k_m|iq4_nl|iq4_xs  (default bf16; fp8 = E4M3 projections with\n"
          "                      128x128 block weight_scale_inv, the rest BF16; awq =\n"
          "                      AutoAWQ INT4 GEMM projections, the rest F16; q8_0 and\n"
          "                      after write one GGUF file, DIR/model.gguf or --out\n"
          "                      FILE.gguf, in llama.cpp's layouts (output Q6_K, or Q8_0);\n"
          "                      they need the input dims in whole blocks: 32 for q8_0, 256 where a\n"
          "                      K-quant or IQ4_XS is in the mix, --group for awq)\n"
          "  --group N           AWQ group size (default 128)\n"
          "  --scale-dtype f32|bf16  dtype of the FP8 scales (default f32; Qwen's FP8\n"
          "                      releases use bf16)\n"
          "  --seed N            PRNG seed (default 0); same seed = same weights in any dtype\n"
          "  --yarn F            rope_scaling yarn with factor F (original 32768)\n"
          "  --bos ID --eos ID   token ids (default 151643/151645, or vocab-2/vocab-1)\n"
          "  --shards N | --shard-size BYTES[K|M|G]  write model-0000i-of-0000N files + index\n"
          "  --pattern           repeat a small random pattern per tensor (fast, for huge models)\n"
          "  --embedding         Qwen3-Embedding's layout: tensor names without \"model.\" and\n"
          "                      no lm_head.weight (untied: an embeddings-only checkpoint,\n"
          "                      as Qwen3-Embedding-4B/8B); safetensors dtypes only\n"
          "  --tokenizer DIR     copy tokenizer.json and tokenizer_config.json from DIR\n"
          "                      (GGUF: into the file's tokenizer metadata)\n"
          "  --from DIR          convert the checkpoint in DIR to --dtype (same weights,\n"
          "                      its config and tokenizer files kept); shape flags ignored\n"
          "  prints {\"out\": DIR, \"params\": N, \"bytes\": N, \"files\": N}\n"
          "\n"
          "usage: redlm mkmodel --lora-of BASE --out DIR [options]\n"
          "  Writes a PEFT LoRA adapter with random A and B for the checkpoint BASE\n"
          "  (adapter_config.json + adapter_model.safetensors, as PEFT saves them;\n"
          "  --out FILE.gguf: llama.cpp's GGUF adapter file, the same values).\n"
          "  --lora-rank N       r (default 8)\n"
          "  --lora-alpha F      lora_alpha (default 2 r)\n"
          "  --lora-std F        std of the entries of A and B (default 0.02)\n"
          "  --lora-targets L    comma list of q_proj,k_proj,v_proj,o_proj,gate_proj,\n"
          "                      up_proj,down_proj (default all)\n"
          "  --rslora            scale alpha / sqrt(r) instead of alpha / r\n"
          "  --seed N --dtype f32|bf16\n"
          "usage: redlm mkmodel --merge-lora ADAPTER --from BASE --out DIR\n"
          "  Writes BASE with the adapter merged into its weights (one model.safetensors)\n"
          "  prints {\"out\": DIR}\n",
          f);
}

/* --lora-of and --merge-lora: the adapter maker's own flags. */
static int lora_args(int argc, char **argv, struct mk_lora_opts *o, const char **merge,
                     const char **from, struct rl_err *err)
{
    mk_lora_opts_init(o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--rslora")) {
            o->rslora = 1;
            continue;
        }
        if (i + 1 >= argc)
            return rl_errf(err, RL_EINVAL, "unknown or incomplete argument \"%s\" (see --help)", a);
        const char *v = argv[++i];
        long x;
        char *end;
        int rc;
        if (!strcmp(a, "--lora-of")) {
            o->base_dir = v;
        } else if (!strcmp(a, "--merge-lora")) {
            *merge = v;
        } else if (!strcmp(a, "--from")) {
            *from = v;
        } else if (!strcmp(a, "--out")) {
            o->out_dir = v;
        } else if (!strcmp(a, "--lora-rank")) {
            if ((rc = cli_parse_int(v, 1, 512, &x, a, err)))
                return rc;
            o->rank = (int)x;
        } else if (!strcmp(a, "--lora-alpha") || !strcmp(a, "--lora-std")) {
            double f = strtod(v, &end);
            if (end == v || *end || !(f > 0) || f > 1e6)
                return rl_errf(err, RL_EINVAL, "%s: \"%s\" is not a positive number", a, v);
            if (a[7] == 'a')
                o->alpha = f;
            else
                o->std = (float)f;
        } else if (!strcmp(a, "--lora-targets")) {
            static const char *const names[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                "gate_proj", "up_proj", "down_proj"};
            o->targets = 0;
            for (const char *t = v; *t;) {
                size_t n = strcspn(t, ",");
                int found = 0;
                for (int p = 0; p < 7; p++)
                    if (strlen(names[p]) == n && !strncmp(t, names[p], n))
                        o->targets |= 1u << p, found = 1;
                if (!found)
                    return rl_errf(err, RL_EINVAL, "--lora-targets: \"%.*s\" is not one of q_proj, "
                                   "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj", (int)n, t);
                t += n + (t[n] == ',');
            }
        } else if (!strcmp(a, "--seed")) {
            errno = 0;
            unsigned long long sd = strtoull(v, &end, 0);
            if (errno || end == v || *end || v[0] == '-')
                return rl_errf(err, RL_EINVAL, "--seed: \"%s\" is not a non-negative integer", v);
            o->seed = sd;
        } else if (!strcmp(a, "--dtype")) {
            if (strcmp(v, "f32") && strcmp(v, "bf16"))
                return rl_errf(err, RL_EINVAL, "--dtype: an adapter is f32 or bf16, not \"%s\"", v);
            o->bf16 = !strcmp(v, "bf16");
        } else {
            return rl_errf(err, RL_EINVAL, "unknown argument \"%s\" for an adapter (see --help)", a);
        }
    }
    if (!o->out_dir)
        return rl_errf(err, RL_EINVAL, "--out is needed");
    if (*merge && (!*from || o->base_dir))
        return rl_errf(err, RL_EINVAL, "--merge-lora ADAPTER takes --from BASE (and no --lora-of)");
    return 0;
}

static int mkmodel_lora(int argc, char **argv)
{
    struct mk_lora_opts o;
    const char *merge = NULL, *from = NULL;
    struct rl_err err = {0};
    struct modelref base;
    int rc = lora_args(argc, argv, &o, &merge, &from, &err);
    const char *b = merge ? from : o.base_dir;
    if (!rc && !(rc = modelref_resolve(b, &base, &err)))
        b = base.dir;
    if (!rc)
        rc = merge ? mk_lora_merge(b, merge, o.out_dir, &err)
                   : (o.base_dir = b, mk_lora_write(&o, &err));
    if (rc) {
        fprintf(stderr, "mkmodel: %s\n", err.msg);
        return 1;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "out", o.out_dir);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    printf("%s\n", s ? s : "{}");
    free(s);
    return 0;
}

static int parse_size(const char *s, uint64_t *out, struct rl_err *err)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1ull << 30, end++;
    if (errno || end == s || *end || s[0] == '-' || v == 0 || v > UINT64_MAX / mul)
        return rl_errf(err, RL_EINVAL, "--shard-size: \"%s\" is not a positive byte count", s);
    *out = v * mul;
    return 0;
}

static int parse_args(int argc, char **argv, struct mk_opts *o, struct rl_err *err)
{
    mk_opts_init(o);
    int rc;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--shape")) {
            if (i + 1 >= argc)
                return rl_errf(err, RL_EINVAL, "--shape needs a value");
            if ((rc = mk_opts_preset(o, argv[i + 1], err)))
                return rc;
        }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--tied")) {
            o->tied = 1;
            continue;
        }
        if (!strcmp(a, "--untied")) {
            o->tied = 0;
            continue;
        }
        if (!strcmp(a, "--pattern")) {
            o->pattern = 1;
            continue;
        }
        if (!strcmp(a, "--embedding")) {
            o->embedding = 1;
            continue;
        }
        if (i + 1 >= argc || strncmp(a, "--", 2))
            return rl_errf(err, RL_EINVAL, "unknown or incomplete argument \"%s\" (see --help)", a);
        const char *v = argv[++i];
        long x;
        struct {
            const char *flag;
            int *field;
            long lo, hi;
        } ints[] = {
            {"--hidden", &o->hidden, 1, 1 << 20},   {"--intermediate", &o->intermediate, 1, 1 << 20},
            {"--layers", &o->n_layers, 1, 10000},   {"--heads", &o->n_heads, 1, 4096},
            {"--kv-heads", &o->n_kv_heads, 1, 4096}, {"--head-dim", &o->head_dim, 1, 4096},
            {"--vocab", &o->vocab, 2, 1 << 24},     {"--shards", &o->n_shards, 1, 99999},
            {"--bos", &o->bos_id, 0, 1 << 24},      {"--eos", &o->eos_id, 0, 1 << 24},
            {"--group", &o->awq_group, 1, 1 << 16},
        };
        int done = 0;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !done; k++)
            if (!strcmp(a, ints[k].flag)) {
                if ((rc = cli_parse_int(v, ints[k].lo, ints[k].hi, &x, a, err)))
                    return rc;
                *ints[k].field = (int)x;
                done = 1;
            }
        if (done || !strcmp(a, "--shape"))
            continue;
        if (!strcmp(a, "--out")) {
            o->out_dir = v;
        } else if (!strcmp(a, "--from")) {
            o->from_dir = v;
        } else if (!strcmp(a, "--tokenizer")) {
            o->tokenizer_dir = v;
        } else if (!strcmp(a, "--dtype")) {
            if (mk_dtype_parse(v, &o->dtype))
                return rl_errf(err, RL_EINVAL,
                               "--dtype: \"%s\" is not f32, bf16, fp8, awq, q8_0, q4_k_m, q5_k_m, q6_k, "
                               "q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_m, iq4_nl or iq4_xs", v);
        } else if (!strcmp(a, "--scale-dtype")) {
            if (strcmp(v, "f32") && strcmp(v, "bf16"))
                return rl_errf(err, RL_EINVAL, "--scale-dtype: \"%s\" is not f32 or bf16", v);
            o->scale_bf16 = !strcmp(v, "bf16");
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 0);
            if (errno || end == v || *end || v[0] == '-')
                return rl_errf(err, RL_EINVAL, "--seed: \"%s\" is not a non-negative integer", v);
            o->seed = s;
        } else if (!strcmp(a, "--yarn")) {
            char *end;
            double f = strtod(v, &end);
            if (end == v || *end || !(f > 0.0) || f > 1000.0)
                return rl_errf(err, RL_EINVAL, "--yarn: \"%s\" is not a factor in (0, 1000]", v);
            o->yarn_factor = f;
        } else if (!strcmp(a, "--shard-size")) {
            if ((rc = parse_size(v, &o->shard_size, err)))
                return rc;
        } else {
            return rl_errf(err, RL_EINVAL, "unknown argument \"%s\" (see --help)", a);
        }
    }
    return 0;
}

int cmd_mkmodel(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--lora-of") || !strcmp(argv[i], "--merge-lora"))
            return mkmodel_lora(argc, argv);
    struct mk_opts o;
    struct mk_result r;
    struct rl_err err = {0};
    struct modelref from; /* --from: a directory, or a repo id in the Hugging Face cache */
    int rc = parse_args(argc, argv, &o, &err);
    if (!rc && o.from_dir && !(rc = modelref_resolve(o.from_dir, &from, &err)))
        o.from_dir = from.dir;
    if (rc || mk_write(&o, &r, &err)) {
        fprintf(stderr, "mkmodel: %s\n", err.msg);
        return 1;
    }
    cJSON *j = cJSON_CreateObject();
    char gpath[4096];
    mk_gguf_path(o.out_dir, gpath, sizeof gpath);
    cJSON_AddStringToObject(j, "out", mk_dtype_is_gguf(o.dtype) ? gpath : o.out_dir);
    cJSON_AddNumberToObject(j, "params", (double)r.n_params);
    cJSON_AddNumberToObject(j, "bytes", (double)r.n_bytes);
    cJSON_AddNumberToObject(j, "files", r.n_files);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) {
        fprintf(stderr, "mkmodel: out of memory\n");
        return 1;
    }
    printf("%s\n", s);
    free(s);
    return 0;
}
