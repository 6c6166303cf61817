/* worker/lorart.c - LoRA adapters loaded and unloaded at runtime, fleet-wide.
 *
 * The fleet's wish is a hash in Redis, <prefix>loras:<model> (field: the
 * adapter's name, value: its lora_path), which the front door writes
 * (POST /v1/load_lora_adapter, /v1/unload_lora_adapter:
 * common/lorafleet.c) and every worker of the model reads with its
 * heartbeat (one HGETALL in the same pipelined round trip) and once at
 * start, so a worker that starts later serves what the fleet serves. What
 * each worker made of it is in its heartbeat: lora_adapters[] names the
 * adapters it serves, the runtime ones with their lora_path, and
 * lora_failed[] the wishes it could not follow, with why. The front door
 * answers once every live worker of the model has said one or the other.
 * Declarative, so nothing is lost to a worker that was restarting when the
 * wish changed, and a wish is idempotent.
 *
 * Paths are paths on the worker's machine, and a hostile client could name
 * any: a worker loads runtime adapters only from inside its lora_dirs (a
 * relative lora_path is looked up in each, an absolute one must resolve,
 * symlinks followed, inside one). Without lora_dirs it loads none and says
 * so in lora_failed.
 *
 * Unloading stops admission at once (w_lora_find skips the adapter, the
 * heartbeat no longer names it, so the dispatcher stops routing to it);
 * the jobs that run with it finish; then the engine frees its weights
 * (engine_lora_drop). An adapter's index, name and stream stay until the
 * worker exits: jobs still queued in its stream are answered
 * MODEL_NOT_FOUND, and a later load of the name reuses them.
 *
 * Adapters of lora_modules are the operator's: the wish cannot unload or
 * replace them (a wish naming one with another path fails, said in
 * lora_failed).
 *
 * Main thread only. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "lorafleet.h"
#include "worker.h"

#define RT_MAX LORA_MAX_ADAPTERS
#define RT_MSG_MAX 320

struct rt_wish {
    char name[MODELREF_NAME_MAX + 1];
    char *path;                     /* owned */
};

struct w_lorart {
    struct rt_wish want[RT_MAX];    /* the hash as last read */
    int n_want;
    bool dirty;                     /* want changed, or a load waits for a drop */
    bool denied;                    /* the ACL refuses HGETALL: asked no more */
    /* per adapter index (engine_lora_name's) */
    char *path[RT_MAX];             /* its lora_path as the wish said; NULL: not loaded
                                       from the wish (lora_modules's) */
    bool gone[RT_MAX];              /* unloaded or unloading: not served */
    bool dropping[RT_MAX];          /* engine_lora_drop still to be done */
    /* the adapter being read and hashed off the loop thread (one at a
     * time): for a 14B rank-16 adapter about 1.5 s that every running
     * stream would otherwise wait (BENCHMARKS.md) */
    struct rt_job {
        pthread_t th;
        bool running;               /* started, not joined */
        atomic_bool done;
        char name[MODELREF_NAME_MAX + 1];
        char *path;                 /* the wish's lora_path, owned */
        char dir[PATH_MAX];         /* resolved */
        char id[SHA256_HEX_LEN + 1];
        struct lora_adapter *a;     /* the result, owned until installed */
        struct rl_err err;
        int rc;
        int64_t t0;
        const struct worker *w;
    } job;
    /* wishes that failed here, kept until the wish for the name changes */
    struct rt_fail {
        char name[MODELREF_NAME_MAX + 1];
        char *path;                 /* owned */
        char msg[RT_MSG_MAX];
    } fail[RT_MAX];
    int n_fail;
};

int w_lorart_create(struct worker *w)
{
    w->rt = calloc(1, sizeof *w->rt);
    return w->rt ? 0 : -RL_ENOMEM;
}

