/* common/config.c - the option table and everything made from it.
 *
 * `options[]` below is the only place an option is declared. Each row
 * names the option, its type, its default (as text, parsed by the same
 * code as a flag value, so a default can never be out of its own
 * bounds without a test failing), its bounds or allowed values, the
 * programs it is for, whether SIGHUP may change it, where it lives in
 * struct cfg, and one help sentence. The loader (libconfig), the flag
 * parser, --help and cfg_write_sample() all walk this table.
 *
 * Loading never half-applies: the file and the flags are applied to a
 * copy, checked, and only then swapped in, so a bad SIGHUP reload leaves
 * the running config alone. Called from main threads only, at start and
 * on SIGHUP (never from a signal handler). */
#include "config.h"

#include <errno.h>
#include <libconfig.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "job.h"
#include "rconn.h"

enum opt_type { T_STR, T_INT, T_BOOL, T_ENUM, T_LIST, T_DOUBLE };

#define F_LIVE 1u  /* SIGHUP may change it */
#define F_NAMES 2u /* list items / string: [A-Za-z0-9_-], 1-64 chars */
#define F_EMPTY 4u /* T_LIST: may have no items (default "" = none) */
/* T_LIST: as a flag, each occurrence is one whole item (no comma split: a
 * directory may hold one) and the occurrences add up; the first replaces
 * what the file said, as any flag overrides the file */
#define F_REPEAT 8u

struct opt {
    const char *name;
    enum opt_type type;
    size_t off;
    const char *dflt;    /* as a flag value would spell it */
    long long lo, hi;    /* T_INT bounds; T_DOUBLE bounds too (whole numbers suffice) */
    const char *choices; /* T_ENUM: "a|b|c" */
    unsigned who;        /* enum cfg_who */
    unsigned flags;
    const char *help;
};

