/* dispatcher/http.c - the OpenAI-compatible HTTP front door (libmicrohttpd).
 *
 * Threads. libmicrohttpd runs one thread per connection
 * (MHD_USE_THREAD_PER_CONNECTION); each request borrows a Redis connection
 * of its own from a small pool for as long as it lives (its XADD, cancel,
 * leases). Its events come from the shared reader (common/xmux.h): one
 * blocking XREAD over every request's <prefix>out:<id>, so Redis pays one
 * read per worker flush rather than one per token per request (issue 27);
 * each request thread waits on its own subscription, so none waits on
 * another. On a cluster, or with http_shared_reader off, each request
 * reads its own stream on its own connection instead. The other shared
 * state is the pool, the key table and the counters, each behind its own
 * mutex, held for microseconds.
 *
 * A chat request: the access handler collects the body (413 past
 * max_body_kb, checked against Content-Length before anything is read),
 * checks the key (401) before that, converts the body to a job
 * (openai.c; 400 with the field at fault), checks the tenant's rate limits
 * (429), XADDs the job to <prefix>requests, then blocks reading the job's
 * events until the first one arrives. Only then is the status decided: an
 * error event that comes before any byte was sent (OVERLOADED, a bad
 * prompt) becomes the HTTP status and an OpenAI error body. For stream:
 * true the response is a callback response (chunked encoding, no length):
 * its reader hands libmicrohttpd the bytes of the events it already has,
 * and when it has none it blocks on the next XREAD; every event's chunk is
 * written the moment its event is read, and nothing is kept back for
 * batching (the reader returns whatever it holds, at once). For stream:
 * false the handler reads until done and answers one chat.completion.
 *
 * Disconnects. While it waits for events, a thread looks at its client's
 * socket every POLL_MS (an XREAD BLOCK of that length): a reset socket
 * ends the request, and a request whose job has not ended sets
 * <prefix>cancel:<id> (SET ... EX 600), which the worker checks every
 * step. libmicrohttpd's completion callback does the same for a client
 * lost while writing. A FIN alone is no goodbye: a client may half-close
 * once its request is sent and still read the answer, and only a write
 * tells it from a close(). So a FIN commits the response at once (200, the
 * headers; a non-streamed body then starts with JSON whitespace, and an
 * error after that is the body, as S3 answers long requests) and a byte
 * goes out every PROBE_MS of silence: a client that closed answers it
 * with a reset (cancel), one that half-closed reads its answer. A request
 * in progress has no idle timeout (its wait is ours, bounded by
 * http_timeout_s); http_idle_timeout_s applies to keep-alive connections
 * between requests. A stream quiet for KEEPALIVE_MS gets an SSE comment,
 * which clients skip and proxies take as a sign of life.
 *
 * Orphans. Each queued job carries client_lease_ms, and its key
 * <prefix>lease:<id> is renewed by the lease thread while the request
 * lives; when this process dies (kill -9, a lost host) the renewals stop
 * and the workers cancel its jobs within two lease periods (lease_main).
 *
 * Redis. Pooled connections are looked at (no round trip) as they leave
 * the pool: one whose server closed it meanwhile is dropped, so a Redis
 * restart costs no request and /health tells the truth on both ports.
 *
 * Rate limits are fixed one-minute windows in Redis, so every dispatcher
 * copy shares them: <prefix>ratelimit:<tenant>:rpm:<minute> counts
 * requests (INCR in MULTI with its EXPIRE), :tpm:<minute> counts prompt +
 * completion tokens, charged when a request's done arrives. A request is
 * refused while its tenant's count for the current minute is over the
 * limit, with Retry-After = the seconds left in the minute. Refused
 * requests count against the request limit too.
 *
 * POST /v1/completions takes the same path as chat (openai.c converts
 * either), and so do the embedding routes (embed.c: one job per input,
 * laid out as several choices are, the answer never streamed) and the
 * rerank and score routes (rerank.c: one job per document, the same way).
 * Slow clients cannot hold connection threads: each connection has a deadline
 * for its headers and its body, enforced by a reaper thread, only so many
 * connections (per address and in all) get the full one, and a new
 * connection at http_max_connections displaces the one that has waited
 * longest (see "slow clients" below);
 * http_max_connections_per_ip caps one address. Wrong API keys are
 * throttled per address (auth_slot), and headers that leave the body's
 * end in doubt (two Content-Lengths, one beside Transfer-Encoding) are
 * refused before anything is read. CORS, when http_cors_origins is set,
 * adds the allow headers to every answer and answers OPTIONS preflights,
 * which need no key.
 * /metrics asks for a key when keys are on. The same code also runs the
 * loopback ops listener of http_port (dhttp_start_ops): /healthz, /health
 * and /metrics only, no key, with or without the front door. */
#include "http.h"
#include "clock.h"

#include <cjson/cJSON.h>

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "file.h"
#include "job.h"
#include "listen.h"
#include "modelref.h"
#include "anthropic.h"
#include "compat.h"
#include "embed.h"
#include "rerank.h"
#include "lorafleet.h"
#include "rstore.h"
#include "convo.h"
#include "pager.h"
#include "openai.h"
#include "prompt.h"
#include "rconn.h"
#include "xmux.h"
#include "tokenizer.h"
#include "vmetrics.h"
#include "rcluster.h"

#define POLL_MS 200           /* XREAD BLOCK between disconnect checks (at most) */
#define KEEPALIVE_MS 15000    /* an SSE comment after this long without a byte */
#define KEYS_RECHECK_MS 1000  /* how often the keys file's mtime is looked at */
#define KEYS_FILE_MAX (16u << 20) /* a keys file is a line a key: past this, not one */
#define CANCEL_TTL_S "600"
#define RL_WINDOW_TTL_S "120" /* a minute window outlives its minute */
#define BLOCK_SIZE (16 * 1024)
#define QUICK_MS 1000         /* a connection past a pending cap: its whole request this soon */
#define QUICK_RATE_X 16       /* ... and its body this many times above http_min_body_rate */
#define PROBE_MS 1000         /* after the client's FIN: a probe byte this often */
#define TALLY_LOG_MS 10000    /* one summary line of connection warnings at most this often */
#define AUTH_SLOTS 4096       /* client addresses whose failed API keys are counted */
#define AUTH_PROBE 8          /* slots looked at per address (open addressing) */
#define ADDR_KEY 17           /* addr_key(): a family byte + 16 address bytes */
#define N_BUCKETS 14

static const double bucket_ms[N_BUCKETS] = {1, 2, 5, 10, 25, 50, 100, 250, 500,
                                            1000, 2500, 5000, 10000, 30000};
static const int status_codes[] = {200, 400, 401, 404, 405, 413, 429, 500, 502, 503, 504};
#define N_STATUS ((int)(sizeof status_codes / sizeof status_codes[0]))

struct counters {
    int64_t by_status[N_STATUS + 1]; /* the last slot: any other */
    int64_t chat_stream, chat_plain, client_cancels, rate_limited, auth_failures, sse_events;
    int64_t slow_closed; /* connections cut off for sending too slowly */
    int64_t evicted;     /* waiting connections closed to make room for a new one */
    int64_t refused;     /* connections refused: every one was being answered */
    int64_t auth_throttled; /* requests refused for their address's failed API keys */
    int64_t stored, store_failed; /* Responses kept (rstore.h), and refused by Redis */
    int64_t conv_failed;  /* responses a conversation did not get (convo.h) */
    int64_t first_event[N_BUCKETS + 1]; /* XADD -> first event read, ms buckets; last = +Inf */
    int64_t first_event_n;
    double first_event_sum_ms;
    int active;
};

struct dhttp {
    struct MHD_Daemon *d;
    const struct rl_log *log;
    struct dhttp_hooks hooks;
    /* options, copied */
    char *prefix, *model, *keys_path, *bind;
    char *redis_addr, *redis_user, *redis_pw;
    struct rconn_opts ropts;
    struct job_opts jopts;
    struct oai_limits lim;
    int port, timeout_s, drain_s, max_conn, idle_s;
    int header_s, min_rate, per_ip;
    int max_pending, pending_per_ip, auth_per_min, lease_ms;
    int store_ttl_s;      /* responses_store_ttl_s: stored Responses' TTL, 0 = none kept */
    bool runtime_lora;    /* the runtime LoRA routes (lorafleet.h) are on */
    char *lora_tenants;   /* runtime_lora_tenants as ",a,b," ("" = any key), owned */
    int lora_timeout_ms;  /* and how long they wait for the workers */
    size_t store_max;     /* responses_store_max_kb, in bytes */
    int conv_ttl_s;       /* conversation_ttl_s: conversations' TTL, 0 = none kept */
    bool ops;             /* the loopback ops listener: /healthz, /health, /metrics only */
    struct dhttp *front;  /* ops: the front door whose counters /metrics shows, or NULL */
    char **cors;          /* (n_cors) allowed origins; "*" = any; none = CORS off */
    int n_cors;
    /* connections, for the slow-client deadlines (struct conn) */
    pthread_mutex_t conn_mu;
    struct conn *conns;
    pthread_t reaper;
    bool reaper_started;
    /* what the reaper sums up in one log line at most every TALLY_LOG_MS:
     * a flood of slow clients must not become a flood of log lines
     * (under conn_mu) */
    struct {
        int64_t slow_headers, slow_body, quick, evicted, refused, throttled, mhd;
        char mhd_last[160];
    } tally;
    int64_t tally_logged_ms;
    /* failed API keys per client address: a token bucket each (auth_mu) */
    pthread_mutex_t auth_mu;
    struct auth_slot *auth;  /* (AUTH_SLOTS), NULL when auth_per_min is 0 */
    /* client leases of the jobs being waited for (lease_mu): the lease
     * thread renews them on a connection of its own */
    pthread_mutex_t lease_mu;
    struct req *leases;
    pthread_t lease_thread;
    bool lease_started;
    char block[16];      /* XREAD BLOCK ms: POLL_MS, or less under a short redis_io_timeout_ms */
    int64_t started_s;
    atomic_bool stopping;
    /* the blocking XREADs every request's events are read by (xmux.h):
     * one on a single instance, one per master of a cluster, made by the
     * first request that reads; mux_off once they cannot be had (an ACL
     * without client|id / client|unblock): each request then reads its
     * own stream (mux_mu). On a single instance it blocks on the bell the
     * workers ring (mux_bell) unless the ACL keeps it from the bell, or
     * it finds a writer that does not ring (said once in the log). On a
     * cluster ids are chosen on its request slots (new_id) */
    pthread_mutex_t mux_mu;
    struct xmux_set *mux;
    bool shared_reader, mux_off, mux_bell;
    int64_t mux_tried_ms;
    /* Redis connections not in use */
    pthread_mutex_t pool_mu;
    struct rconn **idle; /* (n_idle) */
    int n_idle, cap_idle;
    /* API keys; auth is on when keys_path is set */
    pthread_mutex_t keys_mu;
    struct oai_keys keys;
    struct timespec keys_mtime;
    off_t keys_size;
    int64_t keys_checked_ms;
    /* metrics */
    pthread_mutex_t m_mu;
    struct counters m;
    /* requests with fields accepted but not applied, for one log line
     * per IGNORED_LOG_MS at most (under m_mu) */
    int64_t ignored_logged_ms, ignored_unlogged;
    int64_t store_logged_ms; /* the last "not stored" line: one per IGNORED_LOG_MS */
    struct vmetrics *vm; /* vLLM-named request metrics (vmetrics.h) */
};

#define IGNORED_LOG_MS 10000
#define DHTTP_VERSION "0.1.0" /* the front door's API version (GET /version) */

enum route {
    R_CHAT, R_COMPLETIONS, R_MODELS, R_MODEL, R_HEALTHZ, R_METRICS, R_PREFLIGHT, R_NOT_FOUND,
    R_BAD_METHOD,
    /* compat.c's APIs: the Responses API and Ollama's */
    R_RESPONSES, R_OLLAMA_CHAT, R_OLLAMA_GENERATE, R_OLLAMA_SHOW, R_OLLAMA_TAGS, R_OLLAMA_PS,
    R_OLLAMA_VERSION,
    R_VERSION, /* vLLM's GET /version */
    R_TOKENIZE, R_DETOKENIZE, /* vLLM's, with the dispatcher's tokenizer */
    /* embed.c's: OpenAI's POST /v1/embeddings, Ollama's /api/embed and
     * /api/embeddings */
    R_EMBEDDINGS, R_OLLAMA_EMBED, R_OLLAMA_EMBEDDINGS,
    /* rerank.c's: Jina's and Cohere's POST /v1/rerank (and /rerank,
     * /v2/rerank), vLLM's POST /v1/score (and /score) */
    R_RERANK, R_SCORE,
    /* Anthropic's Messages API (compat.c, anthropic.c): POST /v1/messages
     * and POST /v1/messages/count_tokens */
    R_ANTHROPIC, R_ANTHROPIC_COUNT,
    /* stored Responses (rstore.h): GET and DELETE /v1/responses/{id},
     * GET /v1/responses/{id}/input_items, POST /v1/responses/{id}/cancel */
    R_STORED,
    /* the Conversations API (convo.h): /v1/conversations[/{id}[/items[/{item}]]] */
    R_CONVERSATIONS,
    /* vLLM's runtime LoRA API (common/lorafleet.h), with runtime_lora on */
    R_LORA_LOAD, R_LORA_UNLOAD,
};

/* A route that answers with a job's events (chat()). */
static bool job_route(enum route r)
{
    return r == R_CHAT || r == R_COMPLETIONS || r == R_RESPONSES || r == R_OLLAMA_CHAT ||
           r == R_OLLAMA_GENERATE || r == R_EMBEDDINGS || r == R_OLLAMA_EMBED ||
           r == R_OLLAMA_EMBEDDINGS || r == R_RERANK || r == R_SCORE || r == R_ANTHROPIC;
}

/* An embedding route: embed.c parses and answers it. */
static bool embed_route(enum route r)
{
    return r == R_EMBEDDINGS || r == R_OLLAMA_EMBED || r == R_OLLAMA_EMBEDDINGS;
}

static enum emb_api emb_api_of(enum route r)
{
    return r == R_OLLAMA_EMBED ? EMB_OLLAMA_EMBED
           : r == R_OLLAMA_EMBEDDINGS ? EMB_OLLAMA_LEGACY : EMB_OPENAI;
}

/* An Ollama route: errors are {"error": "..."}. */
static bool ollama_route(enum route r)
{
    return (r >= R_OLLAMA_CHAT && r <= R_OLLAMA_VERSION) || r == R_OLLAMA_EMBED ||
           r == R_OLLAMA_EMBEDDINGS;
}

/* An error as the route's clients parse it: Ollama's {"error": "..."},
 * Anthropic's {"type": "error", ...}, else OpenAI's. malloc'd. */
static char *route_error_json(enum route r, const struct oai_error *e)
{
    if (r == R_ANTHROPIC || r == R_ANTHROPIC_COUNT)
        return cpt_error_json(CPT_ANTHROPIC, e);
    return ollama_route(r) ? cpt_error_json(CPT_OLLAMA_CHAT, e) : oai_error_json(e);
}

/* One TCP connection, from libmicrohttpd's connection-started callback to
 * its closed one: the deadline by which what the client is sending must
 * have arrived. The reaper thread shuts the socket down past it; the
 * connection's own thread then reads end-of-file and closes. fd is our
 * dup() of the socket, so it names the same socket for as long as this
 * record lives, even after libmicrohttpd closed its own descriptor.
 * Guarded by conn_mu. */
struct conn {
    int fd;
    uint8_t addr[ADDR_KEY]; /* the client's address (addr_key) */
    int64_t deadline_ms;  /* monotonic; 0 = none (a request being answered) */
    int64_t wait_ms;      /* monotonic: when the current wait began */
    const char *phase;    /* what it was waiting for, for the log */
    bool quick;           /* this wait is past a pending cap: QUICK_MS deadline */
    bool idle;            /* kept alive between requests: not counted against the caps */
    bool evicted;         /* shut down to make room for a new connection */
    struct conn *prev, *next;
};

/* One client address's failed API keys: a token bucket of
 * http_auth_failures_per_min tokens, refilled at that rate. */
struct auth_slot {
    bool used;
    uint8_t addr[ADDR_KEY];
    double tokens;
    int64_t t_ms; /* monotonic: tokens was this at t_ms */
};

/* One HTTP request, from its headers to its completion callback; lives in
 * libmicrohttpd's per-request pointer and is touched only by its
 * connection's thread. */
struct req {
    struct dhttp *h;
    enum route route;
    const char *allow;         /* R_BAD_METHOD: the methods the path takes */
    const char *cors_origin;   /* the Access-Control-Allow-Origin to send, or NULL */
    struct conn *c;            /* its connection's record, or NULL */
    int fd;                    /* the client's socket (for disconnect checks) */
    struct text body;
    bool too_big, responded;
    /* the caller's tenant (auth on) */
    bool has_tenant;
    char tenant[OAI_TENANT_MAX + 1];
    int64_t rpm, tpm;
    /* chat */
    char id[64];
    char out_key[320];
    char last[RCONN_ID_MAX];   /* last entry read from out_key */
    struct rconn *rc;
    struct oai_request oreq;
    struct oai_resp *resp;
    /* R_RESPONSES and Ollama's: compat.c formats the answer instead */
    bool compat;
    struct cpt_request creq;
    struct cpt_resp *cresp;
    /* the embedding routes: embed.c formats the answer instead */
    bool embed;
    struct emb_request ereq;
    struct emb_resp *eresp;
    /* the rerank and score routes: rerank.c formats the answer instead */
    bool rerank;
    struct rr_request rreq;
    struct rr_resp *rresp;
    /* its place in the vLLM-named gauges, under the model name it echoes */
    enum vm_state vm;
    char vm_model[JOB_MODEL_MAX + 1];
    struct text sse;        /* bytes produced and not yet handed to MHD */
    size_t sse_off;
    bool enqueued;             /* the job is in Redis */
    /* Responses with previous_response_id: the chain its record carries
     * (rst_continue's, malloc'd; NULL: written whole) and how many of the
     * conversation's first items that chain holds */
    char *chain;
    int n_prior;
    bool resumed;              /* GET /v1/responses/{id}?stream=true: a background
                                  response's stream again, nothing to keep */
    bool job_ended;            /* done or error seen (or a background job's,
                                  which its connection never cancels): nothing to cancel */
    bool finished;             /* the response's last byte is in sse */
    bool failed;               /* err holds an error not yet delivered */
    bool headers_sent;         /* the streaming response was queued */
    struct oai_error err;
    int64_t give_up_ms;        /* monotonic; 0 = never */
    int64_t t_xadd_ms, t_last_byte_ms;
    bool first_seen;
    int status;
    bool half_closed;          /* the client sent FIN: answered all the same, probed */
    bool tail_added;           /* a non-streamed body committed early: the JSON is in sse */
    bool read_warned;          /* a failed XREAD was logged (once per request) */
    bool close_after;          /* the response says Connection: close */
    int throttle_s;            /* > 0: refused for failed API keys; retry after */
    /* its client lease (http_client_lease_ms), renewed by the lease thread
     * while the request is in the list (lease_mu) */
    char lease_key[320];
    char (*more_leases)[320];  /* several choices: the leases of jobs 1.. */
    int n_more_leases;
    bool in_lease;
    /* several choices (oreq.n_jobs > 1): one job each, "<id>-<i>", read one
     * after the other; sub is the one out_key reads */
    int sub;
    struct xmux_sub *xs;       /* out_key on the shared reader; NULL: read on rc */
    struct req *lease_prev, *lease_next;
};

/* ---- Redis connections ---- */

/* A connection for one request: an idle one that is still connected, or
 * a new one. An idle connection whose server closed it meanwhile (Redis
 * restarted) is dropped here, without a round trip, rather than failing
 * the request that would have used it; so the first request after a
 * restart gets a fresh connection and succeeds. */
static struct rconn *pool_get(struct dhttp *h, struct rl_err *err)
{
    struct rconn *c = NULL;
    for (;;) {
        pthread_mutex_lock(&h->pool_mu);
        c = h->n_idle ? h->idle[--h->n_idle] : NULL;
        pthread_mutex_unlock(&h->pool_mu);
        if (!c || rconn_check_idle(c))
            break;
        rconn_free(c);
    }
    if (!c && rconn_create(&c, &h->ropts, err))
        return NULL;
    return c;
}

static void pool_put(struct dhttp *h, struct rconn *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&h->pool_mu);
    if (rconn_connected(c) && h->n_idle < h->cap_idle) {
        h->idle[h->n_idle++] = c;
        c = NULL;
    }
    pthread_mutex_unlock(&h->pool_mu);
    rconn_free(c);
}

/* ---- metrics ---- */