void w_lorart_free(struct worker *w)
{
    struct w_lorart *rt = w->rt;
    if (!rt)
        return;
    if (rt->job.running)
        pthread_join(rt->job.th, NULL);
    lora_free(rt->job.a); /* read, not installed */
    free(rt->job.path);
    for (int i = 0; i < rt->n_want; i++)
        free(rt->want[i].path);
    for (int i = 0; i < RT_MAX; i++)
        free(rt->path[i]);
    for (int i = 0; i < rt->n_fail; i++)
        free(rt->fail[i].path);
    free(rt);
    w->rt = NULL;
}

bool w_lora_gone(const struct worker *w, int i)
{
    return w->rt && i >= 0 && i < RT_MAX && w->rt->gone[i];
}

void w_lorart_key(const struct worker *w, char out[W_KEY_MAX])
{
    lfl_wish_key(out, W_KEY_MAX, w->opt.prefix, w->model.name);
}

bool w_lorart_wanted(const struct worker *w) { return w->rt && !w->rt->denied; }

void w_lorart_forget(struct worker *w, int i)
{
    struct w_lorart *rt = w->rt;
    if (!rt || i < 0 || i >= RT_MAX)
        return;
    free(rt->path[i]);
    rt->path[i] = NULL;
    rt->gone[i] = rt->dropping[i] = false;
}

/* ---- the wish ---- */

static const struct rt_wish *wish_of(const struct w_lorart *rt, const char *name)
{
    for (int i = 0; i < rt->n_want; i++)
        if (!strcmp(rt->want[i].name, name))
            return &rt->want[i];
    return NULL;
}

void w_lorart_reply(struct worker *w, const struct rconn_reply *r)
{
    struct w_lorart *rt = w->rt;
    if (!rt || !r)
        return;
    if (r->type == RCONN_ERROR) {
        if (!strncmp(r->str, "NOPERM", 6)) {
            rt->denied = true;
            RL_LOG(&w->log, RL_LOG_WARN, "runtime LoRA adapters: Redis refuses HGETALL on "
                   "loras:* to this worker (an ACL from before them: config/redis-acl.conf); "
                   "none is loaded at runtime");
        } else {
            RL_LOG(&w->log, RL_LOG_DEBUG, "runtime LoRA adapters: %s", r->str);
        }
        return;
    }
    if (r->type != RCONN_ARRAY || r->n_elem % 2)
        return;
    struct rt_wish next[RT_MAX];
    int n = 0;
    for (size_t k = 0; k + 1 < r->n_elem; k += 2) {
        const struct rconn_reply *f = &r->elem[k], *v = &r->elem[k + 1];
        if (f->type != RCONN_STRING || v->type != RCONN_STRING || f->len > MODELREF_NAME_MAX ||
            strlen(f->str) != f->len || strlen(v->str) != v->len || v->len >= PATH_MAX)
            continue; /* the front door writes none such; someone else did */
        if (n == RT_MAX)
            break;
        snprintf(next[n].name, sizeof next[n].name, "%s", f->str);
        next[n].path = v->str; /* borrowed until copied below */
        n++;
    }
    bool same = n == rt->n_want;
    for (int i = 0; i < n && same; i++) {
        const struct rt_wish *o = wish_of(rt, next[i].name);
        same = o && !strcmp(o->path, next[i].path);
    }
    if (same)
        return;
    struct rt_wish copy[RT_MAX];
    for (int i = 0; i < n; i++) {
        copy[i] = next[i];
        if (!(copy[i].path = strdup(next[i].path))) {
            for (int k = 0; k < i; k++)
                free(copy[k].path);
            return; /* the next heartbeat's read brings it again */
        }
    }
    for (int i = 0; i < rt->n_want; i++)
        free(rt->want[i].path);
    memcpy(rt->want, copy, (size_t)n * sizeof copy[0]);
    rt->n_want = n;
    rt->dirty = true;
}

/* ---- failures ---- */

static struct rt_fail *fail_of(struct w_lorart *rt, const char *name)
{
    for (int i = 0; i < rt->n_fail; i++)
        if (!strcmp(rt->fail[i].name, name))
            return &rt->fail[i];
    return NULL;
}