#define O(f) offsetof(struct cfg, f)
static const struct opt options[] = {
    /* Redis */
    {"redis", T_STR, O(redis), "127.0.0.1:6379", 0, 0, NULL, CFG_BOTH, 0,
     "Redis address: host:port, [v6addr]:port, unix:/path or /path (a unix socket)."},
    {"redis_user", T_STR, O(redis_user), "", 0, 0, NULL, CFG_BOTH, 0,
     "ACL user to AUTH as; empty for the default user (needs redis_password_file)."},
    {"redis_password_file", T_STR, O(redis_password_file), "", 0, 0, NULL, CFG_BOTH, 0,
     "File holding the Redis password (trailing newline ignored), re-read on every reconnect; empty: no AUTH."},
    {"redis_connect_timeout_ms", T_INT, O(redis_connect_timeout_ms), "1000", 1, 60000, NULL, CFG_BOTH, 0,
     "Timeout of one connection attempt."},
    {"redis_io_timeout_ms", T_INT, O(redis_io_timeout_ms), "5000", 0, 600000, NULL, CFG_BOTH, 0,
     "Timeout of one command's round trip (a blocking read adds its block_ms); 0 = none."},
    {"redis_backoff_max_ms", T_INT, O(redis_backoff_max_ms), "5000", 10, 600000, NULL, CFG_BOTH, 0,
     "Longest wait between reconnect attempts (the wait doubles from 50 ms, with jitter)."},
    {"prefix", T_STR, O(prefix), "redlm:", 0, 0, NULL, CFG_BOTH, 0,
     "Prefix of every Redis key (jobs:<pool>, out:<id>, cancel:<id>, dead, cache:<key>)."},
    /* what is served */
    {"pools", T_LIST, O(pools), "fast,think", 0, 0, NULL, CFG_BOTH, F_NAMES,
     "Pools served, in the order they are read (worker); pools that exist (dispatcher)."},
    {"name", T_STR, O(name), "", 0, 0, NULL, CFG_BOTH, 0,
     "Consumer name in the workers group (a worker; must be unique and stable across restarts; empty = the host name) or the dispatchers group (a dispatcher; empty = host-pid)."},
    {"default_pool", T_STR, O(default_pool), "fast", 0, 0, NULL, CFG_DISPATCHER, F_NAMES | F_LIVE,
     "Pool for requests that name none; must be one of pools."},
    /* engine */
    {"model", T_STR, O(model), "", 0, 0, NULL, CFG_BOTH, 0,
     "Model directory (config.json, tokenizer.json, *.safetensors), or a Hugging Face repo id ORG/NAME[@REVISION] found offline in the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub); the dispatcher loads only its tokenizer, for the result-cache fast path of that model (off when empty)."},
    {"lora_modules", T_LIST, O(lora_modules), "", 0, 0, NULL, CFG_WORKER, F_EMPTY | F_REPEAT | F_LIVE,
     "LoRA adapters served beside the model (vLLM's --lora-modules), each \"NAME=DIR\": the PEFT adapter in DIR (adapter_config.json, adapter_model.safetensors) answers jobs and HTTP requests whose model is NAME (1-128 of [A-Za-z0-9._:/-], not the served name); the worker announces them in its heartbeat and the dispatcher lists and routes them as models whose parent is this one. A bad adapter stops the worker at start; SIGHUP loads the ones added to the list (one that changed or left it stays served until a restart, since jobs may be running with it). Workers of a model may load different adapters: an adapter's jobs then go to a stream of its own (jobs:lora@NAME) that only the workers holding it read. As a flag: --lora NAME=DIR, once per adapter."},
    {"lora_dirs", T_LIST, O(lora_dirs), "", 0, 0, NULL, CFG_WORKER, F_EMPTY | F_LIVE,
     "Directories this worker may load LoRA adapters from at runtime, when the fleet is asked to (the front door's POST /v1/load_lora_adapter, with runtime_lora on): a relative lora_path is looked up in each in turn, an absolute one must lie inside one once symlinks are resolved. Empty = this worker loads no adapter at runtime and says so to the caller. Paths are this machine's: give each machine the same tree."},
    {"served_model_name", T_STR, O(served_model_name), "", 0, 0, NULL, CFG_BOTH, 0,
     "Worker: the name it serves its model under (in its heartbeat; jobs and HTTP requests select it with `model`); empty = the repo id given as model, else the model directory's name. Dispatcher: empty = the HTTP API serves the models live workers announce; a name = it serves that one name only and forwards to the shared pools (the single-model behaviour)."},
    {"pool_scope", T_ENUM, O(pool_scope), "shared", 0, 0, "shared|model", CFG_WORKER, 0,
     "shared: pool P is the stream <prefix>jobs:P (one model per Redis and prefix); model: <prefix>jobs:<served name>:P, so workers of several models share one Redis without taking each other's jobs (the dispatcher learns the layout from the heartbeats)."},
    {"backend", T_ENUM, O(backend), "cpu", 0, 0, "cpu|cuda|sim", CFG_WORKER, 0,
     "Compute backend. sim: a modelled GPU without weights (engine/sim/README.md): the model directory then needs only a tokenizer, the shape comes from sim_model."},
    {"device", T_INT, O(device), "0", 0, 1023, NULL, CFG_WORKER, 0,
     "CUDA device ordinal among the devices the worker sees (CUDA_VISIBLE_DEVICES narrows those)."},
    {"sim_profile", T_ENUM, O(sim_profile), "h200", 0, 0, "h200|h100|a100|l40s", CFG_WORKER, 0,
     "Device the sim backend models (published bandwidth, BF16/FP8 peaks, memory)."},
    {"sim_model", T_STR, O(sim_model), "", 0, 0, NULL, CFG_WORKER, 0,
     "Model shape the sim backend models: a built-in (qwen3-0.6b, -1.7b, -4b, -8b, -14b, -32b, -8b-fp8, -14b-fp8, -32b-fp8) or a config.json path; empty = the model directory's config.json."},
    {"threads", T_INT, O(threads), "0", 0, 1024, NULL, CFG_WORKER, 0,
     "CPU threads; 0 = one per core."},
    {"mmap_weights", T_BOOL, O(mmap_weights), "false", 0, 0, NULL, CFG_WORKER, 0,
     "CPU: run on the checkpoint's file mapping instead of copying the matrices into 2 MiB pages "
     "at load (less memory and a faster start; slower decode, and no packed decode tiles)."},
    {"quantize", T_ENUM, O(quantize), "none", 0, 0, "none|q8_0", CFG_WORKER, 0,
     "CPU: quantize a BF16/F16/F32 checkpoint's matrices to Q8_0 at load, as llama.cpp's Q8_0 files "
     "hold them (integer kernels; about half the bytes of BF16 per decode step, logits within the "
     "noise of int8 activations). GGUF and AWQ checkpoints run in their own formats."},
    {"kv_budget_mb", T_INT, O(kv_budget_mb), "0", 0, 16777216, NULL, CFG_WORKER, 0,
     "Memory for the KV cache in MiB; 0 = 1024 (the engine's default; sim: the modelled device's memory left after the weights; cuda: the device's free memory after the weights, less kv_reserve_mb)."},
    /* issue 25: the CUDA backend's KV pool from the device's free memory */
    {"kv_reserve_mb", T_INT, O(kv_reserve_mb), "1024", 0, 1048576, NULL, CFG_WORKER, 0,
     "CUDA: device memory in MiB left free when kv_budget_mb is 0 and the KV cache is sized from "
     "the device (free memory after the weights, activations, workspace and graphs, less this)."},
    {"kv_prefault", T_BOOL, O(kv_prefault), "true", 0, 0, NULL, CFG_WORKER, 0,
     "Commit the KV cache's memory at start: no page fault in the middle of a step, and a budget "
     "the machine cannot give fails at start, not mid-request. false: pages come in as blocks are "
     "first used (CPU backend)."},
    {"max_batch", T_INT, O(max_batch), "64", 1, 4096, NULL, CFG_WORKER, 0,
     "Most requests running at once."},
    {"max_batch_tokens", T_INT, O(max_batch_tokens), "8192", 16, 1048576, NULL, CFG_WORKER, 0,
     "Most tokens computed in one step, prefill and decode together."},
    {"prefill_chunk", T_INT, O(prefill_chunk), "512", 16, 1048576, NULL, CFG_WORKER, 0,
     "Most prompt tokens of one request per step (chunked prefill)."},
    {"speculative", T_ENUM, O(speculative), "off", 0, 0, "off|ngram", CFG_WORKER, 0,
     "Speculative decoding: ngram drafts tokens by prompt lookup (the last 1-4 tokens matched in the "
     "prompt and output) and verifies them in the decode step; outputs are bit-identical to off. "
     "A job may turn it off (\"speculative\": false)."},
    {"spec_tokens", T_INT, O(spec_tokens), "4", 1, 16, NULL, CFG_WORKER, 0,
     "Most draft tokens per request per step (speculative = ngram); fewer while acceptance is low."},
    {"spec_max_rows", T_INT, O(spec_max_rows), "0", 0, 1048576, NULL, CFG_WORKER, 0,
     "Drafts go into a step only while it computes fewer tokens than this: past it a step is "
     "compute-bound and a draft row costs more than it can win; 0 = the backend's (cpu 8, cuda 64)."},
    /* structured output: new constraints compile off the stepping thread */
    {"grammar_compile_threads", T_INT, O(grammar_compile_threads), "0", 0, 16, NULL, CFG_WORKER, 0,
     "Threads compiling the JSON Schemas, tool sets and grammars the worker has not compiled "
     "before (a schema near the compiler's limit takes a few hundred milliseconds), while the "
     "running requests go on; 0 = a quarter of the cores, 1 to 4."},
    {"grammar_cache_mb", T_INT, O(grammar_cache_mb), "512", 1, 1048576, NULL, CFG_WORKER, 0,
     "Memory the worker's cache of compiled constraints may hold, in MiB (it keeps the last 64, "
     "least recently used first out): a schema near the compiler's state limit compiles to tens "
     "of MB, so a client sending many distinct ones is bounded by this, not by the count."},
    {"max_compiling", T_INT, O(max_compiling), "0", 0, 4096, NULL, CFG_WORKER, 0,
     "Most jobs the worker holds while their constraint compiles; they hold no batch slot, so "
     "plain jobs keep running beside a burst of new schemas. At this many the worker reads no "
     "more jobs until a compile ends (the rest stay in the pool for other workers); 0 = "
     "twice max_batch (a whole batch of new schemas compiles while plain jobs still start)."},
    /* jobs */
    {"runtime_lora", T_BOOL, O(runtime_lora), "false", 0, 0, NULL, CFG_DISPATCHER, 0,
     "Whether the front door takes vLLM's POST /v1/load_lora_adapter {lora_name, lora_path} and /v1/unload_lora_adapter {lora_name} (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING), for every live and future worker of the model at once; off = 404. Workers load only from their lora_dirs."},
    {"runtime_lora_tenants", T_LIST, O(runtime_lora_tenants), "", 0, 0, NULL, CFG_DISPATCHER, F_EMPTY,
     "With API keys on (api_keys_file), the tenants (the keys file's second column) whose keys may call the runtime LoRA routes; another key gets 403. Empty = every key: keep runtime_lora off, or name the operators here, where the keys go to clients."},
    {"runtime_lora_timeout_s", T_INT, O(runtime_lora_timeout_s), "60", 1, 3600, NULL, CFG_DISPATCHER, 0,
     "How long a load or unload waits for every live worker of the model to say it is done."},
    {"default_max_tokens", T_INT, O(default_max_tokens), "1024", 1, 1048576, NULL, CFG_BOTH, F_LIVE,
     "max_tokens of a job that gives none."},
    {"max_job_kb", T_INT, O(max_job_kb), "4096", 1, 1048576, NULL, CFG_BOTH, F_LIVE,
     "Largest job text accepted, in KiB (JOB_TOO_LARGE above)."},
    {"stream_ttl_s", T_INT, O(stream_ttl_s), "3600", 1, 604800, NULL, CFG_BOTH, F_LIVE,
     "How long redlm:out:<id> lives after done, for jobs that give no stream_ttl_s."},
    {"max_stream_ttl_s", T_INT, O(max_stream_ttl_s), "604800", 1, 604800, NULL, CFG_BOTH, F_LIVE,
     "Largest stream_ttl_s a job may ask for."},
    {"result_cache", T_BOOL, O(result_cache), "true", 0, 0, NULL, CFG_WORKER, F_LIVE,
     "Answer repeated deterministic jobs (greedy or seeded) from redlm:cache:<sha256>."},
    {"cache_ttl_s", T_INT, O(cache_ttl_s), "86400", 1, 2592000, NULL, CFG_WORKER, F_LIVE,
     "Lifetime of a result-cache entry."},
    {"coalesce_ms", T_INT, O(coalesce_ms), "0", 0, 1000, NULL, CFG_WORKER, F_LIVE,
     "Coalescing: running jobs' token deltas are held back and sent, one delta event per job, all together once this long has passed since the last time (a job that ends meanwhile sends its done then too), so Redis takes one XADD for several tokens and one emit call for the whole batch; the bound on the latency it adds. A job's first delta goes at once. 0 = every step's deltas go out at once. Jobs asking for logprobs are never coalesced."},
    {"publish_overlap", T_BOOL, O(publish_overlap), "true", 0, 0, NULL, CFG_WORKER, F_LIVE,
     "Write each step's events to Redis while the engine computes the next step, and read the replies after it (one round trip off the critical path); false = the serial loop: step, then wait for the round trip."},
    {"publish_buffer_kb", T_INT, O(publish_buffer_kb), "256", 1, 1048576, NULL, CFG_WORKER, F_LIVE,
     "Most KiB of one running job's events a worker keeps while Redis refuses to store them (maxmemory with noeviction, or another refusal); past it the job is given up: left pending, unacknowledged, for a worker to resume from its last stored event, never a gap (schemas/README.md, \"Memory pressure\")."},
    {"publish_channel", T_BOOL, O(publish_channel), "false", 0, 0, NULL, CFG_WORKER, F_LIVE,
     "Also PUBLISH every event on redlm:tok:<id>."},
    {"dead_maxlen", T_INT, O(dead_maxlen), "100000", 0, 1000000000, NULL, CFG_BOTH, F_LIVE,
     "Approximate cap of the dead-letter stream in letters (XADD MAXLEN ~); 0 = no cap but dead_max_mb's."},
    /* queue */
    {"block_ms", T_INT, O(block_ms), "1000", 1, 60000, NULL, CFG_BOTH, F_LIVE,
     "XREADGROUP BLOCK time when idle."},
    {"pool_shards", T_INT, O(pool_shards), "3", 1, 16, NULL, CFG_BOTH, 0,
     "Redis Cluster only (issue 27): each pool stream is split over this many hash tags (the number of masters, or a multiple of it: every shard costs each worker calls of its own), {<prefix>}jobs:<pool> (shard 0, also where jobs XADDed directly land) and {<prefix><s>.<n>}jobs:<pool>, so that the queue work spreads over the masters; workers read every shard, the dispatcher forwards each request into one (schemas/README.md, \"Key layout on a Redis Cluster\"). Workers and dispatchers of one prefix must use the same value. A single instance always has one pool stream; 1 = the cluster layout before issue 27 (one queue slot)."},
    {"home_shard", T_INT, O(home_shard), "-1", -1, 15, NULL, CFG_WORKER, 0,
     "Redis Cluster with pool_shards > 1 (issue 27): the pool shard this worker prefers, whose jobs' streams live on that shard's master, so that a busy worker's step writes one master (schemas/README.md, \"Home shards\"); -1 = a shard that the fewest live workers (their heartbeats) have as home, the next of a fleet-wide count ({<prefix>}homes) choosing among those: workers started together take the shards in turn, and one restarted fills the shard it left."},
    {"foreign_room_pct", T_INT, O(foreign_room_pct), "100", 0, 100, NULL, CFG_WORKER, 0,
     "Redis Cluster with pool_shards > 1: while at least this share of its batch is free a worker takes jobs from every shard as they come; below it only from its home shard as they come, and from the others only what waits there, looked for every steal_ms. 100 (the default) = every shard only while it runs nothing; 0 = every shard always (no home)."},
    {"steal_ms", T_INT, O(steal_ms), "50", 1, 60000, NULL, CFG_WORKER, 0,
     "How often a worker with some room but less than foreign_room_pct looks for jobs waiting in the shards other than its home, and how long such a job must have waited to be taken there (so a look takes what that shard's own workers did not, not one they are about to). A shard a look finds with nothing waiting is looked at half as often each time, down to every 4 x steal_ms (looks cost its master a read event each, per worker): such a job waits at most 4 x this while a worker has room. A worker whose busy loop takes longer than half of this uses two loop periods instead (up to 4 x this): the shard's own workers read again once a loop. While its home shard still has jobs for it, a worker takes from the others only jobs queued 20 x this before its home's next one (home first)."},
    {"claim_idle_ms", T_INT, O(claim_idle_ms), "30000", 1000, 3600000, NULL, CFG_BOTH, F_LIVE,
     "A job pending this long without a lease renewal is taken over (XAUTOCLAIM) from its dead worker."},
    {"claim_interval_ms", T_INT, O(claim_interval_ms), "5000", 100, 600000, NULL, CFG_BOTH, F_LIVE,
     "How often to look for such jobs (and once at start). A worker with room first takes its pool's claimer lease (<prefix>claimer:<pool key>, SET NX for this long) and only the holder runs XAUTOCLAIM: about one worker per pool per interval, fleet-wide."},
    {"lease_renew_ms", T_INT, O(lease_renew_ms), "5000", 100, 600000, NULL, CFG_WORKER, F_LIVE,
     "How often a worker renews its claim on its running jobs (XCLAIM JUSTID, only for the ones it still owns); must be below claim_idle_ms."},
    {"max_deliveries", T_INT, O(max_deliveries), "3", 1, 100, NULL, CFG_WORKER, F_LIVE,
     "A job delivered this many times in a row to workers that died before publishing anything goes to the dead letters (TOO_MANY_DELIVERIES) on its next delivery; deliveries that moved the job on do not count (schemas/README.md, \"One writer per job\")."},
    /* process */
    {"drain_timeout_s", T_INT, O(drain_timeout_s), "60", 0, 3600, NULL, CFG_BOTH, F_LIVE,
     "On SIGTERM, how long running jobs may take to finish before exit."},
    {"heartbeat_interval_ms", T_INT, O(heartbeat_interval_ms), "2000", 100, 60000, NULL, CFG_BOTH, F_LIVE,
     "How often the heartbeat key is written."},
    {"heartbeat_ttl_s", T_INT, O(heartbeat_ttl_s), "10", 1, 3600, NULL, CFG_BOTH, F_LIVE,
     "TTL of the heartbeat key."},
    {"http_port", T_INT, O(http_port), "9464", 0, 65535, NULL, CFG_BOTH, 0,
     "Loopback port of /healthz, /health and /metrics (the dispatcher serves it with or without the HTTP API; no API key asked); 0 = off."},
    {"metrics_bind", T_STR, O(metrics_bind), "127.0.0.1", 0, 0, NULL, CFG_WORKER, 0,
     "Address the worker's http_port listens on (IPv4 or IPv6, e.g. 0.0.0.0 or :: so that a Prometheus on another host scrapes /metrics); no key is asked there, so open it to a trusted network only."},
    {"log_level", T_ENUM, O(log_level), "info", 0, 0, "error|warn|info|debug", CFG_BOTH, F_LIVE,
     "Log lines above this level are dropped."},
    /* dispatcher routing (dispatcher/route.c) */
    {"think_ratio", T_DOUBLE, O(think_ratio), "0.3", 0, 1, NULL, CFG_DISPATCHER, F_LIVE,
     "Share of auto requests sent to the think pool (the rest go to default_pool), split smoothly: over any run of n auto requests the think count is within one of n * think_ratio."},
    {"adaptive", T_BOOL, O(adaptive), "false", 0, 0, NULL, CFG_DISPATCHER, F_LIVE,
     "Shift auto requests away from a pool whose queue wait passes adaptive_wait_ms, within [adaptive_min_ratio, adaptive_max_ratio]; back to think_ratio when it clears."},
    {"adaptive_wait_ms", T_INT, O(adaptive_wait_ms), "2000", 1, 3600000, NULL, CFG_DISPATCHER, F_LIVE,
     "Queue wait (age of the oldest job no worker has taken yet) above which a pool counts as backed up."},
    {"adaptive_min_ratio", T_DOUBLE, O(adaptive_min_ratio), "0.1", 0, 1, NULL, CFG_DISPATCHER, F_LIVE,
     "Lowest effective think ratio adaptive routing may use (when the think pool is backed up)."},
    {"adaptive_max_ratio", T_DOUBLE, O(adaptive_max_ratio), "0.6", 0, 1, NULL, CFG_DISPATCHER, F_LIVE,
     "Highest effective think ratio adaptive routing may use (when the fast pool is backed up)."},
    {"think_rules", T_LIST, O(think_rules), "", 0, 0, NULL, CFG_DISPATCHER, F_LIVE | F_EMPTY,
     "PCRE2 patterns matched against the last user message (or the prompt) of auto requests; a match sends the request to think before the ratio applies. As a flag, comma-separated."},
    {"max_waiting", T_INT, O(max_waiting), "10000", 0, 100000000, NULL, CFG_DISPATCHER, F_LIVE,
     "When a pool's stream already holds this many jobs no worker has taken, new requests for it get an OVERLOADED error at once instead of being forwarded; 0 = no limit."},
    {"retry_after_ms", T_INT, O(retry_after_ms), "1000", 0, 3600000, NULL, CFG_DISPATCHER, F_LIVE,
     "The retry_after_ms an OVERLOADED error tells the client."},
    /* dispatcher: the OpenAI-compatible HTTP front door (dispatcher/http.c) */
    {"http", T_INT, O(http), "0", 0, 65535, NULL, CFG_DISPATCHER, 0,
     "Port of the OpenAI-compatible HTTP API (POST /v1/chat/completions, GET /v1/models, /healthz, /metrics); 0 = off."},
    {"http_bind", T_STR, O(http_bind), "127.0.0.1", 0, 0, NULL, CFG_DISPATCHER, 0,
     "Address the HTTP API listens on (IPv4 or IPv6); put a TLS proxy in front before opening it beyond loopback."},
    {"api_keys_file", T_STR, O(api_keys_file), "", 0, 0, NULL, CFG_DISPATCHER, 0,
     "API keys, one per line: KEY TENANT [RPM [TPM]] (requests and tokens per minute per tenant, 0 = no limit); re-read when it changes; empty = no authentication."},
    {"max_body_kb", T_INT, O(max_body_kb), "4096", 1, 1048576, NULL, CFG_DISPATCHER, 0,
     "Largest HTTP request body, in KiB (413 above)."},
    {"max_messages", T_INT, O(max_messages), "1024", 1, 4096, NULL, CFG_DISPATCHER, 0,
     "Most messages in one chat request (400 above)."},
    {"http_max_tokens", T_INT, O(http_max_tokens), "32768", 1, 1048576, NULL, CFG_DISPATCHER, 0,
     "Largest max_tokens / max_completion_tokens an HTTP request may ask for (400 above)."},
    {"http_max_connections", T_INT, O(http_max_connections), "1024", 1, 65536, NULL, CFG_DISPATCHER, 0,
     "Most HTTP connections at once (one thread and one Redis connection each); a new one past it closes the connection that has waited longest for its request, or is refused when every one is being answered."},
    {"http_timeout_s", T_INT, O(http_timeout_s), "600", 0, 86400, NULL, CFG_DISPATCHER, 0,
     "An HTTP request's deadline (sent as the job's deadline_ms; 504 if nothing came by then); 0 = none."},
    {"http_idle_timeout_s", T_INT, O(http_idle_timeout_s), "60", 1, 3600, NULL, CFG_DISPATCHER, 0,
     "An idle keep-alive HTTP connection is closed after this long."},
    {"http_shared_reader", T_BOOL, O(http_shared_reader), "true", 0, 0, NULL, CFG_DISPATCHER, 0,
     "Read every HTTP request's events with one shared reader (common/xmux.h) instead of an XREAD per request: it blocks on <prefix>bell, which the workers ring with every write, and reads only the streams it names, so Redis pays a read per worker step instead of one per token and stream. Off by itself on a Redis Cluster (a stream per slot) or an ACL without client|id and client|unblock; an ACL without the bell makes it block on every stream instead."},
    {"http_default_mode", T_ENUM, O(http_default_mode), "think", 0, 0, "think|no_think|auto", CFG_DISPATCHER, 0,
     "Mode of an HTTP chat request that chooses none (no mode, chat_template_kwargs.enable_thinking or reasoning_effort, no /think or /no_think in its last user message): think is Qwen3's own default; auto leaves it to think_rules and think_ratio."},
    {"http_cors_origins", T_LIST, O(http_cors_origins), "", 0, 0, NULL, CFG_DISPATCHER, F_EMPTY,
     "Browser origins (scheme://host[:port]) allowed to call the HTTP API directly (CORS, with OPTIONS preflight answered); * = any; empty = CORS off. As a flag, comma-separated."},
    {"http_header_timeout_s", T_INT, O(http_header_timeout_s), "10", 1, 3600, NULL, CFG_DISPATCHER, 0,
     "An HTTP connection whose request line and headers have not all arrived this long after it opened (after the previous response plus http_idle_timeout_s on keep-alive) is closed: slow clients cannot hold threads."},
    {"http_min_body_rate", T_INT, O(http_min_body_rate), "1024", 0, 1073741824, NULL, CFG_DISPATCHER, 0,
     "Bytes per second a request body must arrive at, on average, after a grace of http_header_timeout_s; a slower upload is cut off; 0 = no limit."},
    {"http_max_connections_per_ip", T_INT, O(http_max_connections_per_ip), "0", 0, 65536, NULL, CFG_DISPATCHER, 0,
     "Most HTTP connections at once from one client address (more are closed at accept); 0 = no limit, the default, since behind a reverse proxy every client has the proxy's address."},
    {"http_max_pending", T_INT, O(http_max_pending), "128", 0, 65536, NULL, CFG_DISPATCHER, 0,
     "Connections still sending their request (headers or body) that get the full http_header_timeout_s; one past it must send its whole request within 1 s, so slow clients cannot hold the server (connections kept alive between requests are not counted); 0 = no cap."},
    {"http_max_pending_per_ip", T_INT, O(http_max_pending_per_ip), "16", 0, 65536, NULL, CFG_DISPATCHER, 0,
     "The same for one client address (IPv6: one /64): its connections past this many waiting for their request must send it within 1 s; 0 = no cap."},
    {"http_auth_failures_per_min", T_INT, O(http_auth_failures_per_min), "60", 0, 1000000, NULL, CFG_DISPATCHER, 0,
     "Requests with a missing or wrong API key one client address may make per minute (in bursts of as many); past it every request from that address is answered 429 without its key being looked at, until the count recovers; 0 = no limit."},
    {"http_client_lease_ms", T_INT, O(http_client_lease_ms), "5000", 0, 3600000, NULL, CFG_DISPATCHER, 0,
     "Each job the HTTP API queues carries a lease (<prefix>lease:<id>) that the front door renews every third of this while its client waits; a worker cancels a job whose lease has been missing this long, so a front door that dies (kill -9, lost host) leaves no job running; 0 = off, else at least 1000."},
    /* issue 29: what clients really send */
    {"http_unknown_fields", T_ENUM, O(http_unknown_fields), "ignore", 0, 0, "ignore|refuse", CFG_DISPATCHER, 0,
     "An HTTP request member the API does not know, or a value it accepts but does not apply (min_tokens > 0, stop_token_ids, logit_bias, chat_template_kwargs other than enable_thinking ...): ignore (vLLM's way) answers it all the same and names such fields in the X-Redlm-Ignored-Fields header and a log line (one per 10 s at most); refuse answers 400 (UNKNOWN_FIELD / BAD_VALUE)."},
    {"responses_store_ttl_s", T_INT, O(responses_store_ttl_s), "3600", 0, 2592000, NULL, CFG_DISPATCHER, 0,
     "How long a response made through POST /v1/responses with store (OpenAI's default) is kept in Redis (<prefix>response:<id>) for previous_response_id, GET and DELETE /v1/responses/<id>; each use starts it again; 0 = keep none (store is false in every response)."},
    {"responses_store_max_kb", T_INT, O(responses_store_max_kb), "1024", 1, 1048576, NULL, CFG_DISPATCHER, 0,
     "The largest input (items, in KiB of JSON) a stored response keeps: what its own request added, the conversation before it being kept by the responses it continues (a conversation's first response, or one past 256 turns, keeps it whole). A larger one is answered with store false (a background one is refused), so that one client cannot put max_body_kb into Redis with every request."},
    {"conversation_ttl_s", T_INT, O(conversation_ttl_s), "2592000", 0, 31536000, NULL, CFG_DISPATCHER, 0,
     "How long a conversation of the Conversations API (POST /v1/conversations, and a Responses request's conversation) is kept in Redis (<prefix>conversation:<id>) after its last use; each use starts it again; 0 = keep none (the Conversations routes answer 404, a conversation in a Responses request 400)."},
    /* issue 26: tenants and bounded dead letters */
    {"tenants", T_LIST, O(tenants), "", 0, 0, NULL, CFG_DISPATCHER, F_NAMES | F_EMPTY,
     "Tenants (1-32 of [A-Za-z0-9_-]): the dispatcher also reads <prefix>requests:<tenant> for each, and a job read there lives in the id namespace \"<tenant>:\" (its id gets that prefix), so that with the shipped ACL one tenant can neither break another's intake nor use, pre-empt or read another's ids (config/README.md). As a flag, comma-separated."},
    {"dead_max_mb", T_INT, O(dead_max_mb), "64", 0, 1048576, NULL, CFG_BOTH, F_LIVE,
     "The dead-letter stream holds at most about this many MiB: each letter is at most 20 KiB (a job's text is cut to fit), so the cap in letters is dead_max_mb MiB / 20 KiB when that is below dead_maxlen; 0 = only dead_maxlen."},
    /* issue 27: prefix-affine pulling (dispatcher/affinity.c, worker/loop.c) */
    {"affinity", T_BOOL, O(affinity), "true", 0, 0, NULL, CFG_BOTH, 0,
     "Prefix-affine pulling: a worker publishes a fixed-size filter of the KV block hashes it holds with its heartbeat and also reads its own offer streams (<prefix>jobs:<pool>:w:<name>); the dispatcher offers a job to the live worker holding the longest run of its prompt's leading blocks (when some other worker holds less; among equals the one with the fewest offers waiting, and only while its offers waiting are no more than the pool's), and moves it to the pool stream if it is not taken within affinity_wait_ms. Off: jobs go to the pool streams only, as before. Needs the dispatcher's model (its tokenizer); off on a Redis Cluster."},
    {"affinity_wait_ms", T_INT, O(affinity_wait_ms), "50", 0, 60000, NULL, CFG_DISPATCHER, F_LIVE,
     "How long an offered job waits for its worker before any worker may take it (it is moved to the pool stream); two of the worker's busy loop periods when that is longer (it reads only between engine steps; a CPU worker's can outlast 50 ms), at most 1 s."},
    {"affinity_filter_bytes", T_INT, O(affinity_filter_bytes), "2048", 64, 65536, NULL, CFG_WORKER, 0,
     "Size of the block-hash filter a worker publishes (a Bloom filter, 3 bits per block; rounded down to a power of two); its heartbeat grows by 4/3 of this (base64)."},
    {"affinity_refresh_ms", T_INT, O(affinity_refresh_ms), "100", 10, 60000, NULL, CFG_BOTH, F_LIVE,
     "Worker: how often the filter is recomputed; when it changed the heartbeat goes out at once. Dispatcher: how often it re-reads the workers' filters while requests come in."},
};
#undef O
#define N_OPTS ((int)(sizeof options / sizeof options[0]))