static void count_status(struct dhttp *h, int status)
{
    int i = 0;
    while (i < N_STATUS && status_codes[i] != status)
        i++;
    pthread_mutex_lock(&h->m_mu);
    h->m.by_status[i]++;
    pthread_mutex_unlock(&h->m_mu);
}

#define BUMP(h, field)                                                                         \
    do {                                                                                       \
        pthread_mutex_lock(&(h)->m_mu);                                                        \
        (h)->m.field++;                                                                        \
        pthread_mutex_unlock(&(h)->m_mu);                                                      \
    } while (0)

static void observe_first_event(struct dhttp *h, double ms)
{
    int i = 0;
    while (i < N_BUCKETS && ms > bucket_ms[i])
        i++;
    pthread_mutex_lock(&h->m_mu);
    h->m.first_event[i]++;
    h->m.first_event_n++;
    h->m.first_event_sum_ms += ms;
    pthread_mutex_unlock(&h->m_mu);
}

/* The front door's unlabelled counters: one family each, read from a
 * copy of struct counters by offset. */
static const struct {
    const char *name, *help;
    size_t off;
} plain_counters[] = {
    {"client_cancels_total", "jobs cancelled because their client left",
     offsetof(struct counters, client_cancels)},
    {"rate_limited_total", "requests refused with 429 by a tenant's limits",
     offsetof(struct counters, rate_limited)},
    {"auth_failures_total", "requests refused for a missing or unknown API key",
     offsetof(struct counters, auth_failures)},
    {"sse_events_total", "server-sent events written", offsetof(struct counters, sse_events)},
    {"slow_clients_closed_total", "connections closed for sending their request too slowly",
     offsetof(struct counters, slow_closed)},
    {"connections_evicted_total",
     "connections waiting for their request closed to make room at http_max_connections",
     offsetof(struct counters, evicted)},
    {"connections_refused_total",
     "connections refused at http_max_connections while every one was being answered",
     offsetof(struct counters, refused)},
    {"auth_throttled_total",
     "requests refused with 429 because their address sent too many wrong API keys",
     offsetof(struct counters, auth_throttled)},
    {"responses_stored_total", "Responses API answers kept for previous_response_id",
     offsetof(struct counters, stored)},
    {"responses_store_failures_total",
     "Responses API answers with store that Redis refused to keep (full: OOM)",
     offsetof(struct counters, store_failed)},
    {"conversation_failures_total",
     "Responses API answers not added to their conversation (deleted meanwhile, or Redis "
     "refused)",
     offsetof(struct counters, conv_failed)},
};

/* The front door's own families (its counters, under m_mu). */
static void put_http_families(struct dhttp *h, struct text *b)
{
    struct counters m;
    pthread_mutex_lock(&h->m_mu);
    m = h->m;
    pthread_mutex_unlock(&h->m_mu);
    text_printf(b, "# HELP redlm_http_requests_total HTTP requests answered, by status\n"
                   "# TYPE redlm_http_requests_total counter\n");
    for (int i = 0; i <= N_STATUS; i++)
        if (i < N_STATUS)
            text_printf(b, "redlm_http_requests_total{code=\"%d\"} %lld\n", status_codes[i],
                        (long long)m.by_status[i]);
        else
            text_printf(b, "redlm_http_requests_total{code=\"other\"} %lld\n",
                        (long long)m.by_status[i]);
    text_printf(b,
                "# HELP redlm_http_chat_requests_total chat completion requests, streamed or not\n"
                "# TYPE redlm_http_chat_requests_total counter\n"
                "redlm_http_chat_requests_total{stream=\"true\"} %lld\n"
                "redlm_http_chat_requests_total{stream=\"false\"} %lld\n",
                (long long)m.chat_stream, (long long)m.chat_plain);
    text_printf(b,
                "# HELP redlm_http_active_requests requests in flight\n"
                "# TYPE redlm_http_active_requests gauge\nredlm_http_active_requests %d\n",
                m.active);
    for (size_t i = 0; i < sizeof plain_counters / sizeof plain_counters[0]; i++) {
        const char *n = plain_counters[i].name;
        int64_t v;
        memcpy(&v, (const char *)&m + plain_counters[i].off, sizeof v);
        text_printf(b, "# HELP redlm_http_%s %s\n# TYPE redlm_http_%s counter\nredlm_http_%s %lld\n",
                    n, plain_counters[i].help, n, n, (long long)v);
    }
    text_printf(
        b, "# HELP redlm_http_first_event_seconds time from the job's XADD to its first event\n"
           "# TYPE redlm_http_first_event_seconds histogram\n");
    int64_t cum = 0;
    for (int i = 0; i < N_BUCKETS; i++) {
        cum += m.first_event[i];
        text_printf(b, "redlm_http_first_event_seconds_bucket{le=\"%g\"} %lld\n",
                    bucket_ms[i] / 1000, (long long)cum);
    }
    text_printf(
        b,
        "redlm_http_first_event_seconds_bucket{le=\"+Inf\"} %lld\n"
        "redlm_http_first_event_seconds_sum %.6f\nredlm_http_first_event_seconds_count %lld\n",
        (long long)m.first_event_n, m.first_event_sum_ms / 1000, (long long)m.first_event_n);
}

static char *render_metrics(struct dhttp *h)
{
    if (h->ops && h->front)
        return render_metrics(h->front); /* the same page on both ports */
    struct text b = {0};
    if (!h->ops) { /* an ops port with no front door: the dispatcher's families only */
        put_http_families(h, &b);
        struct vm_fleet fleet[VM_MODELS];
        int n_fleet = h->hooks.fleet ? h->hooks.fleet(h->hooks.ctx, fleet, VM_MODELS) : 0;
        vm_render(h->vm, fleet, n_fleet, &b);
    }
    char *more = h->hooks.metrics_text ? h->hooks.metrics_text(h->hooks.ctx) : NULL;
    if (more) {
        text_add(&b, more, strlen(more));
        free(more);
    }
    if (!b.p)
        text_add(&b, "", 0);
    return b.p;
}

/* ---- API keys ---- */

/* Loads the keys file if it changed since the last look (at most once a
 * second). Caller holds keys_mu. A file that no longer parses keeps the
 * old keys (and says so in the log). */
static int keys_refresh(struct dhttp *h, bool force, struct rl_err *err)
{
    int64_t now = rl_mono_ms();
    if (!force && now - h->keys_checked_ms < KEYS_RECHECK_MS)
        return 0;
    h->keys_checked_ms = now;
    struct stat st;
    if (stat(h->keys_path, &st))
        return rl_errf(err, RL_EIO, "%s: %s", h->keys_path, strerror(errno));
    if (!force && st.st_mtim.tv_sec == h->keys_mtime.tv_sec &&
        st.st_mtim.tv_nsec == h->keys_mtime.tv_nsec && st.st_size == h->keys_size)
        return 0;
    char *text;
    size_t n;
    int rc = file_read(h->keys_path, KEYS_FILE_MAX, &text, &n, err);
    struct oai_keys keys;
    if (!rc)
        rc = oai_keys_parse(text, n, h->keys_path, &keys, err);
    free(text);
    if (rc)
        return rc;
    oai_keys_free(&h->keys);
    h->keys = keys;
    h->keys_mtime = st.st_mtim;
    h->keys_size = st.st_size;
    if (!force)
        RL_LOG(h->log, RL_LOG_INFO, "http: %s re-read: %d keys", h->keys_path, keys.n);
    return 0;
}

/* ---- client addresses ---- */

/* The key a client address is counted under: IPv4 (also when mapped into
 * IPv6) as itself, IPv6 by its /64, since one host may pick any address of
 * its /64. All zero when there is none. */
static void addr_key(const struct sockaddr *sa, uint8_t out[ADDR_KEY])
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    memset(out, 0, ADDR_KEY);
    if (sa && sa->sa_family == AF_INET) {
        out[0] = 4;
        memcpy(out + 1, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa && sa->sa_family == AF_INET6) {
        const uint8_t *a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
        if (!memcmp(a, mapped, 12)) {
            out[0] = 4;
            memcpy(out + 1, a + 12, 4);
        } else {
            out[0] = 6;
            memcpy(out + 1, a, 8);
        }
    }
}

static void conn_addr(struct MHD_Connection *conn, uint8_t out[ADDR_KEY])
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    addr_key(ci ? ci->client_addr : NULL, out);
}

/* ---- failed API keys, per client address ----
 *
 * Each address has a bucket of http_auth_failures_per_min tokens, refilled
 * at that many a minute; a request with a missing or wrong key takes one.
 * While an address has less than one, its requests are refused (429,
 * Retry-After) before their key is looked at: a right key must not answer
 * differently, or guessing would go on at full speed. Addresses live in a
 * fixed table (AUTH_SLOTS, AUTH_PROBE slots looked at per address, the
 * least recently touched of them taken over), so a flood of addresses
 * costs no memory. */

/* addr's bucket, refilled to now (auth_mu held). */
static struct auth_slot *auth_slot(struct dhttp *h, const uint8_t *addr, int64_t now)
{
    uint32_t x = 2166136261u; /* FNV-1a */
    for (int i = 0; i < ADDR_KEY; i++)
        x = (x ^ addr[i]) * 16777619u;
    struct auth_slot *pick = NULL, *sl = NULL;
    for (int k = 0; k < AUTH_PROBE && !sl; k++) {
        struct auth_slot *t = &h->auth[(x + (uint32_t)k) % AUTH_SLOTS];
        if (t->used && !memcmp(t->addr, addr, ADDR_KEY))
            sl = t;
        else if (!pick || (pick->used && (!t->used || t->t_ms < pick->t_ms)))
            pick = t;
    }
    if (!sl) {
        sl = pick;
        sl->used = true;
        memcpy(sl->addr, addr, ADDR_KEY);
        sl->tokens = h->auth_per_min;
        sl->t_ms = now;
    }
    sl->tokens += (double)(now - sl->t_ms) * h->auth_per_min / 60000.0;
    if (sl->tokens > h->auth_per_min)
        sl->tokens = h->auth_per_min;
    sl->t_ms = now;
    return sl;
}

/* Fills q's tenant from the Authorization header; false = refused: 401,
 * or 429 when q->throttle_s > 0 (the address's failed keys). */
static bool authorize(struct req *q, struct MHD_Connection *conn)
{
    struct dhttp *h = q->h;
    if (!h->keys_path)
        return true;
    uint8_t addr[ADDR_KEY];
    if (h->auth) {
        conn_addr(conn, addr);
        pthread_mutex_lock(&h->auth_mu);
        struct auth_slot *sl = auth_slot(h, addr, rl_mono_ms());
        if (sl->tokens < 1)
            q->throttle_s = (int)ceil((1 - sl->tokens) * 60.0 / h->auth_per_min);
        pthread_mutex_unlock(&h->auth_mu);
        if (q->throttle_s) {
            if (q->throttle_s < 1)
                q->throttle_s = 1;
            BUMP(h, auth_throttled);
            pthread_mutex_lock(&h->conn_mu);
            h->tally.throttled++;
            pthread_mutex_unlock(&h->conn_mu);
            return false;
        }
    }
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    pthread_mutex_lock(&h->keys_mu);
    struct rl_err err = {0};
    if (keys_refresh(h, false, &err))
        RL_LOG(h->log, RL_LOG_ERROR, "http: keeping the old API keys: %s", err.msg);
    /* without Authorization, the key as Anthropic's SDKs send it */
    const struct oai_key *k =
        auth ? oai_keys_find(&h->keys, auth)
             : oai_keys_lookup(&h->keys,
                               MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "x-api-key"));
    if (k) {
        q->has_tenant = true;
        memcpy(q->tenant, k->tenant, sizeof q->tenant);
        q->rpm = k->rpm;
        q->tpm = k->tpm;
    }
    pthread_mutex_unlock(&h->keys_mu);
    if (!k) {
        BUMP(h, auth_failures);
        if (h->auth) {
            pthread_mutex_lock(&h->auth_mu);
            auth_slot(h, addr, rl_mono_ms())->tokens -= 1;
            pthread_mutex_unlock(&h->auth_mu);
        }
    }
    return k != NULL;
}

/* ---- slow clients ----
 *
 * A thread per connection means a client that sends its request a byte at
 * a time holds a thread (and a slot of http_max_connections) for as long
 * as it likes: libmicrohttpd's idle timeout restarts with every byte. So
 * each connection carries a deadline for what it is sending: the request
 * line and headers within http_header_timeout_s of connecting (of the end
 * of the previous response plus http_idle_timeout_s on a kept-alive
 * connection); the body within http_header_timeout_s plus its length at
 * http_min_body_rate bytes per second of the headers. While a request is
 * being answered there is none (its wait is bounded by http_timeout_s).
 * The reaper thread looks every REAP_MS and shuts down the sockets past
 * their deadline; libmicrohttpd's thread for the connection then reads
 * end-of-file, closes it, and is free.
 *
 * Deadlines alone let a client that reopens what is closed keep every slot
 * (and, past http_max_connections, every new connection refused: the API
 * down). So only http_max_pending waiting connections, and
 * http_max_pending_per_ip of one address, get those deadlines; a
 * connection that starts waiting past either cap must send its whole
 * request within QUICK_MS (its body at QUICK_RATE_X times the minimum
 * rate). A kept-alive connection idle between requests is outside the caps
 * (wait_idle). An honest request arrives in milliseconds and never notices; a
 * slow one past the caps lives a second. And at http_max_connections a
 * new connection closes the one that has waited longest for its request
 * (the quick ones first), so a flood of waiting connections can never
 * lock out a client; it is refused only when every connection is being
 * answered. What this closes and refuses is summed up in one log line at
 * most every TALLY_LOG_MS. */

#define REAP_MS 200

/* Starts c's wait for what the client sends (conn_mu held): the long
 * deadline while the caps allow, else QUICK. */
static void start_wait(struct dhttp *h, struct conn *c, int64_t long_ms, int64_t quick_ms,
                       const char *phase)
{
    int same = 0, total = 0;
    for (struct conn *o = h->conns; o; o = o->next)
        if (o != c && o->deadline_ms && !o->quick && !o->evicted && !o->idle) {
            total++;
            same += !memcmp(o->addr, c->addr, ADDR_KEY);
        }
    bool over = (h->max_pending && total >= h->max_pending) ||
                (h->pending_per_ip && same >= h->pending_per_ip);
    int64_t now = rl_mono_ms();
    c->quick = over;
    c->idle = false;
    c->deadline_ms = now + (over ? quick_ms : long_ms);
    c->wait_ms = now;
    c->phase = phase;
    if (over)
        h->tally.quick++;
}

/* The accept policy: at http_max_connections, make room by closing the
 * connection that has waited longest for its request (a quick one first),
 * or refuse when every connection is being answered. libmicrohttpd's own
 * limit is set above ours, so the decision is made here. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    struct dhttp *h = cls;
    int n = 0;
    struct conn *victim = NULL;
    enum MHD_Result ok = MHD_YES;
    pthread_mutex_lock(&h->conn_mu);
    for (struct conn *c = h->conns; c; c = c->next) {
        if (c->evicted)
            continue;
        n++;
        if (c->deadline_ms &&
            (!victim || (c->quick && !victim->quick) ||
             (c->quick == victim->quick && c->wait_ms < victim->wait_ms)))
            victim = c;
    }
    if (n >= h->max_conn) {
        if (victim) {
            shutdown(victim->fd, SHUT_RDWR);
            victim->evicted = true;
            victim->deadline_ms = 0;
            h->tally.evicted++;
        } else {
            h->tally.refused++;
            ok = MHD_NO;
        }
    }
    pthread_mutex_unlock(&h->conn_mu);
    pthread_mutex_lock(&h->m_mu);
    if (victim && ok == MHD_YES && n >= h->max_conn)
        h->m.evicted++;
    if (ok == MHD_NO)
        h->m.refused++;
    pthread_mutex_unlock(&h->m_mu);
    return ok;
}

static void on_connection(void *cls, struct MHD_Connection *connection, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct dhttp *h = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct conn *c = ci ? calloc(1, sizeof *c) : NULL;
        if (!c)
            return; /* untracked: no deadline, as before */
        if ((c->fd = dup(ci->connect_fd)) < 0) {
            free(c);
            return;
        }
        conn_addr(connection, c->addr);
        pthread_mutex_lock(&h->conn_mu);
        start_wait(h, c, (int64_t)h->header_s * 1000, QUICK_MS, "request headers");
        c->next = h->conns;
        if (h->conns)
            h->conns->prev = c;
        h->conns = c;
        pthread_mutex_unlock(&h->conn_mu);
        *socket_context = c;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        struct conn *c = *socket_context;
        pthread_mutex_lock(&h->conn_mu);
        if (c->prev)
            c->prev->next = c->next;
        else
            h->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
        pthread_mutex_unlock(&h->conn_mu);
        close(c->fd);
        free(c);
        *socket_context = NULL;
    }
}

/* Sets the deadline of q's connection: ms from now, 0 = none (being
 * answered). */
static void set_deadline(struct req *q, int64_t ms, const char *phase)
{
    if (!q->c)
        return;
    pthread_mutex_lock(&q->h->conn_mu);
    if (ms > 0) {
        q->c->deadline_ms = rl_mono_ms() + ms;
    } else {
        q->c->deadline_ms = 0;
        q->c->quick = false;
    }
    q->c->idle = false;
    q->c->phase = phase;
    pthread_mutex_unlock(&q->h->conn_mu);
}

/* q's connection starts waiting for the client: long_ms when the pending
 * caps allow, else quick_ms. */
static void wait_for_client(struct req *q, int64_t long_ms, int64_t quick_ms, const char *phase)
{
    if (!q->c)
        return;
    pthread_mutex_lock(&q->h->conn_mu);
    if (!q->c->evicted)
        start_wait(q->h, q->c, long_ms, quick_ms, phase);
    pthread_mutex_unlock(&q->h->conn_mu);
}

/* q's connection, its request answered, waits for the next one (keep-alive):
 * the full idle time, outside the caps. An SDK's pool of idle connections
 * from one address is honest, and closing it after a second would make its
 * next POST race the close; a flood of idle connections is bounded by the
 * idle deadline and displaced oldest first at http_max_connections. */
static void wait_idle(struct req *q, int64_t ms)
{
    if (!q->c)
        return;
    pthread_mutex_lock(&q->h->conn_mu);
    if (!q->c->evicted) {
        q->c->deadline_ms = rl_mono_ms() + ms;
        q->c->wait_ms = rl_mono_ms();
        q->c->quick = false;
        q->c->idle = true;
        q->c->phase = "request headers";
    }
    pthread_mutex_unlock(&q->h->conn_mu);
}

/* One line for what was closed and refused since the last one (conn_mu
 * held; the caller logs it after unlocking). */
static bool tally_line(struct dhttp *h, char *line, size_t size)
{
    int64_t now = rl_mono_ms();
    if (now - h->tally_logged_ms < TALLY_LOG_MS)
        return false;
    const struct {
        int64_t n;
        const char *what;
    } parts[] = {
        {h->tally.slow_headers, "closed too slow sending request headers"},
        {h->tally.slow_body, "closed too slow sending a body"},
        {h->tally.quick, "given 1 s for their request (over http_max_pending or "
                         "http_max_pending_per_ip)"},
        {h->tally.evicted, "closed to make room at http_max_connections"},
        {h->tally.refused, "refused: http_max_connections all being answered"},
        {h->tally.throttled, "requests refused 429 for their address's failed API keys"},
        {h->tally.mhd, "libmicrohttpd messages"},
    };
    size_t used = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (parts[i].n && used < size)
            used += (size_t)snprintf(line + used, size - used, "%s%lld %s", used ? "; " : "",
                                     (long long)parts[i].n, parts[i].what);
    if (!used)
        return false;
    if (h->tally.mhd && used < size)
        snprintf(line + used, size - used, " (the last: %s)", h->tally.mhd_last);
    memset(&h->tally, 0, sizeof h->tally);
    h->tally_logged_ms = now;
    return true;
}

static void *reaper_main(void *arg)
{
    struct dhttp *h = arg;
    while (!atomic_load(&h->stopping)) {
        usleep(REAP_MS * 1000);
        int64_t now = rl_mono_ms();
        int n = 0;
        char line[1024];
        pthread_mutex_lock(&h->conn_mu);
        for (struct conn *c = h->conns; c; c = c->next)
            if (c->deadline_ms && now > c->deadline_ms) {
                shutdown(c->fd, SHUT_RDWR);
                c->deadline_ms = 0;
                if (c->phase && !strcmp(c->phase, "a request body"))
                    h->tally.slow_body++;
                else
                    h->tally.slow_headers++;
                n++;
            }
        bool say = tally_line(h, line, sizeof line);
        pthread_mutex_unlock(&h->conn_mu);
        if (n) {
            pthread_mutex_lock(&h->m_mu);
            h->m.slow_closed += n;
            pthread_mutex_unlock(&h->m_mu);
        }
        if (say)
            RL_LOG(h->log, RL_LOG_WARN, "http: in the last %d s at most: %s", TALLY_LOG_MS / 1000,
                   line);
    }
    return NULL;
}

