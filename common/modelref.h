/* common/modelref.h - what `--model` names: a checkpoint directory (or a
 * GGUF file), a Hugging Face repo id found offline in the Hugging Face
 * cache, or an Ollama model `ollama:NAME[:TAG]` found offline in the
 * Ollama store.
 *
 * Users have their models as the Hugging Face tools leave them: a repo id
 * (`Qwen/Qwen3-14B`) downloaded into the cache, whose files sit under a
 * snapshot directory named by a commit hash. Every program that loads a
 * model (worker, dispatcher, the `redlm` commands) resolves its `--model`
 * here, so they all accept the same spellings, and all derive the same
 * served name, the name clients ask for (`model` of a job or an HTTP
 * request) and workers announce in their heartbeat. */
#ifndef RL_MODELREF_H
#define RL_MODELREF_H

#include <stdbool.h>
#include <stdint.h>

#include "err.h"

#define MODELREF_PATH_MAX 4096
#define MODELREF_NAME_MAX 128 /* a served name; also the job field `model` */

/* A resolved --model. Plain record, filled by modelref_resolve. */
struct modelref {
    char dir[MODELREF_PATH_MAX];    /* the checkpoint directory (or GGUF file) to load */
    char name[MODELREF_NAME_MAX + 1]; /* served name: the repo id (without
                                        @revision), else the directory's
                                        last component */
    char owned_by[MODELREF_NAME_MAX + 1]; /* the repo id's organisation, else "redlm" */
    int64_t created;                /* Unix seconds: mtime of config.json (0 if none) */
    bool from_hub;                  /* found in the Hugging Face cache */
    char revision[MODELREF_NAME_MAX + 1]; /* from_hub: the revision asked for ("main") */
    bool from_ollama;               /* found in the Ollama store: dir is the model blob */
    char adapter[MODELREF_PATH_MAX]; /* from_ollama with MODELREF_ADAPTER: the blob of the
                                        manifest's ADAPTER layer (a GGUF LoRA adapter,
                                        part of the model), else "" */
};

/* modelref_resolve_ex flags. */
#define MODELREF_ADAPTER 1u /* the caller serves an Ollama model's ADAPTER layer
                               (fills modelref.adapter); without it such a model
                               is refused, since its base alone is another model */

/* The Hugging Face hub cache directory, as the Hugging Face tools choose it:
 * $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub. *why
 * (may be NULL) gets which of the three it was. Returns buf. */
const char *modelref_hub_cache(char *buf, size_t size, const char **why);

/* The Ollama model store, as Ollama chooses it: $OLLAMA_MODELS, else
 * ~/.ollama/models. *why (may be NULL) says which. Returns buf. */
const char *modelref_ollama_store(char *buf, size_t size, const char **why);

/* Resolves spec:
 *   - an existing directory (absolute or relative): that directory;
 *   - else a repo id `ORG/NAME` or `NAME`, optionally `@REVISION` (a branch
 *     or tag under refs/, or a commit hash under snapshots/; default main),
 *     looked up offline in the hub cache: models--ORG--NAME/refs/REVISION
 *     holds the commit hash, snapshots/<hash>/ the files.
 *   - `ollama:NAME[:TAG]` (TAG defaults to latest; NAME is MODEL,
 *     NAMESPACE/MODEL or HOST/NAMESPACE/MODEL, by default
 *     registry.ollama.ai/library/MODEL), looked up offline in the Ollama
 *     store: manifests/HOST/NAMESPACE/MODEL/TAG is a JSON manifest whose
 *     layer of mediaType application/vnd.ollama.image.model names the GGUF
 *     blob blobs/sha256-<hex>; served as NAME:TAG, owned by "ollama".
 * Nothing is downloaded. Returns 0, or -RL_ENOTFOUND with a message that
 * says what was looked for and where (the cache directory and the
 * variable that chose it), or -RL_EINVAL for an empty spec. */
int modelref_resolve(const char *spec, struct modelref *out, struct rl_err *err);
/* The same with flags (MODELREF_ADAPTER). */
int modelref_resolve_ex(const char *spec, unsigned flags, struct modelref *out, struct rl_err *err);

/* A served name clients can send and Redis keys can hold: 1 to
 * MODELREF_NAME_MAX of [A-Za-z0-9._:/-], not starting with '/' or '.'. */
bool modelref_name_ok(const char *name);

/* A LoRA adapter a worker serves beside its model (vLLM's --lora-modules):
 * the worker option lora_modules / --lora NAME=DIR. Plain record. */
struct modelref_lora {
    char name[MODELREF_NAME_MAX + 1]; /* the model name jobs select it by */
    char dir[MODELREF_PATH_MAX];      /* the PEFT adapter directory, as given */
};

/* Parses spec "NAME=DIR" (split at the first '=': a name holds none, a
 * directory may) into *out. NAME must pass modelref_name_ok, DIR be
 * non-empty. Returns 0, or -RL_EINVAL with a message quoting spec. */
int modelref_lora_parse(const char *spec, struct modelref_lora *out, struct rl_err *err);

/* Checks n parsed adapters against each other and the model's served
 * name: names distinct and none equal to served (a job's `model` must say
 * which of them it means). Returns 0, or -RL_EINVAL naming the adapter. */
int modelref_lora_check(const struct modelref_lora *l, int n, const char *served,
                        struct rl_err *err);

#endif