/* Defaults that differ by program. A worker and a dispatcher often run on
 * one host (the README's "by hand" steps do), so their loopback ops ports
 * must differ or the second to start cannot listen. The sample file leaves
 * such an option unset (commented out), so that one file serves both. */
static const struct {
    const char *name;
    unsigned who; /* the one program (enum cfg_who) that has this default */
    const char *dflt;
} prog_defaults[] = {
    {"http_port", CFG_DISPATCHER, "9465"},
};
#define N_PROG_DEFAULTS ((int)(sizeof prog_defaults / sizeof prog_defaults[0]))

/* o's default for program who. */
static const char *dflt_for(const struct opt *o, unsigned who)
{
    for (int i = 0; i < N_PROG_DEFAULTS; i++)
        if (prog_defaults[i].who == who && !strcmp(prog_defaults[i].name, o->name))
            return prog_defaults[i].dflt;
    return o->dflt;
}

/* Whether o's default depends on the program. */
static bool per_program(const struct opt *o)
{
    for (int i = 0; i < N_PROG_DEFAULTS; i++)
        if (!strcmp(prog_defaults[i].name, o->name))
            return true;
    return false;
}

static void *field(struct cfg *c, const struct opt *o) { return (char *)c + o->off; }
static const void *cfield(const struct cfg *c, const struct opt *o) { return (const char *)c + o->off; }