/* ---- CORS ---- */

/* The Access-Control-Allow-Origin for this request: its Origin when that
 * is allowed (echoed, with Vary: Origin), "*" when any is; NULL when CORS
 * is off or the origin is not listed. */
static const char *cors_origin(struct dhttp *h, struct MHD_Connection *conn)
{
    if (!h->n_cors)
        return NULL;
    const char *o = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin");
    if (!o)
        return NULL;
    for (int i = 0; i < h->n_cors; i++) {
        if (!strcmp(h->cors[i], "*"))
            return "*";
        if (!strcasecmp(h->cors[i], o))
            return o;
    }
    return NULL;
}

static void add_cors(const struct req *q, struct MHD_Response *r)
{
    if (!q->cors_origin)
        return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", q->cors_origin);
    if (strcmp(q->cors_origin, "*"))
        MHD_add_response_header(r, "Vary", "Origin");
    MHD_add_response_header(r, "Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
}

/* Access-Control-Request-Headers is echoed when it is a plain list of
 * header names (the openai SDKs send a dozen X-Stainless-* headers). */
static bool header_list_ok(const char *s)
{
    if (strlen(s) > 1024)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '-' || *s == '_' || *s == ',' || *s == ' '))
            return false;
    return true;
}

/* ---- responses ---- */

static enum MHD_Result respond(struct req *q, struct MHD_Connection *conn, int status,
                               const char *ctype, char *body, const struct oai_error *e)
{
    if (!body)
        return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body,
                                                             MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    add_cors(q, r);
    if (q->id[0])
        MHD_add_response_header(r, "X-Request-Id", q->id);
    if (q->oreq.ignored[0])
        MHD_add_response_header(r, "X-Redlm-Ignored-Fields", q->oreq.ignored);
    if (e && e->retry_after_s > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", e->retry_after_s);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    if (status == 401)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (q->close_after)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    if (status == 405 && q->allow)
        MHD_add_response_header(r, "Allow", q->allow);
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    q->responded = true;
    q->status = status;
    return rc;
}

static enum MHD_Result respond_error(struct req *q, struct MHD_Connection *conn,
                                     const struct oai_error *e)
{
    if (e->status >= 500)
        RL_LOG(q->h->log, RL_LOG_WARN, "http: %s %d %s: %s", q->id[0] ? q->id : "-", e->status,
               e->code, e->message);
    return respond(q, conn, e->status, "application/json",
                   route_error_json(q->route, e), e);
}

/* 413 for a body past max_body_kb (read on to its end, refused here). */
static enum MHD_Result refuse_too_big(struct req *q, struct MHD_Connection *conn)
{
    struct oai_error e;
    oai_error_set(&e, 413, "invalid_request_error", ev_code_name(EV_CODE_JOB_TOO_LARGE), NULL,
                  "body: over the limit of %zu bytes", q->h->lim.max_body_bytes);
    return respond_error(q, conn, &e);
}

/* ---- the job's events ---- */

/* What the client's socket says while we wait. A reset (or a FIN after
 * which our bytes met a reset) is a client gone. A FIN alone is not: a
 * client may half-close (shutdown(SHUT_WR)) once its request is sent and
 * still read the answer, and TCP cannot tell that from a close() until we
 * write; so a FIN makes the caller commit its answer and probe (pump). */
enum client { C_HERE, C_FIN, C_GONE };
static enum client client_state(int fd)
{
    if (fd < 0)
        return C_HERE;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return C_HERE;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL))
        return C_GONE;
    if (p.revents & POLLRDHUP)
        return C_FIN;
    if (p.revents & POLLIN) { /* data is a pipelined request; EOF is a FIN */
        char c;
        return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0 ? C_FIN : C_HERE;
    }
    return C_HERE;
}

/* The id of choice i's job: the request's id, or "<id>-<i>" when it has
 * several choices (openai.h). */
static void sub_id(const struct req *q, int i, char out[JOB_ID_MAX + 1])
{
    if (q->oreq.n_jobs > 1)
        snprintf(out, JOB_ID_MAX + 1, "%.100s-%d", q->id, i);
    else
        snprintf(out, JOB_ID_MAX + 1, "%s", q->id);
}

static void cancel_job(struct req *q, const char *why)
{
    struct dhttp *h = q->h;
    char key[320];
    struct rl_err err = {0};
    struct rconn *c = q->rc ? q->rc : pool_get(h, &err);
    int rc = c ? 0 : -RL_EIO;
    /* the choice being read and those after it (the earlier ones ended) */
    int n = q->oreq.n_jobs > 1 ? q->oreq.n_jobs : 1;
    for (int i = q->sub; i < n && c; i++) {
        char jid[JOB_ID_MAX + 1];
        sub_id(q, i, jid);
        rcl_tagged_key(key, sizeof key, rconn_is_cluster(c), h->prefix, "cancel:", jid);
        const char *argv[] = {"SET", key, "1", "EX", CANCEL_TTL_S};
        int r1 = rconn_command(c, 5, argv, NULL, NULL, &err);
        if (r1) /* one retry: the request's connection may have been mid-read */
            r1 = rconn_command(c, 5, argv, NULL, NULL, &err);
        rc = rc ? rc : r1;
    }
    if (c != q->rc)
        pool_put(h, c);
    if (rc)
        RL_LOG(h->log, RL_LOG_ERROR, "http: %s: cannot cancel: %s", q->id, err.msg);
    else
        RL_LOG(h->log, RL_LOG_INFO, "http: %s: job cancelled: %s", q->id, why);
    q->job_ended = true;
}

/* A request with fields accepted but not applied (http_unknown_fields =
 * ignore): one line per IGNORED_LOG_MS at most, so that a client sending
 * them with every request cannot flood the log; the line counts the
 * requests since the last one. */
static void log_ignored(struct dhttp *h, const struct req *q)
{
    int64_t now = rl_mono_ms(), more = 0;
    bool log = false;
    pthread_mutex_lock(&h->m_mu);
    if (!h->ignored_logged_ms || now - h->ignored_logged_ms >= IGNORED_LOG_MS) {
        log = true;
        more = h->ignored_unlogged;
        h->ignored_unlogged = 0;
        h->ignored_logged_ms = now;
    } else {
        h->ignored_unlogged++;
    }
    pthread_mutex_unlock(&h->m_mu);
    if (log)
        RL_LOG(h->log, RL_LOG_WARN,
               "http: %s: fields accepted but not applied: %s (%lld more such requests since "
               "the last line; http_unknown_fields = refuse refuses them)",
               q->id, q->oreq.ignored, (long long)more);
}

/* The answer's formatter: openai.c's, compat.c's for the Responses and
 * Ollama's chat APIs, embed.c's for the embedding routes, rerank.c's for
 * the rerank and score routes. */
static int64_t resp_tokens(const struct req *q)
{
    return q->embed    ? emb_resp_total_tokens(q->eresp)
           : q->rerank ? rr_resp_total_tokens(q->rresp)
           : q->compat ? cpt_resp_total_tokens(q->cresp)
                       : oai_resp_total_tokens(q->resp);
}

static int resp_stream_error(struct req *q)
{
    if (q->embed || q->rerank) /* never streamed; an answer committed early ends in the
                                  error object */
        return 0;
    return q->compat ? cpt_stream_error(q->cresp, &q->err, &q->sse)
                     : oai_sse_error(&q->err, &q->sse);
}

static char *resp_body(const struct req *q)
{
    if (q->embed) /* Ollama's total_duration: from the first XADD */
        return emb_resp_body(q->eresp, rl_mono_ms() - q->t_xadd_ms);
    if (q->rerank)
        return rr_resp_body(q->rresp);
    return q->compat ? cpt_resp_body(q->cresp) : oai_resp_completion(q->resp);
}

static char *error_body(const struct req *q, const struct oai_error *e)
{
    return route_error_json(q->route, e);
}

/* Adds prompt + completion tokens to the tenant's current minute. */
/* n tokens onto the tenant's count of this minute. */
static void charge(struct req *q, int64_t n)
{
    if (!q->has_tenant || !q->tpm || n <= 0)
        return;
    char key[320], num[24];
    /* in a cluster a tenant's counters share its slot: rate_limit's MULTI
     * touches both */
    snprintf(key, sizeof key, rconn_is_cluster(q->rc) ? "%sratelimit:{%s}:tpm:%lld"
                                                      : "%sratelimit:%s:tpm:%lld",
             q->h->prefix, q->tenant, (long long)(rl_wall_ms() / 60000));
    snprintf(num, sizeof num, "%lld", (long long)n);
    const char *a1[] = {"INCRBY", key, num};
    const char *a2[] = {"EXPIRE", key, RL_WINDOW_TTL_S};
    struct rl_err err = {0};
    if (rconn_command(q->rc, 3, a1, NULL, NULL, &err) ||
        rconn_command(q->rc, 3, a2, NULL, NULL, &err))
        RL_LOG(q->h->log, RL_LOG_WARN, "http: %s: tokens not charged to %s: %s", q->id,
               q->tenant, err.msg);
}

/* The answer's tokens, once it ended: a background response's were
 * charged when it was queued (charge_budget). */
static void charge_tokens(struct req *q)
{
    if (!q->creq.background)
        charge(q, resp_tokens(q));
}

/* A background response: its output budget (the job's max_tokens, else
 * http_max_tokens) charged when it is queued, as OpenAI's limits count
 * max_tokens up front: its tokens are counted whether or not it is ever
 * read back. */
static void charge_budget(struct req *q)
{
    cJSON *job = cJSON_ParseWithLength(q->oreq.job, q->oreq.job_len);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(job, "max_tokens");
    charge(q, cJSON_IsNumber(mt) ? (int64_t)mt->valuedouble : q->h->lim.max_tokens);
    cJSON_Delete(job);
}

/* The request leaves the vLLM gauges; done: its done event (NULL: it
 * ended otherwise, counted as abort). */
static void vm_end(struct req *q, const char *event, size_t len)
{
    if (q->vm == VM_NONE)
        return;
    cJSON *ev = event ? cJSON_ParseWithLength(event, len) : NULL;
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(ev, "usage");
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(ev, "finish_reason");
    vm_done(q->h->vm, q->vm_model, (double)(rl_mono_ms() - q->t_xadd_ms) / 1000,
            cJSON_IsNumber(pt) ? (int64_t)pt->valuedouble : 0,
            cJSON_IsNumber(ct) ? (int64_t)ct->valuedouble : 0,
            cJSON_IsString(fr) ? fr->valuestring : "abort");
    cJSON_Delete(ev);
    vm_move(q->h->vm, q->vm_model, q->vm, VM_NONE);
    q->vm = VM_NONE;
}

/* Whose stored responses a request may use: its API key's tenant, or
 * everyone's ("") on a door without keys. */
static const char *owner_of(const struct req *q)
{
    return q->has_tenant ? q->tenant : "";
}

/* The store of conversations as request q sees it (convo.h). */
static struct cnv_store conv_store(const struct req *q)
{
    return (struct cnv_store){q->rc, q->h->prefix, owner_of(q), q->h->conv_ttl_s,
                              q->h->store_max};
}

/* A response of conversation conv: the input items its request added (a
 * JSON array, or NULL and in, which holds the conversation's n_prior items
 * first) and the output items of its object obj added to the conversation
 * (convo.h). A conversation deleted meanwhile, or a Redis that refuses,
 * costs the conversation this turn: said in the log and counted. */
static void add_turn(struct req *q, const char *conv, const char *turn, const char *in,
                     int n_prior, const char *obj)
{
    struct dhttp *h = q->h;
    cJSON *o = obj ? cJSON_Parse(obj) : NULL;
    cJSON *items = turn ? cJSON_Parse(turn) : in ? cJSON_Parse(in) : cJSON_CreateArray();
    cJSON *out = cJSON_DetachItemFromObjectCaseSensitive(o, "output");
    struct rl_err err = {0};
    int rc = cJSON_IsArray(items) && cJSON_IsArray(out) ? 0
                                                        : rl_errf(&err, RL_ENOMEM, "out of memory");
    for (int i = 0; !rc && !turn && i < n_prior && cJSON_GetArraySize(items); i++)
        cJSON_DeleteItemFromArray(items, 0); /* the conversation's own */
    cJSON *it;
    while (!rc && (it = cJSON_DetachItemFromArray(out, 0)))
        cJSON_AddItemToArray(items, it);
    char *text = !rc ? cJSON_PrintUnformatted(items) : NULL;
    if (!rc && !text)
        rc = rl_errf(&err, RL_ENOMEM, "out of memory");
    struct cnv_store s = conv_store(q);
    if (!rc)
        rc = cnv_append(&s, conv, text, &err);
    if (rc == 1)
        rl_errf(&err, RL_EINVAL, "it was deleted or expired meanwhile");
    free(text);
    cJSON_Delete(out);
    cJSON_Delete(items);
    cJSON_Delete(o);
    if (!rc)
        return;
    pthread_mutex_lock(&h->m_mu);
    h->m.conv_failed++;
    pthread_mutex_unlock(&h->m_mu);
    RL_LOG(h->log, RL_LOG_WARN, "http: %s: not added to conversation %s "
           "(redlm_http_conversation_failures_total counts them): %s", q->id, conv, err.msg);
}

/* A Responses answer with store, kept (rstore.h) before its last byte goes
 * out: the response object of that byte is in q->sse, not yet sent, so a
 * client that chains at once finds it. A Redis that refuses (full: OOM)
 * costs the client only the chaining, and is said in the log. */
static void store_response(struct req *q)
{
    struct dhttp *h = q->h;
    if (q->creq.conversation[0]) { /* before its last byte, store or not, as OpenAI's */
        char *now = cpt_resp_object(q->cresp);
        add_turn(q, q->creq.conversation, NULL, q->creq.input, q->n_prior, now);
        free(now);
    }
    char *obj = cpt_resp_stored(q->cresp);
    if (!obj)
        return; /* not the Responses API, or store false */
    struct rst_record *rec = NULL;
    struct rl_err err = {0};
    struct rst_origin from = {q->n_prior, q->chain, q->creq.conversation};
    int rc = rst_new(owner_of(q), q->id, q->creq.input ? q->creq.input : "[]", &from, obj, NULL,
                     &rec);
    if (rc)
        rl_errf(&err, -rc, "out of memory");
    else
        rc = rst_put(q->rc, h->prefix, q->id, rec, h->store_ttl_s, &err);
    rst_free(rec);
    free(obj);
    if (!rc) {
        BUMP(h, stored);
        return;
    }
    /* a full Redis refuses every one: a line per IGNORED_LOG_MS, the
     * counter has them all */
    int64_t now = rl_mono_ms();
    pthread_mutex_lock(&h->m_mu);
    h->m.store_failed++;
    bool say = now - h->store_logged_ms >= IGNORED_LOG_MS;
    if (say)
        h->store_logged_ms = now;
    pthread_mutex_unlock(&h->m_mu);
    if (say)
        RL_LOG(h->log, RL_LOG_WARN, "http: %s: the response is not stored (previous_response_id "
               "will not find it; redlm_http_responses_store_failures_total counts them): %s",
               q->id, err.msg);
}

/* Feeds the entries of one XREAD reply. */
static int take_events(struct req *q, const struct rconn_reply *r)
{
    if (!r || r->type != RCONN_ARRAY || r->n_elem < 1) /* NULL: the shared reader's timeout */
        return 0;
    const struct rconn_reply *s = &r->elem[0];
    if (s->type != RCONN_ARRAY || s->n_elem != 2 || s->elem[1].type != RCONN_ARRAY)
        return -RL_EFORMAT;
    const struct rconn_reply *es = &s->elem[1];
    for (size_t i = 0; i < es->n_elem && !q->finished && !q->failed; i++) {
        const struct rconn_reply *en = &es->elem[i];
        if (en->type != RCONN_ARRAY || en->n_elem != 2 || en->elem[0].type != RCONN_STRING)
            return -RL_EFORMAT;
        snprintf(q->last, sizeof q->last, "%s", en->elem[0].str);
        const struct rconn_reply *f = &en->elem[1];
        const char *ev = NULL;
        size_t ev_len = 0;
        for (size_t k = 0; f->type == RCONN_ARRAY && k + 1 < f->n_elem; k += 2)
            if (f->elem[k].str && !strcmp(f->elem[k].str, "event")) {
                ev = f->elem[k + 1].str;
                ev_len = f->elem[k + 1].len;
            }
        if (!q->first_seen) {
            q->first_seen = true;
            double ms = (double)(rl_mono_ms() - q->t_xadd_ms);
            observe_first_event(q->h, ms);
            vm_first_token(q->h->vm, q->vm_model, ms / 1000);
            vm_move(q->h->vm, q->vm_model, q->vm, VM_RUNNING);
            q->vm = VM_RUNNING;
        }
        size_t before = q->sse.n;
        int rc = q->embed    ? emb_resp_feed(q->eresp, ev, ev_len, &q->err)
                 : q->rerank ? rr_resp_feed(q->rresp, ev, ev_len, &q->err)
                 : q->compat ? cpt_resp_feed(q->cresp, ev, ev_len, &q->sse, &q->err)
                             : oai_resp_feed(q->resp, ev, ev_len, &q->sse, &q->err);
        if (rc < 0)
            return rc;
        if (q->sse.n > before)
            BUMP(q->h, sse_events);
        if (rc == OAI_NEXT) {
            /* the next choice's job: its stream from the start (the rest
             * of this reply, if any, is the finished one's) */
            char jid[JOB_ID_MAX + 1];
            sub_id(q, ++q->sub, jid);
            rcl_tagged_key(q->out_key, sizeof q->out_key, rconn_is_cluster(q->rc), q->h->prefix,
                           "out:", jid);
            snprintf(q->last, sizeof q->last, "0-0");
            return 0;
        }
        if (rc == OAI_END || rc == OAI_FAILED)
            vm_end(q, rc == OAI_END ? ev : NULL, ev_len);
        if (rc == OAI_END) {
            q->job_ended = q->finished = true;
            charge_tokens(q);
            if (q->compat && !q->resumed)
                store_response(q);
        } else if (rc == OAI_FAILED) {
            q->job_ended = true;
            if (q->oreq.stream && (q->headers_sent || q->sse.n > q->sse_off)) {
                /* bytes are out (or about to be): the error is a chunk */
                resp_stream_error(q);
                q->finished = true;
            } else {
                q->failed = true;
            }
        }
    }
    return 0;
}

/* The shared reader (NULL: the request reads its stream on its own
 * connection). Made on first use, when Redis is known to be reachable and
 * whether it is a cluster; a failure to reach it is tried again a second
 * later, not by every request of an outage. */
static struct xmux_set *shared_reader(struct dhttp *h)
{
    pthread_mutex_lock(&h->mux_mu);
    int64_t now = rl_mono_ms();
    if (!h->mux && !h->mux_off && h->shared_reader && now - h->mux_tried_ms >= 1000) {
        struct rl_err e = {0}, note;
        h->mux_tried_ms = now;
        int rc = xmux_set_create(&h->mux, &h->ropts, h->prefix, true, &note, &e);
        h->mux_bell = rc == 0 && !note.code;
        if (!rc && note.code)
            RL_LOG(h->log, RL_LOG_INFO, "http: the shared reader blocks on every stream, "
                   "not on the bell: %s", note.msg);
        if (rc == -RL_EUNSUPPORTED) {
            h->mux_off = true;
            RL_LOG(h->log, RL_LOG_INFO, "http: every request reads its own event stream: %s",
                   e.msg);
        } else if (rc) {
            RL_LOG(h->log, RL_LOG_DEBUG, "http: the shared reader: %s (tried again in 1 s)",
                   e.msg);
        }
    }
    struct xmux_stats st;
    if (h->mux && h->mux_bell && (xmux_set_stats(h->mux, &st), !st.bell_on)) {
        h->mux_bell = false;
        RL_LOG(h->log, RL_LOG_WARN, "http: a stream was written without ringing %.128sbell "
               "(a worker or dispatcher from before it, or an ACL that does not let it): "
               "the shared reader blocks on every stream from now on", h->prefix);
    }
    struct xmux_set *m = h->mux;
    pthread_mutex_unlock(&h->mux_mu);
    return m;
}

enum pump { P_OK = 0, P_GONE = -1, P_STOPPING = -2, P_TIMEOUT = -3, P_NOMEM = -4, P_FIN = -5 };

/* Bytes that change nothing for the client: an SSE comment in a stream,
 * JSON whitespace before a non-streamed body. */
