/* tests/bench/bench_http.c - how long a token event takes from Redis to
 * the HTTP client, through the front door (dispatcher/http.c).
 *
 *   build/tests/bench_http --redis 127.0.0.1:6379 [--requests 300] [--tokens 8]
 *
 * Benchmark mode runs the front door in this process on a free loopback
 * port, under the key prefix "bench<pid>:", and plays both of its
 * neighbours: a client thread sends POST /v1/chat/completions with
 * stream: true over a plain socket, and a "worker" thread takes the job
 * from <prefix>requests (no dispatcher in between) and writes its events
 * to <prefix>out:<id> one at a time. Before each XADD it takes a monotonic
 * timestamp; the client takes one when the bytes of that event's SSE chunk
 * arrive (the recv() that completes them), and only then is the next
 * event written, so every event is measured alone. The first event of a
 * request goes through the access handler (status still open), the
 * others through the streaming reader; they are reported apart, as JSON
 * lines with the median, p90 and p99 in milliseconds.
 *
 * --api chat|anthropic|both (default both): the requests are chat
 * completions, Anthropic messages (POST /v1/messages: the same events as
 * content_block_delta events, after message_start and
 * content_block_start), or the two taking turns, reported apart, so that
 * the Messages door's cost is read against chat's in one run. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "dispatcher/http.h"
#include "rconn.h"

/* ---- benchmark ---- */

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

struct shared {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int port;
    int n_req, n_tok;
    int api;          /* 0 chat, 1 anthropic, 2 both (request r: r % 2) */
    const char *redis, *prefix;
    /* handshake: the worker writes event k of request r at t_sent[...],
     * the client reports it got it */
    int got;          /* r * (n_tok + 1) + events the client has seen of request r */
    double *t_sent;   /* (n_req * n_tok) */
    double *t_recv;   /* (n_req * n_tok) */
    int failed;
};