static void list_free(struct cfg_strlist *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    l->n = 0;
    l->v = NULL;
}

void cfg_free(struct cfg *c)
{
    if (!c)
        return;
    for (int i = 0; i < N_OPTS; i++) {
        const struct opt *o = &options[i];
        if (o->type == T_STR || o->type == T_ENUM) {
            char **s = field(c, o);
            free(*s);
            *s = NULL;
        } else if (o->type == T_LIST) {
            list_free(field(c, o));
        }
    }
}

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 64)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-'))
            return false;
    return true;
}

static bool choice_ok(const char *choices, const char *v)
{
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !strncmp(p, v, n))
            return true;
        if (!bar)
            break;
        p = bar + 1;
    }
    return false;
}

/* Stores a string value; `where` prefixes messages ("FILE:LINE" or
 * "--flag"). */
static int set_str(struct cfg *c, const struct opt *o, const char *v, const char *where,
                   struct rl_err *err)
{
    if (o->type == T_ENUM && !choice_ok(o->choices, v))
        return rl_errf(err, RL_EINVAL, "%s: %s must be one of %s, not \"%.64s\"", where, o->name,
                       o->choices, v);
    if ((o->flags & F_NAMES) && !name_ok(v))
        return rl_errf(err, RL_EINVAL, "%s: %s \"%.64s\" must be 1-64 characters of [A-Za-z0-9_-]",
                       where, o->name, v);
    char *d = strdup(v);
    if (!d)
        return rl_errf(err, RL_ENOMEM, "config: out of memory");
    char **s = field(c, o);
    free(*s);
    *s = d;
    return 0;
}