static int put_filler(struct req *q)
{
    if (q->oreq.stream && q->compat)
        return cpt_keepalive(q->cresp, &q->sse);
    return q->oreq.stream ? text_add(&q->sse, ": keep-alive\n\n", 14) : text_add(&q->sse, "\n", 1);
}

/* Reads events until there is something to deliver: in stream mode any
 * new bytes, or the end; otherwise the end (or, once committed early, the
 * probes). Blocks at most POLL_MS per XREAD, looking at the client's
 * socket, the deadline and shutdown in between. A client's FIN before the
 * response is committed returns P_FIN: the caller commits it at once (a
 * 200 and its headers), and from then on a byte goes out every PROBE_MS
 * of silence, so that a client that closed for good shows as gone (its
 * host answers our bytes with a reset) while one that only half-closed
 * reads its answer. Returns an enum pump. */
static int pump(struct req *q)
{
    struct dhttp *h = q->h;
    const char *argv[] = {"XREAD", "COUNT", "512", "BLOCK", h->block, "STREAMS", q->out_key, q->last};
    for (;;) {
        bool have = q->finished || q->failed || q->sse.n > q->sse_off;
        if (have)
            return P_OK;
        if (atomic_load(&h->stopping))
            return P_STOPPING;
        enum client cs = client_state(q->fd);
        if (cs == C_GONE)
            return P_GONE;
        if (cs == C_FIN && !q->half_closed) {
            q->half_closed = true;
            RL_LOG(h->log, RL_LOG_DEBUG, "http: %s: the client sent FIN; answering it, probing",
                   q->id);
            if (!q->headers_sent)
                return P_FIN;
        }
        int64_t now = rl_mono_ms();
        if (q->give_up_ms && now > q->give_up_ms)
            return P_TIMEOUT;
        if (q->headers_sent && now - q->t_last_byte_ms >
                                   (q->half_closed ? PROBE_MS : q->oreq.stream ? KEEPALIVE_MS
                                                                               : INT64_MAX / 2)) {
            /* clients skip it; proxies see the stream alive; a gone client
             * answers it with a reset */
            if (put_filler(q))
                return P_NOMEM;
            continue;
        }
        struct rconn_reply *r = NULL;
        struct rl_err err = {0};
        struct xmux_set *m = q->xs ? NULL : shared_reader(h);
        if (m && xmux_set_sub(m, q->out_key, q->last, 0, &q->xs, &err))
            q->xs = NULL; /* out of memory: this read on our own connection */
        argv[7] = q->last;
        int rc = q->xs ? xmux_next(q->xs, atoi(h->block), &r, &err)
                       : rconn_command(q->rc, 8, argv, NULL, &r, &err);
        if (rc) {
            rconn_reply_free(r);
            if (!q->read_warned) /* once: an outage must not flood the log */
                RL_LOG(h->log, RL_LOG_WARN, "http: %s: reading events: %s (retrying)", q->id,
                       err.msg);
            q->read_warned = true;
            int64_t wait = rconn_retry_in_ms(q->rc);
            usleep((useconds_t)(wait > 0 && wait < POLL_MS ? wait : 50) * 1000);
            continue;
        }
        rc = take_events(q, r);
        rconn_reply_free(r);
        if (q->xs && strcmp(xmux_sub_key(q->xs), q->out_key)) {
            xmux_unsub(q->xs); /* the next choice's stream: subscribed at the next read */
            q->xs = NULL;
        }
        if (rc == -RL_ENOMEM)
            return P_NOMEM;
        if (rc) {
            oai_error_set(&q->err, 502, "server_error", "BAD_EVENT", NULL,
                          "the job's event stream is malformed");
            q->failed = !(q->oreq.stream && q->headers_sent);
            if (!q->failed) {
                resp_stream_error(q);
                q->finished = true;
            }
        }
    }
}

/* A non-streamed answer committed early (the client's FIN): once the job
 * ended, its JSON (the completion, or the error object: the status is
 * already 200, as S3 does when it must commit before it knows) follows the
 * whitespace probes. */
static int put_tail(struct req *q)
{
    if (q->oreq.stream || q->tail_added || !(q->finished || q->failed))
        return 0;
    char *body = q->failed ? error_body(q, &q->err) : resp_body(q);
    int rc = body ? text_add(&q->sse, body, strlen(body)) : -RL_ENOMEM;
    free(body);
    q->tail_added = q->finished = true;
    q->failed = false;
    return rc;
}

/* libmicrohttpd's reader for a streamed response (and for a non-streamed
 * one committed early): hands over what is produced, blocking on the next
 * event only when nothing is. */
static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct req *q = cls;
    for (;;) {
        if (put_tail(q))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (q->sse_off < q->sse.n) {
            size_t k = q->sse.n - q->sse_off;
            if (k > max)
                k = max;
            memcpy(buf, q->sse.p + q->sse_off, k);
            q->sse_off += k;
            if (q->sse_off == q->sse.n)
                q->sse.n = q->sse_off = 0; /* keep the memory, drop the bytes */
            q->t_last_byte_ms = rl_mono_ms();
            return (ssize_t)k;
        }
        if (q->finished)
            return MHD_CONTENT_READER_END_OF_STREAM;
        int rc = pump(q);
        if (rc == P_TIMEOUT) {
            oai_error_set(&q->err, 504, "server_error",
                          ev_code_name(EV_CODE_DEADLINE_EXCEEDED), NULL,
                          "no answer within http_timeout_s");
            if (!q->job_ended)
                cancel_job(q, "http_timeout_s passed");
            if (q->oreq.stream) {
                resp_stream_error(q);
                q->finished = true;
            } else {
                q->failed = true;
            }
        } else if (rc != P_OK) {
            if (!q->job_ended) {
                cancel_job(q, rc == P_GONE ? "the client left" : "shutting down");
                if (rc == P_GONE)
                    BUMP(q->h, client_cancels);
            }
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

/* ---- routes ---- */

/* <prefix><24 random hex digits>; on a cluster, then six letters that put
 * it on one of the request slots (common/rcluster.h), a random one, so
 * that workers write, and the shared readers read, the requests of one
 * master in one call each */
static void new_id(struct dhttp *h, char out[64], const char *prefix)
{
    unsigned char r[13];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        uint64_t t = (uint64_t)rl_wall_ms() ^ ((uint64_t)getpid() << 32);
        memcpy(r, &t, 8);
        memcpy(r + 8, &t, 5);
    }
    int n = snprintf(out, 64, "%s", prefix);
    for (int i = 0; i < 12; i++)
        n += snprintf(out + n, 64 - (size_t)n, "%02x", r[i]);
    const int *slots;
    struct xmux_set *m = shared_reader(h);
    int n_slots = m ? xmux_set_slots(m, &slots) : 0;
    if (n_slots && n + RCL_SLOT_FILL_LEN < 64) {
        out[n + RCL_SLOT_FILL_LEN] = 0;
        rcl_slot_fill(out, (size_t)(n + RCL_SLOT_FILL_LEN), (size_t)n, slots[r[12] % n_slots]);
    }
}

static int rate_limit(struct req *q, struct oai_error *e)
{
    struct dhttp *h = q->h;
    if (!q->has_tenant || (!q->rpm && !q->tpm))
        return 0;
    int64_t now = rl_wall_ms();
    long long minute = (long long)(now / 60000);
    int retry = (int)(60 - (now / 1000) % 60);
    char rk[320], tk[320];
    bool cl = rconn_ensure(q->rc, NULL) == 0 && rconn_is_cluster(q->rc);
    snprintf(rk, sizeof rk, cl ? "%sratelimit:{%s}:rpm:%lld" : "%sratelimit:%s:rpm:%lld",
             h->prefix, q->tenant, minute);
    snprintf(tk, sizeof tk, cl ? "%sratelimit:{%s}:tpm:%lld" : "%sratelimit:%s:tpm:%lld",
             h->prefix, q->tenant, minute);
    const char *multi[] = {"MULTI"}, *incr[] = {"INCR", rk},
               *exp[] = {"EXPIRE", rk, RL_WINDOW_TTL_S}, *get[] = {"GET", tk},
               *exec[] = {"EXEC"};
    struct rconn_batch *b = NULL;
    struct rl_err err = {0};
    int rc = rconn_batch_create(&b, &err);
    if (!rc)
        rc = rconn_batch_add(b, 1, multi, NULL, &err);
    if (!rc)
        rc = rconn_batch_add(b, 2, incr, NULL, &err);
    if (!rc)
        rc = rconn_batch_add(b, 3, exp, NULL, &err);
    if (!rc)
        rc = rconn_batch_add(b, 2, get, NULL, &err);
    if (!rc)
        rc = rconn_batch_add(b, 1, exec, NULL, &err);
    if (!rc)
        rc = rconn_batch_exec(q->rc, b, &err);
    const struct rconn_reply *x = rc ? NULL : rconn_batch_reply(b, 4);
    if (!x || x->type != RCONN_ARRAY || x->n_elem != 3 || x->elem[0].type != RCONN_INTEGER) {
        rconn_batch_free(b);
        oai_error_set(e, 503, "server_error", "REDIS_UNAVAILABLE", NULL,
                      "the rate limiter cannot reach Redis");
        e->retry_after_s = 1;
        RL_LOG(h->log, RL_LOG_ERROR, "http: rate limit for %s: %s", q->tenant,
               rc ? err.msg : "unexpected EXEC reply");
        return -1;
    }
    long long n_req = x->elem[0].integer;
    long long n_tok = x->elem[2].type == RCONN_STRING ? atoll(x->elem[2].str) : 0;
    rconn_batch_free(b);
    if (q->rpm && n_req > q->rpm) {
        oai_error_set(e, 429, "requests", "rate_limit_exceeded", NULL,
                      "Rate limit reached for %s: %lld requests per minute. Retry in %d s.",
                      q->tenant, (long long)q->rpm, retry);
        e->retry_after_s = retry;
    } else if (q->tpm && n_tok >= q->tpm) {
        oai_error_set(e, 429, "tokens", "rate_limit_exceeded", NULL,
                      "Rate limit reached for %s: %lld tokens per minute (used %lld). Retry in %d s.",
                      q->tenant, (long long)q->tpm, n_tok, retry);
        e->retry_after_s = retry;
    } else {
        return 0;
    }
    BUMP(h, rate_limited);
    return -1;
}

/* The served models as a parsed array: the one served_model_name, or the
 * dispatcher's table of what live workers serve. NULL when out of memory. */
static cJSON *served_models(struct dhttp *h)
{
    if (h->model[0]) {
        cJSON *a = cJSON_CreateArray(), *o = cJSON_CreateObject();
        if (!a || !o) {
            cJSON_Delete(a);
            cJSON_Delete(o);
            return NULL;
        }
        cJSON_AddStringToObject(o, "id", h->model);
        cJSON_AddStringToObject(o, "object", "model");
        cJSON_AddNumberToObject(o, "created", (double)h->started_s);
        cJSON_AddStringToObject(o, "owned_by", "redlm");
        cJSON_AddItemToArray(a, o);
        /* the dispatcher's entry of the same name knows its workers'
         * context and what their weights are */
        char *t = h->hooks.models_json ? h->hooks.models_json(h->hooks.ctx) : NULL;
        cJSON *all = t ? cJSON_Parse(t) : NULL;
        free(t);
        const cJSON *m;
        cJSON_ArrayForEach(m, all)
        {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "id");
            if (!cJSON_IsString(id) || strcmp(id->valuestring, h->model))
                continue;
            const cJSON *ml = cJSON_GetObjectItemCaseSensitive(m, "max_model_len");
            const cJSON *det = cJSON_GetObjectItemCaseSensitive(m, "details");
            if (cJSON_IsNumber(ml))
                cJSON_AddNumberToObject(o, "max_model_len", ml->valuedouble);
            if (cJSON_IsObject(det))
                cJSON_AddItemToObject(o, "details", cJSON_Duplicate(det, 1));
        }
        /* the workers' LoRA adapters are served too, as adapters of the one
         * name this door shows: their parent is said to be it */
        cJSON_ArrayForEach(m, all)
        {
            const cJSON *parent = cJSON_GetObjectItemCaseSensitive(m, "parent");
            cJSON *x = cJSON_IsString(parent) ? cJSON_Duplicate(m, 1) : NULL;
            if (!x)
                continue;
            cJSON_ReplaceItemInObjectCaseSensitive(x, "parent", cJSON_CreateString(h->model));
            cJSON_AddItemToArray(a, x);
        }
        cJSON_Delete(all);
        return a;
    }
    char *s = h->hooks.models_json ? h->hooks.models_json(h->hooks.ctx) : NULL;
    cJSON *a = s ? cJSON_Parse(s) : cJSON_CreateArray();
    free(s);
    return a;
}

/* The model object named id in the array a, or NULL. */
static const cJSON *model_in(const cJSON *a, const char *id)
{
    const cJSON *m;
    cJSON_ArrayForEach(m, a) {
        const cJSON *i = cJSON_GetObjectItemCaseSensitive(m, "id");
        if (cJSON_IsString(i) && !strcmp(i->valuestring, id))
            return m;
    }
    return NULL;
}

/* "`a`, `b`" of the served names (or "no model: no worker is serving"). */
static void served_names(const cJSON *a, char *buf, size_t size)
{
    buf[0] = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, a) {
        const cJSON *i = cJSON_GetObjectItemCaseSensitive(m, "id");
        size_t used = strlen(buf);
        if (cJSON_IsString(i))
            snprintf(buf + used, size - used, "%s`%s`", used ? ", " : "", i->valuestring);
    }
    if (!buf[0])
        snprintf(buf, size, "no model (no live worker announces one)");
}

/* 404 model_not_found for id, naming what is served. */
static void model_not_found(const cJSON *a, const char *id, struct oai_error *e)
{
    char names[1024];
    served_names(a, names, sizeof names);
    oai_error_set(e, 404, "invalid_request_error", "model_not_found", "model",
                  "The model `%.200s` does not exist; this server serves %s.", id, names);
}

/* ---- client leases ----
 *
 * A job queued by the front door names client_lease_ms; its key
 * <prefix>lease:<id> (SET PX at queueing) is renewed every third of that by
 * the lease thread for as long as its request is in the list, however
 * slowly its client reads. A worker cancels a job whose lease has been
 * gone a whole lease period (publish.c): kill -9 of this process, or its
 * host lost, stops the renewals and so the jobs its clients were waiting
 * for, instead of leaving them to run to max_tokens or their deadline. */

static void lease_add(struct req *q)
{
    struct dhttp *h = q->h;
    pthread_mutex_lock(&h->lease_mu);
    q->lease_prev = NULL;
    q->lease_next = h->leases;
    if (h->leases)
        h->leases->lease_prev = q;
    h->leases = q;
    q->in_lease = true;
    pthread_mutex_unlock(&h->lease_mu);
}

static void lease_del(struct req *q)
{
    struct dhttp *h = q->h;
    if (!q->in_lease)
        return;
    pthread_mutex_lock(&h->lease_mu);
    if (q->lease_prev)
        q->lease_prev->lease_next = q->lease_next;
    else
        h->leases = q->lease_next;
    if (q->lease_next)
        q->lease_next->lease_prev = q->lease_prev;
    q->in_lease = false;
    pthread_mutex_unlock(&h->lease_mu);
}

static void *lease_main(void *arg)
{
    struct dhttp *h = arg;
    struct rconn_opts o = h->ropts;
    o.client_name = "redlm-http-lease";
    struct rconn *c = NULL;
    struct rconn_batch *b = NULL;
    struct rl_err err = {0};
    char (*keys)[320] = NULL;
    int cap = 0;
    bool warned = false;
    if (rconn_create(&c, &o, &err) || rconn_batch_create(&b, &err)) {
        RL_LOG(h->log, RL_LOG_ERROR, "http: no client lease renewals: %s", err.msg);
        goto out;
    }
    char ms[16];
    snprintf(ms, sizeof ms, "%d", h->lease_ms);
    int64_t next = 0;
    while (!atomic_load(&h->stopping)) {
        usleep(50 * 1000);
        int64_t now = rl_mono_ms();
        if (now < next)
            continue;
        next = now + h->lease_ms / 3;
        int n = 0;
        pthread_mutex_lock(&h->lease_mu);
        for (struct req *q = h->leases; q; q = q->lease_next)
            n += 1 + q->n_more_leases;
        if (n > cap) {
            void *more = realloc(keys, (size_t)n * 2 * sizeof *keys);
            if (more) {
                keys = more;
                cap = n * 2;
            }
        }
        n = 0;
        for (struct req *q = h->leases; q && n < cap; q = q->lease_next) {
            memcpy(keys[n++], q->lease_key, sizeof keys[0]);
            for (int i = 0; i < q->n_more_leases && n < cap; i++)
                memcpy(keys[n++], q->more_leases[i], sizeof keys[0]);
        }
        pthread_mutex_unlock(&h->lease_mu);
        if (!n)
            continue;
        rconn_batch_reset(b);
        int rc = 0;
        for (int i = 0; i < n && !rc; i++) {
            const char *argv[] = {"SET", keys[i], "1", "PX", ms};
            rc = rconn_batch_add(b, 5, argv, NULL, &err);
        }
        if (!rc)
            rc = rconn_batch_exec(c, b, &err);
        if (rc) {
            if (!warned)
                RL_LOG(h->log, RL_LOG_WARN, "http: renewing %d client leases: %s (retrying)", n,
                       err.msg);
            warned = true;
            int64_t wait = rconn_retry_in_ms(c);
            next = now + (wait > 0 && wait < h->lease_ms / 3 ? wait : 100);
        } else if (warned) {
            RL_LOG(h->log, RL_LOG_INFO, "http: client leases renewed again (%d)", n);
            warned = false;
        }
    }
out:
    free(keys);
    rconn_batch_free(b);
    rconn_free(c);
    return NULL;
}

/* The start of a job route's request ids: each API's own (OpenAI's
 * chatcmpl-, cmpl-, resp_; vLLM's embd-, rerank-, score-). */
static const char *id_prefix(enum route r)
{
    switch (r) {
    case R_COMPLETIONS: return "cmpl-";
    case R_RESPONSES: return "resp_";
    case R_ANTHROPIC: return "msg_";
    case R_OLLAMA_CHAT: case R_OLLAMA_GENERATE: return "ollama-";
    case R_EMBEDDINGS: case R_OLLAMA_EMBED: case R_OLLAMA_EMBEDDINGS: return "embd-";
    case R_RERANK: return "rerank-";
    case R_SCORE: return "score-";
    default: return "chatcmpl-";
    }
}

/* Whether the last entry of an XREVRANGE reply is a job's last event
 * (done or error). */
static bool last_is_end(const struct rconn_reply *x)
{
    const struct rconn_reply *f =
        x && x->type == RCONN_ARRAY && x->n_elem == 1 && x->elem[0].n_elem == 2
            ? &x->elem[0].elem[1] : NULL;
    bool end = false;
    for (size_t k = 0; f && f->type == RCONN_ARRAY && k + 1 < f->n_elem; k += 2) {
        if (!f->elem[k].str || strcmp(f->elem[k].str, "event"))
            continue;
        cJSON *ev = cJSON_ParseWithLength(f->elem[k + 1].str, f->elem[k + 1].len);
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ev, "type"));
        end = t && (!strcmp(t, "done") || !strcmp(t, "error"));
        cJSON_Delete(ev);
    }
    return end;
}

/* The answer of background response id made again from its record, to
 * be fed its job's events: the record's response object holds all that
 * the answer repeats (the request's fields, model, created_at). */
static int rebuild(const char *id, const struct rst_record *rec, bool stream,
                   struct cpt_resp **out, struct rl_err *err)
{
    *out = NULL;
    char *resp = rst_response(rec);
    const char *model = rst_response_string(rec, "model");
    struct rst_running run;
    struct cpt_request c = {.api = CPT_RESPONSES, .echo = resp, .store = true, .background = true,
                            .cancelled = rst_running(rec, &run) && run.cancel};
    int rc = !resp ? rl_errf(err, RL_ENOMEM, "response %s: out of memory", id)
                   : cpt_resp_create(out, &c, id, model ? model : "",
                                     (int64_t)rst_response_number(rec, "created_at") * 1000,
                                     stream, err);
    free(resp);
    return rc;
}

/* A running background response's answer as it stands, made again from
 * its record and its job's events (<prefix>out:<id>): *obj (malloc'd) and
 * whether they ended. The object carries its output only at the end, so a
 * poll of one still running reads two entries (the last, the first), not
 * the whole stream: a client that polls often costs Redis little. */
