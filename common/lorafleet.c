/* common/lorafleet.c - runtime LoRA adapters for the fleet (lorafleet.h).
 *
 * The wish is declarative, so a call only writes it and watches the
 * fleet's heartbeats follow. A load that nobody could follow (every worker
 * failed, none answered, none is alive) is withdrawn by a compare-and-
 * delete, so a retry starts clean and a later load of the name by someone
 * else is never deleted by our late withdrawal. */
#include "lorafleet.h"

#include <cjson/cJSON.h>

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "modelref.h"
#include "registry.h"
#include "text.h"

#define LFL_MAX_WORKERS 1000
#define LFL_NOTE_MAX 600 /* the workers' reasons said in one answer, bytes */

/* HDEL only while the wish is still ours (the path we wrote) */
static const char withdraw_lua[] =
    "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then\n"
    "  return redis.call('HDEL', KEYS[1], ARGV[1])\n"
    "end\n"
    "return 0\n";

__attribute__((format(printf, 5, 6))) static void err_set(struct lfl_error *e, int status,
                                                   const char *code, const char *param,
                                                   const char *fmt, ...)
{
    e->status = status;
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

struct wish {
    char name[MODELREF_NAME_MAX + 1];
    char path[PATH_MAX];
    char model[MODELREF_NAME_MAX + 1];
    char key[512];
};

/* What the fleet's heartbeats say of a wish, once. */
struct tally {
    int workers;        /* live workers of the model */
    int done;           /* serve it from the path (load) / no longer serve it (unload) */
    int failed;
    int pending;
    struct text why;    /* "worker: reason; ..." of the failed */
    struct text waiting; /* "worker, ..." of the pending */
};

static void tally_free(struct tally *t)
{
    text_free(&t->why);
    text_free(&t->waiting);
}

static const cJSON *item(const cJSON *o, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

static bool str_is(const cJSON *v, const char *s)
{
    return cJSON_IsString(v) && !strcmp(v->valuestring, s);
}

/* ---- the body ---- */

static int parse(const char *body, size_t len, bool load, struct wish *x, struct lfl_error *e)
{
    memset(x, 0, sizeof *x);
    cJSON *o = cJSON_ParseWithLength(body, len);
    int rc = 0;
    const cJSON *name = item(o, "lora_name"), *path = item(o, "lora_path"),
                *model = item(o, "model"), *inplace = item(o, "load_inplace");
    if (!cJSON_IsObject(o)) {
        err_set(e, 400, "invalid_json", NULL,
                "the body is not a JSON object");
        rc = 400;
    } else if (!cJSON_IsString(name) || !name->valuestring[0]) {
        err_set(e, 400, "MISSING_FIELD", "lora_name",
                "lora_name: required, a string");
        rc = 400;
    } else if (strlen(name->valuestring) > MODELREF_NAME_MAX ||
               !modelref_name_ok(name->valuestring)) {
        err_set(e, 400, "BAD_VALUE", "lora_name",
                "lora_name \"%.200s\": 1-%d of [A-Za-z0-9._:/-], not starting with '/' "
                "or '.'", name->valuestring, MODELREF_NAME_MAX);
        rc = 400;
    } else if (load && (!cJSON_IsString(path) || !path->valuestring[0])) {
        err_set(e, 400, "MISSING_FIELD", "lora_path",
                "lora_path: required, a string (a directory on the workers' machines)");
        rc = 400;
    } else if (load && strlen(path->valuestring) >= PATH_MAX) {
        err_set(e, 400, "BAD_VALUE", "lora_path",
                "lora_path: longer than %d bytes", PATH_MAX - 1);
        rc = 400;
    } else if (model && !cJSON_IsNull(model) &&
               (!cJSON_IsString(model) || strlen(model->valuestring) > MODELREF_NAME_MAX)) {
        err_set(e, 400, "BAD_VALUE", "model",
                "model: the served base model's name, a string");
        rc = 400;
    } else if (load && inplace && !cJSON_IsNull(inplace) && !cJSON_IsBool(inplace)) {
        err_set(e, 400, "BAD_VALUE", "load_inplace",
                "load_inplace: a boolean");
        rc = 400;
    } else if (load && cJSON_IsTrue(inplace)) {
        /* a running job would meet two sets of weights: unload, then load */
        err_set(e, 400, "BAD_VALUE", "load_inplace",
                "load_inplace: not supported; unload the adapter, then load it again");
        rc = 400;
    } else {
        snprintf(x->name, sizeof x->name, "%s", name->valuestring);
        if (load)
            snprintf(x->path, sizeof x->path, "%s", path->valuestring);
        if (cJSON_IsString(model))
            snprintf(x->model, sizeof x->model, "%s", model->valuestring);
    }
    cJSON_Delete(o);
    return rc;
}

/* ---- the served models ---- */

static cJSON *models_now(const struct lfl_opts *o)
{
    char *t = o->models_json ? o->models_json(o->ctx) : NULL;
    cJSON *m = t ? cJSON_Parse(t) : NULL;
    free(t);
    return m;
}

/* The served model named id (base or adapter), or NULL. */
static const cJSON *served(const cJSON *models, const char *id)
{
    const cJSON *m;
    cJSON_ArrayForEach(m, models)
    {
        if (str_is(item(m, "id"), id))
            return m;
    }
    return NULL;
}

#define LFL_MAX_MODELS 64

/* The models the live workers serve (their heartbeats' "model"): what the
 * wishes are kept under (each worker reads loras:<its model>). The
 * dispatcher's table is not asked: it lags the heartbeats by a refresh, and
 * holds served_model_name's alias, which no worker serves. */
struct fleet {
    char (*out)[MODELREF_NAME_MAX + 1];
    int n;
    const char *name;   /* NULL: not asked */
    bool name_served;
};

static void fleet_one(void *ctx, const char *who, const cJSON *hb)
{
    (void)who;
    struct fleet *f = ctx;
    const cJSON *m = item(hb, "model"), *a;
    if (!cJSON_IsString(m) || strlen(m->valuestring) > MODELREF_NAME_MAX)
        return;
    bool have = false;
    for (int k = 0; k < f->n && !have; k++)
        have = !strcmp(f->out[k], m->valuestring);
    if (!have && f->n < LFL_MAX_MODELS)
        snprintf(f->out[f->n++], MODELREF_NAME_MAX + 1, "%s", m->valuestring);
    /* name already served here, as a model or an adapter? */
    if (!f->name)
        return;
    f->name_served |= str_is(m, f->name);
    cJSON_ArrayForEach(a, item(hb, "lora_adapters"))
        f->name_served |= str_is(item(a, "name"), f->name);
}

static int fleet_models(struct rconn *c, const struct lfl_opts *o,
                        char out[LFL_MAX_MODELS][MODELREF_NAME_MAX + 1], const char *name,
                        bool *name_served, struct rl_err *err)
{
    struct fleet f = {out, 0, name, false};
    if (reg_each_heartbeat(c, o->prefix, LFL_MAX_WORKERS, fleet_one, &f, err))
        return -1;
    if (name_served)
        *name_served = f.name_served;
    return f.n;
}

/* x->model: the one given (a model live workers serve), or the only one. */
static int pick_model(struct rconn *c, const struct lfl_opts *o, struct wish *x,
                      bool *name_served, struct lfl_error *e)
{
    char models[LFL_MAX_MODELS][MODELREF_NAME_MAX + 1];
    struct rl_err err;
    int n = fleet_models(c, o, models, x->name, name_served, &err);
    if (n < 0) {
        err_set(e, 503, "redis_unavailable", NULL,
                "reading the workers' heartbeats: %.300s", err.msg);
        return 503;
    }
    if (x->model[0]) {
        for (int k = 0; k < n; k++)
            if (!strcmp(models[k], x->model))
                return 0;
        err_set(e, 404, "model_not_found", "model",
                "model '%.200s': no live worker serves it (a LoRA adapter's base model "
                "is the name its workers serve)", x->model);
        return 404;
    }
    if (n == 1) {
        snprintf(x->model, sizeof x->model, "%s", models[0]);
        return 0;
    }
    if (n == 0) {
        err_set(e, 503, "no_workers", "model",
                "no live worker serves a model to load an adapter on");
        return 503;
    }
    struct text names = {0};
    for (int k = 0; k < n; k++)
        text_printf(&names, "%s%s", k ? ", " : "", models[k]);
    err_set(e, 400, "MODEL_REQUIRED", "model",
            "several models are served (%.300s): say which in \"model\"",
            names.p ? names.p : "");
    text_free(&names);
    return 400;
}

int lfl_wish_key(char *buf, size_t cap, const char *prefix, const char *model)
{
    int n = snprintf(buf, cap, "%.64sloras:%.128s", prefix, model);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

static void wish_key(const char *prefix, struct wish *x)
{
    lfl_wish_key(x->key, sizeof x->key, prefix, x->model);
}

/* ---- the fleet ---- */

/* What look() asks of each heartbeat. */
struct look {
    const struct wish *x;
    bool load;
    struct tally *t;
};

static void look_one(void *ctx, const char *who, const cJSON *hb)
{
    struct look *lk = ctx;
    const struct wish *x = lk->x;
    struct tally *t = lk->t;
    if (!str_is(item(hb, "model"), x->model))
        return;
    bool serves = false, from_path = false;
    const char *failed = NULL;
    const cJSON *a;
    cJSON_ArrayForEach(a, item(hb, "lora_adapters"))
    {
        if (!str_is(item(a, "name"), x->name))
            continue;
        serves = true;
        const cJSON *p = item(a, "lora_path");
        from_path = lk->load ? str_is(p, x->path) : cJSON_IsString(p);
    }
    cJSON_ArrayForEach(a, item(hb, "lora_failed"))
    {
        const cJSON *why = item(a, "error");
        if (str_is(item(a, "name"), x->name) && str_is(item(a, "lora_path"), x->path))
            failed = cJSON_IsString(why) ? why->valuestring : "failed";
    }
    t->workers++;
    if (lk->load && from_path) {
        t->done++;
    } else if (!lk->load && !(serves && from_path)) {
        t->done++;
    } else if (lk->load && failed) {
        t->failed++;
        if (t->why.n < LFL_NOTE_MAX)
            text_printf(&t->why, "%s%.100s: %.300s", t->why.n ? "; " : "", who, failed);
    } else {
        t->pending++;
        if (t->waiting.n < LFL_NOTE_MAX)
            text_printf(&t->waiting, "%s%.100s", t->waiting.n ? ", " : "", who);
    }
}

/* Reads every live worker's heartbeat and counts, for the workers of
 * x->model, who is done with the wish (load: serves x->name from x->path;
 * unload: no longer serves it at runtime), who failed (load) and who has
 * not said yet. */
static int look(struct rconn *c, const struct lfl_opts *o, const struct wish *x, bool load,
                struct tally *t, struct rl_err *err)
{
    tally_free(t);
    memset(t, 0, sizeof *t);
    struct look lk = {x, load, t};
    return reg_each_heartbeat(c, o->prefix, LFL_MAX_WORKERS, look_one, &lk, err) ? -1 : 0;
}

static void nap(const struct lfl_opts *o)
{
    int poll = o->poll_ms > 0 ? o->poll_ms : 100;
    struct timespec ts = {poll / 1000, (long)(poll % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Looks until nobody is pending or the time is up; the last look in *t. */
static int watch(struct rconn *c, const struct lfl_opts *o, const struct wish *x, bool load,
                 struct tally *t, struct rl_err *err)
{
    int64_t until = rl_mono_ms() + o->timeout_ms;
    for (;;) {
        if (look(c, o, x, load, t, err))
            return -1;
        if (t->pending == 0 || rl_mono_ms() >= until)
            return 0;
        nap(o);
    }
}

/* Waits (until the deadline the workers left) for this front door's model
 * table to list adapter x->name (listed) or not. */
static void settle(const struct lfl_opts *o, const struct wish *x, bool listed, int64_t until)
{
    if (!o->models_json)
        return; /* no door of ours to wait for (redlm lora) */
    for (;;) {
        cJSON *m = models_now(o);
        bool is = served(m, x->name) != NULL;
        cJSON_Delete(m);
        if (is == listed || rl_mono_ms() >= until)
            return;
        nap(o);
    }
}

static void withdraw(struct rconn *c, const struct wish *x)
{
    const char *argv[] = {"EVAL", withdraw_lua, "1", x->key, x->name, x->path};
    struct rl_err err;
    struct rconn_reply *r = NULL;
    rconn_command(c, 6, argv, NULL, &r, &err);
    rconn_reply_free(r);
}

/* One command whose reply is an integer (HSETNX, HDEL, HEXISTS): it, or
 * -1 when Redis failed (err filled). */
static long long ask_int(struct rconn *c, int argc, const char *const *argv, struct rl_err *err)
{
    struct rconn_reply *r = NULL;
    long long v = -1;
    if (!rconn_command(c, argc, argv, NULL, &r, err))
        v = r && r->type == RCONN_INTEGER ? r->integer : 0;
    rconn_reply_free(r);
    return v;
}

static int already_loaded(struct lfl_error *e, const char *name)
{
    err_set(e, 400, "lora_already_loaded", "lora_name",
            "The lora adapter '%.200s' has already been loaded.", name);
    return 400;
}

static int redis_error(struct lfl_error *e, const char *what, const char *msg)
{
    err_set(e, 503, "redis_unavailable", NULL, "%s: %.300s", what, msg);
    return 503;
}

/* ---- the routes ---- */

int lfl_load(struct rconn *c, const struct lfl_opts *o, const char *body, size_t len, char **ok,
             struct lfl_error *e)
{
    *ok = NULL;
    struct wish x;
    int64_t until = rl_mono_ms() + o->timeout_ms;
    int rc = parse(body, len, true, &x, e);
    if (rc)
        return rc;
    /* the door's table (it also holds served_model_name's alias), then the
     * heartbeats (what it has not seen yet) */
    cJSON *models = models_now(o);
    bool taken = served(models, x.name) != NULL;
    cJSON_Delete(models);
    if (taken)
        return already_loaded(e, x.name);
    if ((rc = pick_model(c, o, &x, &taken, e)))
        return rc;
    if (taken)
        return already_loaded(e, x.name);
    wish_key(o->prefix, &x);
    const char *argv[] = {"HSETNX", x.key, x.name, x.path};
    struct rl_err err;
    long long mine = ask_int(c, 4, argv, &err);
    if (mine < 0)
        return redis_error(e, "writing the wish", err.msg);
    if (mine != 1)
        return already_loaded(e, x.name);
    struct tally t = {0};
    if (watch(c, o, &x, true, &t, &err)) {
        tally_free(&t);
        return redis_error(e, "reading the workers' heartbeats", err.msg);
    }
    if (t.done == 0) {
        withdraw(c, &x);
        if (t.workers == 0)
            err_set(e, 503, "no_workers", "model",
                    "no live worker serves %.200s", x.model);
        else if (t.failed)
            err_set(e, 400, "lora_load_failed", "lora_path",
                    "Loading lora adapter '%.128s' failed: %.380s", x.name, t.why.p);
        else
            err_set(e, 504, "timeout", NULL,
                    "no worker of %.128s loaded '%.128s' within %d s (waiting for %.200s)",
                    x.model, x.name, o->timeout_ms / 1000, t.waiting.p);
        rc = e->status;
        tally_free(&t);
        return rc;
    }
    settle(o, &x, true, until);
    struct text s = {0};
    text_printf(&s, "Success: LoRA adapter '%s' added successfully.", x.name);
    if (t.failed || t.pending)
        text_printf(&s, " Served by %d of the %d live workers of %s%s%s%s%s.", t.done, t.workers,
                    x.model, t.failed ? "; failed: " : "", t.failed ? t.why.p : "",
                    t.pending ? "; not answered yet: " : "", t.pending ? t.waiting.p : "");
    text_printf(&s, "\n");
    tally_free(&t);
    if (!s.p) {
        err_set(e, 500, "out_of_memory", NULL, "out of memory");
        return 500;
    }
    *ok = s.p;
    return 0;
}

int lfl_unload(struct rconn *c, const struct lfl_opts *o, const char *body, size_t len,
               char **ok, struct lfl_error *e)
{
    *ok = NULL;
    struct wish x;
    int64_t until = rl_mono_ms() + o->timeout_ms;
    int rc = parse(body, len, false, &x, e);
    if (rc)
        return rc;
    cJSON *models = models_now(o);
    const cJSON *m = served(models, x.name);
    bool is_served = m != NULL;
    if (!x.model[0] && m && cJSON_IsString(item(m, "parent")))
        snprintf(x.model, sizeof x.model, "%s", item(m, "parent")->valuestring);
    /* not served now (every worker failed it, or none is alive): the
     * wish may still be there, under one of the fleet's models */
    char fleet[LFL_MAX_MODELS][MODELREF_NAME_MAX + 1];
    struct rl_err ferr;
    int n_fleet = x.model[0] ? 0 : fleet_models(c, o, fleet, NULL, NULL, &ferr);
    for (int k = 0; k < n_fleet; k++) {
        snprintf(x.model, sizeof x.model, "%.128s", fleet[k]);
        wish_key(o->prefix, &x);
        const char *argv[] = {"HEXISTS", x.key, x.name};
        if (ask_int(c, 3, argv, &ferr) == 1)
            break;
        x.model[0] = 0;
    }
    cJSON_Delete(models);
    if (!x.model[0]) {
        err_set(e, 404, "lora_not_found", "lora_name",
                "The lora adapter '%.200s' cannot be found.", x.name);
        return 404;
    }
    wish_key(o->prefix, &x);
    const char *argv[] = {"HDEL", x.key, x.name};
    struct rl_err err;
    long long had = ask_int(c, 3, argv, &err);
    if (had < 0)
        return redis_error(e, "deleting the wish", err.msg);
    if (!had && is_served) {
        err_set(e, 400, "BAD_VALUE", "lora_name",
                "The lora adapter '%.200s' comes from the workers' lora_modules, not from "
                "a load: remove it there", x.name);
        return 400;
    }
    if (!had) {
        err_set(e, 404, "lora_not_found", "lora_name",
                "The lora adapter '%.200s' cannot be found.", x.name);
        return 404;
    }
    struct tally t = {0};
    if (watch(c, o, &x, false, &t, &err)) {
        tally_free(&t);
        return redis_error(e, "reading the workers' heartbeats", err.msg);
    }
    if (t.pending) {
        err_set(e, 504, "timeout", NULL,
                "'%.128s' is no longer wished, but %.200s still serve%s it after %d s",
                x.name, t.waiting.p, t.pending > 1 ? "" : "s", o->timeout_ms / 1000);
        tally_free(&t);
        return 504;
    }
    tally_free(&t);
    settle(o, &x, false, until);
    struct text s = {0};
    text_printf(&s, "Success: LoRA adapter '%s' removed successfully.\n", x.name);
    if (!s.p) {
        err_set(e, 500, "out_of_memory", NULL, "out of memory");
        return 500;
    }
    *ok = s.p;
    return 0;
}

/* ---- the listing ---- */

static cJSON *model_entry(cJSON *models, const char *name)
{
    cJSON *m;
    cJSON_ArrayForEach(m, models)
    {
        if (str_is(item(m, "model"), name))
            return m;
    }
    m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "model", name);
    cJSON_AddObjectToObject(m, "wished");
    cJSON_AddArrayToObject(m, "workers");
    cJSON_AddItemToArray(models, m);
    return m;
}

static void list_one(void *ctx, const char *who, const cJSON *hb)
{
    cJSON *models = ctx;
    const cJSON *model = item(hb, "model");
    if (!cJSON_IsString(model))
        return;
    cJSON *w = cJSON_CreateObject();
    cJSON_AddStringToObject(w, "name", who);
    const cJSON *a = item(hb, "lora_adapters"), *f = item(hb, "lora_failed");
    cJSON_AddItemToObject(w, "adapters", a ? cJSON_Duplicate(a, 1) : cJSON_CreateArray());
    cJSON_AddItemToObject(w, "failed", f ? cJSON_Duplicate(f, 1) : cJSON_CreateArray());
    cJSON_AddItemToArray(
        cJSON_GetObjectItemCaseSensitive(model_entry(models, model->valuestring), "workers"), w);
}

int lfl_list(struct rconn *c, const char *prefix, cJSON **out, struct rl_err *err)
{
    *out = NULL;
    cJSON *o = cJSON_CreateObject(), *models = cJSON_AddArrayToObject(o, "models");
    if (!models) {
        cJSON_Delete(o);
        return rl_errf(err, RL_ENOMEM, "out of memory");
    }
    int rc = reg_each_heartbeat(c, prefix, LFL_MAX_WORKERS, list_one, models, err);
    if (rc) {
        cJSON_Delete(o);
        return rc;
    }
    cJSON *m;
    cJSON_ArrayForEach(m, models)
    {
        struct wish x = {0};
        snprintf(x.model, sizeof x.model, "%.128s", item(m, "model")->valuestring);
        wish_key(prefix, &x);
        const char *argv[] = {"HGETALL", x.key};
        struct rconn_reply *r = NULL;
        if ((rc = rconn_command(c, 2, argv, NULL, &r, err)))
            break;
        cJSON *wished = cJSON_GetObjectItemCaseSensitive(m, "wished");
        for (size_t k = 0; r && r->type == RCONN_ARRAY && k + 1 < r->n_elem; k += 2)
            if (r->elem[k].type == RCONN_STRING && r->elem[k + 1].type == RCONN_STRING)
                cJSON_AddStringToObject(wished, r->elem[k].str, r->elem[k + 1].str);
        rconn_reply_free(r);
    }
    if (rc) {
        cJSON_Delete(o);
        return rc;
    }
    *out = o;
    return 0;
}