static void wait_got(struct shared *s, int want)
{
    pthread_mutex_lock(&s->mu);
    while (s->got < want && !s->failed)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void *worker_main(void *arg)
{
    struct shared *s = arg;
    struct rconn_opts o;
    rconn_opts_default(&o);
    o.addr = s->redis;
    struct rconn *c = NULL;
    struct rl_err err = {0};
    char req_key[128], last[RCONN_ID_MAX] = "0-0";
    snprintf(req_key, sizeof req_key, "%srequests", s->prefix);
    if (rconn_create(&c, &o, &err) || rconn_wait(c, 5000, &err))
        goto fail;
    for (int r = 0; r < s->n_req; r++) {
        const char *argv[] = {"XREAD", "COUNT", "1", "BLOCK", "10000", "STREAMS", req_key, last};
        struct rconn_reply *rep = NULL;
        if (rconn_command(c, 8, argv, NULL, &rep, &err) || rep->type != RCONN_ARRAY) {
            rconn_reply_free(rep);
            if (!err.msg[0])
                snprintf(err.msg, sizeof err.msg, "no request came within 10 s");
            goto fail;
        }
        const struct rconn_reply *en = &rep->elem[0].elem[1].elem[0];
        snprintf(last, sizeof last, "%s", en->elem[0].str);
        cJSON *job = cJSON_Parse(en->elem[1].elem[1].str);
        rconn_reply_free(rep);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(job, "id");
        char out[256];
        snprintf(out, sizeof out, "%sout:%s", s->prefix, cJSON_IsString(id) ? id->valuestring : "?");
        cJSON_Delete(job);
        for (int k = 0; k <= s->n_tok; k++) {
            char ev[256], sid[32];
            if (k < s->n_tok)
                snprintf(ev, sizeof ev,
                         "{\"seq\":%d,\"type\":\"delta\",\"delta\":{\"content\":\"t%d \"},\"token_ids\":[%d]}",
                         k, k, k + 1);
            else
                snprintf(ev, sizeof ev,
                         "{\"seq\":%d,\"type\":\"done\",\"finish_reason\":\"length\",\"usage\":"
                         "{\"prompt_tokens\":1,\"completion_tokens\":%d,\"reasoning_tokens\":0,"
                         "\"cached_prompt_tokens\":0},\"cached\":false,\"timings\":{\"queue_ms\":0,"
                         "\"ttft_ms\":0,\"total_ms\":0},\"tool_calls\":[]}",
                         k, s->n_tok);
            snprintf(sid, sizeof sid, "0-%d", k + 1);
            const char *names[] = {"event"}, *values[] = {ev};
            double t = now_ms();
            if (rconn_xadd(c, out, sid, 0, 1, names, values, NULL, NULL, NULL, &err))
                goto fail;
            if (k < s->n_tok) {
                s->t_sent[r * s->n_tok + k] = t;
                wait_got(s, r * (s->n_tok + 1) + k + 1);
                if (s->failed)
                    goto done;
            }
        }
        wait_got(s, (r + 1) * (s->n_tok + 1)); /* the client is done with it */
    }
    goto done;
fail:
    fprintf(stderr, "bench_http worker: %s\n", err.msg);
    pthread_mutex_lock(&s->mu);
    s->failed = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
done:
    rconn_free(c);
    return NULL;
}

static void set_got(struct shared *s, int v)
{
    pthread_mutex_lock(&s->mu);
    s->got = v;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Whether request r is an Anthropic message. */
static bool api_of(const struct shared *s, int r)
{
    return s->api == 1 || (s->api == 2 && r % 2);
}

/* One streamed request over a fresh connection; records when each
 * event's chunk is complete in the bytes received. */
static int client_one(struct shared *s, int r)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    bool ant = api_of(s, r);
    const char *body = ant ? "{\"model\":\"redlm\",\"max_tokens\":64,\"stream\":true,\"messages\":"
                             "[{\"role\":\"user\",\"content\":\"hi\"}]}"
                           : "{\"model\":\"redlm\",\"stream\":true,\"messages\":[{\"role\":"
                             "\"user\",\"content\":\"hi\"}]}";
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                     "Connection: close\r\nContent-Length: %zu\r\n\r\n%s",
                     ant ? "/v1/messages" : "/v1/chat/completions", strlen(body), body);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    int k = 0, rc = -1;
    for (;;) {
        if (len + 4096 + 1 > cap)
            buf = realloc(buf, cap *= 2);
        ssize_t got = recv(fd, buf + len, cap - len - 1, 0);
        double t = now_ms();
        if (got <= 0)
            break;
        len += (size_t)got;
        buf[len] = 0;
        char marker[32];
        while (k < s->n_tok) {
            snprintf(marker, sizeof marker, ant ? "\"text\":\"t%d \"" : "\"content\":\"t%d \"", k);
            char *m = strstr(buf, marker);
            if (!m || !strstr(m, "\n\n"))
                break;
            s->t_recv[r * s->n_tok + k] = t;
            k++;
            set_got(s, r * (s->n_tok + 1) + k);
        }
        if (strstr(buf, ant ? "event: message_stop" : "data: [DONE]")) {
            rc = k == s->n_tok ? 0 : -1;
            break;
        }
    }
    set_got(s, (r + 1) * (s->n_tok + 1));
    if (rc && len) /* what the door said instead */
        fprintf(stderr, "bench_http: request %d got: %.300s\n", r, buf);
    free(buf);
    close(fd);
    return rc;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *name, double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    printf("{\"bench\":\"%s\",\"n\":%d,\"median_ms\":%.3f,\"p90_ms\":%.3f,\"p99_ms\":%.3f,"
           "\"max_ms\":%.3f}\n",
           name, n, v[n / 2], v[(int)(n * 0.9)], v[(int)(n * 0.99)], v[n - 1]);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t l = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &l))
        return -1;
    close(fd);
    return ntohs(a.sin_port);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    struct shared s = {.n_req = 300, .n_tok = 8, .api = 2, .redis = "127.0.0.1:6379"};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--redis"))
            s.redis = argv[i + 1];
        else if (!strcmp(argv[i], "--requests"))
            s.n_req = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens"))
            s.n_tok = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--api") && (!strcmp(argv[i + 1], "chat") ||
                                               !strcmp(argv[i + 1], "anthropic") ||
                                               !strcmp(argv[i + 1], "both")))
            s.api = argv[i + 1][0] == 'c' ? 0 : argv[i + 1][0] == 'a' ? 1 : 2;
        else {
            fprintf(stderr, "usage: bench_http [--redis ADDR] [--requests N] [--tokens N] "
                            "[--api chat|anthropic|both]\n");
            return 2;
        }
    }
    if (s.n_req < 1 || s.n_tok < 2) {
        fprintf(stderr, "bench_http: --requests >= 1 and --tokens >= 2\n");
        return 2;
    }
    char prefix[64], port[16];
    snprintf(prefix, sizeof prefix, "bench%d:", (int)getpid());
    s.prefix = prefix;
    s.port = free_port();
    snprintf(port, sizeof port, "%d", s.port);
    /* one served name: there is no worker to announce one */
    char *cargv[] = {"bench_http", "--redis", (char *)s.redis, "--http", port, "--prefix", prefix,
                     "--log-level", "warn", "--served-model-name", "redlm", NULL};
    struct cfg c;
    struct rl_err err = {0};
    enum cfg_action act;
    if (cfg_load(&c, 11, cargv, CFG_DISPATCHER, &act, &err)) {
        fprintf(stderr, "bench_http: %s\n", err.msg);
        return 1;
    }
    struct rl_log log = {.level = RL_LOG_WARN, .ident = "bench_http"};
    struct dhttp *h = NULL;
    if (dhttp_start(&h, &c, &log, NULL, &err)) {
        fprintf(stderr, "bench_http: %s\n", err.msg);
        cfg_free(&c);
        return 1;
    }
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    s.t_sent = calloc((size_t)(s.n_req * s.n_tok), sizeof(double));
    s.t_recv = calloc((size_t)(s.n_req * s.n_tok), sizeof(double));
    pthread_t w;
    pthread_create(&w, NULL, worker_main, &s);
    int rc = 0;
    for (int r = 0; r < s.n_req && !s.failed; r++) {
        if (client_one(&s, r)) {
            fprintf(stderr, "bench_http: request %d failed\n", r);
            rc = 1;
            pthread_mutex_lock(&s.mu);
            s.failed = 1;
            pthread_cond_broadcast(&s.cv);
            pthread_mutex_unlock(&s.mu);
        }
    }
    pthread_join(w, NULL);
    if (!rc && !s.failed) {
        double *first = malloc(sizeof(double) * (size_t)s.n_req);
        double *next = malloc(sizeof(double) * (size_t)(s.n_req * (s.n_tok - 1)));
        for (int ant = 0; ant < 2; ant++) {
            int nf = 0, nn = 0;
            for (int r = 0; r < s.n_req; r++)
                for (int k = 0; k < s.n_tok && api_of(&s, r) == ant; k++) {
                    double d = s.t_recv[r * s.n_tok + k] - s.t_sent[r * s.n_tok + k];
                    if (k == 0)
                        first[nf++] = d;
                    else
                        next[nn++] = d;
                }
            if (!nf)
                continue;
            report(ant ? "anthropic_sse_first_event" : "http_sse_first_event", first, nf);
            report(ant ? "anthropic_sse_next_event" : "http_sse_next_event", next, nn);
        }
        free(first);
        free(next);
    } else {
        rc = 1;
    }
    dhttp_stop(h);
    cfg_free(&c);
    free(s.t_sent);
    free(s.t_recv);
    return rc;
}