static int replay(struct req *q, const char *id, const struct rst_record *rec, char **obj,
                  bool *ended, struct rl_err *err)
{
    struct dhttp *h = q->h;
    *obj = NULL;
    *ended = false;
    struct cpt_resp *r = NULL;
    int rc = rebuild(id, rec, false, &r, err);
    char key[320];
    rcl_tagged_key(key, sizeof key, rconn_is_cluster(q->rc), h->prefix, "out:", id);
    const char *last[] = {"XREVRANGE", key, "+", "-", "COUNT", "1"};
    struct rconn_reply *x = NULL;
    if (!rc)
        rc = rconn_command(q->rc, 6, last, NULL, &x, err);
    bool end = !rc && last_is_end(x);
    rconn_reply_free(x);
    x = NULL;
    const char *argv[] = {"XRANGE", key, "-", "+", "COUNT", "1"};
    if (!rc)
        rc = rconn_command(q->rc, end ? 4 : 6, argv, NULL, &x, err);
    struct text junk = {0}; /* not a stream: nothing is written */
    for (size_t i = 0; !rc && !*ended && x && x->type == RCONN_ARRAY && i < x->n_elem; i++) {
        const struct rconn_reply *f = x->elem[i].n_elem == 2 ? &x->elem[i].elem[1] : NULL;
        for (size_t k = 0; f && f->type == RCONN_ARRAY && k + 1 < f->n_elem; k += 2) {
            if (!f->elem[k].str || strcmp(f->elem[k].str, "event"))
                continue;
            struct oai_error e;
            int fr = cpt_resp_feed(r, f->elem[k + 1].str, f->elem[k + 1].len, &junk, &e);
            if (fr < 0)
                rc = rl_errf(err, RL_ENOMEM, "out of memory");
            *ended = fr == OAI_END || fr == OAI_FAILED;
        }
    }
    text_free(&junk);
    rconn_reply_free(x);
    if (!rc && !(*obj = cpt_resp_object(r)))
        rc = rl_errf(err, RL_ENOMEM, "out of memory");
    cpt_resp_free(r);
    return rc;
}

/* A running background record brought up to date from its job's events
 * (replay): the answer as it stands into *obj (malloc'd; obj may be NULL),
 * and, once they ended, the record finished and written back, so that it
 * outlives its event stream. Returns 0 or a negative code with err. */
static int catch_up(struct req *q, const char *id, struct rst_record *rec, char **obj,
                    struct rl_err *err)
{
    char *now = NULL;
    bool ended = false, first = false;
    int rc = replay(q, id, rec, &now, &ended, err);
    if (!rc && ended && rst_update(rec, now, NULL))
        rc = rl_errf(err, RL_ENOMEM, "out of memory");
    if (!rc && ended)
        rc = rst_put_finished(q->rc, q->h->prefix, id, rec, q->h->store_ttl_s, &first, err);
    /* in a conversation: its turn added by the one read that finished its
     * record (at most once: a front door that dies in between costs the
     * conversation the turn), when it answered */
    const char *conv = !rc && first ? rst_conversation(rec) : NULL;
    const char *status = conv ? rst_response_string(rec, "status") : NULL; /* now's */
    if (status && (!strcmp(status, "completed") || !strcmp(status, "incomplete"))) {
        char *turn = rst_turn(rec);
        if (turn)
            add_turn(q, conv, turn, NULL, 0, now);
        free(turn);
    }
    if (!rc && obj) {
        *obj = now;
        now = NULL;
    }
    free(now);
    return rc;
}

/* The record of stored response id for this request's tenant (rst_get,
 * its TTL started again when ttl_s), a running background one brought up
 * to date (catch_up) with its answer as it stands in *obj (malloc'd; NULL
 * for a finished one, whose record's object is the answer; obj may be
 * NULL). Returns 0 and *rec, 1 when there is none, or a negative code
 * with err. */
static int stored_record(struct req *q, const char *id, int ttl_s, struct rst_record **rec,
                         char **obj, struct rl_err *err)
{
    if (obj)
        *obj = NULL;
    int rc = rst_get(q->rc, q->h->prefix, id, owner_of(q), ttl_s, rec, err);
    if (!rc && rst_running(*rec, NULL))
        rc = catch_up(q, id, *rec, obj, err);
    if (rc < 0) {
        rst_free(*rec);
        *rec = NULL;
    }
    return rc;
}

/* The context of stored response rec (id), made in a conversation: the
 * conversation's first items, as many as it had then, its turn and its
 * output, into *prior; the record the request writes is whole (q->chain
 * NULL). The conversation gone is 400 previous_response_not_found naming
 * it. Returns 0 or -RL_EINVAL with *e. */
static int conversation_prefix(struct req *q, const struct rst_record *rec, const char *id,
                               char **prior, struct oai_error *e)
{
    const char *conv = rst_conversation(rec);
    if (!q->h->conv_ttl_s) {
        oai_error_set(e, 400, "invalid_request_error", "previous_response_not_found",
                      "previous_response_id", "Previous response with id '%s' was made in "
                      "conversation '%.128s', and this server keeps no conversations "
                      "(conversation_ttl_s = 0)", id, conv);
        return -RL_EINVAL;
    }
    struct cnv_store s = conv_store(q);
    char *before = NULL;
    int n = 0;
    /* the items it had then (later ones, and any deleted since, aside) */
    if (cnv_context(&s, conv, rst_conversation_items(rec), &before, &n, e)) {
        if (e->status == 400) /* gone */
            oai_error_set(e, 400, "invalid_request_error", "previous_response_not_found",
                          "previous_response_id", "Previous response with id '%s' not found: "
                          "its conversation '%.128s' is no longer stored", id, conv);
        return -RL_EINVAL;
    }
    *prior = rst_continue_after(rec, before);
    free(before);
    q->n_prior = 0;
    if (!*prior) {
        oai_error_set(e, 500, "server_error", "INTERNAL", NULL, "out of memory");
        return -RL_EINVAL;
    }
    return 0;
}

/* The conversation a Responses body continues: its previous_response_id's
 * stored context (rst_continue) into *prior (malloc'd), NULL when it names
 * none, and the chain of the record this request will write into q. A name not found, or another tenant's, is 400
 * previous_response_not_found, as OpenAI answers (saying why when none are
 * kept); Redis's refusal is 503. Returns 0 or -RL_EINVAL with *e. */
static int previous_context(struct req *q, const struct cpt_peek *pk, char **prior,
                            struct oai_error *e)
{
    struct dhttp *h = q->h;
    const char *id = pk->previous_id;
    *prior = NULL;
    if (!pk->continues)
        return 0;
    if (!h->store_ttl_s) {
        oai_error_set(e, 400, "invalid_request_error", "previous_response_not_found",
                      "previous_response_id", "Previous response with id '%s' not found: this "
                      "server keeps no responses (responses_store_ttl_s = 0); send the whole "
                      "conversation in input", id);
        return -RL_EINVAL;
    }
    struct rl_err err = {0};
    struct rst_record *rec = NULL;
    int rc = !id[0] ? 1
             : !q->rc && !(q->rc = pool_get(h, &err))
                 ? -RL_EIO
                 : stored_record(q, id, h->store_ttl_s, &rec, NULL, &err);
    if (rc == 1) {
        oai_error_set(e, 400, "invalid_request_error", "previous_response_not_found",
                      "previous_response_id", "Previous response with id '%s' not found.", id);
        return -RL_EINVAL;
    }
    if (!rc && rst_running(rec, NULL)) {
        rst_free(rec);
        oai_error_set(e, 400, "invalid_request_error", "BAD_VALUE", "previous_response_id",
                      "Previous response with id '%s' has not finished (a background response "
                      "still running): poll GET /v1/responses/%s until it has", id, id);
        return -RL_EINVAL;
    }
    if (!rc && rst_conversation(rec)) {
        /* made in a conversation: its context is the conversation's items
         * then, its turn and output after; the record this request writes
         * holds all of it (no chain: a chain's records hold their turns) */
        int r2 = conversation_prefix(q, rec, id, prior, e);
        rst_free(rec);
        return r2;
    }
    char missing[RST_ID_MAX + 1] = "";
    if (!rc)
        rc = rst_load_chain(q->rc, h->prefix, rec, owner_of(q), h->store_ttl_s, missing,
                            sizeof missing, &err);
    if (rc == 1) {
        rst_free(rec);
        oai_error_set(e, 400, "invalid_request_error", "previous_response_not_found",
                      "previous_response_id", "Previous response with id '%s' not found: an "
                      "earlier response of its conversation, '%s', is no longer stored "
                      "(expired or deleted)", id, missing);
        return -RL_EINVAL;
    }
    if (!rc && rst_continue(rec, id, prior, &q->n_prior, &q->chain))
        rc = rl_errf(&err, RL_ENOMEM, "out of memory");
    if (!q->chain) /* the conversation is written whole */
        q->n_prior = 0;
    rst_free(rec);
    if (rc) {
        oai_error_set(e, 503, "server_error", ev_code_name(EV_CODE_INTERNAL),
                      "previous_response_id", "the stored response could not be read: %s",
                      err.msg);
        return -RL_EINVAL;
    }
    return 0;
}

/* The conversation a Responses body runs in: its items into *prior
 * (malloc'd), how many into q->n_prior, whose items the record of this
 * response then leaves to the conversation. Returns 0 or -RL_EINVAL with
 * *e (400 not found, or none kept; 503). */
static int conversation_context(struct req *q, const struct cpt_peek *pk, char **prior,
                                struct oai_error *e)
{
    struct dhttp *h = q->h;
    *prior = NULL;
    if (!h->conv_ttl_s) {
        oai_error_set(e, 400, "invalid_request_error", "not_found", "conversation",
                      "Conversation with id '%s' not found: this server keeps no "
                      "conversations (conversation_ttl_s = 0)", pk->conversation);
        return -RL_EINVAL;
    }
    struct rl_err err = {0};
    if (!q->rc && !(q->rc = pool_get(h, &err))) {
        oai_error_set(e, 503, "server_error", "REDIS_UNAVAILABLE", "conversation", "%s",
                      err.msg);
        return -RL_EINVAL;
    }
    if (!pk->conversation[0]) { /* too long to be one of ours */
        oai_error_set(e, 400, "invalid_request_error", "not_found", "conversation",
                      "Conversation not found.");
        return -RL_EINVAL;
    }
    struct cnv_store s = conv_store(q);
    return cnv_context(&s, pk->conversation, -1, prior, &q->n_prior, e);
}

/* The answer as it comes: chunked, each event written when it is read
 * (sse_reader). */
static enum MHD_Result stream_answer(struct req *q, struct MHD_Connection *conn)
{
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, BLOCK_SIZE, sse_reader, q, NULL);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type",
                            !q->oreq.stream ? "application/json"
                            : ollama_route(q->route) ? "application/x-ndjson"
                                                     : "text/event-stream; charset=utf-8");
    if (q->oreq.stream)
        MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no"); /* nginx: do not buffer */
    MHD_add_response_header(r, "X-Request-Id", q->id);
    if (q->oreq.ignored[0])
        MHD_add_response_header(r, "X-Redlm-Ignored-Fields", q->oreq.ignored);
    add_cors(q, r);
    q->headers_sent = true;
    q->t_last_byte_ms = rl_mono_ms();
    enum MHD_Result mr = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    q->responded = true;
    q->status = 200;
    return mr;
}

/* A background response is kept before its job is queued, "queued" and
 * marked running (its object holds what the answer repeats: rebuild): a
 * GET that comes before any event finds it. *queued: that object, the POST's answer (malloc'd).
 * Returns 0, or -1 with *e (503: Redis refused; nothing was queued). */
static int keep_background(struct req *q, char **queued, struct oai_error *e)
{
    struct dhttp *h = q->h;
    struct rst_running run = {.cancel = false};
    struct rst_record *rec = NULL;
    struct rl_err err = {0};
    *queued = cpt_resp_object(q->cresp);
    int rc = !*queued ? -RL_ENOMEM
             : rst_new(owner_of(q), q->id, q->creq.input ? q->creq.input : "[]",
                       &(struct rst_origin){q->n_prior, q->chain, q->creq.conversation},
                       *queued, &run, &rec);
    if (rc)
        rl_errf(&err, RL_ENOMEM, "out of memory");
    else
        rc = rst_put(q->rc, h->prefix, q->id, rec, h->store_ttl_s, &err);
    rst_free(rec);
    if (!rc)
        return 0;
    free(*queued);
    *queued = NULL;
    oai_error_set(e, 503, "server_error", "REDIS_UNAVAILABLE", "background",
                  "the background response could not be kept, so it was not started: %s",
                  err.msg);
    e->retry_after_s = 1;
    return -1;
}

/* The record of a background response whose job could not be queued. */
static void unkeep_background(struct req *q)
{
    struct rl_err err = {0};
    if (rst_delete(q->rc, q->h->prefix, q->id, owner_of(q), true, &err) < 0)
        RL_LOG(q->h->log, RL_LOG_WARN, "http: %s: its record stays until it expires: %s", q->id,
               err.msg);
}

static enum MHD_Result chat(struct req *q, struct MHD_Connection *conn)
{
    struct dhttp *h = q->h;
    struct oai_error e;
    /* a request waiting for its events is not idle: libmicrohttpd would
     * count our blocking in the handler and the reader as silence and
     * close it. The idle timeout is set again when the request ends. */
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    bool compl = q->route == R_COMPLETIONS;
    q->embed = embed_route(q->route);
    q->rerank = q->route == R_RERANK || q->route == R_SCORE;
    q->compat = !q->embed && !q->rerank &&
                (q->route == R_RESPONSES || q->route == R_ANTHROPIC || ollama_route(q->route));
    new_id(h, q->id, id_prefix(q->route));
    int64_t now = rl_wall_ms();
    int64_t deadline = h->timeout_s ? now + (int64_t)h->timeout_s * 1000 : 0;
    if (q->too_big)
        return refuse_too_big(q, conn);
    const char *body = q->body.p ? q->body.p : "";
    char *prior = NULL;
    struct cpt_peek pk = {0};
    struct oai_limits lim = h->lim;
    if (q->route == R_RESPONSES) {
        cpt_responses_peek(body, q->body.n, &pk);
        if (pk.background && !h->store_ttl_s) {
            oai_error_set(&e, 400, "invalid_request_error", "BAD_VALUE", "background",
                          "background: this server keeps no responses (responses_store_ttl_s "
                          "= 0), so none could be read back");
            return respond_error(q, conn, &e);
        }
        if (pk.background) { /* nobody waits: no client lease, no deadline of ours */
            lim.client_lease_ms = 0;
            deadline = 0;
            /* its answer is read back from its events as long as its record
             * lives: they live as long (a job's bound: 7 days) */
            lim.stream_ttl_s = h->store_ttl_s < 7 * 86400 ? h->store_ttl_s : 7 * 86400;
        }
        if (pk.in_conversation && !pk.continues) {
            if (conversation_context(q, &pk, &prior, &e))
                return respond_error(q, conn, &e);
        } else if (!pk.in_conversation && previous_context(q, &pk, &prior, &e)) {
            return respond_error(q, conn, &e);
        } /* both: cpt_parse_responses refuses it */
    }
    int prc = 0;
    if (q->embed)
        prc = emb_parse(emb_api_of(q->route), body, q->body.n, &h->lim, q->id, deadline,
                        &q->oreq, &q->ereq, &e);
    else if (q->rerank)
        prc = rr_parse(q->route == R_SCORE ? RR_SCORE : RR_RERANK, body, q->body.n, &h->lim,
                       q->id, deadline, &q->oreq, &q->rreq, &e);
    else if (q->route == R_RESPONSES)
        prc = cpt_parse_responses(body, q->body.n, prior, &lim, q->id, deadline, &q->oreq,
                                  &q->creq, &e);
    else if (q->compat)
        prc = cpt_parse(q->route == R_ANTHROPIC     ? CPT_ANTHROPIC
                        : q->route == R_OLLAMA_CHAT ? CPT_OLLAMA_CHAT
                                                    : CPT_OLLAMA_GENERATE,
                        body, q->body.n, &h->lim, q->id, deadline, &q->oreq, &q->creq, &e);
    else
        prc = (compl ? oai_parse_completion : oai_parse_request)(body, q->body.n, &h->lim, q->id,
                                                                deadline, &q->oreq, &e);
    /* what this request's record keeps: its own turn, the chain holds the
     * rest */
    size_t kept = q->creq.input ? strlen(q->creq.input) : 0;
    size_t held = prior && (q->chain || q->creq.conversation[0]) ? strlen(prior) : 0;
    kept = kept > held ? kept - held : 0;
    free(prior);
    if (!h->store_ttl_s)
        q->creq.store = false; /* none kept: the response says so */
    if (!prc && q->creq.store && kept > h->store_max) {
        if (q->creq.background) { /* nothing could be read back */
            oai_error_set(&e, 400, "invalid_request_error", "BAD_VALUE", "background",
                          "background: its input is %zu KiB, over the %zu KiB a stored "
                          "response keeps (responses_store_max_kb)", kept / 1024,
                          h->store_max / 1024);
            prc = -RL_EINVAL;
        }
        q->creq.store = false; /* answered, not kept: the response says so */
    }
    if (prc)
        return respond_error(q, conn, &e);
    if (q->oreq.ignored[0])
        log_ignored(h, q);
    if (q->creq.load_only) /* Ollama's preload: the workers hold their models loaded */
        return respond(q, conn, 200, "application/json",
                       cpt_ollama_loaded(h->model[0] ? h->model : "", now), NULL);
    if (q->ereq.load_only) /* the same, Ollama's embedding way: no input */
        return respond(q, conn, 200, "application/json",
                       emb_empty_body(q->ereq.api, h->model[0] ? h->model : q->oreq.model),
                       NULL);
    if (q->oreq.stream)
        BUMP(h, chat_stream);
    else
        BUMP(h, chat_plain);
    struct rl_err err = {0};
    if (!q->rc && !(q->rc = pool_get(h, &err))) {
        oai_error_set(&e, 500, "server_error", ev_code_name(EV_CODE_INTERNAL), NULL, "%s", err.msg);
        return respond_error(q, conn, &e);
    }
    if (rate_limit(q, &e))
        return respond_error(q, conn, &e);
    const char *echo = h->model;
    cJSON *served = NULL;
    if (!h->model[0] || q->oreq.model[0]) {
        /* the workers' models: the request must name one that is served
         * (absent: the dispatcher takes the only one, or says MODEL_REQUIRED);
         * with served_model_name, a name other than it must be one of its
         * LoRA adapters (lim.adapters) */
        if (!(served = served_models(h))) {
            oai_error_set(&e, 500, "server_error",
                          ev_code_name(EV_CODE_INTERNAL), NULL, "out of memory");
            return respond_error(q, conn, &e);
        }
        if (q->oreq.model[0] && !model_in(served, q->oreq.model)) {
            model_not_found(served, q->oreq.model, &e);
            cJSON_Delete(served);
            return respond_error(q, conn, &e);
        }
        const cJSON *first = cJSON_GetArrayItem(served, 0);
        const cJSON *fid = cJSON_GetObjectItemCaseSensitive(first, "id");
        echo = q->oreq.model[0] ? q->oreq.model
               : cJSON_GetArraySize(served) == 1 && cJSON_IsString(fid) ? fid->valuestring : "";
    }
    int crc = q->embed    ? emb_resp_create(&q->eresp, &q->ereq, echo, &err)
              : q->rerank ? rr_resp_create(&q->rresp, &q->rreq, q->id, echo, now / 1000, &err)
              : q->compat ? cpt_resp_create(&q->cresp, &q->creq, q->id, echo, now,
                                            q->oreq.stream, &err)
                          : oai_resp_create(&q->resp, q->id, echo, now / 1000, &q->oreq, &err);
    /* echo may point into served: copied before it goes */
    snprintf(q->vm_model, sizeof q->vm_model, "%s", echo ? echo : "");
    cJSON_Delete(served);
    echo = NULL;
    if (crc) {
        oai_error_set(&e, 500, "server_error", ev_code_name(EV_CODE_INTERNAL), NULL, "%s", err.msg);
        return respond_error(q, conn, &e);
    }
    bool bg = q->creq.background;
    char *queued = NULL; /* bg: the answer now, the object "queued" */
    if (bg && keep_background(q, &queued, &e))
        return respond_error(q, conn, &e);
    char key[300];
    /* connected first: the key layout depends on what the server is */
    rconn_ensure(q->rc, NULL);
    rcl_queue_key(key, sizeof key, rconn_is_cluster(q->rc), h->prefix, "requests");
    /* several choices: every job is queued now (the workers run them side
     * by side, the prompt's KV shared through the prefix cache), and their
     * streams are read one after the other */
    int n_jobs = q->oreq.n_jobs > 1 ? q->oreq.n_jobs : 1;
    if (n_jobs > 1 && h->lease_ms &&
        !(q->more_leases = calloc((size_t)n_jobs - 1, sizeof *q->more_leases))) {
        oai_error_set(&e, 500, "server_error", ev_code_name(EV_CODE_INTERNAL), NULL,
                      "out of memory");
        return respond_error(q, conn, &e);
    }
    char jid[JOB_ID_MAX + 1];
    sub_id(q, 0, jid);
    rcl_tagged_key(q->out_key, sizeof q->out_key, rconn_is_cluster(q->rc), h->prefix, "out:",
                   jid);
    snprintf(q->last, sizeof q->last, "0-0");
    /* Followed before the job is queued: its stream is unwritten (the id
     * is ours, new_id), so the shared reader need not be woken for it
     * (XMUX_UNWRITTEN). Left to the first read (pump) if this fails. */
    struct xmux_set *mux = shared_reader(h);
    if (mux && xmux_set_sub(mux, q->out_key, q->last, XMUX_UNWRITTEN, &q->xs, &err))
        q->xs = NULL;
    q->t_xadd_ms = rl_mono_ms();
    q->give_up_ms = h->timeout_s ? q->t_xadd_ms + (int64_t)h->timeout_s * 1000 + 5000 : 0;
    for (int i = 0; i < n_jobs; i++) {
        const char *names[] = {"job"};
        const char *values[] = {n_jobs > 1 ? q->oreq.jobs[i] : q->oreq.job};
        size_t lens[] = {n_jobs > 1 ? q->oreq.job_lens[i] : q->oreq.job_len};
        int lrc = 0;
        sub_id(q, i, jid);
        if (h->lease_ms && !bg) { /* the job's client lease, before the job exists (lease_main) */
            char ms[16];
            snprintf(ms, sizeof ms, "%d", h->lease_ms);
            char *lk = i ? q->more_leases[i - 1] : q->lease_key;
            rcl_tagged_key(lk, sizeof q->lease_key, rconn_is_cluster(q->rc), h->prefix,
                           "lease:", jid);
            const char *la[] = {"SET", lk, "1", "PX", ms};
            lrc = rconn_command(q->rc, 5, la, NULL, NULL, &err);
            q->n_more_leases = i;
        }
        if (lrc || rconn_xadd(q->rc, key, "*", 0, 1, names, values, lens, NULL, NULL, &err)) {
            if (i) { /* the ones queued already go too */
                q->enqueued = true;
                cancel_job(q, "the request queue failed");
            }
            oai_error_set(&e, 503, "server_error", "REDIS_UNAVAILABLE", NULL,
                          "the request queue is unavailable: %s", err.msg);
            e.retry_after_s = 1;
            if (bg)
                unkeep_background(q);
            free(queued);
            return respond_error(q, conn, &e);
        }
    }
    q->enqueued = true;
    if (h->lease_ms && !bg)
        lease_add(q);
    RL_LOG(h->log, RL_LOG_DEBUG, "http: %s queued%s%s%s", q->id, bg ? " in the background" : "",
           q->has_tenant ? " for " : "", q->has_tenant ? q->tenant : "");
    if (bg) {
        q->job_ended = true; /* not this connection's to cancel: it may leave */
        charge_budget(q);
        if (!q->oreq.stream) /* read back by GET /v1/responses/{id}: no request to count */
            return respond(q, conn, 200, "application/json", queued, NULL);
    }
    free(queued);
    vm_move(h->vm, q->vm_model, VM_NONE, VM_WAITING);
    q->vm = VM_WAITING;