static int set_int(struct cfg *c, const struct opt *o, long long v, const char *where,
                   struct rl_err *err)
{
    if (v < o->lo || v > o->hi)
        return rl_errf(err, RL_EINVAL, "%s: %s = %lld is out of range [%lld, %lld]", where, o->name,
                       v, o->lo, o->hi);
    *(int *)field(c, o) = (int)v;
    return 0;
}

static int set_double(struct cfg *c, const struct opt *o, double v, const char *where,
                      struct rl_err *err)
{
    if (!(v >= (double)o->lo && v <= (double)o->hi)) /* NaN fails too */
        return rl_errf(err, RL_EINVAL, "%s: %s = %g is out of range [%lld, %lld]", where, o->name,
                       v, o->lo, o->hi);
    *(double *)field(c, o) = v;
    return 0;
}

/* Replaces a list with items[0..n); checks names and duplicates. */
static int set_list(struct cfg *c, const struct opt *o, const char *const *items, int n,
                    const char *where, struct rl_err *err)
{
    if (n < 1 && !(o->flags & F_EMPTY))
        return rl_errf(err, RL_EINVAL, "%s: %s must not be empty", where, o->name);
    for (int i = 0; i < n; i++) {
        if ((o->flags & F_NAMES) && !name_ok(items[i]))
            return rl_errf(err, RL_EINVAL, "%s: %s item \"%.64s\" must be 1-64 characters of [A-Za-z0-9_-]",
                           where, o->name, items[i]);
        for (int k = 0; k < i; k++)
            if (!strcmp(items[i], items[k]))
                return rl_errf(err, RL_EINVAL, "%s: %s lists \"%.64s\" twice", where, o->name, items[i]);
    }
    struct cfg_strlist l = {0, calloc(n > 0 ? (size_t)n : 1, sizeof(char *))};
    if (!l.v)
        return rl_errf(err, RL_ENOMEM, "config: out of memory");
    for (; l.n < n; l.n++)
        if (!(l.v[l.n] = strdup(items[l.n]))) {
            list_free(&l);
            return rl_errf(err, RL_ENOMEM, "config: out of memory");
        }
    list_free(field(c, o));
    *(struct cfg_strlist *)field(c, o) = l;
    return 0;
}