static void fail_drop(struct w_lorart *rt, int i)
{
    free(rt->fail[i].path);
    rt->fail[i] = rt->fail[--rt->n_fail];
}

static void fail_note(struct worker *w, const struct rt_wish *x, const char *msg)
{
    struct w_lorart *rt = w->rt;
    struct rt_fail *f = fail_of(rt, x->name);
    if (!f && rt->n_fail < RT_MAX)
        f = &rt->fail[rt->n_fail++];
    else if (f)
        free(f->path);
    if (!f)
        return;
    snprintf(f->name, sizeof f->name, "%s", x->name);
    f->path = strdup(x->path);
    snprintf(f->msg, sizeof f->msg, "%s", msg);
    RL_LOG(&w->log, RL_LOG_ERROR, "runtime LoRA adapter %s (%s): %s", x->name, x->path, msg);
}

/* ---- paths ---- */

/* Whether resolved path p is dir or inside it (dir resolved too). */
static bool inside(const char *p, const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    return !strncmp(p, dir, n) && (p[n] == '/' || p[n] == 0 || (n == 1 && dir[0] == '/'));
}

/* The directory lora_path names on this machine, resolved, inside one of
 * lora_dirs; else why not. */
static int resolve(const struct worker *w, const char *path, char out[PATH_MAX], struct rl_err *err)
{
    const struct cfg_strlist *dirs = &w->cfg.lora_dirs;
    if (dirs->n == 0)
        return rl_errf(err, RL_EINVAL, "this worker loads no adapters at runtime (its lora_dirs "
                       "is empty)");
    if (!path[0])
        return rl_errf(err, RL_EINVAL, "lora_path is empty");
    bool any = false;
    for (int i = 0; i < dirs->n; i++) {
        char root[PATH_MAX], cand[PATH_MAX * 2];
        if (!realpath(dirs->v[i], root))
            continue;
        if (path[0] == '/')
            snprintf(cand, sizeof cand, "%s", path);
        else
            snprintf(cand, sizeof cand, "%s/%s", root, path);
        if (!realpath(cand, out))
            continue;
        any = true;
        if (inside(out, root))
            return 0;
    }
    if (any)
        return rl_errf(err, RL_EINVAL, "%s is outside this worker's lora_dirs", path);
    return rl_errf(err, RL_ENOTFOUND, "%s: no such directory %s this worker's lora_dirs", path,
                   path[0] == '/' ? "on" : "in");
}

/* ---- following the wish ---- */

static void *prepare_main(void *arg)
{
    struct rt_job *jb = arg;
    jb->rc = w_lora_prepare(jb->w, jb->dir, jb->id, &jb->a, &jb->err);
    atomic_store(&jb->done, true);
    return NULL;
}

/* Starts loading wish x (nothing is served as x->name now): its files are
 * read on a thread of their own, installed by w_lorart_step once read. */
static void load(struct worker *w, const struct rt_wish *x)
{
    struct w_lorart *rt = w->rt;
    struct rt_job *jb = &rt->job;
    if (jb->running)
        return; /* after the one being read: its install follows the wish again */
    struct rl_err err = {0};
    if (resolve(w, x->path, jb->dir, &err)) {
        fail_note(w, x, err.msg);
        return;
    }
    free(jb->path);
    if (!(jb->path = strdup(x->path))) {
        fail_note(w, x, "out of memory");
        return;
    }
    snprintf(jb->name, sizeof jb->name, "%s", x->name);
    jb->a = NULL;
    jb->rc = 0;
    jb->err = (struct rl_err){0};
    jb->w = w;
    jb->t0 = rl_wall_ms();
    atomic_store(&jb->done, false);
    jb->running = !pthread_create(&jb->th, NULL, prepare_main, jb);
    if (!jb->running)
        prepare_main(jb); /* no thread: here, as lora_modules's are */
}

/* The adapter the job read, into the engine, if the wish still wants it
 * from that path; else it is dropped. */