    int rc = pump(q);
    if (bg && (rc == P_GONE || rc == P_STOPPING || rc == P_TIMEOUT)) {
        /* a background response runs on without its stream; read back by
         * GET /v1/responses/{id} */
        if (rc == P_GONE)
            return MHD_NO;
        oai_error_set(&e, rc == P_TIMEOUT ? 504 : 503, "server_error",
                      rc == P_TIMEOUT ? ev_code_name(EV_CODE_DEADLINE_EXCEEDED) : "SHUTTING_DOWN",
                      NULL, "%s; the background response runs on: GET /v1/responses/%s",
                      rc == P_TIMEOUT ? "no answer within http_timeout_s"
                                      : "the server is shutting down", q->id);
        return respond_error(q, conn, &e);
    }
    if (rc == P_GONE || rc == P_STOPPING || rc == P_NOMEM) {
        cancel_job(q, rc == P_GONE ? "the client left" : rc == P_STOPPING ? "shutting down"
                                                                          : "out of memory");
        if (rc == P_GONE) {
            BUMP(h, client_cancels);
            return MHD_NO; /* nobody to answer: close */
        }
        oai_error_set(&e, rc == P_NOMEM ? 500 : 503, "server_error",
                      rc == P_NOMEM ? ev_code_name(EV_CODE_INTERNAL) : "SHUTTING_DOWN", NULL,
                      rc == P_NOMEM ? "out of memory" : "the server is shutting down");
        return respond_error(q, conn, &e);
    }
    if (rc == P_TIMEOUT) {
        cancel_job(q, "http_timeout_s passed");
        oai_error_set(&e, 504, "server_error", ev_code_name(EV_CODE_DEADLINE_EXCEEDED), NULL,
                      "no answer within http_timeout_s (%d s)", h->timeout_s);
        return respond_error(q, conn, &e);
    }
    if (q->failed)
        return respond_error(q, conn, &q->err);
    if (!q->oreq.stream && rc != P_FIN) {
        return respond(q, conn, 200, "application/json", resp_body(q), NULL);
    }
    /* a stream, or an answer the client's FIN made us commit before its
     * end (pump) */
    return stream_answer(q, conn);
}

/* POST /v1/responses/{id}/cancel of rec (rst_get's, freed here): a
 * running background response's job is cancelled (SET cancel:<id>, as a
 * client that leaves) and its record says so until the job's end does;
 * the answer is the object then, its events read once. A finished one
 * cannot be, nor one whose events say it ended (catch_up finishes its
 * record on the way). */
static enum MHD_Result cancel_stored(struct req *q, struct MHD_Connection *conn,
                                     const char *id, struct rst_record *rec)
{
    struct dhttp *h = q->h;
    struct oai_error e;
    struct rst_running run = {.cancel = true};
    struct rl_err err = {0};
    char *obj = NULL;
    bool running = rst_running(rec, NULL);
    int rc = !running                      ? 0
             : rst_update(rec, NULL, &run) ? rl_errf(&err, RL_ENOMEM, "out of memory")
                                           : catch_up(q, id, rec, &obj, &err);
    running = running && rst_running(rec, NULL);
    if (!rc && running) {
        snprintf(q->id, sizeof q->id, "%.63s", id); /* the job's id: cancel_job's (ours fit) */
        cancel_job(q, "its client cancelled the background response");
        rc = rst_put(q->rc, h->prefix, id, rec, h->store_ttl_s, &err);
    }
    rst_free(rec);
    if (rc) {
        free(obj);
        oai_error_set(&e, 503, "server_error", ev_code_name(EV_CODE_INTERNAL), NULL,
                      "the background response could not be cancelled: %s", err.msg);
        return respond_error(q, conn, &e);
    }
    if (!running) {
        free(obj);
        oai_error_set(&e, 400, "invalid_request_error", "BAD_VALUE", "response_id",
                      "Cannot cancel a response that has finished, and only background "
                      "responses can be cancelled here: the others end when their request "
                      "does (close the connection to cancel one)");
        return respond_error(q, conn, &e);
    }
    return respond(q, conn, 200, "application/json", obj, NULL);
}

/* GET /v1/responses/{id}?stream=true[&starting_after=N] of rec
 * (rst_get's, freed here): a background response's stream, from its
 * job's events, written as they come; events numbered up to N are left
 * out (the client has them). The events are numbered the same on every
 * replay, so a client that lost its stream goes on where it was. The
 * record's response object is the request's fields to echo. Only a
 * background response has a stream to give again, and only while its job's
 * events last (stream_ttl_s after its end). */
static enum MHD_Result resume_stream(struct req *q, struct MHD_Connection *conn,
                                     const char *id, struct rst_record *rec, long long after)
{
    struct dhttp *h = q->h;
    struct oai_error e;
    struct rl_err err = {0};
    bool bg = rst_response_true(rec, "background");
    bool running = rst_running(rec, NULL);
    char key[sizeof q->out_key];
    rcl_tagged_key(key, sizeof key, rconn_is_cluster(q->rc), h->prefix, "out:", id);
    const char *ex[] = {"EXISTS", key};
    struct rconn_reply *x = NULL;
    int rc = bg && !running ? rconn_command(q->rc, 2, ex, NULL, &x, &err) : 0;
    bool gone = !rc && bg && !running && (!x || x->type != RCONN_INTEGER || !x->integer);
    rconn_reply_free(x);
    if (!rc && (!bg || gone)) {
        rst_free(rec);
        oai_error_set(&e, 400, "invalid_request_error", "BAD_VALUE", "stream",
                      !bg ? "stream: only a background response is streamed again; GET it "
                            "without stream"
                          : "stream: its job's events have expired; GET it without stream");
        return respond_error(q, conn, &e);
    }
    if (!rc)
        rc = rebuild(id, rec, true, &q->cresp, &err);
    rst_free(rec);
    if (rc) {
        oai_error_set(&e, 503, "server_error", ev_code_name(EV_CODE_INTERNAL), NULL,
                      "the stream could not be resumed: %s", err.msg);
        return respond_error(q, conn, &e);
    }
    cpt_resp_resume(q->cresp, after);
    snprintf(q->id, sizeof q->id, "%.63s", id);
    snprintf(q->out_key, sizeof q->out_key, "%s", key);
    snprintf(q->last, sizeof q->last, "0-0");
    q->compat = q->resumed = q->oreq.stream = true;
    q->job_ended = true; /* its job is not this connection's to cancel */
    q->creq.api = CPT_RESPONSES;
    q->creq.background = true; /* its tokens were charged when it was queued */
    return stream_answer(q, conn);
}

/* GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items,
 * POST /v1/responses/{id}/cancel (path: what follows /v1/responses/): a
 * stored response (rstore.h), for its own tenant only; any other id is
 * 404, whether it exists or not. A running background response is read
 * as it stands (stored_record); deleting one cancels its job. */
static enum MHD_Result stored(struct req *q, struct MHD_Connection *conn, const char *method,
                              const char *path)
{
    struct dhttp *h = q->h;
    struct oai_error e;
    char id[RST_ID_MAX + 1];
    const char *tail = strchr(path, '/');
    size_t n = tail ? (size_t)(tail - path) : strlen(path);
    snprintf(id, sizeof id, "%.*s", n < sizeof id ? (int)n : 0, path); /* too long: none */
    bool items = tail && !strcmp(tail, "/input_items"), cancel = tail && !strcmp(tail, "/cancel");
    bool del = !strcmp(method, "DELETE");
    if (tail && !items && !cancel) {
        oai_error_set(&e, 404, "invalid_request_error", "not_found", NULL,
                      "no such path: /v1/responses/%.*s%.40s", RST_ID_MAX, id, tail);
        return respond_error(q, conn, &e);
    }
    const char *stream = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "stream");
    bool resume = !tail && !del && stream && !strcmp(stream, "true");
    const char *sa = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "starting_after");
    char *sa_end = NULL;
    long long resume_after = sa ? strtoll(sa, &sa_end, 10) : -1;
    if (resume && sa && (!*sa || *sa_end || resume_after < -1)) {
        oai_error_set(&e, 400, "invalid_request_error", "BAD_VALUE", "starting_after",
                      "starting_after: must be an event's sequence_number");
        return respond_error(q, conn, &e);
    }
    /* the query of input_items, checked before Redis is asked */
    const char *order = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "order");
    const char *after = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "after");
    const char *ls = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "limit");
    char *end = NULL;
    long limit = ls ? strtol(ls, &end, 10) : 20;
    if (ls && (!*ls || *end))
        limit = 0;
    struct rl_err err = {0};
    struct rst_record *rec = NULL;
    char *body = NULL;
    /* only a plain GET needs the answer as it stands: the others read the
     * record (cancel and a stream read the job's events themselves) */
    bool plain = !items && !del && !cancel && !resume;
    int rc = !h->store_ttl_s || !id[0]          ? 1
             : !(q->rc = pool_get(h, &err))     ? -RL_EIO
             : plain ? stored_record(q, id, 0, &rec, &body, &err)
                     : rst_get(q->rc, h->prefix, id, owner_of(q), 0, &rec, &err);
    if (rc == 1) {
        oai_error_set(&e, 404, "invalid_request_error", "not_found", "response_id",
                      "Response with id '%s' not found.%s", id,
                      h->store_ttl_s ? "" : " This server keeps no responses "
                                           "(responses_store_ttl_s = 0).");
        return respond_error(q, conn, &e);
    }
    char missing[RST_ID_MAX + 1] = "";
    if (!rc && items)
        rc = rst_load_chain(q->rc, h->prefix, rec, owner_of(q), 0, missing, sizeof missing, &err);
    if (rc == 1) {
        rst_free(rec);
        oai_error_set(&e, 404, "invalid_request_error", "not_found", "response_id",
                      "The input items of response '%s' are not all stored: an earlier "
                      "response of its conversation, '%s', has expired or was deleted", id,
                      missing);
        return respond_error(q, conn, &e);
    }
    if (!rc && del) {
        if (rst_running(rec, NULL)) { /* no work left for nobody */
            snprintf(q->id, sizeof q->id, "%.63s", id);
            cancel_job(q, "its background response was deleted");
        }
        rc = rst_delete(q->rc, h->prefix, id, owner_of(q), false, &err);
        if (rc == 1) /* deleted by another request meanwhile: the same answer */
            rc = 0;
    }
    if (rc) {
        rst_free(rec);
        free(body);
        oai_error_set(&e, 503, "server_error", ev_code_name(EV_CODE_INTERNAL), NULL,
                      "the stored response could not be read: %s", err.msg);
        return respond_error(q, conn, &e);
    }
    if (cancel)
        return cancel_stored(q, conn, id, rec);
    if (resume)
        return resume_stream(q, conn, id, rec, resume_after);
    if (del) {
        cJSON *o = cJSON_CreateObject();
        if (o && cJSON_AddStringToObject(o, "id", id) &&
            cJSON_AddStringToObject(o, "object", "response") &&
            cJSON_AddBoolToObject(o, "deleted", 1))
            body = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
    } else if (items) {
        char msg[RL_ERR_MSG_MAX], param[16];
        rc = rst_input_items(rec, order, limit < 0 || limit > 100 ? 0 : (int)limit, after, &body,
                             msg, sizeof msg);
        if (rc == -RL_EINVAL) { /* the message leads with the parameter's name */
            rst_free(rec);
            snprintf(param, sizeof param, "%.*s", (int)strcspn(msg, ":"), msg);
            oai_error_set(&e, 400, "invalid_request_error", "BAD_VALUE", param, "%s", msg);
            return respond_error(q, conn, &e);
        }
    } else if (!body) { /* finished: its record's object is the answer */
        body = rst_response(rec);
    }
    rst_free(rec);
    return respond(q, conn, 200, "application/json", body, NULL);
}

/* The Conversations API (convo.h), path what follows /v1/conversations:
 * route_of let through only its paths and methods. Another tenant's
 * conversation is 404, as one that does not exist. */
static enum MHD_Result conversations(struct req *q, struct MHD_Connection *conn,
                                     const char *method, const char *path)
{
    struct dhttp *h = q->h;
    struct oai_error e;
    if (!h->conv_ttl_s) {
        oai_error_set(&e, 404, "invalid_request_error", "not_found", NULL,
                      "this server keeps no conversations (conversation_ttl_s = 0)");
        return respond_error(q, conn, &e);
    }
    if (q->too_big)
        return refuse_too_big(q, conn);
    /* /{id}[/items[/{item}]] into its parts; one too long names none */
    char id[CNV_ID_MAX + 1] = "", item[PG_ID_MAX + 1] = "";
    const char *p = path[0] ? path + 1 : path, *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    snprintf(id, sizeof id, "%.*s", n < sizeof id ? (int)n : 0, p);
    bool items = slash != NULL, one = items && slash[6] == '/';
    if (one) {
        size_t m = strlen(slash + 7);
        snprintf(item, sizeof item, "%.*s", m < sizeof item ? (int)m : 0, slash + 7);
    }
    struct rl_err err = {0};
    if (!(q->rc = pool_get(h, &err))) {
        oai_error_set(&e, 503, "server_error", "REDIS_UNAVAILABLE", NULL, "%s", err.msg);
        return respond_error(q, conn, &e);
    }
    struct cnv_store s = conv_store(q);
    const char *body = q->body.p ? q->body.p : "";
    bool post = !strcmp(method, "POST"), del = !strcmp(method, "DELETE");
    /* what writes counts against its tenant's requests per minute, as a
     * request does: a client cannot fill Redis with conversations faster */
    if ((post || del) && rate_limit(q, &e))
        return respond_error(q, conn, &e);
    char *out = NULL;
    int rc;
    if (path[0] && (!id[0] || (one && !item[0]))) { /* empty, or too long to be ours */
        bool conv = !id[0];
        size_t len = conv ? n : strlen(slash + 7);
        oai_error_set(&e, 404, "invalid_request_error", "not_found",
                      conv ? "conversation_id" : "item_id", "%s with id '%.*s%s' not found.",
                      conv ? "Conversation" : "Item", len > 40 ? 40 : (int)len,
                      conv ? p : slash + 7, len > 40 ? "..." : "");
        return respond_error(q, conn, &e);
    }
    if (!path[0]) {
        char cid[64];
        new_id(h, cid, "conv_");
        rc = cnv_create(&s, cid, rl_wall_ms() / 1000, body, q->body.n, &out, &e);
    } else if (one) {
        rc = del ? cnv_item_delete(&s, id, item, &out, &e) : cnv_item(&s, id, item, &out, &e);
    } else if (items && post) {
        rc = cnv_add(&s, id, body, q->body.n, &out, &e);
    } else if (items) {
        const char *order = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "order");
        const char *after = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "after");
        const char *ls = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "limit");
        char *end = NULL;
        long limit = ls ? strtol(ls, &end, 10) : 20;
        if (ls && (!*ls || *end || limit < 0 || limit > 100))
            limit = 0; /* pg_list says what is wrong */
        rc = cnv_items(&s, id, order, (int)limit, after, &out, &e);
    } else if (post) {
        rc = cnv_update(&s, id, body, q->body.n, &out, &e);
    } else {
        rc = del ? cnv_delete(&s, id, &out, &e) : cnv_get(&s, id, &out, &e);
    }
    if (rc)
        return respond_error(q, conn, &e);
    return respond(q, conn, 200, "application/json", out, NULL);
}

/* GET /v1/models (id NULL) or /v1/models/<id>. */
static enum MHD_Result models(struct req *q, struct MHD_Connection *conn, const char *id)
{
    struct oai_error e;
    cJSON *a = served_models(q->h);
    if (!a)
        return MHD_NO;
    char *body = NULL;
    if (id) {
        const cJSON *m = model_in(a, id);
        if (!m) {
            model_not_found(a, id, &e);
            cJSON_Delete(a);
            return respond_error(q, conn, &e);
        }
        body = cJSON_PrintUnformatted(m);
    } else {
        cJSON *o = cJSON_CreateObject();
        if (o && cJSON_AddStringToObject(o, "object", "list")) {
            cJSON_AddItemToObject(o, "data", a);
            a = NULL;
            /* Anthropic's SDKs list models as their API does */
            if (MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "anthropic-version"))
                ant_models_list(o);
            body = cJSON_PrintUnformatted(o);
        }
        cJSON_Delete(o);
    }
    cJSON_Delete(a);
    return respond(q, conn, 200, "application/json", body, NULL);
}

/* Ollama's details of a model: what its clients show and test for. */
static cJSON *ollama_details(const cJSON *model)
{
    /* a LoRA adapter's base model (its /v1/models parent) */
    const cJSON *parent = cJSON_GetObjectItemCaseSensitive(model, "parent");
    cJSON *d = cJSON_CreateObject();
    /* what its workers' heartbeats said of the weights (models.c) */
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(model, "details");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(w, "format");
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(w, "parameter_size");
    const cJSON *ql = cJSON_GetObjectItemCaseSensitive(w, "quantization_level");
    cJSON_AddStringToObject(d, "parent_model", cJSON_IsString(parent) ? parent->valuestring : "");
    cJSON_AddStringToObject(d, "format", cJSON_IsString(fmt) && *fmt->valuestring ? fmt->valuestring
                                                                                   : "safetensors");
    cJSON_AddStringToObject(d, "family", "qwen3");
    cJSON *f = cJSON_AddArrayToObject(d, "families");
    cJSON_AddItemToArray(f, cJSON_CreateString("qwen3"));
    cJSON_AddStringToObject(d, "parameter_size", cJSON_IsString(ps) ? ps->valuestring : "");
    cJSON_AddStringToObject(d, "quantization_level", cJSON_IsString(ql) ? ql->valuestring : "");
    return d;
}