/* A value written as text (a flag, a default). */
static int set_text(struct cfg *c, const struct opt *o, const char *v, const char *where,
                    struct rl_err *err)
{
    switch (o->type) {
    case T_STR:
    case T_ENUM:
        return set_str(c, o, v, where, err);
    case T_INT: {
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end)
            return rl_errf(err, RL_EINVAL, "%s: %s must be an integer, not \"%.64s\"", where, o->name, v);
        return set_int(c, o, x, where, err);
    }
    case T_BOOL:
        if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on") || !strcmp(v, "1"))
            *(bool *)field(c, o) = true;
        else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off") || !strcmp(v, "0"))
            *(bool *)field(c, o) = false;
        else
            return rl_errf(err, RL_EINVAL, "%s: %s must be true or false, not \"%.64s\"", where,
                           o->name, v);
        return 0;
    case T_DOUBLE: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end)
            return rl_errf(err, RL_EINVAL, "%s: %s must be a number, not \"%.64s\"", where, o->name, v);
        return set_double(c, o, x, where, err);
    }
    case T_LIST: {
        if (!v[0] && (o->flags & F_EMPTY))
            return set_list(c, o, NULL, 0, where, err);
        /* comma-separated; blanks around items are dropped */
        char *copy = strdup(v);
        const char *items[64];
        int n = 0, rc = 0;
        if (!copy)
            return rl_errf(err, RL_ENOMEM, "config: out of memory");
        /* strsep, not strtok: "a,,b" must fail on its empty item, not
         * quietly become "a,b" */
        for (char *rest = copy, *t; (t = strsep(&rest, ",")) != NULL;) {
            while (*t == ' ')
                t++;
            char *e = t + strlen(t);
            while (e > t && e[-1] == ' ')
                *--e = 0;
            if (n == 64) {
                rc = rl_errf(err, RL_EINVAL, "%s: %s has more than 64 items", where, o->name);
                break;
            }
            items[n++] = t;
        }
        if (!rc)
            rc = set_list(c, o, items, n, where, err);
        free(copy);
        return rc;
    }
    }
    return rl_errf(err, RL_EINTERNAL, "config: option %s has no type", o->name);
}

int cfg_defaults(struct cfg *c, struct rl_err *err)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < N_OPTS; i++) {
        int rc = set_text(c, &options[i], options[i].dflt, "default", err);
        if (rc) {
            cfg_free(c);
            return rc;
        }
    }
    return 0;
}

/* Deep copy, for the apply-to-a-copy-then-swap pattern. */
static int cfg_copy(struct cfg *dst, const struct cfg *src, struct rl_err *err)
{
    memcpy(dst, src, sizeof *dst);
    for (int i = 0; i < N_OPTS; i++) { /* first forget the borrowed pointers */
        const struct opt *o = &options[i];
        if (o->type == T_STR || o->type == T_ENUM)
            *(char **)field(dst, o) = NULL;
        else if (o->type == T_LIST)
            memset(field(dst, o), 0, sizeof(struct cfg_strlist));
    }
    for (int i = 0; i < N_OPTS; i++) {
        const struct opt *o = &options[i];
        int rc = 0;
        if (o->type == T_STR || o->type == T_ENUM) {
            const char *s = *(char *const *)cfield(src, o);
            if (s && !(*(char **)field(dst, o) = strdup(s)))
                rc = -RL_ENOMEM;
        } else if (o->type == T_LIST) {
            const struct cfg_strlist *l = cfield(src, o);
            if (l->n)
                rc = set_list(dst, o, (const char *const *)l->v, l->n, "copy", err);
        }
        if (rc) {
            cfg_free(dst);
            return rl_errf(err, RL_ENOMEM, "config: out of memory");
        }
    }
    return 0;
}

static const struct opt *find(const char *name, size_t len)
{
    for (int i = 0; i < N_OPTS; i++)
        if (strlen(options[i].name) == len && !strncmp(options[i].name, name, len))
            return &options[i];
    return NULL;
}

/* Flags that are other names of an option (vLLM's spelling is --lora-modules,
 * one adapter a flag reads better as --lora); the file knows only the
 * option's own name. */
static const struct {
    const char *flag, *option;
} flag_aliases[] = {
    {"lora", "lora_modules"},
};

static const struct opt *find_flag(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof flag_aliases / sizeof flag_aliases[0]; i++)
        if (strlen(flag_aliases[i].flag) == len && !strncmp(flag_aliases[i].flag, name, len))
            return find(flag_aliases[i].option, strlen(flag_aliases[i].option));
    return find(name, len);
}

/* One more item of an F_REPEAT list from a flag: the first occurrence
 * replaces the list (the file's), later ones append. */
static int add_item(struct cfg *c, const struct opt *o, const char *v, bool first,
                    const char *where, struct rl_err *err)
{
    const struct cfg_strlist *l = cfield(c, o);
    int n = first ? 0 : l->n;
    if (n == 64)
        return rl_errf(err, RL_EINVAL, "%s: %s has more than 64 items", where, o->name);
    const char *items[64];
    for (int i = 0; i < n; i++)
        items[i] = l->v[i];
    items[n] = v;
    /* set_list copies before it frees the old list, so items may point into it */
    return set_list(c, o, items, n + 1, where, err);
}

static int apply_setting(struct cfg *c, const config_setting_t *s, const char *path,
                         struct rl_err *err)
{
    char where[600];
    const char *file = config_setting_source_file(s);
    snprintf(where, sizeof where, "%.500s:%u", file ? file : path, config_setting_source_line(s));
    const char *name = config_setting_name(s);
    const struct opt *o = name ? find(name, strlen(name)) : NULL;
    if (!o)
        return rl_errf(err, RL_EINVAL, "%s: unknown option \"%.64s\"", where, name ? name : "");
    int t = config_setting_type(s);
    switch (o->type) {
    case T_STR:
    case T_ENUM:
        if (t != CONFIG_TYPE_STRING)
            return rl_errf(err, RL_EINVAL, "%s: %s must be a string (in double quotes)", where, o->name);
        return set_str(c, o, config_setting_get_string(s), where, err);
    case T_INT:
        if (t == CONFIG_TYPE_INT)
            return set_int(c, o, config_setting_get_int(s), where, err);
        if (t == CONFIG_TYPE_INT64)
            return set_int(c, o, config_setting_get_int64(s), where, err);
        return rl_errf(err, RL_EINVAL, "%s: %s must be an integer", where, o->name);
    case T_DOUBLE:
        if (t == CONFIG_TYPE_FLOAT)
            return set_double(c, o, config_setting_get_float(s), where, err);
        if (t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64)
            return set_double(c, o, (double)config_setting_get_int64(s), where, err);
        return rl_errf(err, RL_EINVAL, "%s: %s must be a number", where, o->name);
    case T_BOOL:
        if (t != CONFIG_TYPE_BOOL)
            return rl_errf(err, RL_EINVAL, "%s: %s must be true or false", where, o->name);
        *(bool *)field(c, o) = config_setting_get_bool(s);
        return 0;
    case T_LIST: {
        if (t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_LIST)
            return rl_errf(err, RL_EINVAL, "%s: %s must be a list of strings, like [\"a\", \"b\"]",
                           where, o->name);
        int n = config_setting_length(s);
        if (n > 64)
            return rl_errf(err, RL_EINVAL, "%s: %s has more than 64 items", where, o->name);
        const char *items[64] = {NULL};
        for (int i = 0; i < n; i++) {
            const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
            if (config_setting_type(e) != CONFIG_TYPE_STRING)
                return rl_errf(err, RL_EINVAL, "%s: %s item %d must be a string", where, o->name, i);
            items[i] = config_setting_get_string(e);
        }
        return set_list(c, o, items, n, where, err);
    }
    }
    return rl_errf(err, RL_EINTERNAL, "config: option %s has no type", o->name);
}

