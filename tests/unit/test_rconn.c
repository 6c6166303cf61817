/* tests/unit/test_rconn.c - rconn against a real redis-server.
 *
 * With REDLM_TEST_REDIS=host:port (CI) the tests use that server and skip
 * the ones that must restart it. Otherwise the group setup starts its own
 * `redis-server` on a free loopback port (and a unix socket), with no
 * persistence, as a child process; teardown kills it. The reconnect test
 * kills and restarts that child on the same port. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rconn.h"
#include "xmux.h"
#include "test_util.h"

static char addr[256];        /* host:port of the server under test */
static char sock_path[256];   /* its unix socket, "" if none */
static char tmpdir[256];
static int port;
static pid_t server = -1;     /* our child, -1 when using REDLM_TEST_REDIS */
static char prefix[64];       /* keys of this run: "redlm-test:<pid>:" */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) ||
        getsockname(fd, (struct sockaddr *)&sa, &len))
        return -1;
    int p = ntohs(sa.sin_port);
    close(fd);
    return p;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static struct rconn *mk(const char *a, const char *user, const char *pwfile)
{
    struct rconn_opts o;
    rconn_opts_default(&o);
    o.addr = a;
    o.user = user;
    o.password_file = pwfile;
    o.client_name = "redlm-test";
    o.backoff_min_ms = 20;
    o.backoff_max_ms = 400;
    o.io_timeout_ms = 2000;
    struct rconn *c = NULL;
    struct rl_err err = {0};
    if (rconn_create(&c, &o, &err))
        fail_msg("rconn_create(%s): %s", a, err.msg);
    return c;
}

static int start_server(void)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        execlp("redis-server", "redis-server", "--port", ps, "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", "--daemonize", "no", "--unixsocket",
               sock_path, "--unixsocketperm", "700", "--dir", tmpdir, (char *)NULL);
        _exit(127);
    }
    server = pid;
    /* ready when a PING answers */
    struct rconn *c = mk(addr, NULL, NULL);
    struct rl_err err;
    int rc = rconn_wait(c, 10000, &err);
    rconn_free(c);
    return rc;
}

static void stop_server(int sig)
{
    if (server > 0) {
        kill(server, sig);
        waitpid(server, NULL, 0);
        server = -1;
    }
}

static int group_setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    snprintf(prefix, sizeof prefix, "redlm-test:%d:", (int)getpid());
    const char *env = getenv("REDLM_TEST_REDIS");
    if (env && env[0]) {
        snprintf(addr, sizeof addr, "%s", env);
        return 0;
    }
    if (tu_tmpdir(tmpdir, sizeof tmpdir, "rconn"))
        return -1;
    memcpy(sock_path, tmpdir, strlen(tmpdir));
    strcpy(sock_path + strlen(tmpdir), "/redis.sock");
    if ((port = free_port()) < 0)
        return -1;
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    return start_server();
}

static int group_teardown(void **state)
{
    (void)state;
    stop_server(SIGTERM);
    return tu_rmtree(tmpdir); /* the socket, password files, a dump */
}

static const char *key(const char *name)
{
    static char buf[8][160];
    static int i;
    i = (i + 1) % 8;
    snprintf(buf[i], sizeof buf[i], "%s%s", prefix, name);
    return buf[i];
}

static void cmd_ok(struct rconn *c, int argc, const char *const *argv)
{
    struct rl_err err = {0};
    if (rconn_command(c, argc, argv, NULL, NULL, &err))
        fail_msg("%s: %s", argv[0], err.msg);
}

/* Writes password + "\n" to a file of this run (path filled in) for an
 * ACL user's rconn_opts.password_file. */