static void install(struct worker *w)
{
    struct w_lorart *rt = w->rt;
    struct rt_job *jb = &rt->job;
    const struct rt_wish *x = wish_of(rt, jb->name);
    struct rt_wish me = {.path = jb->path};
    snprintf(me.name, sizeof me.name, "%s", jb->name);
    if (!x || strcmp(x->path, jb->path)) {
        lora_free(jb->a);
        jb->a = NULL;
        return;
    }
    if (jb->rc) {
        rl_err_wrap(&jb->err, "lora %s (%s)", jb->name, jb->dir);
        fail_note(w, &me, jb->err.msg);
        return;
    }
    struct rl_err err = {0};
    char *p = strdup(jb->path);
    int i = p ? w_lora_install(w, jb->name, jb->dir, jb->id, jb->a, &err)
              : rl_errf(&err, RL_ENOMEM, "out of memory");
    if (i < 0) {
        free(p);
        lora_free(jb->a);
        jb->a = NULL;
        fail_note(w, &me, err.msg);
        return;
    }
    jb->a = NULL; /* the engine's */
    free(rt->path[i]);
    rt->path[i] = p;
    rt->gone[i] = false;
    RL_LOG(&w->log, RL_LOG_INFO, "runtime LoRA adapter \"%s\": %s, rank %d, read in %.1f s off "
           "the loop", jb->name, jb->dir, engine_lora_rank(w->eng, i),
           (double)(rl_wall_ms() - jb->t0) / 1000.0);
    /* a new name reads from a stream of its own once no read is out */
    if (w->n_loras > w->n_lora_specs && w->n_lora_specs < W_MAX_STREAMS)
        w->relayout = true;
}

/* Stops serving runtime adapter i: its running jobs finish first. */
static void unload(struct worker *w, int i, const char *why)
{
    struct w_lorart *rt = w->rt;
    rt->gone[i] = true;
    rt->dropping[i] = true;
    RL_LOG(&w->log, RL_LOG_INFO, "runtime LoRA adapter %s: unloading (%s); its running jobs "
           "finish first", engine_lora_name(w->eng, i), why);
}

/* The jobs this worker holds for adapter i. */
static int jobs_with(const struct worker *w, int i)
{
    int n = 0;
    for (int k = 0; k < w->n_jobs; k++)
        n += w->jobs[k]->lora == i;
    return n;
}

static void follow(struct worker *w)
{
    struct w_lorart *rt = w->rt;
    rt->dirty = false;
    /* failures of wishes that changed or went are forgotten */
    for (int k = rt->n_fail - 1; k >= 0; k--) {
        const struct rt_wish *x = wish_of(rt, rt->fail[k].name);
        if (!x || !rt->fail[k].path || strcmp(x->path, rt->fail[k].path))
            fail_drop(rt, k);
    }
    /* runtime adapters the wish no longer names, or names with another path */
    for (int i = 0; i < w->n_loras; i++) {
        if (!rt->path[i] || rt->gone[i])
            continue;
        const struct rt_wish *x = wish_of(rt, engine_lora_name(w->eng, i));
        if (!x)
            unload(w, i, "no longer wished");
        else if (strcmp(x->path, rt->path[i]))
            unload(w, i, "wished from another path");
    }
    for (int k = 0; k < rt->n_want; k++) {
        const struct rt_wish *x = &rt->want[k];
        int i = engine_lora_index(w->eng, x->name);
        const struct rt_fail *f = fail_of(rt, x->name);
        if (f)
            continue; /* until the wish changes */
        if (!strcmp(x->name, w->model.name)) {
            fail_note(w, x, "that is the name of the model itself");
        } else if (i >= 0 && !rt->path[i]) {
            /* lora_modules's: fine when it is the same directory */
            char dir[PATH_MAX], mine[PATH_MAX];
            struct rl_err err;
            if (resolve(w, x->path, dir, &err) || !realpath(w->lora_dir[i], mine) ||
                strcmp(dir, mine)) {
                char msg[RT_MSG_MAX];
                snprintf(msg, sizeof msg, "lora_modules serves %.128s from %.80s here; a "
                         "runtime adapter cannot replace it", x->name, w->lora_dir[i]);
                fail_note(w, x, msg);
            }
        } else if (i >= 0 && rt->dropping[i]) {
            rt->dirty = true; /* loaded again once the drop is done */
        } else if (i < 0 || rt->gone[i]) {
            load(w, x);
        }
    }
}