int cfg_load_file(struct cfg *c, const char *path, struct rl_err *err)
{
    config_t lc;
    struct cfg tmp;
    int rc = cfg_copy(&tmp, c, err);
    if (rc)
        return rc;
    config_init(&lc);
    /* fopen first only for a clear errno message: libconfig reports a
     * missing file as a parse error on line 0 */
    FILE *f = fopen(path, "r");
    if (!f) {
        rc = rl_errf(err, RL_EIO, "%s: %s", path, strerror(errno));
        goto done;
    }
    fclose(f);
    if (config_read_file(&lc, path) != CONFIG_TRUE) {
        const char *ef = config_error_file(&lc);
        rc = rl_errf(err, RL_EINVAL, "%s:%d: %s", ef ? ef : path, config_error_line(&lc),
                     config_error_text(&lc) ? config_error_text(&lc) : "syntax error");
        goto done;
    }
    const config_setting_t *root = config_root_setting(&lc);
    for (int i = 0; i < config_setting_length(root) && !rc; i++) {
        const config_setting_t *s = config_setting_get_elem(root, (unsigned)i);
        if (config_setting_is_group(s)) {
            char where[600];
            snprintf(where, sizeof where, "%.500s:%u", path, config_setting_source_line(s));
            rc = rl_errf(err, RL_EINVAL, "%s: unknown option \"%.64s\" (options are not grouped)",
                         where, config_setting_name(s) ? config_setting_name(s) : "");
            break;
        }
        rc = apply_setting(&tmp, s, path, err);
    }
done:
    config_destroy(&lc);
    if (rc) {
        cfg_free(&tmp);
        return rc;
    }
    cfg_free(c);
    *c = tmp;
    return 0;
}

static bool bool_word(const char *v)
{
    static const char *const w[] = {"true", "false", "yes", "no", "on", "off", "1", "0"};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        if (!strcmp(v, w[i]))
            return true;
    return false;
}

static bool is_meta(const char *a)
{
    return !strcmp(a, "-h") || !strcmp(a, "--help") || !strcmp(a, "--print-config");
}

int cfg_apply_args(struct cfg *c, int argc, char **argv, unsigned who, struct rl_err *err)
{
    struct cfg tmp;
    int rc = cfg_copy(&tmp, c, err);
    if (rc)
        return rc;
    bool repeated[N_OPTS] = {false}; /* F_REPEAT lists given a flag already */
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i];
        if (is_meta(a))
            continue;
        if (!strcmp(a, "-c") || !strcmp(a, "--config")) {
            i++; /* cfg_load reads the file */
            continue;
        }
        if (!strncmp(a, "--config=", 9))
            continue;
        if (strncmp(a, "--", 2) || !a[2]) {
            rc = rl_errf(err, RL_EINVAL, "unexpected argument \"%.64s\" (see --help)", a);
            break;
        }
        /* --name[=value], dashes standing for underscores */
        char name[80];
        const char *eq = strchr(a + 2, '=');
        size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (len >= sizeof name) {
            rc = rl_errf(err, RL_EINVAL, "unknown flag %.64s", a);
            break;
        }
        memcpy(name, a + 2, len);
        name[len] = 0;
        for (char *p = name; *p; p++)
            if (*p == '-')
                *p = '_';
        const struct opt *o = find_flag(name, len);
        bool negated = false;
        if (!o && !strncmp(name, "no_", 3) && !eq) {
            o = find(name + 3, len - 3);
            negated = o && o->type == T_BOOL;
            if (!negated)
                o = NULL;
        }
        if (!o) {
            rc = rl_errf(err, RL_EINVAL, "unknown flag %.64s (see --help)", a);
            break;
        }
        if (!(o->who & who)) {
            rc = rl_errf(err, RL_EINVAL, "--%s is not an option of this program (see --help)",
                         o->name);
            break;
        }
        char where[100];
        snprintf(where, sizeof where, "--%.80s", o->name);
        const char *v;
        if (eq) {
            v = eq + 1;
        } else if (o->type == T_BOOL) {
            /* --name, --no-name, or --name true|false as --help's
             * "--name VALUE" suggests (the word is taken only when it is a
             * boolean's, so a bare flag before another flag stays bare) */
            v = negated ? "false" : "true";
            if (!negated && i + 1 < argc && bool_word(argv[i + 1]))
                v = argv[++i];
        } else if (i + 1 < argc) {
            v = argv[++i];
        } else {
            rc = rl_errf(err, RL_EINVAL, "%s needs a value", where);
            break;
        }
        if (o->type == T_LIST && (o->flags & F_REPEAT)) {
            rc = add_item(&tmp, o, v, !repeated[o - options], where, err);
            repeated[o - options] = true;
        } else {
            rc = set_text(&tmp, o, v, where, err);
        }
    }
    if (rc) {
        cfg_free(&tmp);
        return rc;
    }
    cfg_free(c);
    *c = tmp;
    return 0;
}

int cfg_check(const struct cfg *c, unsigned who, struct rl_err *err)
{
    if ((who & CFG_WORKER) && c->lease_renew_ms >= c->claim_idle_ms) /* the dispatcher holds no leases */
        return rl_errf(err, RL_EINVAL,
                       "lease_renew_ms (%d) must be below claim_idle_ms (%d), or running jobs "
                       "would be taken over from live workers",
                       c->lease_renew_ms, c->claim_idle_ms);
    if (c->stream_ttl_s > c->max_stream_ttl_s)
        return rl_errf(err, RL_EINVAL, "stream_ttl_s (%d) is above max_stream_ttl_s (%d)",
                       c->stream_ttl_s, c->max_stream_ttl_s);
    if (c->heartbeat_interval_ms >= c->heartbeat_ttl_s * 1000)
        return rl_errf(err, RL_EINVAL,
                       "heartbeat_interval_ms (%d) must be below heartbeat_ttl_s (%d s), or the "
                       "heartbeat key lapses between beats",
                       c->heartbeat_interval_ms, c->heartbeat_ttl_s);
    bool found = false;
    for (int i = 0; i < c->pools.n; i++)
        found |= !strcmp(c->pools.v[i], c->default_pool);
    if (!found && (who & CFG_DISPATCHER))
        return rl_errf(err, RL_EINVAL, "default_pool \"%s\" is not one of pools", c->default_pool);
    if (c->redis_user[0] && !c->redis_password_file[0])
        return rl_errf(err, RL_EINVAL, "redis_user \"%s\" needs redis_password_file", c->redis_user);
    if (!c->prefix[0])
        return rl_errf(err, RL_EINVAL, "prefix must not be empty");
    if (c->adaptive_min_ratio > c->adaptive_max_ratio)
        return rl_errf(err, RL_EINVAL, "adaptive_min_ratio (%g) is above adaptive_max_ratio (%g)",
                       c->adaptive_min_ratio, c->adaptive_max_ratio);
    return 0;
}

int cfg_load(struct cfg *c, int argc, char **argv, unsigned who, enum cfg_action *action,
             struct rl_err *err)
{
    *action = CFG_RUN;
    int rc = cfg_defaults(c, err);
    if (rc)
        return rc;
    for (int i = 0; i < N_OPTS; i++)
        if (options[i].dflt != dflt_for(&options[i], who) &&
            (rc = set_text(c, &options[i], dflt_for(&options[i], who), "default", err)))
            goto fail;
    const char *file = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            *action = CFG_HELP;
        else if (!strcmp(argv[i], "--print-config") && *action == CFG_RUN)
            *action = CFG_PRINT_CONFIG;
        else if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) {
                rc = rl_errf(err, RL_EINVAL, "%s needs a file name", argv[i]);
                goto fail;
            }
            file = argv[++i];
        } else if (!strncmp(argv[i], "--config=", 9))
            file = argv[i] + 9;
    }
    if (*action == CFG_HELP)
        return 0;
    if (file && (rc = cfg_load_file(c, file, err)))
        goto fail;
    if ((rc = cfg_apply_args(c, argc, argv, who, err)))
        goto fail;
    if ((rc = cfg_check(c, who, err)))
        goto fail;
    return 0;
fail:
    cfg_free(c);
    return rc;
}