static void write_pw_file(char *path, size_t cap, const char *name, const char *password)
{
    if (tmpdir[0])
        snprintf(path, cap, "%s/%s", tmpdir, name);
    else
        snprintf(path, cap, "/tmp/redlm-rconn-%s-%d", name, (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", password);
    fclose(f);
}

static void test_bad_addresses(void **state)
{
    (void)state;
    const char *bad[] = {"", "localhost", "host:", "host:0", "host:65536", "host:12x", ":6379",
                         "[::1]6379", "unix:"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct rconn_opts o;
        rconn_opts_default(&o);
        o.addr = bad[i];
        struct rconn *c = (struct rconn *)1;
        struct rl_err err = {0};
        assert_int_equal(rconn_create(&c, &o, &err), -RL_EINVAL);
        assert_null(c);
        assert_true(err.msg[0]);
    }
    struct rconn_opts o;
    rconn_opts_default(&o);
    o.user = "alice"; /* a user without a password file */
    struct rconn *c = NULL;
    assert_int_equal(rconn_create(&c, &o, NULL), -RL_EINVAL);
    o.user = NULL;
    o.addr = "[::1]:6379";
    assert_int_equal(rconn_create(&c, &o, NULL), 0);
    rconn_free(c);
}

static void test_command_binary_safe(void **state)
{
    (void)state;
    struct rconn *c = mk(addr, NULL, NULL);
    struct rl_err err = {0};
    assert_int_equal(rconn_wait(c, 2000, &err), 0);
    const char val[] = {'a', 0, 'b', '\n', (char)0xff};
    const char *argv[] = {"SET", key("bin"), val};
    size_t lens[] = {3, strlen(argv[1]), sizeof val};
    assert_int_equal(rconn_command(c, 3, argv, lens, NULL, &err), 0);
    const char *get[] = {"GET", key("bin")};
    struct rconn_reply *r = NULL;
    assert_int_equal(rconn_command(c, 2, get, NULL, &r, &err), 0);
    assert_int_equal(r->type, RCONN_STRING);
    assert_int_equal(r->len, sizeof val);
    assert_memory_equal(r->str, val, sizeof val);
    rconn_reply_free(r);
    /* an error reply: -RL_EINVAL, connection kept */
    const char *bad[] = {"INCR", key("bin")};
    assert_int_equal(rconn_command(c, 2, bad, NULL, &r, &err), -RL_EINVAL);
    assert_int_equal(r->type, RCONN_ERROR);
    assert_non_null(strstr(err.msg, "INCR"));
    rconn_reply_free(r);
    assert_true(rconn_connected(c));
    const char *name[] = {"CLIENT", "GETNAME"};
    assert_int_equal(rconn_command(c, 2, name, NULL, &r, &err), 0);
    assert_string_equal(r->str, "redlm-test");
    rconn_reply_free(r);
    bool ex = false;
    assert_int_equal(rconn_exists(c, key("bin"), &ex, &err), 0);
    assert_true(ex);
    assert_int_equal(rconn_exists(c, key("nope"), &ex, &err), 0);
    assert_false(ex);
    rconn_free(c);
}

static void test_unix_socket(void **state)
{
    (void)state;
    if (!sock_path[0])
        skip();
    char a[300];
    snprintf(a, sizeof a, "unix:%s", sock_path);
    struct rconn *c = mk(a, NULL, NULL);
    struct rl_err err = {0};
    assert_int_equal(rconn_wait(c, 2000, &err), 0);
    const char *ping[] = {"PING"};
    struct rconn_reply *r = NULL;
    assert_int_equal(rconn_command(c, 1, ping, NULL, &r, &err), 0);
    assert_string_equal(r->str, "PONG");
    rconn_reply_free(r);
    rconn_free(c);
}

static void test_acl_auth(void **state)
{
    (void)state;
    struct rconn *admin = mk(addr, NULL, NULL);
    const char *user = key("alice");
    const char *setuser[] = {"ACL", "SETUSER", user, "on", ">s3cret pw", "~*", "&*", "+@all"};
    cmd_ok(admin, 8, setuser);

    char pw[300];
    write_pw_file(pw, sizeof pw, "pw", "s3cret pw");
    struct rconn *c = mk(addr, user, pw);
    struct rl_err err = {0};
    assert_int_equal(rconn_wait(c, 2000, &err), 0);
    const char *who[] = {"ACL", "WHOAMI"};
    struct rconn_reply *r = NULL;
    assert_int_equal(rconn_command(c, 2, who, NULL, &r, &err), 0);
    assert_string_equal(r->str, user);
    rconn_reply_free(r);
    rconn_free(c);

    /* wrong password: a connect failure with Redis's reason, and backoff */
    write_pw_file(pw, sizeof pw, "pw", "wrong");
    c = mk(addr, user, pw);
    assert_int_equal(rconn_ensure(c, &err), -RL_EIO);
    assert_non_null(strstr(err.msg, "WRONGPASS"));
    assert_false(rconn_connected(c));
    assert_true(rconn_retry_in_ms(c) > 0);
    rconn_free(c);
    /* missing file */
    unlink(pw);
    c = mk(addr, user, pw);
    assert_int_equal(rconn_ensure(c, &err), -RL_EIO);
    assert_non_null(strstr(err.msg, pw));
    rconn_free(c);

    const char *deluser[] = {"ACL", "DELUSER", user};
    cmd_ok(admin, 3, deluser);
    rconn_free(admin);
}

static void test_backoff_when_down(void **state)
{
    (void)state;
    char a[64];
    snprintf(a, sizeof a, "127.0.0.1:%d", free_port()); /* nothing listens */
    struct rconn *c = mk(a, NULL, NULL);
    struct rl_err err = {0};
    int64_t prev = 0;
    for (int i = 0; i < 6; i++) {
        assert_int_equal(rconn_ensure(c, &err), -RL_EIO);
        int64_t d = rconn_retry_in_ms(c);
        /* jittered into [d/2, d] of 20, 40, 80, ... capped at 400 */
        int64_t cap = 20LL << i;
        if (cap > 400)
            cap = 400;
        /* (less the few ms since the attempt; loose so a loaded CI
         * machine cannot fail it) */
        assert_true(d <= cap && d >= cap / 2 - 15);
        (void)prev;
        /* a call during the delay fails fast without trying */
        assert_int_equal(rconn_ensure(c, &err), -RL_EIO);
        assert_non_null(strstr(err.msg, "next attempt"));
        sleep_ms((int)d + 1);
    }
    const char *ping[] = {"PING"};
    assert_int_equal(rconn_command(c, 1, ping, NULL, NULL, &err), -RL_EIO);
    rconn_free(c);
}

static void test_streams(void **state)
{
    (void)state;
    struct rconn *c = mk(addr, NULL, NULL);
    struct rl_err err = {0};
    const char *jobs = key("jobs:fast"), *jobs2 = key("jobs:think");
    assert_int_equal(rconn_xgroup_create(c, jobs, "workers", "0", &err), 0);
    assert_int_equal(rconn_xgroup_create(c, jobs, "workers", "0", &err), 0); /* BUSYGROUP */
    assert_int_equal(rconn_xgroup_create(c, jobs2, "workers", "0", &err), 0);

    char ids[3][RCONN_ID_MAX];
    const char *names[] = {"job"};
    for (int i = 0; i < 3; i++) {
        char v[32];
        snprintf(v, sizeof v, "{\"prompt\":\"%d\"}", i);
        const char *vals[] = {v};
        assert_int_equal(rconn_xadd(c, jobs, "*", 0, 1, names, vals, NULL, ids[i], NULL, &err), 0);
    }
    const char *tv[] = {"{\"prompt\":\"t\"}"};
    char tid[RCONN_ID_MAX];
    assert_int_equal(rconn_xadd(c, jobs2, "*", 0, 1, names, tv, NULL, tid, NULL, &err), 0);

    struct rconn_entries e;
    const char *keys[] = {jobs, jobs2};
    assert_int_equal(rconn_xreadgroup(c, "workers", "w1", 2, keys, ">", 2, -1, &e, &err), 0);
    assert_int_equal(e.n, 3); /* two from fast, one from think */
    assert_string_equal(e.v[0].id, ids[0]);
    assert_int_equal(e.v[0].stream, 0);
    assert_int_equal(e.v[2].stream, 1);
    size_t len;
    assert_string_equal(rconn_entry_field(&e.v[1], "job", &len), "{\"prompt\":\"1\"}");
    assert_int_equal(len, 14);
    assert_null(rconn_entry_field(&e.v[1], "nope", NULL));
    rconn_entries_free(&e);
    assert_int_equal(rconn_xreadgroup(c, "workers", "w1", 1, keys, ">", 5, -1, &e, &err), 0);
    assert_int_equal(e.n, 1);
    assert_string_equal(e.v[0].id, ids[2]);
    rconn_entries_free(&e);

    /* nothing new: BLOCK times out with 0 entries, even past io_timeout */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(rconn_xreadgroup(c, "workers", "w1", 2, keys, ">", 5, 150, &e, &err), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(e.n, 0);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    assert_true(ms >= 140);

    /* own pending ones, after a restart of this consumer */
    assert_int_equal(rconn_xreadgroup(c, "workers", "w1", 1, keys, "0", 10, -1, &e, &err), 0);
    assert_int_equal(e.n, 3);
    rconn_entries_free(&e);

    struct rconn_pending *p = NULL;
    int np = 0;
    assert_int_equal(rconn_xpending(c, jobs, "workers", 0, "-", "+", 10, NULL, &p, &np, &err), 0);
    assert_int_equal(np, 3);
    assert_string_equal(p[0].consumer, "w1");
    assert_int_equal(p[0].deliveries, 2); /* read by ">" then by "0" */
    free(p);

    /* w2 takes over w1's idle jobs */
    sleep_ms(200);
    char next[RCONN_ID_MAX];
    struct rconn_ids del;
    assert_int_equal(rconn_xautoclaim(c, jobs, "workers", "w2", 150, "0-0", 2, &e, next, &del, &err), 0);
    assert_int_equal(e.n, 2);
    assert_string_equal(e.v[0].id, ids[0]);
    assert_non_null(rconn_entry_field(&e.v[0], "job", NULL));
    assert_int_equal(del.n, 0);
    rconn_entries_free(&e);
    rconn_ids_free(&del);
    assert_int_equal(rconn_xpending(c, jobs, "workers", 0, "-", "+", 10, "w2", &p, &np, &err), 0);
    assert_int_equal(np, 2);
    assert_int_equal(p[0].deliveries, 3);
    free(p);
    /* IDLE filter: w1's last one is idle, w2's are fresh */
    assert_int_equal(rconn_xpending(c, jobs, "workers", 150, "-", "+", 10, NULL, &p, &np, &err), 0);
    assert_int_equal(np, 1);
    assert_string_equal(p[0].id, ids[2]);
    free(p);

    /* lease renewal: JUSTID resets idle and does not count a delivery */
    sleep_ms(50);
    assert_int_equal(rconn_xpending(c, jobs, "workers", 0, "-", "+", 10, "w2", &p, &np, &err), 0);
    int64_t idle_before = p[0].idle_ms;
    assert_true(idle_before >= 50);
    free(p);
    const char *mine[] = {ids[0], ids[1], "1-1"};
    struct rconn_ids claimed;
    assert_int_equal(rconn_xclaim_justid(c, jobs, "workers", "w2", 0, 3, mine, &claimed, &err), 0);
    assert_int_equal(claimed.n, 2); /* 1-1 was never pending */
    rconn_ids_free(&claimed);
    assert_int_equal(rconn_xpending(c, jobs, "workers", 0, "-", "+", 10, "w2", &p, &np, &err), 0);
    assert_int_equal(p[0].deliveries, 3);
    assert_true(p[0].idle_ms < idle_before);
    free(p);

    /* an XDELed pending entry: flagged by XREADGROUP 0, dropped by XAUTOCLAIM */
    const char *xdel[] = {"XDEL", jobs, ids[2]};
    cmd_ok(c, 3, xdel);
    assert_int_equal(rconn_xreadgroup(c, "workers", "w1", 1, keys, "0", 10, -1, &e, &err), 0);
    assert_int_equal(e.n, 1);
    assert_true(e.v[0].deleted);
    assert_int_equal(e.v[0].n_fields, 0);
    rconn_entries_free(&e);
    assert_int_equal(rconn_xautoclaim(c, jobs, "workers", "w3", 0, "0-0", 10, &e, next, &del, &err), 0);
    assert_int_equal(del.n, 1);
    assert_string_equal(del.v[0], ids[2]);
    assert_string_equal(next, "0-0");
    rconn_entries_free(&e);
    rconn_ids_free(&del);

    long long n = 0;
    const char *ack[] = {ids[0], ids[1]};
    assert_int_equal(rconn_xack(c, jobs, "workers", 2, ack, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_int_equal(rconn_xack(c, jobs, "workers", 2, ack, &n, &err), 0);
    assert_int_equal(n, 0);

    const char *nogroup[] = {jobs};
    assert_int_equal(rconn_xreadgroup(c, "nosuch", "w1", 1, nogroup, ">", 1, -1, &e, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "NOGROUP"));
    rconn_free(c);
}

static void test_out_stream_idempotent(void **state)
{
    (void)state;
    struct rconn *c = mk(addr, NULL, NULL);
    struct rl_err err = {0};
    const char *out = key("out:req1");
    const char *names[] = {"event"};
    const char *e0[] = {"{\"seq\":0}"}, *e1[] = {"{\"seq\":1}"};
    bool dup = true;
    char id[RCONN_ID_MAX];
    assert_int_equal(rconn_xadd(c, out, "0-1", 0, 1, names, e0, NULL, id, &dup, &err), 0);
    assert_false(dup);
    assert_string_equal(id, "0-1");
    assert_int_equal(rconn_xadd(c, out, "0-2", 0, 1, names, e1, NULL, id, &dup, &err), 0);
    assert_int_equal(rconn_xadd(c, out, "0-2", 0, 1, names, e1, NULL, id, &dup, &err), 0);
    assert_true(dup); /* re-sent after a lost reply: not duplicated */
    assert_int_equal(rconn_xadd(c, out, "0-1", 0, 1, names, e0, NULL, id, NULL, &err), -RL_EINVAL);

    struct rconn_entries e;
    assert_int_equal(rconn_xrange(c, out, "-", "+", 0, &e, &err), 0);
    assert_int_equal(e.n, 2);
    assert_string_equal(rconn_entry_field(&e.v[1], "event", NULL), "{\"seq\":1}");
    rconn_entries_free(&e);
    assert_int_equal(rconn_xrange(c, out, "(0-1", "+", 1, &e, &err), 0);
    assert_int_equal(e.n, 1);
    assert_string_equal(e.v[0].id, "0-2");
    rconn_entries_free(&e);

    bool set = false;
    assert_int_equal(rconn_expire(c, out, 600, &set, &err), 0);
    assert_true(set);
    assert_int_equal(rconn_expire(c, key("nothing"), 600, &set, &err), 0);
    assert_false(set);
    long long nr = -1;
    assert_int_equal(rconn_publish(c, key("tok:req1"), "x", 1, &nr, &err), 0);
    assert_int_equal(nr, 0);

    /* MAXLEN ~ on a capped stream keeps it near the cap */
    const char *dead = key("dead");
    for (int i = 0; i < 300; i++)
        assert_int_equal(rconn_xadd(c, dead, "*", 100, 1, names, e0, NULL, NULL, NULL, &err), 0);
    const char *xlen[] = {"XLEN", dead};
    struct rconn_reply *r = NULL;
    assert_int_equal(rconn_command(c, 2, xlen, NULL, &r, &err), 0);
    assert_true(r->integer >= 100 && r->integer < 300);
    rconn_reply_free(r);
    rconn_free(c);
}

static void test_pipeline(void **state)
{
    (void)state;
    struct rconn *c = mk(addr, NULL, NULL);
    struct rl_err err = {0};
    struct rconn_batch *b = NULL;
    assert_int_equal(rconn_batch_create(&b, &err), 0);
    const char *out = key("out:pipe");
    const char *names[] = {"event"};
    char ids[100][32], vals[100][32];
    for (int i = 0; i < 100; i++) {
        snprintf(ids[i], sizeof ids[i], "0-%d", i + 1);
        snprintf(vals[i], sizeof vals[i], "{\"seq\":%d}", i);
        const char *v[] = {vals[i]};
        assert_int_equal(rconn_batch_add_xadd(b, out, ids[i], 0, 1, names, v, NULL, &err), 0);
        if (i == 50) { /* one failing command in the middle */
            const char *incr[] = {"INCR", out};
            assert_int_equal(rconn_batch_add(b, 2, incr, NULL, &err), 0);
        }
    }
    const char *expire[] = {"EXPIRE", out, "60"};
    assert_int_equal(rconn_batch_add(b, 3, expire, NULL, &err), 0);
    assert_int_equal(rconn_batch_count(b), 102);
    assert_int_equal(rconn_batch_exec(c, b, &err), 0);
    assert_int_equal(rconn_batch_n_done(b), 102);
    assert_int_equal(rconn_batch_n_errors(b), 1);
    assert_int_equal(rconn_batch_reply(b, 51)->type, RCONN_ERROR);
    assert_string_equal(rconn_batch_reply(b, 0)->str, "0-1");
    assert_int_equal(rconn_batch_reply(b, 101)->integer, 1);
    assert_null(rconn_batch_reply(b, 102));
    /* exec again: nothing left to send */
    assert_int_equal(rconn_batch_exec(c, b, &err), 0);

    /* the same events again: every XADD is recognised as already written */
    rconn_batch_reset(b);
    for (int i = 0; i < 100; i++) {
        const char *v[] = {vals[i]};
        assert_int_equal(rconn_batch_add_xadd(b, out, ids[i], 0, 1, names, v, NULL, &err), 0);
    }
    assert_int_equal(rconn_batch_exec(c, b, &err), 0);
    assert_int_equal(rconn_batch_n_errors(b), 100);
    for (int i = 0; i < 100; i++)
        assert_true(rconn_reply_is_stale_id(rconn_batch_reply(b, i)));
    rconn_batch_free(b);
    rconn_free(c);
}

/* Kill the server under a live connection, restart it, and see every
 * layer come back: commands fail fast with -RL_EIO meanwhile, a pending
 * batch is re-sent whole once the server is back. */
static void test_reconnect_after_restart(void **state)
{
    (void)state;
    if (server < 0)
        skip(); /* REDLM_TEST_REDIS: not ours to restart */
    struct rconn *c = mk(addr, NULL, NULL);
    struct rl_err err = {0};
    const char *ping[] = {"PING"};
    assert_int_equal(rconn_wait(c, 2000, &err), 0);
    assert_int_equal(rconn_command(c, 1, ping, NULL, NULL, &err), 0);
    assert_int_equal(rconn_n_reconnects(c), 0);

    stop_server(SIGKILL);
    assert_int_equal(rconn_command(c, 1, ping, NULL, NULL, &err), -RL_EIO);
    assert_false(rconn_connected(c));
    struct rconn_batch *b = NULL;
    assert_int_equal(rconn_batch_create(&b, &err), 0);
    const char *set1[] = {"SET", key("r1"), "1"}, *set2[] = {"SET", key("r2"), "2"};
    assert_int_equal(rconn_batch_add(b, 3, set1, NULL, &err), 0);
    assert_int_equal(rconn_batch_add(b, 3, set2, NULL, &err), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(rconn_batch_exec(c, b, &err), -RL_EIO);
        sleep_ms((int)rconn_retry_in_ms(c) + 1);
    }
    assert_int_equal(rconn_batch_n_done(b), 0);
    assert_true(rconn_retry_in_ms(c) <= 400);

    assert_int_equal(start_server(), 0);
    assert_int_equal(rconn_wait(c, 5000, &err), 0);
    assert_int_equal(rconn_batch_exec(c, b, &err), 0);
    assert_int_equal(rconn_batch_n_done(b), 2);
    assert_int_equal(rconn_batch_n_errors(b), 0);
    struct rconn_reply *r = NULL;
    const char *get[] = {"GET", key("r2")};
    assert_int_equal(rconn_command(c, 2, get, NULL, &r, &err), 0);
    assert_string_equal(r->str, "2");
    rconn_reply_free(r);
    assert_int_equal(rconn_n_reconnects(c), 1);
    /* the connection is named again after the reconnect */
    const char *name[] = {"CLIENT", "GETNAME"};
    assert_int_equal(rconn_command(c, 2, name, NULL, &r, &err), 0);
    assert_string_equal(r->str, "redlm-test");
    rconn_reply_free(r);
    rconn_batch_free(b);
    rconn_free(c);
}

/* ---- xmux: one XREAD for many streams ---- */

/* bell: NULL, or the bell's key (the reader then blocks on it alone, and
 * sweeps every sweep_ms, 0 for the default); io_timeout_ms: its
 * connections' reply timeout, 0 for rconn's default */
static double ms_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) * 1e3 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e6;
}

/* The id of the connection blocked in an XREADGROUP, from CLIENT LIST; 0
 * when none is (yet). */
static long long blocked_xreadgroup(struct rconn *c)
{
    const char *argv[] = {"CLIENT", "LIST"};
    struct rconn_reply *r = NULL;
    assert_int_equal(rconn_command(c, 2, argv, NULL, &r, NULL), 0);
    long long id = 0;
    char *save = NULL;
    for (char *l = strtok_r(r->str, "\n", &save); l && !id; l = strtok_r(NULL, "\n", &save))
        if (strstr(l, " flags=b ") && strstr(l, " cmd=xreadgroup "))
            id = atoll(l + 3);
    rconn_reply_free(r);
    return id;
}

/* The standing read (a busy worker's, issue 27): sent once; looked at
 * without waiting; answered when entries come (delivered to the consumer
 * then, COUNT honoured), or empty when its BLOCK runs out; the connection
 * refuses other commands meanwhile; a connection killed under it is an
 * error, and the connection works again afterwards. */
static void test_standing_read(void **state)
{
    (void)state;
    struct rconn *c = mk(addr, NULL, NULL), *w = mk(addr, NULL, NULL);
    struct rl_err err = {0};
    const char *jobs = key("stand:jobs"), *keys[] = {jobs};
    assert_int_equal(rconn_xgroup_create(w, jobs, "workers", "0", &err), 0);
    assert_int_equal(rconn_xreadgroup_send(c, "workers", "ws", 1, keys, 2, 5000, &err), 0);
    assert_true(rconn_awaiting(c));
    struct rconn_entries e;
    bool came = true;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(rconn_xreadgroup_collect(c, 1, keys, 0, &e, &came, &err), 0);
    assert_false(came);
    assert_int_equal(e.n, 0);
    assert_true(ms_since(&t0) < 500); /* looking does not wait for the BLOCK */
    for (int t = 0; t < 5000 && !blocked_xreadgroup(w); t++)
        sleep_ms(1);
    assert_true(blocked_xreadgroup(w) > 0); /* it waits in Redis, not in a poll */
    const char *ping[] = {"PING"};
    assert_int_equal(rconn_command(c, 1, ping, NULL, NULL, &err), -RL_EINVAL);
    assert_int_equal(rconn_xreadgroup_send(c, "workers", "ws", 1, keys, 2, 5000, &err),
                     -RL_EINVAL);
    assert_true(rconn_awaiting(c));

    /* three jobs: the reply brings the first two (COUNT 2) */
    char ids[3][RCONN_ID_MAX];
    const char *names[] = {"job"}, *vals[] = {"{}"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(rconn_xadd(w, jobs, "*", 0, 1, names, vals, NULL, ids[i], NULL, &err), 0);
    assert_int_equal(rconn_xreadgroup_collect(c, 1, keys, 3000, &e, &came, &err), 0);
    assert_true(came);
    assert_false(rconn_awaiting(c));
    assert_true(e.n >= 1 && e.n <= 2); /* the first XADD may wake it alone */
    assert_string_equal(e.v[0].id, ids[0]);
    assert_int_equal(e.v[0].stream, 0);
    int got = e.n;
    rconn_entries_free(&e);
    /* the next read takes the rest at once */
    assert_int_equal(rconn_xreadgroup_send(c, "workers", "ws", 1, keys, 2, 5000, &err), 0);
    assert_int_equal(rconn_xreadgroup_collect(c, 1, keys, 3000, &e, &came, &err), 0);
    assert_true(came);
    assert_int_equal(got + e.n, 3);
    assert_string_equal(e.v[e.n - 1].id, ids[2]);
    rconn_entries_free(&e);
    assert_int_equal(rconn_command(c, 1, ping, NULL, NULL, &err), 0); /* usable again */

    /* nothing comes: the BLOCK runs out, and the read is over, empty */
    assert_int_equal(rconn_xreadgroup_send(c, "workers", "ws", 1, keys, 2, 100, &err), 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(rconn_xreadgroup_collect(c, 1, keys, 3000, &e, &came, &err), 0);
    assert_true(came);
    assert_int_equal(e.n, 0);
    assert_true(ms_since(&t0) >= 80);

    /* no BLOCK (-1, a look at a shard): answered at once, empty when
     * nothing waits, with what waits otherwise; 0 and -2 are refused */
    assert_int_equal(rconn_xreadgroup_send(c, "workers", "ws", 1, keys, 2, 0, &err), -RL_EINVAL);
    assert_int_equal(rconn_xreadgroup_send(c, "workers", "ws", 1, keys, 2, -2, &err), -RL_EINVAL);
    assert_int_equal(rconn_xreadgroup_send(c, "workers", "ws", 1, keys, 2, -1, &err), 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(rconn_xreadgroup_collect(c, 1, keys, 3000, &e, &came, &err), 0);
    assert_true(came);
    assert_int_equal(e.n, 0);
    assert_true(ms_since(&t0) < 1000);
    char waiting[RCONN_ID_MAX];
    assert_int_equal(rconn_xadd(w, jobs, "*", 0, 1, names, vals, NULL, waiting, NULL, &err), 0);
    assert_int_equal(rconn_xreadgroup_send(c, "workers", "ws", 1, keys, 2, -1, &err), 0);
    assert_int_equal(rconn_xreadgroup_collect(c, 1, keys, 3000, &e, &came, &err), 0);
    assert_true(came);
    assert_int_equal(e.n, 1);
    assert_string_equal(e.v[0].id, waiting);
    rconn_entries_free(&e);

    /* its connection killed: an error, nothing awaited any more, and the
     * next command reconnects */
    assert_int_equal(rconn_xreadgroup_send(c, "workers", "ws", 1, keys, 2, 5000, &err), 0);
    long long id = 0;
    for (int t = 0; t < 5000 && !(id = blocked_xreadgroup(w)); t++)
        sleep_ms(1);
    char ids_[24];
    snprintf(ids_, sizeof ids_, "%lld", id);
    const char *kill_id[] = {"CLIENT", "KILL", "ID", ids_};
    cmd_ok(w, 4, kill_id);
    assert_int_equal(rconn_xreadgroup_collect(c, 1, keys, 3000, &e, &came, &err), -RL_EIO);
    assert_false(rconn_awaiting(c));
    for (int t = 0; t < 100 && rconn_command(c, 1, ping, NULL, NULL, &err); t++)
        sleep_ms(20);
    assert_int_equal(rconn_command(c, 1, ping, NULL, NULL, &err), 0);
    rconn_free(c);
    rconn_free(w);
}

static struct xmux *mk_mux(const char *bell, int sweep_ms, int io_timeout_ms)
{
    struct rconn_opts o;
    rconn_opts_default(&o);
    o.addr = addr;
    if (io_timeout_ms)
        o.io_timeout_ms = io_timeout_ms;
    struct xmux *m = NULL;
    struct rl_err err = {0};
    struct xmux_opts xo = {.bell = bell, .sweep_ms = sweep_ms};
    if (xmux_create(&m, &o, &xo, &err))
        fail_msg("xmux_create: %s", err.msg);
    return m;
}

/* Rings the bell (unless NULL) for key, as a writer does after its XADDs. */
static void ring(struct rconn *c, const char *bell, const char *k)
{
    if (!bell)
        return;
    const char *argv[] = {"XADD", bell, "MAXLEN", "~", XMUX_BELL_MAXLEN, "*", k, "1"};
    struct rconn_reply *r = NULL;
    assert_int_equal(rconn_command(c, 8, argv, NULL, &r, NULL), 0);
    assert_int_equal(r->type, RCONN_STRING);
    rconn_reply_free(r);
}

/* Entries from..from+n-1 on k (ids 0-i), then the bell rung for it. */
static void xadd_n(struct rconn *c, const char *k, int from, int n, const char *bell)
{
    for (int i = from; i < from + n; i++) {
        char id[32], v[200];
        snprintf(id, sizeof id, "0-%d", i);
        snprintf(v, sizeof v, "%s/%d", k, i);
        const char *argv[] = {"XADD", k, id, "event", v};
        cmd_ok(c, 5, argv);
    }
    ring(c, bell, k);
}

/* Queues on b entry i of k (id 0-i, as xadd_n writes it) and the bell's
 * ring for k, so that a writer's entry and ring go in one write. */
static void batch_entry_ring(struct rconn_batch *b, const char *k, int i, const char *bell)
{
    char id[32], v[200];
    snprintf(id, sizeof id, "0-%d", i);
    snprintf(v, sizeof v, "%s/%d", k, i);
    const char *x[] = {"XADD", k, id, "event", v};
    const char *rg[] = {"XADD", bell, "MAXLEN", "~", XMUX_BELL_MAXLEN, "*", k, "1"};
    assert_int_equal(rconn_batch_add(b, 5, x, NULL, NULL), 0);
    assert_int_equal(rconn_batch_add(b, 8, rg, NULL, NULL), 0);
}

/* Takes entries from s until `want` have come (each checked: its stream's
 * own, in order, ids from..): the count taken. A failed read in between
 * (the reader's connection lost) is waited out. */
static int take_in_order(struct xmux_sub *s, const char *k, int from, int want)
{
    int got = 0, eio_ok = 100;
    while (got < want) {
        struct rconn_reply *r = NULL;
        struct rl_err err = {0};
        int rc = xmux_next(s, 5000, &r, &err);
        if (rc == -RL_EIO && eio_ok) { /* the reader reconnects and reads on */
            eio_ok--;
            continue;
        }
        assert_int_equal(rc, 0);
        if (!r)
            fail_msg("%s: no entry within 5 s after %d of %d", k, got, want);
        assert_int_equal(r->type, RCONN_ARRAY);
        assert_int_equal(r->n_elem, 1);
        assert_string_equal(r->elem[0].elem[0].str, k);
        const struct rconn_reply *es = &r->elem[0].elem[1];
        for (size_t i = 0; i < es->n_elem; i++) {
            char id[32], v[200];
            snprintf(id, sizeof id, "0-%d", from + got);
            snprintf(v, sizeof v, "%s/%d", k, from + got);
            assert_string_equal(es->elem[i].elem[0].str, id);
            assert_string_equal(es->elem[i].elem[1].elem[1].str, v);
            got++;
        }
        rconn_reply_free(r);
    }
    return got;
}

/* The number after field (e.g. "total_reads_processed:") in INFO section;
 * 0 when absent. */
static long long info_field(struct rconn *c, const char *section, const char *field)
{
    const char *argv[] = {"INFO", section};
    struct rconn_reply *r = NULL;
    assert_int_equal(rconn_command(c, 2, argv, NULL, &r, NULL), 0);
    const char *p = strstr(r->str, field);
    long long n = p ? atoll(p + strlen(field)) : 0;
    rconn_reply_free(r);
    return n;
}

static long long cmd_calls(struct rconn *c, const char *cmd)
{
    char pat[64];
    snprintf(pat, sizeof pat, "cmdstat_%s:calls=", cmd);
    return info_field(c, "commandstats", pat);
}

/* Some client is blocked in XREAD, as CLIENT LIST shows it. */
static bool reader_blocked(struct rconn *c)
{
    const char *argv[] = {"CLIENT", "LIST"};
    struct rconn_reply *r = NULL;
    assert_int_equal(rconn_command(c, 2, argv, NULL, &r, NULL), 0);
    bool b = false;
    char *save = NULL;
    for (char *l = strtok_r(r->str, "\n", &save); l && !b; l = strtok_r(NULL, "\n", &save))
        b = strstr(l, " flags=b ") && strstr(l, " cmd=xread ");
    rconn_reply_free(r);
    return b;
}

/* Waits up to 5 s for reader_blocked; whether it came. */
static bool wait_reader_blocked(struct rconn *c)
{
    for (int t = 0; t < 5000 && !reader_blocked(c); t++)
        sleep_ms(1);
    return reader_blocked(c);
}

static struct xmux_stats stats(struct xmux *m)
{
    struct xmux_stats st;
    xmux_stats(m, &st);
    return st;
}

/* Kills the reader's connection while it is blocked and waits for the
 * read it was in to fail (the reader then reconnects). */
static void kill_reader(struct rconn *c, struct xmux *m)
{
    (void)wait_reader_blocked(c);
    long long n0 = stats(m).reads;
    const char *list[] = {"CLIENT", "LIST"};
    struct rconn_reply *cl = NULL;
    assert_int_equal(rconn_command(c, 2, list, NULL, &cl, NULL), 0);
    char *line = strstr(cl->str, " name=xmux ");
    assert_non_null(line);
    while (line > cl->str && line[-1] != '\n')
        line--;
    assert_int_equal(strncmp(line, "id=", 3), 0);
    char id[24];
    snprintf(id, sizeof id, "%lld", atoll(line + 3));
    rconn_reply_free(cl);
    const char *kill_id[] = {"CLIENT", "KILL", "ID", id};
    cmd_ok(c, 4, kill_id);
    for (int t = 0; t < 5000 && stats(m).reads == n0; t++)
        sleep_ms(1);
}

/* Blocking on every stream (state NULL) and on a bell (state its key). */
static void test_xmux_streams_apart(void **state)
{
    const char *bell = *state ? key(*state) : NULL;
    struct rconn *c = mk(addr, NULL, NULL);
    assert_int_equal(rconn_wait(c, 2000, NULL), 0);
    const char *ka = key(bell ? "mux-a-b" : "mux-a"), *kb = key(bell ? "mux-b-b" : "mux-b");
    const char *kc = key(bell ? "mux-c-b" : "mux-c");
    xadd_n(c, ka, 1, 3, bell);
    struct xmux *m = mk_mux(bell, 0, 0);
    struct xmux_sub *a = NULL, *b = NULL, *b2 = NULL, *cc = NULL;
    assert_int_equal(xmux_sub(m, ka, "0-0", 0, &a, NULL), 0);
    assert_int_equal(xmux_sub(m, kb, "0-0", 0, &b, NULL), 0);
    assert_string_equal(xmux_sub_key(b), kb);
    assert_int_equal(take_in_order(a, ka, 1, 3), 3);
    /* the reader now blocks on both; a third stream joins: CLIENT UNBLOCK
     * cuts the read short instead of waiting out its BLOCK */
    assert_true(wait_reader_blocked(c));
    long long unb = cmd_calls(c, "client|unblock");
    assert_int_equal(xmux_sub(m, kc, "0-0", 0, &cc, NULL), 0);
    assert_true(cmd_calls(c, "client|unblock") > unb);
    xadd_n(c, kc, 1, 2, bell);
    xadd_n(c, kb, 1, 4, bell);
    xadd_n(c, ka, 4, 2, bell);
    assert_int_equal(take_in_order(cc, kc, 1, 2), 2);
    assert_int_equal(take_in_order(b, kb, 1, 4), 4);
    assert_int_equal(take_in_order(a, ka, 4, 2), 2);
    /* one key twice, from two places: each from its own cursor */
    assert_int_equal(xmux_sub(m, kb, "0-2", 0, &b2, NULL), 0);
    xadd_n(c, kb, 5, 1, bell);
    assert_int_equal(take_in_order(b2, kb, 3, 3), 3);
    assert_int_equal(take_in_order(b, kb, 5, 1), 1);
    /* the reader's connection killed under it: it reconnects, and the
     * entries written meanwhile still come, each once */
    kill_reader(c, m);
    xadd_n(c, ka, 6, 3, bell);
    assert_int_equal(take_in_order(a, ka, 6, 3), 3);
    /* nothing new: a timeout, not an entry of another stream */
    struct rconn_reply *r = (struct rconn_reply *)1;
    assert_int_equal(xmux_next(a, 50, &r, NULL), 0);
    assert_null(r);
    xmux_unsub(a);
    xmux_unsub(b);
    xmux_unsub(b2);
    xmux_unsub(cc);
    xmux_unsub(NULL);
    xmux_free(m);
    rconn_free(c);
}

static void test_xmux_backpressure(void **state)
{
    const char *bell = *state ? key(*state) : NULL;
    struct rconn *c = mk(addr, NULL, NULL);
    assert_int_equal(rconn_wait(c, 2000, NULL), 0);
    const char *k = key(bell ? "mux-many-b" : "mux-many");
    int n = XMUX_HELD_MAX + 1000; /* more than one subscription may hold */
    xadd_n(c, k, 1, n, bell);
    struct xmux *m = mk_mux(bell, 0, 0);
    struct xmux_sub *s = NULL, *gone = NULL;
    assert_int_equal(xmux_sub(m, k, "0-0", 0, &s, NULL), 0);
    /* a subscription ended while the reader may be reading it */
    assert_int_equal(xmux_sub(m, k, "0-0", 0, &gone, NULL), 0);
    xmux_unsub(gone);
    /* the reader fills s up to its cap, and no further, before anything
     * is taken; the rest waits in Redis */
    for (int t = 0; t < 5000 && xmux_n_held(s) < XMUX_HELD_MAX; t++)
        sleep_ms(1);
    assert_int_equal(xmux_n_held(s), XMUX_HELD_MAX);
    assert_int_equal(take_in_order(s, k, 1, n), n);
    xmux_unsub(s);
    xmux_free(m);
    rconn_free(c);
}

/* n subscriptions from the start of <prefix><name>-0 .. -(n-1), their
 * keys written to keys[0..n-1]. */
static void follow_n(struct xmux *m, const char *name, int n, char (*keys)[160],
                     struct xmux_sub **subs)
{
    for (int i = 0; i < n; i++) {
        snprintf(keys[i], sizeof keys[i], "%s%s-%d", prefix, name, i);
        assert_int_equal(xmux_sub(m, keys[i], "0-0", 0, &subs[i], NULL), 0);
    }
}

/* With a bell the reader names only the streams the bell names: one that
 * is written without a ring waits (here: the sweep is a minute off), and
 * comes once the bell names it; a bell read that comes back full (more
 * rings than one read takes: some may have been trimmed unread) reads
 * every stream; the sweep reads the ones nobody rang for. With 24 streams
 * or fewer it blocks on them instead. */
static void test_xmux_bell(void **state)
{
    (void)state;
    struct rconn *c = mk(addr, NULL, NULL);
    assert_int_equal(rconn_wait(c, 2000, NULL), 0);
    char bell[160], keys[40][160];
    snprintf(bell, sizeof bell, "%s", key("bell-only"));
    struct xmux *m = mk_mux(bell, 60000, 0);
    struct xmux_sub *s[40];
    follow_n(m, "bell", 40, keys, s);
    /* more than 24 streams: the reader reads them all once (new
     * subscriptions are read whole), then blocks on the bell alone */
    assert_true(wait_reader_blocked(c));
    long long named0 = stats(m).named, reads0 = stats(m).reads;
    xadd_n(c, keys[7], 1, 1, NULL); /* no ring */
    xadd_n(c, keys[9], 1, 2, bell);
    assert_int_equal(take_in_order(s[9], keys[9], 1, 2), 2);
    struct rconn_reply *r = (struct rconn_reply *)1;
    assert_int_equal(xmux_next(s[7], 300, &r, NULL), 0);
    assert_null(r); /* not read: nobody rang for it */
    ring(c, bell, keys[7]);
    assert_int_equal(take_in_order(s[7], keys[7], 1, 1), 1);
    /* each wake named the bell and the one stream it rang for, not all 40 */
    long long reads = stats(m).reads - reads0, named = stats(m).named - named0;
    assert_true(reads >= 2);
    assert_true(named <= reads);
    /* a full bell read: every stream is read */
    xadd_n(c, keys[3], 1, 1, NULL);
    struct rconn_batch *b = NULL;
    assert_int_equal(rconn_batch_create(&b, NULL), 0);
    const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"};
    assert_int_equal(rconn_batch_add(b, 1, multi, NULL, NULL), 0);
    for (int i = 0; i < 600; i++) {
        const char *x[] = {"XADD", bell, "MAXLEN", "~", XMUX_BELL_MAXLEN, "*", "nobody", "1"};
        assert_int_equal(rconn_batch_add(b, 8, x, NULL, NULL), 0);
    }
    assert_int_equal(rconn_batch_add(b, 1, exec, NULL, NULL), 0);
    assert_int_equal(rconn_batch_exec(c, b, NULL), 0);
    rconn_batch_free(b);
    assert_int_equal(take_in_order(s[3], keys[3], 1, 1), 1);
    /* its connection killed on the bell: it reconnects, takes the bell's
     * place again, and what was rung meanwhile still comes */
    kill_reader(c, m);
    xadd_n(c, keys[5], 1, 2, bell);
    assert_int_equal(take_in_order(s[5], keys[5], 1, 2), 2);
    xadd_n(c, keys[6], 1, 1, bell);
    assert_int_equal(take_in_order(s[6], keys[6], 1, 1), 1);
    assert_true(stats(m).bell_on); /* every write it saw was rung for */
    for (int i = 0; i < 40; i++)
        xmux_unsub(s[i]);
    xmux_free(m);
    /* the sweep: a stream written without a ring still comes, and the
     * reader, caught out by a writer that does not ring, gives the bell up
     * and blocks on every stream from then on */
    m = mk_mux(bell, 100, 0);
    struct xmux_sub *w[30];
    for (int i = 0; i < 30; i++) /* more than 24: on the bell alone */
        assert_int_equal(xmux_sub(m, keys[10 + i], "0-0", 0, &w[i], NULL), 0);
    (void)wait_reader_blocked(c);
    assert_true(stats(m).bell_on);
    xadd_n(c, keys[11], 1, 3, NULL);
    assert_int_equal(take_in_order(w[1], keys[11], 1, 3), 3);
    assert_false(stats(m).bell_on);
    xadd_n(c, keys[11], 4, 2, NULL);
    assert_int_equal(take_in_order(w[1], keys[11], 4, 2), 2);
    for (int i = 0; i < 30; i++)
        xmux_unsub(w[i]);
    xmux_free(m);
    /* few streams: blocked on them, not on the bell, so a write to one is
     * answered by the read it wakes, rung for or not */
    m = mk_mux(bell, 60000, 0);
    char few_keys[3][160];
    struct xmux_sub *few[3];
    follow_n(m, "few", 3, few_keys, few);
    (void)wait_reader_blocked(c);
    long long reads1 = stats(m).reads;
    xadd_n(c, few_keys[1], 1, 2, NULL); /* no ring, and the sweep a minute off */
    assert_int_equal(take_in_order(few[1], few_keys[1], 1, 2), 2);
    assert_true(stats(m).reads - reads1 <= 2); /* the wake brought it */
    assert_true(stats(m).bell_on);
    for (int i = 0; i < 3; i++)
        xmux_unsub(few[i]);
    xmux_free(m);
    rconn_free(c);
}

/* A connection whose reply timeout is shorter than the reader's usual
 * BLOCK: the reader blocks for less, instead of every read failing as a
 * dead connection (state: NULL, or the bell's key). */
static void test_xmux_short_io_timeout(void **state)
{
    const char *bell = *state ? key(*state) : NULL;
    struct rconn *c = mk(addr, NULL, NULL);
    assert_int_equal(rconn_wait(c, 2000, NULL), 0);
    const char *k = key(bell ? "mux-io-b" : "mux-io");
    struct xmux *m = mk_mux(bell, 0, 800); /* less than the usual BLOCK of 1000 ms */
    struct rl_err err = {0};
    struct xmux_sub *s = NULL;
    assert_int_equal(xmux_sub(m, k, "0-0", 0, &s, NULL), 0);
    struct rconn_reply *r = (struct rconn_reply *)1;
    int nrc = xmux_next(s, 1300, &r, &err);
    if (nrc)
        fail_msg("xmux_next: %s", err.msg); /* no read failed meanwhile */
    assert_null(r);
    assert_true(stats(m).reads >= 2); /* blocked reads that ended, none failed */
    xadd_n(c, k, 1, 2, bell);
    assert_int_equal(take_in_order(s, k, 1, 2), 2);
    xmux_unsub(s);
    xmux_free(m);
    rconn_free(c);
}

/* On the bell, a round is one read event for Redis (issue 27): the read
 * of the streams a ring named goes in one write with the next blocking
 * read of the bell (rconn_command_then). A writer that writes and rings
 * in one write and waits for its entry before the next costs 2 read
 * events a round (its write, the reader's pair), where a read and then
 * a blocking read cost 3. A ring answered by the first of the pair makes
 * the second answer at once without taking it twice; a new subscription
 * cuts the blocked second short. */
static void test_xmux_bell_pair(void **state)
{
    (void)state;
    struct rconn *c = mk(addr, NULL, NULL);
    assert_int_equal(rconn_wait(c, 2000, NULL), 0);
    char bell[160], keys[40][160];
    snprintf(bell, sizeof bell, "%s", key("bell-pair"));
    struct xmux *m = mk_mux(bell, 60000, 0);
    struct xmux_sub *s[40];
    follow_n(m, "pair", 30, keys, s);
    assert_true(wait_reader_blocked(c));
    struct rconn_batch *b = NULL;
    assert_int_equal(rconn_batch_create(&b, NULL), 0);
    enum { ROUNDS = 40 };
    long long reads0 = info_field(c, "stats", "total_reads_processed:"), xr0 = stats(m).reads;
    for (int i = 0; i < ROUNDS; i++) {
        const char *k = keys[i % 30];
        rconn_batch_reset(b);
        batch_entry_ring(b, k, i / 30 + 1, bell);
        assert_int_equal(rconn_batch_exec(c, b, NULL), 0);
        assert_int_equal(take_in_order(s[i % 30], k, i / 30 + 1, 1), 1);
    }
    long long reads = info_field(c, "stats", "total_reads_processed:") - reads0 - 1; /* less the INFO */
    long long xreads = stats(m).reads - xr0;
    print_message("bell pair: %lld read events, %lld XREADs in %d rounds\n", reads, xreads,
                  ROUNDS);
    assert_true(reads <= ROUNDS * 2 + ROUNDS / 4);
    assert_true(xreads >= 2 * ROUNDS); /* each round: the pair's two reads */
    /* two rings in one write, the second's stream read by the first of a
     * pair: each entry comes once */
    rconn_batch_reset(b);
    batch_entry_ring(b, keys[1], 9, bell);
    batch_entry_ring(b, keys[2], 9, bell);
    assert_int_equal(rconn_batch_exec(c, b, NULL), 0);
    assert_int_equal(take_in_order(s[1], keys[1], 9, 1), 1);
    assert_int_equal(take_in_order(s[2], keys[2], 9, 1), 1);
    struct rconn_reply *r = (struct rconn_reply *)1;
    assert_int_equal(xmux_next(s[1], 200, &r, NULL), 0);
    assert_null(r);
    assert_int_equal(xmux_next(s[2], 1, &r, NULL), 0);
    assert_null(r);
    /* a subscription made while the pair's second read blocks: read at once */
    snprintf(keys[35], sizeof keys[35], "%spair-%d", prefix, 35);
    xadd_n(c, keys[35], 1, 1, NULL);
    assert_int_equal(xmux_sub(m, keys[35], "0-0", 0, &s[35], NULL), 0);
    assert_int_equal(take_in_order(s[35], keys[35], 1, 1), 1);
    rconn_batch_free(b);
    for (int i = 0; i < 30; i++)
        xmux_unsub(s[i]);
    xmux_unsub(s[35]);
    xmux_free(m);
    rconn_free(c);
}

/* XMUX_UNWRITTEN (issue 27): on the bell alone, following a stream that
 * nothing has written yet does not cut the reader's read short (no CLIENT
 * UNBLOCK, which costs Redis a command and a read each job); the stream's
 * first write, rung, brings it. A caller wrong about it (entries written
 * and rung for before it followed) still gets them, with the reader's
 * next round, and the bell stays on. With few streams, blocked on each,
 * the read does not name the new one: cut short as any subscription. */
static void test_xmux_unwritten(void **state)
{
    (void)state;
    struct rconn *c = mk(addr, NULL, NULL);
    assert_int_equal(rconn_wait(c, 2000, NULL), 0);
    char bell[160], keys[40][160];
    snprintf(bell, sizeof bell, "%s", key("bell-unwritten"));
    struct xmux *m = mk_mux(bell, 60000, 0); /* no sweep within the test */
    struct xmux_sub *s[40];
    follow_n(m, "unw", 30, keys, s); /* more than 24: on the bell alone */
    xadd_n(c, keys[0], 1, 1, bell);
    assert_int_equal(take_in_order(s[0], keys[0], 1, 1), 1);
    assert_true(wait_reader_blocked(c));
    long long unb = cmd_calls(c, "client|unblock");
    snprintf(keys[30], sizeof keys[30], "%sunw-30", prefix);
    assert_int_equal(xmux_sub(m, keys[30], "0-0", XMUX_UNWRITTEN, &s[30], NULL), 0);
    assert_int_equal(cmd_calls(c, "client|unblock"), unb);
    xadd_n(c, keys[30], 1, 2, bell);
    assert_int_equal(take_in_order(s[30], keys[30], 1, 2), 2);
    /* wrong about it: its ring came before it was followed (ignored then:
     * once keys[1]'s later ring is taken, the reader is past it) */
    snprintf(keys[31], sizeof keys[31], "%sunw-31", prefix);
    xadd_n(c, keys[31], 1, 3, bell);
    xadd_n(c, keys[1], 1, 1, bell);
    assert_int_equal(take_in_order(s[1], keys[1], 1, 1), 1);
    assert_int_equal(xmux_sub(m, keys[31], "0-0", XMUX_UNWRITTEN, &s[31], NULL), 0);
    assert_int_equal(cmd_calls(c, "client|unblock"), unb);
    xadd_n(c, keys[2], 1, 1, bell); /* any ring: the next round reads it too */
    assert_int_equal(take_in_order(s[2], keys[2], 1, 1), 1);
    assert_int_equal(take_in_order(s[31], keys[31], 1, 3), 3);
    assert_true(stats(m).bell_on);
    for (int i = 0; i < 32; i++)
        xmux_unsub(s[i]);
    xmux_free(m);
    /* few streams: the read names each, not the new one: cut short */
    m = mk_mux(bell, 60000, 0);
    follow_n(m, "unw-few", 3, keys, s);
    assert_true(wait_reader_blocked(c));
    unb = cmd_calls(c, "client|unblock");
    snprintf(keys[3], sizeof keys[3], "%sunw-few-3", prefix);
    assert_int_equal(xmux_sub(m, keys[3], "0-0", XMUX_UNWRITTEN, &s[3], NULL), 0);
    assert_true(cmd_calls(c, "client|unblock") > unb);
    xadd_n(c, keys[3], 1, 2, NULL);
    assert_int_equal(take_in_order(s[3], keys[3], 1, 2), 2);
    for (int i = 0; i < 4; i++)
        xmux_unsub(s[i]);
    xmux_free(m);
    rconn_free(c);
}

/* c's standing read of key (alone) brings the one entry w now adds. */
static void read_brings_one(struct rconn *c, struct rconn *w, const char *key)
{
    struct rl_err err = {0};
    char id[RCONN_ID_MAX];
    const char *names[] = {"job"}, *vals[] = {"{}"}, *keys[] = {key};
    assert_int_equal(rconn_xadd(w, key, "*", 0, 1, names, vals, NULL, id, NULL, &err), 0);
    struct rconn_entries e;
    bool came = false;
    assert_int_equal(rconn_xreadgroup_collect(c, 1, keys, 3000, &e, &came, &err), 0);
    assert_true(came);
    assert_int_equal(e.n, 1);
    assert_string_equal(e.v[0].id, id);
    rconn_entries_free(&e);
}

/* Commands, then a standing read, in one write (issue 27: a worker's
 * admission check and its next read): the commands' replies at once, error
 * replies included (the first failure returned, the read still out); the
 * read blocks in Redis and is collected as any standing read; nothing
 * else may use the connection meanwhile. */
static void test_commands_then_read(void **state)
{
    (void)state;
    struct rconn *c = mk(addr, NULL, NULL), *w = mk(addr, NULL, NULL);
    struct rl_err err = {0};
    const char *jobs = key("then:jobs"), *keys[] = {jobs};
    const char *k1 = key("then:a"), *k2 = key("then:b");
    assert_int_equal(rconn_xgroup_create(w, jobs, "workers", "0", &err), 0);
    const char *set[] = {"SET", k1, "one"};
    cmd_ok(w, 3, set);
    const char *g1[] = {"GET", k1}, *g2[] = {"GET", k2};
    const char *const *argvs[] = {g1, g2};
    const int argcs[] = {2, 2};
    struct rconn_reply *out[2] = {NULL, NULL};
    const char *ping[] = {"PING"};
    assert_int_equal(rconn_command(c, 1, ping, NULL, NULL, &err), 0); /* connected */
    long long reads0 = info_field(w, "stats", "total_reads_processed:");
    assert_int_equal(rconn_commands_then_xreadgroup(c, 2, argcs, argvs, out, "workers", "ws", 1,
                                                    keys, 4, 5000, &err), 0);
    /* one read event for the three (less w's own INFO) */
    assert_int_equal(info_field(w, "stats", "total_reads_processed:") - reads0, 2);
    assert_int_equal(out[0]->type, RCONN_STRING);
    assert_string_equal(out[0]->str, "one");
    assert_int_equal(out[1]->type, RCONN_NIL);
    rconn_reply_free(out[0]);
    rconn_reply_free(out[1]);
    assert_true(rconn_awaiting(c));
    for (int t = 0; t < 5000 && !blocked_xreadgroup(w); t++)
        sleep_ms(1);
    assert_true(blocked_xreadgroup(w) > 0);
    assert_int_equal(rconn_command(c, 1, ping, NULL, NULL, &err), -RL_EINVAL);
    read_brings_one(c, w, jobs);
    struct rconn_entries e;
    bool came = false;
    /* a refused command: its error, the first failure, and the read out */
    const char *bad[] = {"NOSUCHCOMMAND", k1};
    const char *const *argvs2[] = {g1, bad};
    assert_int_equal(rconn_commands_then_xreadgroup(c, 2, argcs, argvs2, out, "workers", "ws", 1,
                                                    keys, 4, 100, &err), -RL_EINVAL);
    assert_int_equal(out[0]->type, RCONN_STRING);
    assert_int_equal(out[1]->type, RCONN_ERROR);
    rconn_reply_free(out[0]);
    rconn_reply_free(out[1]);
    assert_true(rconn_awaiting(c));
    assert_int_equal(rconn_xreadgroup_collect(c, 1, keys, 3000, &e, &came, &err), 0);
    assert_true(came);
    assert_int_equal(e.n, 0); /* its BLOCK ran out */
    assert_int_equal(rconn_command(c, 1, ping, NULL, NULL, &err), 0);
    rconn_free(c);
    rconn_free(w);
}

/* A pipeline, then a standing read, in one write (issue 27: the
 * dispatcher's round and its next read): the batch's replies as
 * rconn_batch_exec gives them, one read event for all, and the read out
 * until collected. */
static void test_batch_then_read(void **state)
{
    (void)state;
    struct rconn *c = mk(addr, NULL, NULL), *w = mk(addr, NULL, NULL);
    struct rl_err err = {0};
    const char *reqs = key("bthen:reqs"), *keys[] = {reqs};
    const char *k = key("bthen:k");
    assert_int_equal(rconn_xgroup_create(w, reqs, "dispatchers", "0", &err), 0);
    const char *ping[] = {"PING"};
    assert_int_equal(rconn_command(c, 1, ping, NULL, NULL, &err), 0); /* connected */
    struct rconn_batch *b = NULL;
    assert_int_equal(rconn_batch_create(&b, NULL), 0);
    const char *set[] = {"SET", k, "v"}, *get[] = {"GET", k};
    assert_int_equal(rconn_batch_add(b, 3, set, NULL, NULL), 0);
    assert_int_equal(rconn_batch_add(b, 2, get, NULL, NULL), 0);
    long long reads0 = info_field(w, "stats", "total_reads_processed:");
    assert_int_equal(rconn_batch_exec_then_xreadgroup(c, b, "dispatchers", "d1", 1, keys, 8, 5000,
                                                      &err), 0);
    assert_int_equal(info_field(w, "stats", "total_reads_processed:") - reads0, 2);
    assert_int_equal(rconn_batch_n_done(b), 2);
    assert_string_equal(rconn_batch_reply(b, 1)->str, "v");
    assert_true(rconn_awaiting(c));
    assert_int_equal(rconn_command(c, 1, ping, NULL, NULL, &err), -RL_EINVAL);
    assert_int_equal(rconn_batch_exec_then_xreadgroup(c, b, "dispatchers", "d1", 1, keys, 8, 5000,
                                                      &err), -RL_EINVAL);
    read_brings_one(c, w, reqs);
    assert_int_equal(rconn_command(c, 1, ping, NULL, NULL, &err), 0);
    rconn_batch_free(b);
    rconn_free(c);
    rconn_free(w);
}

/* One aged look on keys, collected at once: its entries' "job" values
 * and streams must be want[] ("" ends it) in order ("1:newb": stream 1). */
static void aged_look(struct rconn *c, int n, const char *const *keys, int count, int age,
                      int64_t upto, const char *const *want, bool drained)
{
    struct rl_err err = {0};
    assert_int_equal(
        rconn_xreadgroup_send_aged(c, "workers", "w1", n, keys, count, age, upto, &err), 0);
    assert_true(rconn_awaiting(c));
    struct rconn_entries ents = {0};
    bool came = false;
    assert_int_equal(rconn_xreadgroup_collect(c, n, keys, 5000, &ents, &came, &err), 0);
    assert_true(came);
    int k = 0;
    for (; want[k][0]; k++) {
        assert_true(k < ents.n);
        char got[64];
        size_t len = 0;
        const char *v = rconn_entry_field(&ents.v[k], "job", &len);
        assert_non_null(v);
        snprintf(got, sizeof got, "%d:%.*s", ents.v[k].stream, (int)len, v);
        assert_string_equal(got, want[k]);
    }
    assert_int_equal(ents.n, k);
    assert_int_equal(ents.drained, drained);
    rconn_entries_free(&ents);
    assert_false(ents.drained);
}

/* rconn_xreadgroup_send_aged (issue 27 point 4, a busy worker's look at
 * another shard): only entries at least that old by Redis's clock, at
 * most COUNT a stream, the younger ones left undelivered for the shard's
 * own readers; the reply maps to the keys as a read's; a missing group is
 * XREADGROUP's NOGROUP. */
static void test_aged_read(void **state)
{
    (void)state;
    struct rconn *c = mk(addr, NULL, NULL), *w = mk(addr, NULL, NULL);
    struct rl_err err = {0};
    const char *a = key("aged:a"), *b = key("aged:b"), *keys[] = {a, b};
    assert_int_equal(rconn_xgroup_create(w, a, "workers", "0", &err), 0);
    assert_int_equal(rconn_xgroup_create(w, b, "workers", "0", &err), 0);
    /* a: two entries from long ago (explicit IDs: their time is 1970),
     * then one added now; b: one added now */
    const char *x1[] = {"XADD", a, "1-1", "job", "old1"}, *x2[] = {"XADD", a, "2-1", "job", "old2"};
    const char *xa[] = {"XADD", a, "*", "job", "new"}, *xb[] = {"XADD", b, "*", "job", "newb"};
    cmd_ok(w, 5, x1);
    cmd_ok(w, 5, x2);
    cmd_ok(w, 5, xa);
    cmd_ok(w, 5, xb);
    /* added no later than 1 ms after the epoch: the first only, though
     * the second is old enough too and COUNT allows (a worker's look
     * during a home backlog: only jobs older than the home's next) */
    aged_look(c, 2, keys, 8, 60000, 1, (const char *const[]){"0:old1", ""}, false);
    aged_look(c, 2, keys, 8, 60000, 1, (const char *const[]){""}, false);
    /* COUNT 1, any time: the oldest left */
    aged_look(c, 2, keys, 1, 60000, 0, (const char *const[]){"0:old2", ""}, false);
    /* none old enough, but some waiting: not drained (the look comes
     * again at steal_ms, worker/loop.c) */
    aged_look(c, 2, keys, 8, 60000, 0, (const char *const[]){""}, false);
    /* nothing young was delivered: the group's pending list holds two */
    const char *pend[] = {"XPENDING", a, "workers"};
    struct rconn_reply *r = NULL;
    assert_int_equal(rconn_command(w, 3, pend, NULL, &r, &err), 0);
    assert_int_equal(r->elem[0].integer, 2);
    rconn_reply_free(r);
    /* age 0: whatever waits, in both streams */
    aged_look(c, 2, keys, 8, 0, 0, (const char *const[]){"0:new", "1:newb", ""}, false);
    /* nothing undelivered in either: drained, the one answer that says so */
    aged_look(c, 2, keys, 8, 0, 0, (const char *const[]){""}, true);
    aged_look(c, 2, keys, 8, 60000, 0, (const char *const[]){""}, true);
    /* a plain read of nothing (nil) is never drained */
    struct rconn_entries none = {0};
    bool came0 = false;
    assert_int_equal(rconn_xreadgroup_send(c, "workers", "w1", 2, keys, 8, -1, &err), 0);
    assert_int_equal(rconn_xreadgroup_collect(c, 2, keys, 5000, &none, &came0, &err), 0);
    assert_true(came0);
    assert_int_equal(none.n, 0);
    assert_false(none.drained);
    /* no group: the read's own error */
    const char *nog[] = {key("aged:nogroup")};
    const char *xn[] = {"XADD", nog[0], "*", "job", "x"};
    cmd_ok(w, 5, xn);
    assert_int_equal(rconn_xreadgroup_send_aged(c, "workers", "w1", 1, nog, 8, 0, 0, &err), 0);
    struct rconn_entries ents = {0};
    bool came = false;
    assert_int_not_equal(rconn_xreadgroup_collect(c, 1, nog, 5000, &ents, &came, &err), 0);
    assert_non_null(strstr(err.msg, "NOGROUP"));
    rconn_free(c);
    rconn_free(w);
}

/* An ACL that does not let the reader read the bell: refused with the
 * reason (the caller then blocks on every stream). */
static void test_xmux_bell_refused(void **state)
{
    (void)state;
    struct rconn *admin = mk(addr, NULL, NULL);
    const char *user = key("nobell");
    char pat[200];
    snprintf(pat, sizeof pat, "~%sout*", prefix);
    const char *setuser[] = {"ACL", "SETUSER", user, "on", ">pw", pat, "+@all"};
    cmd_ok(admin, 7, setuser);
    char pw[300];
    write_pw_file(pw, sizeof pw, "xmux-bell-pw", "pw");
    struct rconn_opts o;
    rconn_opts_default(&o);
    o.addr = addr;
    o.user = user;
    o.password_file = pw;
    struct xmux *m = (struct xmux *)1;
    struct rl_err err = {0};
    struct xmux_opts xo = {.bell = key("bell")};
    assert_int_equal(xmux_create(&m, &o, &xo, &err), -RL_EUNSUPPORTED);
    assert_null(m);
    assert_non_null(strstr(err.msg, "XREAD"));
    assert_int_equal(xmux_create(&m, &o, NULL, &err), 0); /* without it: fine */
    xmux_free(m);
    unlink(pw);
    const char *deluser[] = {"ACL", "DELUSER", user};
    cmd_ok(admin, 3, deluser);
    rconn_free(admin);
}

static void test_xmux_refused_without_unblock(void **state)
{
    (void)state;
    struct rconn *admin = mk(addr, NULL, NULL);
    const char *user = key("nounblock");
    const char *setuser[] = {"ACL", "SETUSER", user, "on", ">pw", "~*", "+@all", "-client|unblock"};
    cmd_ok(admin, 8, setuser);
    char pw[300];
    write_pw_file(pw, sizeof pw, "xmux-pw", "pw");
    struct rconn_opts o;
    rconn_opts_default(&o);
    o.addr = addr;
    o.user = user;
    o.password_file = pw;
    struct xmux *m = (struct xmux *)1;
    struct rl_err err = {0};
    assert_int_equal(xmux_create(&m, &o, NULL, &err), -RL_EUNSUPPORTED);
    assert_null(m);
    assert_non_null(strstr(err.msg, "CLIENT UNBLOCK"));
    unlink(pw);
    const char *deluser[] = {"ACL", "DELUSER", user};
    cmd_ok(admin, 3, deluser);
    rconn_free(admin);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_addresses),
        cmocka_unit_test(test_command_binary_safe),
        cmocka_unit_test(test_unix_socket),
        cmocka_unit_test(test_acl_auth),
        cmocka_unit_test(test_backoff_when_down),
        cmocka_unit_test(test_streams),
        cmocka_unit_test(test_out_stream_idempotent),
        cmocka_unit_test(test_pipeline),
        cmocka_unit_test(test_standing_read),
        cmocka_unit_test(test_xmux_streams_apart),
        cmocka_unit_test_prestate(test_xmux_streams_apart, (void *)"bell-apart"),
        cmocka_unit_test(test_xmux_backpressure),
        cmocka_unit_test_prestate(test_xmux_backpressure, (void *)"bell-many"),
        cmocka_unit_test(test_xmux_bell),
        cmocka_unit_test(test_xmux_bell_pair),
        cmocka_unit_test(test_commands_then_read),
        cmocka_unit_test(test_batch_then_read),
        cmocka_unit_test(test_aged_read),
        cmocka_unit_test(test_xmux_unwritten),
        cmocka_unit_test(test_xmux_short_io_timeout),
        cmocka_unit_test_prestate(test_xmux_short_io_timeout, (void *)"bell-io"),
        cmocka_unit_test(test_xmux_bell_refused),
        cmocka_unit_test(test_xmux_refused_without_unblock),
        cmocka_unit_test(test_reconnect_after_restart),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