void w_lorart_step(struct worker *w)
{
    struct w_lorart *rt = w->rt;
    if (!rt)
        return;
    bool dropped = false;
    struct rt_job *jb = &rt->job;
    if (atomic_load(&jb->done)) {
        if (jb->running) /* (not: read here, no thread could be started) */
            pthread_join(jb->th, NULL);
        jb->running = false;
        atomic_store(&jb->done, false);
        install(w);
        dropped = true; /* follow again: more may wait for their turn */
    }
    for (int i = 0; i < w->n_loras; i++) {
        if (!rt->dropping[i] || jobs_with(w, i))
            continue;
        struct rl_err err = {0};
        int rc = engine_lora_drop(w->eng, engine_lora_name(w->eng, i), &err);
        if (rc == -RL_EBUSY)
            continue;
        rt->dropping[i] = false;
        dropped = true;
        if (rc && rc != -RL_ENOTFOUND)
            RL_LOG(&w->log, RL_LOG_ERROR, "runtime LoRA adapter %s: %s", engine_lora_name(w->eng, i),
                   err.msg);
        else
            RL_LOG(&w->log, RL_LOG_INFO, "runtime LoRA adapter %s: unloaded",
                   engine_lora_name(w->eng, i));
    }
    if (rt->dirty || dropped) {
        follow(w);
        /* the caller of the front door waits for our heartbeat to say so */
        w->next_hb_ms = 0;
    }
}

int w_lorart_start(struct worker *w)
{
    char key[W_KEY_MAX];
    w_lorart_key(w, key);
    const char *argv[2] = {"HGETALL", key};
    struct rconn_reply *r = NULL;
    struct rl_err err;
    /* an error reply is the reply here (the ACL's NOPERM): said once */
    if (rconn_command(w->rc, 2, argv, NULL, &r, &err) && !r) {
        RL_LOG(&w->log, RL_LOG_WARN, "runtime LoRA adapters: %s; read with the heartbeats",
               err.msg);
        return 0;
    }
    w_lorart_reply(w, r);
    rconn_reply_free(r);
    /* before the first job: every wished adapter read, one after another */
    w_lorart_step(w);
    while (w->rt->job.running || w->rt->dirty) {
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
        w_lorart_step(w);
    }
    return 0;
}

void w_lorart_retry(struct worker *w)
{
    struct w_lorart *rt = w->rt;
    if (!rt)
        return;
    while (rt->n_fail > 0)
        fail_drop(rt, rt->n_fail - 1);
    rt->dirty = true;
}

/* ---- the heartbeat ---- */

const char *w_lorart_path(const struct worker *w, int i)
{
    return w->rt && i >= 0 && i < RT_MAX ? w->rt->path[i] : NULL;
}

void w_lorart_heartbeat(const struct worker *w, cJSON *o)
{
    const struct w_lorart *rt = w->rt;
    if (!rt || rt->n_fail == 0)
        return;
    cJSON *a = cJSON_AddArrayToObject(o, "lora_failed");
    for (int i = 0; a && i < rt->n_fail; i++) {
        cJSON *f = cJSON_CreateObject();
        if (!f)
            return;
        cJSON_AddStringToObject(f, "name", rt->fail[i].name);
        cJSON_AddStringToObject(f, "lora_path", rt->fail[i].path ? rt->fail[i].path : "");
        cJSON_AddStringToObject(f, "error", rt->fail[i].msg);
        cJSON_AddItemToArray(a, f);
    }
}