int cfg_apply_live(struct cfg *dst, const struct cfg *src, unsigned who, struct rl_err *err)
{
    struct cfg tmp;
    int rc = cfg_copy(&tmp, dst, err);
    for (int i = 0; i < N_OPTS && !rc; i++) {
        const struct opt *o = &options[i];
        if (!(o->flags & F_LIVE))
            continue;
        switch (o->type) {
        case T_STR:
        case T_ENUM:
            rc = set_str(&tmp, o, *(char *const *)cfield(src, o), "reload", err);
            break;
        case T_INT:
            *(int *)field(&tmp, o) = *(const int *)cfield(src, o);
            break;
        case T_BOOL:
            *(bool *)field(&tmp, o) = *(const bool *)cfield(src, o);
            break;
        case T_DOUBLE:
            *(double *)field(&tmp, o) = *(const double *)cfield(src, o);
            break;
        case T_LIST: {
            const struct cfg_strlist *l = cfield(src, o);
            rc = set_list(&tmp, o, (const char *const *)l->v, l->n, "reload", err);
            break;
        }
        }
    }
    if (!rc)
        rc = cfg_check(&tmp, who, err);
    if (rc) {
        cfg_free(&tmp);
        return rc;
    }
    cfg_free(dst);
    *dst = tmp;
    return 0;
}

/* How a default reads in a libconfig file. */
static void write_value(FILE *f, const struct opt *o)
{
    switch (o->type) {
    case T_STR:
    case T_ENUM:
        fprintf(f, "\"%s\"", o->dflt); /* no default holds a quote or backslash */
        break;
    case T_INT:
    case T_BOOL:
    case T_DOUBLE: /* every double default is written with a decimal point */
        fputs(o->dflt, f);
        break;
    case T_LIST: {
        fputc('[', f);
        const char *p = o->dflt;
        for (int first = 1; *p; first = 0) {
            const char *comma = strchr(p, ',');
            size_t n = comma ? (size_t)(comma - p) : strlen(p);
            fprintf(f, "%s\"%.*s\"", first ? "" : ", ", (int)n, p);
            p += n + (comma ? 1 : 0);
        }
        fputc(']', f);
        break;
    }
    }
}

static const char *type_word(const struct opt *o)
{
    static const char *const w[] = {"string", "integer", "boolean", "one of", "list of strings",
                                    "number"};
    return w[o->type];
}

/* Writes text as "# "-prefixed lines of at most ~76 columns. */
static void write_wrapped(FILE *f, const char *lead, const char *text)
{
    int col = fprintf(f, "%s", lead);
    const char *p = text;
    while (*p) {
        const char *sp = strchr(p, ' ');
        int n = sp ? (int)(sp - p) : (int)strlen(p);
        if (col + 1 + n > 78 && col > (int)strlen(lead)) {
            col = fprintf(f, "\n%s", lead) - 1;
        } else if (col > (int)strlen(lead)) {
            fputc(' ', f);
            col++;
        }
        col += fprintf(f, "%.*s", n, p);
        p += n;
        while (*p == ' ')
            p++;
    }
    fputc('\n', f);
}

static void describe(FILE *f, const struct opt *o, const char *lead)
{
    char line[200];
    const char *who = o->who == CFG_BOTH ? "worker, dispatcher"
                      : o->who == CFG_WORKER ? "worker" : "dispatcher";
    if (o->type == T_INT || o->type == T_DOUBLE)
        snprintf(line, sizeof line, "%s in [%lld, %lld]; %s%s", type_word(o), o->lo, o->hi, who,
                 o->flags & F_LIVE ? "; SIGHUP reloads it" : "");
    else if (o->type == T_ENUM)
        snprintf(line, sizeof line, "%s %s; %s%s", type_word(o), o->choices, who,
                 o->flags & F_LIVE ? "; SIGHUP reloads it" : "");
    else
        snprintf(line, sizeof line, "%s; %s%s", type_word(o), who,
                 o->flags & F_LIVE ? "; SIGHUP reloads it" : "");
    write_wrapped(f, lead, o->help);
    write_wrapped(f, lead, line);
}

void cfg_write_sample(FILE *f)
{
    fputs("# config/redlm.conf - every option of redlm-worker and redlm-dispatcher,\n"
          "# set to its default. Generated from the option table in common/config.c\n"
          "# (cfg_write_sample, `redlm-worker --print-config`); do not edit by hand:\n"
          "# tests/unit/test_config.c fails when this file and the table differ.\n"
          "#\n"
          "# libconfig syntax: name = value; strings in double quotes, lists as\n"
          "# [\"a\", \"b\"]. Flags override the file: --name VALUE (or --name-with-dashes),\n"
          "# and the programs run without any file: redlm-worker --redis HOST:PORT\n"
          "# --model DIR --pools fast,think --name NAME --backend cpu|cuda --threads N\n",
          f);
    for (int i = 0; i < N_OPTS; i++) {
        const struct opt *o = &options[i];
        fputc('\n', f);
        describe(f, o, "# ");
        if (per_program(o)) { /* unset here: each program takes its own */
            fprintf(f, "# Default: %s for redlm-worker", o->dflt);
            for (int k = 0; k < N_PROG_DEFAULTS; k++)
                if (!strcmp(prog_defaults[k].name, o->name))
                    fprintf(f, ", %s for redlm-%s", prog_defaults[k].dflt,
                            prog_defaults[k].who == CFG_DISPATCHER ? "dispatcher" : "worker");
            fputs(" (one file serves both,\n# so it is left unset here).\n# ", f);
        }
        fprintf(f, "%s = ", o->name);
        write_value(f, o);
        fputs(";\n", f);
    }
}

void cfg_print_help(FILE *f, const char *prog, unsigned who)
{
    fprintf(f,
            "usage: %s [-c FILE] [--OPTION VALUE ...]\n"
            "  -c, --config FILE   read options from a libconfig file (flags override it)\n"
            "  -h, --help          this text\n"
            "  --print-config      write the documented config file with every default\n"
            "\noptions (in a file: name = value;  as a flag: --name VALUE; a boolean also as\n"
            "--name or --no-name):\n",
            prog);
    for (int i = 0; i < N_OPTS; i++) {
        const struct opt *o = &options[i];
        if (!(o->who & who))
            continue;
        char flag[100];
        snprintf(flag, sizeof flag, "--%s", o->name);
        for (char *p = flag + 2; *p; p++)
            if (*p == '_')
                *p = '-';
        fprintf(f, "\n  %s (default: %s%s%s)\n", flag, o->type == T_STR ? "\"" : "",
                dflt_for(o, who), o->type == T_STR ? "\"" : "");
        describe(f, o, "      ");
    }
}

void cfg_worker_name(const struct cfg *c, char *buf, size_t size)
{
    if (c->name && c->name[0]) {
        snprintf(buf, size, "%s", c->name);
        return;
    }
    if (gethostname(buf, size) || !buf[0])
        snprintf(buf, size, "worker");
    buf[size - 1] = 0;
}

long cfg_dead_maxlen(const struct cfg *c)
{
    long n = c->dead_maxlen;
    if (c->dead_max_mb > 0) {
        long by_bytes = (long)((int64_t)c->dead_max_mb * 1024 * 1024 / EV_DEAD_LETTER_MAX);
        if (by_bytes < 1)
            by_bytes = 1;
        if (n <= 0 || by_bytes < n)
            n = by_bytes;
    }
    return n;
}

void cfg_job_opts(const struct cfg *c, struct job_opts *o)
{
    job_opts_default(o);
    o->max_job_bytes = (size_t)c->max_job_kb * 1024;
    o->default_max_tokens = c->default_max_tokens;
    o->default_stream_ttl_s = c->stream_ttl_s;
    o->max_stream_ttl_s = c->max_stream_ttl_s;
}

void cfg_rconn_opts(const struct cfg *c, struct rconn_opts *o)
{
    rconn_opts_default(o);
    o->addr = c->redis;
    o->user = c->redis_user;
    o->password_file = c->redis_password_file;
    o->connect_timeout_ms = c->redis_connect_timeout_ms;
    o->io_timeout_ms = c->redis_io_timeout_ms;
    o->backoff_max_ms = c->redis_backoff_max_ms;
    if (o->backoff_min_ms > o->backoff_max_ms)
        o->backoff_min_ms = o->backoff_max_ms;
}