/* GET /api/tags, /api/ps, /api/version; POST /api/show (body: its JSON). */
static enum MHD_Result ollama_info(struct req *q, struct MHD_Connection *conn, const char *body)
{
    struct oai_error e;
    if (q->route == R_OLLAMA_VERSION) /* the Ollama API version this door follows */
        return respond(q, conn, 200, "application/json", strdup("{\"version\":\"0.12.0\"}"), NULL);
    cJSON *a = served_models(q->h);
    if (!a)
        return MHD_NO;
    cJSON *o = cJSON_CreateObject();
    char at[32];
    const cJSON *m;
    if (q->route == R_OLLAMA_SHOW) {
        cJSON *req = cJSON_Parse(body);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(req, "model");
        if (!cJSON_IsString(name))
            name = cJSON_GetObjectItemCaseSensitive(req, "name");
        char want[JOB_MODEL_MAX + 16] = "";
        if (cJSON_IsString(name))
            snprintf(want, sizeof want, "%s", name->valuestring);
        size_t n = strlen(want);
        if (n > 7 && !strcmp(want + n - 7, ":latest"))
            want[n - 7] = 0;
        cJSON_Delete(req);
        m = want[0] ? model_in(a, want) : NULL;
        if (!m) {
            oai_error_set(&e, want[0] ? 404 : 400, "invalid_request_error",
                          want[0] ? "model_not_found" : "MISSING_FIELD", "model",
                          want[0] ? "model '%.200s' not found" : "model: required", want);
            cJSON_Delete(a);
            cJSON_Delete(o);
            return respond_error(q, conn, &e);
        }
        const cJSON *cr = cJSON_GetObjectItemCaseSensitive(m, "created");
        cpt_iso_time(cJSON_IsNumber(cr) ? (int64_t)cr->valuedouble * 1000 : 0, at);
        cJSON_AddStringToObject(o, "modelfile", "");
        cJSON_AddStringToObject(o, "parameters", "");
        cJSON_AddStringToObject(o, "template", "");
        cJSON_AddItemToObject(o, "details", ollama_details(m));
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "model_info"), "general.architecture",
                                "qwen3");
        cJSON *caps = cJSON_AddArrayToObject(o, "capabilities");
        cJSON_AddItemToArray(caps, cJSON_CreateString("completion"));
        cJSON_AddItemToArray(caps, cJSON_CreateString("tools"));
        cJSON_AddItemToArray(caps, cJSON_CreateString("thinking"));
        cJSON_AddStringToObject(o, "modified_at", at);
    } else {
        cJSON *list = cJSON_AddArrayToObject(o, "models");
        cJSON_ArrayForEach(m, a)
        {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "id");
            const cJSON *cr = cJSON_GetObjectItemCaseSensitive(m, "created");
            if (!cJSON_IsString(id))
                continue;
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "name", id->valuestring);
            cJSON_AddStringToObject(x, "model", id->valuestring);
            cpt_iso_time(cJSON_IsNumber(cr) ? (int64_t)cr->valuedouble * 1000 : 0, at);
            cJSON_AddStringToObject(x, q->route == R_OLLAMA_PS ? "expires_at" : "modified_at",
                                    q->route == R_OLLAMA_PS ? "2318-01-01T00:00:00.000Z" : at);
            cJSON_AddNumberToObject(x, "size", 0);
            cJSON_AddStringToObject(x, "digest", "");
            cJSON_AddItemToObject(x, "details", ollama_details(m));
            if (q->route == R_OLLAMA_PS)
                cJSON_AddNumberToObject(x, "size_vram", 0);
            cJSON_AddItemToArray(list, x);
        }
    }
    cJSON_Delete(a);
    char *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return respond(q, conn, 200, "application/json", out, NULL);
}

/* POST /v1/load_lora_adapter, /v1/unload_lora_adapter (lorafleet.h): the
 * thread waits for the fleet, runtime_lora_timeout_s at most. */
static enum MHD_Result lora_admin(struct req *q, struct MHD_Connection *conn)
{
    struct dhttp *h = q->h;
    struct oai_error e;
    if (q->too_big)
        return refuse_too_big(q, conn);
    /* keys go to clients; loading adapters is the operators' */
    char me[OAI_TENANT_MAX + 3];
    snprintf(me, sizeof me, ",%s,", q->tenant);
    if (q->has_tenant && h->lora_tenants && h->lora_tenants[0] && !strstr(h->lora_tenants, me)) {
        oai_error_set(&e, 403, "invalid_request_error", "permission_denied", NULL,
                      "tenant %s may not load or unload LoRA adapters (runtime_lora_tenants)",
                      q->tenant);
        return respond_error(q, conn, &e);
    }
    struct rl_err err;
    struct rconn *c = pool_get(h, &err);
    if (!c) {
        oai_error_set(&e, 503, "server_error", "redis_unavailable", NULL, "redis: %s", err.msg);
        return respond_error(q, conn, &e);
    }
    struct lfl_opts o = {h->prefix, h->hooks.models_json, h->hooks.ctx, h->lora_timeout_ms, 100};
    char *ok = NULL;
    const char *body = q->body.p ? q->body.p : "";
    struct lfl_error le;
    int rc = q->route == R_LORA_LOAD ? lfl_load(c, &o, body, q->body.n, &ok, &le)
                                     : lfl_unload(c, &o, body, q->body.n, &ok, &le);
    pool_put(h, c);
    if (rc) {
        oai_error_set(&e, le.status, le.status >= 500 ? "server_error" : "invalid_request_error",
                      le.code, le.param, "%s", le.message);
        return respond_error(q, conn, &e);
    }
    RL_LOG(h->log, RL_LOG_INFO, "http: %s", ok);
    return respond(q, conn, 200, "text/plain; charset=utf-8", ok, NULL);
}

/* POST /tokenize ({"prompt": text} or a chat request's "messages", rendered
 * with the chat template and mode as a worker would) and POST /detokenize
 * ({"tokens": [ids]}), vLLM's shapes, with the tokenizer of the
 * dispatcher's model option. */
static enum MHD_Result tokenize(struct req *q, struct MHD_Connection *conn)
{
    struct dhttp *h = q->h;
    struct oai_error e;
    const struct tokenizer *tok = h->hooks.tok;
    if (!tok) {
        oai_error_set(&e, 404, "invalid_request_error", "not_found", NULL,
                      "no tokenizer here: the dispatcher loads one with its model option "
                      "(--model DIR)");
        return respond_error(q, conn, &e);
    }
    if (q->too_big)
        return refuse_too_big(q, conn);
    cJSON *b = cJSON_ParseWithLength(q->body.p ? q->body.p : "", q->body.n);
    struct rl_err err = {0};
    cJSON *out = cJSON_CreateObject();
    int rc = 0;
    if (!cJSON_IsObject(b)) {
        oai_error_set(&e, 400, "invalid_request_error", "INVALID_JSON", NULL,
                      "body: must be a JSON object");
        rc = -1;
    } else if (q->route == R_DETOKENIZE) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "tokens");
        int n = cJSON_IsArray(t) ? cJSON_GetArraySize(t) : -1;
        int32_t *ids = n > 0 ? malloc(sizeof *ids * (size_t)n) : NULL;
        int k = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, t)
        {
            if (!ids || !cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 2147483647.0 ||
                x->valuedouble != (double)(int32_t)x->valuedouble)
                break;
            ids[k++] = (int32_t)x->valuedouble;
        }
        char *text = NULL;
        size_t len = 0;
        if (n < 0 || k != n) {
            oai_error_set(&e, 400, "invalid_request_error", "BAD_TYPE", "tokens",
                          "tokens: must be an array of token ids");
            rc = -1;
        } else if (n && tok_decode(tok, ids, (size_t)n, 0, &text, &len, &err)) {
            oai_error_set(&e, 400, "invalid_request_error", "INVALID_TOKEN", "tokens", "%s",
                          err.msg);
            rc = -1;
        } else {
            cJSON_AddStringToObject(out, "prompt", text ? text : "");
        }
        free(text);
        free(ids);
    } else {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(b, "prompt");
        int32_t *ids = NULL;
        int n_ids = 0;
        if (cJSON_IsString(p) && q->route != R_ANTHROPIC_COUNT) {
            struct tok_ids v = {0};
            if (tok_encode(tok, p->valuestring, strlen(p->valuestring), 0, &v, &err)) {
                oai_error_set(&e, 500, "server_error", "INTERNAL", NULL, "%s", err.msg);
                rc = -1;
            }
            ids = v.ids;
            n_ids = (int)v.n;
        } else {
            /* a chat request (or an Anthropic message to count): the job
             * the front door would queue, rendered */
            struct oai_request r;
            struct cpt_request cr;
            struct oai_limits lim = h->lim;
            lim.refuse_unknown = false; /* add_generation_prompt and the like */
            if (q->route == R_ANTHROPIC_COUNT
                    ? cpt_parse(CPT_ANTHROPIC_COUNT, q->body.p, q->body.n, &lim, "count", 0, &r,
                                &cr, &e)
                    : oai_parse_request(q->body.p, q->body.n, &lim, "tokenize", 0, &r, &e)) {
                rc = -1;
            } else {
                struct job *j = NULL;
                struct job_fault f;
                enum ev_code code;
                if (job_parse(r.job, r.job_len, &h->jopts, &j, &f, &err) ||
                    prompt_render(j, job_mode_on(j, "think"), tok, &ids, &n_ids, &code, &err)) {
                    oai_error_set(&e, 400, "invalid_request_error", "TEMPLATE_ERROR", NULL, "%s",
                                  err.msg);
                    rc = -1;
                }
                job_free(j);
                if (q->route == R_ANTHROPIC_COUNT)
                    cpt_request_clear(&cr);
            }
            oai_request_clear(&r);
        }
        if (!rc && q->route == R_ANTHROPIC_COUNT) {
            free(ids);
            cJSON_Delete(b);
            cJSON_Delete(out);
            return respond(q, conn, 200, "application/json", ant_count_body(n_ids), NULL);
        }
        if (!rc) {
            cJSON_AddNumberToObject(out, "count", n_ids);
            cJSON *served = served_models(h);
            const cJSON *pm = cJSON_GetObjectItemCaseSensitive(b, "model");
            const cJSON *mo = cJSON_IsString(pm) ? model_in(served, pm->valuestring)
                                                 : cJSON_GetArrayItem(served, 0);
            const cJSON *ml = cJSON_GetObjectItemCaseSensitive(mo, "max_model_len");
            if (cJSON_IsNumber(ml))
                cJSON_AddNumberToObject(out, "max_model_len", ml->valuedouble);
            else
                cJSON_AddNullToObject(out, "max_model_len");
            cJSON_Delete(served);
            cJSON *a = cJSON_AddArrayToObject(out, "tokens");
            for (int i = 0; i < n_ids; i++)
                cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
            cJSON_AddNullToObject(out, "token_strs");
        }
        free(ids);
    }
    cJSON_Delete(b);
    char *body = rc ? NULL : cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    if (rc)
        return respond_error(q, conn, &e);
    return respond(q, conn, 200, "application/json", body, NULL);
}

static bool redis_ok(struct dhttp *h)
{
    struct rl_err err = {0};
    struct rconn *c = pool_get(h, &err);
    const char *argv[] = {"PING"};
    bool ok = c && !rconn_command(c, 1, argv, NULL, NULL, &err);
    pool_put(h, c);
    return ok;
}

/* OPTIONS on a path that exists is a CORS preflight when CORS is on (and
 * 405 otherwise, as before CORS); the ops listener has only the three
 * monitoring paths. */
static enum route route_of(struct dhttp *h, const char *method, const char *url,
                           const char **allow)
{
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool options = !strcmp(method, "OPTIONS") && h->n_cors;
    enum route r;
    if (!h->ops && (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/v1/completions"))) {
        *allow = "POST";
        if (options)
            return R_PREFLIGHT;
        return !strcmp(method, "POST") ? (!strcmp(url, "/v1/completions") ? R_COMPLETIONS : R_CHAT)
                                        : R_BAD_METHOD;
    }
    struct { const char *url; enum route r; bool post; } compat[] = {
        {"/tokenize", R_TOKENIZE, true},        {"/detokenize", R_DETOKENIZE, true},
        {"/v1/responses", R_RESPONSES, true},   {"/api/chat", R_OLLAMA_CHAT, true},
        {"/api/generate", R_OLLAMA_GENERATE, true}, {"/api/show", R_OLLAMA_SHOW, true},
        {"/api/tags", R_OLLAMA_TAGS, false},    {"/api/ps", R_OLLAMA_PS, false},
        {"/api/version", R_OLLAMA_VERSION, false},
        {"/v1/embeddings", R_EMBEDDINGS, true}, {"/api/embed", R_OLLAMA_EMBED, true},
        {"/api/embeddings", R_OLLAMA_EMBEDDINGS, true},
        {"/v1/rerank", R_RERANK, true},         {"/rerank", R_RERANK, true},
        {"/v2/rerank", R_RERANK, true},         {"/v1/score", R_SCORE, true},
        {"/score", R_SCORE, true},
        {"/v1/messages", R_ANTHROPIC, true},    {"/v1/messages/count_tokens", R_ANTHROPIC_COUNT, true},
        {"/v1/load_lora_adapter", R_LORA_LOAD, true},
        {"/v1/unload_lora_adapter", R_LORA_UNLOAD, true},
    };
    for (size_t i = 0; i < sizeof compat / sizeof compat[0] && !h->ops; i++) {
        if (strcmp(url, compat[i].url))
            continue;
        if ((compat[i].r == R_LORA_LOAD || compat[i].r == R_LORA_UNLOAD) && !h->runtime_lora)
            return R_NOT_FOUND; /* as vLLM without VLLM_ALLOW_RUNTIME_LORA_UPDATING */
        *allow = compat[i].post ? "POST" : "GET, HEAD";
        if (options)
            return R_PREFLIGHT;
        return (compat[i].post ? !strcmp(method, "POST") : get) ? compat[i].r : R_BAD_METHOD;
    }
    if (!h->ops && !strncmp(url, "/v1/conversations", 17) && (!url[17] || url[17] == '/')) {
        /* "", /{id}, /{id}/items, /{id}/items/{item} */
        const char *p = url + 17, *id_end = p[0] ? strchr(p + 1, '/') : NULL;
        bool items = id_end && !strncmp(id_end, "/items", 6) && (!id_end[6] || id_end[6] == '/');
        bool item = items && id_end[6] == '/' && id_end[7] && !strchr(id_end + 7, '/');
        if ((p[0] && !p[1]) || (id_end && !items) || (items && id_end[6] && !item))
            return R_NOT_FOUND;
        *allow = !p[0] ? "POST" : item ? "GET, HEAD, DELETE" : items ? "GET, HEAD, POST"
                                                                     : "GET, HEAD, POST, DELETE";
        if (options)
            return R_PREFLIGHT;
        bool post = !strcmp(method, "POST"), del = !strcmp(method, "DELETE");
        bool ok = !p[0] ? post : item ? get || del : items ? get || post : get || post || del;
        return ok ? R_CONVERSATIONS : R_BAD_METHOD;
    }
    if (!h->ops && !strncmp(url, "/v1/responses/", 14) && url[14]) {
        const char *tail = strchr(url + 14, '/');
        bool cancel = tail && !strcmp(tail, "/cancel");
        *allow = cancel ? "POST" : tail ? "GET, HEAD" : "GET, HEAD, DELETE";
        if (options)
            return R_PREFLIGHT;
        bool ok = cancel ? !strcmp(method, "POST") : get || (!tail && !strcmp(method, "DELETE"));
        return ok ? R_STORED : R_BAD_METHOD;
    }
    if (!h->ops && !strcmp(url, "/v1/models"))
        r = R_MODELS;
    else if (!h->ops && !strncmp(url, "/v1/models/", 11) && url[11])
        r = R_MODEL; /* ids hold slashes (Qwen/Qwen3-14B), as vLLM's do */
    else if (!strcmp(url, "/healthz") || !strcmp(url, "/health"))
        r = R_HEALTHZ;
    else if (!h->ops && !strcmp(url, "/ping")) { /* vLLM's (SageMaker's) health: GET or POST */
        *allow = "GET, HEAD, POST";
        if (options)
            return R_PREFLIGHT;
        return get || !strcmp(method, "POST") ? R_HEALTHZ : R_BAD_METHOD;
    } else if (!h->ops && !strcmp(url, "/version"))
        r = R_VERSION;
    else if (!strcmp(url, "/metrics"))
        r = R_METRICS;
    else
        return R_NOT_FOUND;
    *allow = "GET, HEAD";
    if (options && !h->ops)
        return R_PREFLIGHT;
    return get ? r : R_BAD_METHOD;
}

/* 401, or 429 for an address over http_auth_failures_per_min. */
static enum MHD_Result refuse_auth(struct req *q, struct MHD_Connection *conn)
{
    struct oai_error e;
    if (q->throttle_s > 0) {
        oai_error_set(&e, 429, "invalid_request_error", "too_many_auth_failures", NULL,
                      "Too many requests with a missing or wrong API key from this address "
                      "(http_auth_failures_per_min); retry in %d s.", q->throttle_s);
        e.retry_after_s = q->throttle_s;
    } else {
        oai_error_set(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                      "Incorrect or missing API key: send \"Authorization: Bearer KEY\" (or "
                      "\"x-api-key: KEY\").");
    }
    return respond_error(q, conn, &e);
}

struct framing {
    int n_cl, n_te;
    const char *cl;
    bool bad_cl, differ;
};

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key,
                                     const char *value)
{
    struct framing *f = cls;
    if (!strcasecmp(key, "Content-Length")) {
        size_t n = strspn(value, "0123456789");
        f->bad_cl |= n == 0 || n > 19 || value[n] != 0;
        f->differ |= f->cl && strcmp(f->cl, value);
        f->cl = value;
        f->n_cl++;
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        f->n_te++;
    }
    return MHD_YES;
}

/* Headers that leave in doubt where the body ends (RFC 9112 6.3; the way
 * into request smuggling behind a proxy that reads them otherwise): two
 * Content-Lengths that differ, one that is not a plain number, or a
 * Content-Length beside a Transfer-Encoding. why gets the sentence. */
