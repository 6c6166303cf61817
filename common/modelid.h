/* common/modelid.h - what identifies a model for the result cache.
 *
 * The worker (which fills redlm:cache:<key>) and the dispatcher (which
 * answers from it without a worker) must compute the very same identity,
 * or the dispatcher's fast path never hits; so both call this. */
#ifndef RL_MODELID_H
#define RL_MODELID_H

#include "err.h"
#include "sha256.h"

/* A SHA-256 (lower-case hex) over config.json, tokenizer.json,
 * tokenizer_config.json and generation_config.json of dir (each by name and content; a missing file
 * counts as empty) and the names and sizes of its *.safetensors and *.gguf
 * files and 64 blocks of 4 KiB of each at evenly spaced offsets, so a new
 * checkpoint in the same directory, or another one of the same shape (a
 * fine-tune, an adapter merged into its base), never answers from an old
 * cache entry; 256 KiB read a file. When dir is a file (a GGUF model), its
 * size, its first 16 MiB (the metadata: config and tokenizer) and the same
 * samples. Returns 0, or -RL_EIO when dir cannot be listed or read. */
int modelid_compute(const char *dir, char out[SHA256_HEX_LEN + 1], struct rl_err *err);

/* The identity of the base model base_id with the LoRA adapter in dir
 * (engine/lora.h): a SHA-256 over base_id, adapter_config.json and the
 * whole of adapter_model.safetensors (for a GGUF adapter, dir is the file:
 * the whole file). The content, not only the size as
 * for a model: an adapter retrained in place keeps its rank and so its
 * size, and is small enough to read at start. Returns 0, or -RL_EIO
 * naming the file that cannot be read. */
int modelid_lora(const char *base_id, const char *dir, char out[SHA256_HEX_LEN + 1],
                 struct rl_err *err);

/* The identity of a resolved --model (common/modelref.h): modelid_compute
 * of its checkpoint, and, for an Ollama model with an ADAPTER layer, that
 * identity with the adapter's (modelid_lora): the worker and the
 * dispatcher's fast path key the model alike. */
struct modelref;
int modelid_of(const struct modelref *m, char out[SHA256_HEX_LEN + 1], struct rl_err *err);

#endif