static bool framing_bad(struct MHD_Connection *conn, char *why, size_t size)
{
    struct framing f = {0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, count_framing, &f);
    if (f.differ)
        snprintf(why, size, "%d Content-Length headers that disagree", f.n_cl);
    else if (f.bad_cl)
        snprintf(why, size, "Content-Length \"%.40s\" is not a number of bytes", f.cl);
    else if (f.n_cl && f.n_te)
        snprintf(why, size, "both Content-Length and Transfer-Encoding");
    else
        return false;
    return true;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    struct dhttp *h = cls;
    struct req *q = *con_cls;
    struct oai_error e;
    if (!q) { /* headers are in; the body (if any) is not */
        if (!(q = calloc(1, sizeof *q)))
            return MHD_NO;
        q->h = h;
        q->fd = -1;
        *con_cls = q;
        pthread_mutex_lock(&h->m_mu);
        h->m.active++;
        pthread_mutex_unlock(&h->m_mu);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci)
            q->fd = ci->connect_fd;
        ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        q->c = ci ? ci->socket_context : NULL;
        q->route = route_of(h, method, url, &q->allow);
        q->cors_origin = cors_origin(h, conn);
        bool has_body = job_route(q->route) || q->route == R_OLLAMA_SHOW ||
                        q->route == R_TOKENIZE || q->route == R_DETOKENIZE ||
                        q->route == R_ANTHROPIC_COUNT || q->route == R_LORA_LOAD ||
                        q->route == R_LORA_UNLOAD ||
                        (q->route == R_CONVERSATIONS && !strcmp(method, "POST"));
        if (has_body) {
            /* the body's deadline: the grace, plus its length at the
             * minimum rate (without a length: the largest body's) */
            const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
            uint64_t n = cl ? strtoull(cl, NULL, 10) : h->lim.max_body_bytes;
            if (n > h->lim.max_body_bytes)
                n = h->lim.max_body_bytes;
            int64_t ms = (int64_t)h->header_s * 1000;
            if (h->min_rate > 0)
                wait_for_client(q, ms + (int64_t)(n * 1000 / (uint64_t)h->min_rate),
                                QUICK_MS + (int64_t)(n * 1000 / ((uint64_t)h->min_rate *
                                                                 QUICK_RATE_X)),
                                "a request body");
            else
                set_deadline(q, 0, NULL);
        } else {
            set_deadline(q, 0, NULL);
        }
        char why[160];
        if (framing_bad(conn, why, sizeof why)) {
            /* which bytes are the body is in doubt: answer, then close */
            q->close_after = true;
            oai_error_set(&e, 400, "invalid_request_error", "ambiguous_framing", NULL, "%s", why);
            return respond_error(q, conn, &e);
        }
        switch (q->route) {
        case R_PREFLIGHT: {
            if (!q->cors_origin) {
                oai_error_set(&e, 403, "invalid_request_error", "origin_not_allowed", NULL,
                              "origin %.200s is not in http_cors_origins",
                              MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin")
                                  ? MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin")
                                  : "(none)");
                return respond_error(q, conn, &e);
            }
            struct MHD_Response *r =
                MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
            if (!r)
                return MHD_NO;
            add_cors(q, r);
            char methods[64];
            snprintf(methods, sizeof methods, "%s, OPTIONS", q->allow ? q->allow : "GET, HEAD");
            MHD_add_response_header(r, "Access-Control-Allow-Methods", methods);
            const char *rh = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                         "Access-Control-Request-Headers");
            MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                    rh && header_list_ok(rh) ? rh
                                                             : "Authorization, Content-Type");
            MHD_add_response_header(r, "Access-Control-Max-Age", "600");
            enum MHD_Result mr = MHD_queue_response(conn, 204, r);
            MHD_destroy_response(r);
            q->responded = true;
            q->status = 204;
            return mr;
        }
        case R_COMPLETIONS:
        case R_RESPONSES:
        case R_OLLAMA_CHAT:
        case R_OLLAMA_GENERATE:
        case R_OLLAMA_SHOW:
        case R_TOKENIZE:
        case R_DETOKENIZE:
        case R_EMBEDDINGS:
        case R_OLLAMA_EMBED:
        case R_OLLAMA_EMBEDDINGS:
        case R_RERANK:
        case R_SCORE:
        case R_ANTHROPIC:
        case R_ANTHROPIC_COUNT:
        case R_CONVERSATIONS:
        case R_LORA_LOAD:
        case R_LORA_UNLOAD:
        case R_CHAT: {
            if (!authorize(q, conn))
                return refuse_auth(q, conn);
            const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
            if (cl && strtoull(cl, NULL, 10) > h->lim.max_body_bytes) {
                oai_error_set(&e, 413, "invalid_request_error",
                              ev_code_name(EV_CODE_JOB_TOO_LARGE), NULL,
                              "body: %s bytes is over the limit of %zu", cl,
                              h->lim.max_body_bytes);
                return respond_error(q, conn, &e);
            }
            return MHD_YES; /* read the body */
        }
        case R_MODELS:
        case R_MODEL:
            if (!authorize(q, conn))
                return refuse_auth(q, conn);
            return models(q, conn, q->route == R_MODEL ? url + 11 : NULL);
        case R_STORED:
            if (!authorize(q, conn))
                return refuse_auth(q, conn);
            return stored(q, conn, method, url + 14);
        case R_VERSION:
            return respond(q, conn, 200, "application/json",
                           strdup("{\"version\":\"" DHTTP_VERSION "\",\"server\":\"redlm\"}"),
                           NULL);
        case R_OLLAMA_TAGS:
        case R_OLLAMA_PS:
        case R_OLLAMA_VERSION:
            if (!authorize(q, conn))
                return refuse_auth(q, conn);
            return ollama_info(q, conn, NULL);
        case R_HEALTHZ: {
            bool ok = (!h->hooks.ready || h->hooks.ready(h->hooks.ctx)) &&
                      !atomic_load(&h->stopping) && redis_ok(h);
            return respond(q, conn, ok ? 200 : 503, "text/plain; charset=utf-8",
                           strdup(ok ? "ok\n" : "unavailable\n"), NULL);
        }
        case R_METRICS:
            /* the counters name tenants' traffic: behind the key when keys
             * are on (the loopback ops port asks none) */
            if (!authorize(q, conn))
                return refuse_auth(q, conn);
            return respond(q, conn, 200, "text/plain; version=0.0.4", render_metrics(h), NULL);
        case R_BAD_METHOD:
            oai_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                          "%s is not allowed on %.200s (use %s)", method, url, q->allow);
            return respond_error(q, conn, &e);
        case R_NOT_FOUND:
            oai_error_set(&e, 404, "invalid_request_error", "not_found", NULL,
                          "no such endpoint: %.200s", url);
            return respond_error(q, conn, &e);
        }
        return MHD_NO;
    }
    if (*upload_size) {
        if (!q->responded && !q->too_big) {
            if (q->body.n + *upload_size > h->lim.max_body_bytes)
                q->too_big = true; /* read on, answer 413 at the end */
            else if (text_add(&q->body, upload, *upload_size))
                return MHD_NO;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (q->responded)
        return MHD_YES;
    set_deadline(q, 0, NULL); /* all in: the answer's wait is http_timeout_s's */
    if (q->route == R_OLLAMA_SHOW)
        return ollama_info(q, conn, q->body.p ? q->body.p : "");
    if (q->route == R_TOKENIZE || q->route == R_DETOKENIZE || q->route == R_ANTHROPIC_COUNT)
        return tokenize(q, conn);
    if (q->route == R_CONVERSATIONS)
        return conversations(q, conn, method, url + 17);
    if (q->route == R_LORA_LOAD || q->route == R_LORA_UNLOAD)
        return lora_admin(q, conn);
    return chat(q, conn);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct dhttp *h = cls;
    struct req *q = *con_cls;
    if (!q)
        return;
    lease_del(q);
    if (q->enqueued && !q->job_ended) {
        cancel_job(q, "the connection ended");
        BUMP(h, client_cancels);
    }
    if (job_route(q->route))
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)h->idle_s);
    /* kept alive: the next request's headers within the idle time and the grace */
    wait_idle(q, ((int64_t)h->idle_s + h->header_s) * 1000);
    count_status(h, q->status ? q->status : 500);
    if (q->enqueued)
        RL_LOG(h->log, RL_LOG_DEBUG, "http: %s done: %d%s", q->id, q->status,
               toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection lost)");
    vm_end(q, NULL, 0);
    xmux_unsub(q->xs);
    pool_put(h, q->rc);
    oai_resp_free(q->resp);
    cpt_resp_free(q->cresp);
    cpt_request_clear(&q->creq);
    free(q->chain);
    emb_resp_free(q->eresp);
    rr_resp_free(q->rresp); /* before the request its documents are borrowed from */
    rr_request_clear(&q->rreq);
    oai_request_clear(&q->oreq);
    text_free(&q->body);
    text_free(&q->sse);
    free(q->more_leases);
    free(q);
    *con_cls = NULL;
    pthread_mutex_lock(&h->m_mu);
    h->m.active--;
    pthread_mutex_unlock(&h->m_mu);
}


/* libmicrohttpd's messages: logged as they come until the reaper runs,
 * then summed up in its line (a flood of connections is a flood of
 * "connection limit" messages). */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    struct dhttp *h = cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n')
        msg[--n] = 0;
    if (!h->reaper_started) {
        RL_LOG(h->log, RL_LOG_WARN, "http: %s", msg);
        return;
    }
    pthread_mutex_lock(&h->conn_mu);
    h->tally.mhd++;
    snprintf(h->tally.mhd_last, sizeof h->tally.mhd_last, "%s", msg);
    pthread_mutex_unlock(&h->conn_mu);
}

/* ---- start and stop ---- */

static void free_dhttp(struct dhttp *h)
{
    if (!h)
        return;
    if (h->reaper_started) {
        atomic_store(&h->stopping, true);
        pthread_join(h->reaper, NULL);
    }
    if (h->lease_started) {
        atomic_store(&h->stopping, true);
        pthread_join(h->lease_thread, NULL);
    }
    free(h->auth);
    for (int i = 0; i < h->n_cors; i++)
        free(h->cors[i]);
    free(h->cors);
    for (int i = 0; i < h->n_idle; i++)
        rconn_free(h->idle[i]);
    free(h->idle);
    xmux_set_free(h->mux); /* after the daemon: every request has ended its subscription */
    oai_keys_free(&h->keys);
    free(h->prefix);
    free(h->model);
    free(h->keys_path);
    free(h->lora_tenants);
    free(h->bind);
    free(h->redis_addr);
    free(h->redis_user);
    free(h->redis_pw);
    pthread_mutex_destroy(&h->pool_mu);
    pthread_mutex_destroy(&h->mux_mu);
    pthread_mutex_destroy(&h->keys_mu);
    pthread_mutex_destroy(&h->m_mu);
    pthread_mutex_destroy(&h->conn_mu);
    pthread_mutex_destroy(&h->auth_mu);
    pthread_mutex_destroy(&h->lease_mu);
    vm_free(h->vm);
    free(h);
}

/* Each connection holds its socket, our dup() of it (struct conn) and a
 * Redis connection while answered: raise the soft limit on open files
 * toward what http_max_connections needs (as far as the hard limit goes),
 * since the usual soft limit of 1024 would refuse connections long before. */
static void raise_fd_limit(struct dhttp *h)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)h->max_conn * 3 + 256;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= want)
        return;
    rlim_t to = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    if (to > rl.rlim_cur) {
        rl.rlim_cur = to;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (to < want)
        RL_LOG(h->log, RL_LOG_WARN, "http: open files limited to %llu; http_max_connections %d "
               "wants %llu (raise LimitNOFILE / ulimit -n)", (unsigned long long)to, h->max_conn,
               (unsigned long long)want);
}

/* Both listeners: the front door (ops false: cfg->http on cfg->http_bind)
 * and the loopback ops port (ops true: cfg->http_port on 127.0.0.1). */
static int start(struct dhttp **out, const struct cfg *cfg, const struct rl_log *log,
                 const struct dhttp_hooks *hooks, bool ops, struct dhttp *front,
                 struct rl_err *err)
{
    *out = NULL;
    if (cfg->served_model_name[0] && !modelref_name_ok(cfg->served_model_name))
        return rl_errf(err, RL_EINVAL,
                       "served_model_name \"%.64s\" must be 1-%d of [A-Za-z0-9._:/-], not "
                       "starting with '/' or '.'", cfg->served_model_name, MODELREF_NAME_MAX);
    struct dhttp *h = calloc(1, sizeof *h);
    if (!h)
        return rl_errf(err, RL_ENOMEM, "http: out of memory");
    pthread_mutex_init(&h->pool_mu, NULL);
    pthread_mutex_init(&h->mux_mu, NULL);
    pthread_mutex_init(&h->keys_mu, NULL);
    pthread_mutex_init(&h->m_mu, NULL);
    pthread_mutex_init(&h->conn_mu, NULL);
    pthread_mutex_init(&h->auth_mu, NULL);
    pthread_mutex_init(&h->lease_mu, NULL);
    if (!(h->vm = vm_create())) {
        free_dhttp(h);
        return rl_errf(err, RL_ENOMEM, "http: out of memory");
    }
    h->log = log;
    if (hooks)
        h->hooks = *hooks;
    h->ops = ops;
    h->front = front;
    h->port = ops ? cfg->http_port : cfg->http;
    h->header_s = cfg->http_header_timeout_s;
    h->min_rate = cfg->http_min_body_rate;
    h->per_ip = ops ? 0 : cfg->http_max_connections_per_ip;
    h->max_pending = cfg->http_max_pending;
    h->pending_per_ip = cfg->http_max_pending_per_ip;
    h->auth_per_min = ops ? 0 : cfg->http_auth_failures_per_min;
    h->lease_ms = ops ? 0 : cfg->http_client_lease_ms;
    h->store_ttl_s = cfg->responses_store_ttl_s;
    h->store_max = (size_t)cfg->responses_store_max_kb * 1024;
    h->conv_ttl_s = cfg->conversation_ttl_s;
    h->timeout_s = cfg->http_timeout_s;
    h->drain_s = cfg->drain_timeout_s;
    h->max_conn = cfg->http_max_connections;
    h->idle_s = cfg->http_idle_timeout_s;
    h->shared_reader = !ops && cfg->http_shared_reader;
    h->runtime_lora = !ops && cfg->runtime_lora;
    h->lora_timeout_ms = cfg->runtime_lora_timeout_s * 1000;
    {
        struct text t = {0};
        for (int i = 0; i < cfg->runtime_lora_tenants.n; i++)
            text_printf(&t, "%s%s,", i ? "" : ",", cfg->runtime_lora_tenants.v[i]);
        h->lora_tenants = t.p ? t.p : strdup("");
    }
    /* rconn waits io_timeout for a reply: a BLOCK as long would read as a
     * dead connection */
    int io = cfg->redis_io_timeout_ms;
    snprintf(h->block, sizeof h->block, "%d", io > 0 && io / 2 < POLL_MS ? (io / 2 > 0 ? io / 2 : 1) : POLL_MS);
    h->started_s = rl_wall_ms() / 1000;
    h->prefix = strdup(cfg->prefix);
    h->model = strdup(cfg->served_model_name);
    h->bind = strdup(ops ? "127.0.0.1" : cfg->http_bind);
    h->keys_path = !ops && cfg->api_keys_file[0] ? strdup(cfg->api_keys_file) : NULL;
    h->redis_addr = strdup(cfg->redis);
    h->redis_user = strdup(cfg->redis_user);
    h->redis_pw = strdup(cfg->redis_password_file);
    h->cap_idle = h->max_conn < 64 ? h->max_conn : 64;
    h->idle = calloc((size_t)h->cap_idle, sizeof *h->idle);
    int rc = 0, lfd = -1;
    if (!h->prefix || !h->model || !h->bind || !h->redis_addr || !h->redis_user ||
        !h->redis_pw || !h->idle || (!ops && cfg->api_keys_file[0] && !h->keys_path)) {
        rc = rl_errf(err, RL_ENOMEM, "http: out of memory");
        goto fail;
    }
    if (h->lease_ms > 0 && h->lease_ms < 1000) {
        rc = rl_errf(err, RL_EINVAL, "http_client_lease_ms: %d is below 1000 (0 = off)",
                     h->lease_ms);
        goto fail;
    }
    if (h->auth_per_min && h->keys_path && !(h->auth = calloc(AUTH_SLOTS, sizeof *h->auth))) {
        rc = rl_errf(err, RL_ENOMEM, "http: out of memory");
        goto fail;
    }
    if (!ops && cfg->http_cors_origins.n) {
        if (!(h->cors = calloc((size_t)cfg->http_cors_origins.n, sizeof *h->cors))) {
            rc = rl_errf(err, RL_ENOMEM, "http: out of memory");
            goto fail;
        }
        for (int i = 0; i < cfg->http_cors_origins.n; i++) {
            const char *o = cfg->http_cors_origins.v[i];
            if (strcmp(o, "*") && strncmp(o, "http://", 7) && strncmp(o, "https://", 8)) {
                rc = rl_errf(err, RL_EINVAL, "http_cors_origins: \"%.64s\" is not * or "
                             "scheme://host[:port]", o);
                goto fail;
            }
            if (!(h->cors[h->n_cors++] = strdup(o))) {
                rc = rl_errf(err, RL_ENOMEM, "http: out of memory");
                goto fail;
            }
        }
    }
    cfg_rconn_opts(cfg, &h->ropts);
    h->ropts.addr = h->redis_addr;
    h->ropts.user = h->redis_user;
    h->ropts.password_file = h->redis_pw;
    h->ropts.client_name = "redlm-http";
    cfg_job_opts(cfg, &h->jopts);
    oai_limits_default(&h->lim);
    h->lim.max_body_bytes = (size_t)cfg->max_body_kb * 1024;
    h->lim.max_messages = cfg->max_messages;
    h->lim.max_tokens = cfg->http_max_tokens;
    h->lim.model = h->model[0] ? h->model : NULL; /* NULL: the workers' models (chat()) */
    h->lim.adapters = true; /* another name may be a LoRA adapter: chat() checks it */
    h->lim.job = &h->jopts;
    h->lim.default_mode = !strcmp(cfg->http_default_mode, "think")      ? JOB_MODE_THINK
                          : !strcmp(cfg->http_default_mode, "no_think") ? JOB_MODE_NO_THINK
                                                                        : JOB_MODE_AUTO;
    h->lim.client_lease_ms = h->lease_ms;
    h->lim.refuse_unknown = !strcmp(cfg->http_unknown_fields, "refuse");
    if (h->keys_path) {
        if ((rc = keys_refresh(h, true, err)))
            goto fail;
        RL_LOG(log, RL_LOG_INFO, "http: %d API keys from %s", h->keys.n, h->keys_path);
    } else if (!ops) {
        RL_LOG(log, RL_LOG_WARN, "http: no api_keys_file: the HTTP API takes requests "
                                 "without authentication");
    }

    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (listen_family(h->bind) == 1)
        flags |= MHD_USE_IPv6;
    /* our own socket: a port taken is an error naming it, and no
     * SO_REUSEPORT lets a second dispatcher share it (listen.h) */
    if ((rc = listen_tcp(h->bind, h->port, 1024, ops ? "http_port" : "http", &lfd, err))) {
        if (rc == -RL_EINVAL && !ops)
            rl_errf(err, RL_EINVAL, "http_bind: \"%.64s\" is not an IPv4 or IPv6 address",
                    h->bind);
        rc = rl_err_wrap(err, "http");
        goto fail;
    }
    raise_fd_limit(h);
    /* connection memory: the request headers plus one BLOCK_SIZE write
     * buffer for the streamed body. libmicrohttpd's connection limit sits
     * above ours (on_accept decides) by room for the connections closed to
     * make room, until their threads have seen it. */
    h->d = MHD_start_daemon(
        flags, (uint16_t)h->port, on_accept, h, on_request, h, MHD_OPTION_EXTERNAL_LOGGER,
        mhd_log, h, MHD_OPTION_LISTEN_SOCKET, lfd, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)(h->max_conn + h->max_conn / 2 + 16), MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)cfg->http_idle_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)(BLOCK_SIZE * 4), MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)h->per_ip,
        MHD_OPTION_END);
    if (!h->d) {
        close(lfd);
        rc = rl_errf(err, RL_EIO, "http: cannot start the HTTP server on %s port %d%s", h->bind,
                     h->port, ops ? " (http_port)" : "");
        goto fail;
    }
    if (pthread_create(&h->reaper, NULL, reaper_main, h)) {
        MHD_stop_daemon(h->d);
        rc = rl_errf(err, RL_EIO, "http: cannot start a thread");
        goto fail;
    }
    h->reaper_started = true;
    if (h->lease_ms) {
        if (pthread_create(&h->lease_thread, NULL, lease_main, h)) {
            MHD_stop_daemon(h->d);
            rc = rl_errf(err, RL_EIO, "http: cannot start a thread");
            goto fail;
        }
        h->lease_started = true;
    }
    if (ops)
        RL_LOG(log, RL_LOG_INFO, "http: /healthz, /health and /metrics on %s:%d", h->bind,
               h->port);
    else
        RL_LOG(log, RL_LOG_INFO, "http: OpenAI API on %s:%d, model %s%s%s%s", h->bind, h->port,
               h->model[0] ? "\"" : "", h->model[0] ? h->model : "(what live workers serve)",
               h->model[0] ? "\"" : "", h->n_cors ? ", CORS on" : "");
    *out = h;
    return 0;
fail:
    free_dhttp(h);
    return rc;
}

int dhttp_start(struct dhttp **out, const struct cfg *cfg, const struct rl_log *log,
                const struct dhttp_hooks *hooks, struct rl_err *err)
{
    *out = NULL;
    if (!cfg->http)
        return 0;
    return start(out, cfg, log, hooks, false, NULL, err);
}

int dhttp_start_ops(struct dhttp **out, const struct cfg *cfg, const struct rl_log *log,
                    const struct dhttp_hooks *hooks, struct dhttp *front, struct rl_err *err)
{
    *out = NULL;
    if (!cfg->http_port || (front && cfg->http_port == cfg->http))
        return 0;
    return start(out, cfg, log, hooks, true, front, err);
}

void dhttp_stop(struct dhttp *h)
{
    if (!h)
        return;
    MHD_socket lsock = MHD_quiesce_daemon(h->d);
    int64_t until = rl_mono_ms() + (int64_t)h->drain_s * 1000;
    for (;;) {
        pthread_mutex_lock(&h->m_mu);
        int active = h->m.active;
        pthread_mutex_unlock(&h->m_mu);
        if (!active || rl_mono_ms() >= until)
            break;
        usleep(50 * 1000);
    }
    /* the rest end within POLL_MS, cancelling their jobs */
    atomic_store(&h->stopping, true);
    MHD_stop_daemon(h->d);
    if (lsock != MHD_INVALID_SOCKET)
        close(lsock);
    RL_LOG(h->log, RL_LOG_INFO, "http: stopped");
    free_dhttp(h);
}
