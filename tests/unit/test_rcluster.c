/* tests/unit/test_rcluster.c - Redis Cluster key slots against the values
 * Redis itself gives (cluster spec, CLUSTER KEYSLOT docs), hash-tag rules,
 * command key positions, the CLUSTER SLOTS parser and redirects. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rcluster.h"

static void test_crc16(void **state)
{
    (void)state;
    assert_int_equal(rcl_crc16("123456789", 9), 0x31C3); /* the spec's check value */
    assert_int_equal(rcl_crc16("", 0), 0);
}

static const struct {
    const char *key;
    int slot;
} slots[] = {
    /* CLUSTER KEYSLOT examples of the Redis docs, and redis-cli on a 7.0 cluster */
    {"somekey", 11058},
    {"foo{hash_tag}", 2515},
    {"bar{hash_tag}", 2515},
    {"foo", 12182},
    {"bar", 5061},
    {"123456789", 0x31C3 & 16383},
};

static void test_key_slots(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        assert_int_equal(rcl_key_slot(slots[i].key, strlen(slots[i].key)), slots[i].slot);
}

static int slot_of(const char *k) { return rcl_key_slot(k, strlen(k)); }

static void test_hash_tags(void **state)
{
    (void)state;
    /* the spec's examples: the tag is between the first { and the first } after it */
    assert_int_equal(slot_of("{user1000}.following"), slot_of("user1000"));
    assert_int_equal(slot_of("{user1000}.followers"), slot_of("user1000"));
    assert_int_equal(slot_of("foo{{bar}}zap"), slot_of("{bar"));
    assert_int_equal(slot_of("foo{bar}{zap}"), slot_of("bar"));
    /* an empty tag or none at all hashes the whole key */
    assert_int_equal(slot_of("foo{}{bar}"), rcl_crc16("foo{}{bar}", 10) & 16383);
    assert_int_equal(slot_of("foo{bar"), rcl_crc16("foo{bar", 7) & 16383);
    assert_int_equal(slot_of("foo}bar{"), rcl_crc16("foo}bar{", 8) & 16383);
    /* our layout: one request's keys share the slot of its id */
    char out[64], cancel[64];
    assert_int_equal(rcl_tagged_key(out, sizeof out, true, "redlm:", "out:", "r1"), 14);
    assert_string_equal(out, "redlm:out:{r1}");
    rcl_tagged_key(cancel, sizeof cancel, true, "redlm:", "cancel:", "r1");
    assert_int_equal(slot_of(out), slot_of(cancel));
    assert_int_equal(slot_of(out), slot_of("r1"));
    rcl_tagged_key(out, sizeof out, false, "redlm:", "out:", "r1");
    assert_string_equal(out, "redlm:out:r1"); /* single instance: today's key */
    assert_int_equal(rcl_tagged_key(out, 8, true, "redlm:", "out:", "r1"), -1);
    /* the pools' and adapters' streams, as worker and dispatcher spell them */
    char pool[64], rest[64];
    assert_int_equal(rcl_lora_pool(pool, sizeof pool, "sql"), 8);
    assert_string_equal(pool, "lora@sql");
    assert_int_equal(rcl_pool_rest(rest, sizeof rest, NULL, pool), 13);
    assert_string_equal(rest, "jobs:lora@sql");
    rcl_pool_rest(rest, sizeof rest, "Qwen/Qwen3-8B", "fast");
    assert_string_equal(rest, "jobs:Qwen/Qwen3-8B:fast");
    rcl_queue_key(out, sizeof out, true, "redlm:", rest);
    assert_string_equal(out, "{redlm:}jobs:Qwen/Qwen3-8B:fast");
    assert_int_equal(rcl_pool_rest(rest, 10, NULL, "lora@sql"), -1);
    assert_int_equal(rcl_lora_pool(pool, 8, "sql"), -1);
}

static void test_command_keys(void **state)
{
    (void)state;
    static const struct {
        int argc;
        const char *argv[12];
        int key;
    } cases[] = {
        {3, {"SET", "k", "v"}, 1},
        {2, {"EXISTS", "k"}, 1},
        {1, {"MULTI"}, -1},
        {1, {"exec"}, -1},
        {6, {"SCAN", "0", "MATCH", "x*", "COUNT", "10"}, -1},
        {6, {"XGROUP", "CREATE", "jobs", "g", "0", "MKSTREAM"}, 2},
        {10, {"XREADGROUP", "GROUP", "g", "c", "COUNT", "1", "STREAMS", "a", "b", ">"}, 7},
        {8, {"XREAD", "COUNT", "5", "BLOCK", "100", "STREAMS", "out", "0"}, 6},
        {5, {"EVALSHA", "abc", "1", "key", "arg"}, 3},
        {3, {"EVAL", "return 1", "0"}, -1},
        {3, {"XINFO", "STREAM", "s"}, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(rcl_command_key(cases[i].argc, cases[i].argv, NULL), cases[i].key);
    const char *x[] = {"XADD", "redlm:out:{abc}", "*", "f", "v"};
    assert_int_equal(rcl_command_slot(5, x, NULL), slot_of("abc"));
}

/* Reply builders for the parser. */
static struct rconn_reply r_int(long long v)
{
    return (struct rconn_reply){.type = RCONN_INTEGER, .integer = v};
}
static struct rconn_reply rstr(const char *s)
{
    return (struct rconn_reply){.type = RCONN_STRING, .str = (char *)s, .len = strlen(s)};
}
static struct rconn_reply rarr(size_t n, struct rconn_reply *e)
{
    return (struct rconn_reply){.type = RCONN_ARRAY, .n_elem = n, .elem = e};
}

static void test_map_parse(void **state)
{
    (void)state;
    static struct rcl_map m;
    struct rl_err err;
    /* three masters, one with a replica, one with an empty host */
    struct rconn_reply m0[] = {rstr("127.0.0.1"), r_int(7000), rstr("id0")};
    struct rconn_reply r0[] = {rstr("127.0.0.1"), r_int(7003), rstr("id3")};
    struct rconn_reply m1[] = {rstr("127.0.0.1"), r_int(7001), rstr("id1")};
    struct rconn_reply m2[] = {rstr(""), r_int(7002), rstr("id2")};
    struct rconn_reply e0[] = {r_int(0), r_int(5460), rarr(3, m0), rarr(3, r0)};
    struct rconn_reply e1[] = {r_int(5461), r_int(10922), rarr(3, m1)};
    struct rconn_reply e2[] = {r_int(10923), r_int(16383), rarr(3, m2)};
    struct rconn_reply ranges[] = {rarr(4, e0), rarr(3, e1), rarr(3, e2)};
    struct rconn_reply top = rarr(3, ranges);
    assert_int_equal(rcl_map_parse(&m, &top, "10.0.0.9", &err), 0);
    assert_int_equal(m.n_nodes, 3);
    assert_int_equal(rcl_map_n_uncovered(&m), 0);
    assert_int_equal(m.nodes[m.slot_node[0]].port, 7000);
    assert_int_equal(m.nodes[m.slot_node[5461]].port, 7001);
    assert_int_equal(m.nodes[m.slot_node[16383]].port, 7002);
    assert_string_equal(m.nodes[m.slot_node[16383]].host, "10.0.0.9");
    /* a partial map leaves the rest uncovered */
    struct rconn_reply part = rarr(1, ranges);
    assert_int_equal(rcl_map_parse(&m, &part, "x", &err), 0);
    assert_int_equal(rcl_map_n_uncovered(&m), 16384 - 5461);
    assert_int_equal(m.slot_node[5461], -1);
    /* malformed: a slot past 16383, a range with no master, not an array */
    struct rconn_reply bad_e[] = {r_int(0), r_int(16384), rarr(3, m0)};
    struct rconn_reply bad_r[] = {rarr(3, bad_e)};
    struct rconn_reply bad = rarr(1, bad_r);
    assert_int_equal(rcl_map_parse(&m, &bad, "x", &err), -RL_EFORMAT);
    assert_non_null(strstr(err.msg, "16384"));
    struct rconn_reply short_e[] = {r_int(0), r_int(10)};
    struct rconn_reply short_r[] = {rarr(2, short_e)};
    struct rconn_reply shrt = rarr(1, short_r);
    assert_int_equal(rcl_map_parse(&m, &shrt, "x", &err), -RL_EFORMAT);
    struct rconn_reply s = rstr("nope");
    assert_int_equal(rcl_map_parse(&m, &s, "x", &err), -RL_EFORMAT);
}

static void test_redirects(void **state)
{
    (void)state;
    int slot, port;
    char host[RCL_HOST_MAX];
    assert_int_equal(rcl_parse_redirect("MOVED 3999 127.0.0.1:6381", &slot, host, &port), RCL_MOVED);
    assert_int_equal(slot, 3999);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 6381);
    assert_int_equal(rcl_parse_redirect("ASK 12 ::1:7000", &slot, host, &port), RCL_ASK);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 7000);
    assert_int_equal(rcl_parse_redirect("MOVED 99999 h:1", &slot, host, &port), RCL_NONE);
    assert_int_equal(rcl_parse_redirect("MOVED 1 nohost", &slot, host, &port), RCL_NONE);
    assert_int_equal(rcl_parse_redirect("CLUSTERDOWN The cluster is down", &slot, host, &port),
                     RCL_NONE);
}

static void test_seeds(void **state)
{
    (void)state;
    char seeds[4][RCL_HOST_MAX + 8];
    struct rl_err err;
    assert_int_equal(rcl_split_seeds("a:1,b:2,c:3", seeds, 4, &err), 3);
    assert_string_equal(seeds[2], "c:3");
    assert_int_equal(rcl_split_seeds("127.0.0.1:6379", seeds, 4, &err), 1);
    assert_int_equal(rcl_split_seeds("a:1,,c:3", seeds, 4, &err), -RL_EINVAL);
    assert_non_null(strstr(err.msg, "entry 2 is empty"));
    assert_int_equal(rcl_split_seeds("a:1,b:2,c:3,d:4,e:5", seeds, 4, &err), -RL_EINVAL);
}

/* Pool shards (issue 27): shard 0 is today's key; the others share a tag
 * per shard across pools, sit evenly over the slot space, and give each
 * master of an evenly split cluster its share. */
static int master_of(int slot, int n_masters)
{
    /* redis-cli --cluster create's split: contiguous, even ranges */
    for (int m = 0; m < n_masters; m++)
        if (slot <= (m + 1) * RCL_N_SLOTS / n_masters - (m + 1 < n_masters))
            return m;
    return n_masters - 1;
}

static void test_shard_keys(void **state)
{
    (void)state;
    char k[128], k2[128];
    assert_int_equal(rcl_shard_key(k, sizeof k, "{redlm:}jobs:fast", 0, 8), 17);
    assert_string_equal(k, "{redlm:}jobs:fast"); /* shard 0: today's key, byte for byte */
    assert_true(rcl_shard_key(k, sizeof k, "{redlm:}jobs:fast", 3, 8) > 0);
    assert_int_equal(strncmp(k, "{redlm:3.", 9), 0);
    assert_non_null(strstr(k, "}jobs:fast"));
    /* the same shard of another pool, of a model's pool and of the
     * forward markers shares the slot (one tag per shard) */
    rcl_shard_key(k2, sizeof k2, "{redlm:}jobs:think", 3, 8);
    assert_int_equal(slot_of(k), slot_of(k2));
    rcl_shard_key(k2, sizeof k2, "{redlm:}fwd:requests:1-0", 3, 8);
    assert_int_equal(slot_of(k), slot_of(k2));
    /* deterministic: every process computes the same name */
    rcl_shard_key(k2, sizeof k2, "{redlm:}jobs:fast", 3, 8);
    assert_string_equal(k, k2);
    /* bad input */
    assert_int_equal(rcl_shard_key(k, sizeof k, "redlm:jobs:fast", 1, 8), -1);
    assert_int_equal(rcl_shard_key(k, sizeof k, "{}jobs:fast", 1, 8), -1);
    assert_int_equal(rcl_shard_key(k, sizeof k, "{redlm:}jobs:fast", 8, 8), -1);
    assert_int_equal(rcl_shard_key(k, sizeof k, "{redlm:}jobs:fast", 0, RCL_MAX_SHARDS + 1), -1);
    assert_int_equal(rcl_shard_key(k, 12, "{redlm:}jobs:fast", 1, 8), -1);
    /* the search done once: the same names from rcl_shard_n + rcl_shard_key_n */
    long n3 = rcl_shard_n("redlm:", 6, 3, 8);
    assert_true(n3 >= 0);
    rcl_shard_key(k, sizeof k, "{redlm:}jobs:fast", 3, 8);
    assert_true(rcl_shard_key_n(k2, sizeof k2, "{redlm:}jobs:fast", 3, n3) > 0);
    assert_string_equal(k, k2);
    assert_int_equal(rcl_shard_n("redlm:", 6, 0, 8), -1);
    assert_int_equal(rcl_shard_n("redlm:", 6, 8, 8), -1);
    /* the spread holds wherever the prefix's slot falls (but a slot or two
     * from a range's end): 200 prefixes, 3 shards on 3 masters */
    int bad = 0;
    for (int i = 0; i < 200; i++) {
        char key[64], sh[96];
        snprintf(key, sizeof key, "{t%08x:}jobs:fast", (unsigned)i * 2654435761u);
        int seen = 0;
        for (int s = 0; s < 3; s++) {
            assert_true(rcl_shard_key(sh, sizeof sh, key, s, 3) > 0);
            seen |= 1 << master_of(slot_of(sh), 3);
        }
        bad += seen != 7;
    }
    assert_int_equal(bad, 0);
    /* spacing and spread, for several prefixes and shard counts */
    const char *prefixes[] = {"{redlm:}jobs:fast", "{fl:}jobs:think", "{t1:}jobs:m:fast"};
    static const struct { int k, masters, lo, hi; } cases[] = {
        {6, 3, 2, 2}, {12, 3, 4, 4}, {8, 3, 2, 3}, {8, 4, 2, 2}, {16, 4, 4, 4}, {6, 2, 3, 3},
        {3, 3, 1, 1},
    };
    for (size_t p = 0; p < sizeof prefixes / sizeof prefixes[0]; p++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            int n = cases[c].k, count[8] = {0};
            int s0 = slot_of(prefixes[p]);
            for (int s = 0; s < n; s++) {
                assert_true(rcl_shard_key(k, sizeof k, prefixes[p], s, n) > 0);
                int sl = slot_of(k);
                int off = (sl - s0 + RCL_N_SLOTS) % RCL_N_SLOTS;
                assert_int_equal(off, (s * RCL_N_SLOTS + n / 2) / n); /* evenly, exactly */
                count[master_of(sl, cases[c].masters)]++;
            }
            for (int m = 0; m < cases[c].masters; m++) {
                assert_true(count[m] >= cases[c].lo);
                assert_true(count[m] <= cases[c].hi);
            }
        }
}

static void test_shard_for_slot(void **state)
{
    (void)state;
    assert_int_equal(rcl_shard_slot(100, 0, 3), 100);
    assert_int_equal(rcl_shard_slot(100, 1, 3), 5561);
    assert_int_equal(rcl_shard_slot(16000, 2, 3), (16000 + 10923) % 16384);
    assert_int_equal(rcl_shard_slot(100, 3, 3), -1);
    assert_int_equal(rcl_shard_for_slot(100, 5000, 1), 0);
    /* the first shard at or after the slot, going round: 100, 5561, 11023 */
    assert_int_equal(rcl_shard_for_slot(100, 100, 3), 0);
    assert_int_equal(rcl_shard_for_slot(100, 101, 3), 1);
    assert_int_equal(rcl_shard_for_slot(100, 5561, 3), 1);
    assert_int_equal(rcl_shard_for_slot(100, 5562, 3), 2);
    assert_int_equal(rcl_shard_for_slot(100, 16383, 3), 0);
    assert_int_equal(rcl_shard_for_slot(100, 0, 3), 0);
    /* shards of the real prefix, with the request slots of a cluster made
     * by redis-cli --cluster create (0, 5461, 10923): each request slot's
     * shard is served by the master of the request slot, for 3 and for 6
     * shards (2 a master) */
    int s0 = rcl_key_slot("{redlm:}jobs:fast", 17);
    int starts[3] = {0, 5461, 10923}, ends[3] = {5460, 10922, 16383};
    for (int k = 3; k <= 6; k += 3)
        for (int m = 0; m < 3; m++) {
            int sl = rcl_shard_slot(s0, rcl_shard_for_slot(s0, starts[m], k), k);
            assert_true(sl >= starts[m] && sl <= ends[m]);
        }
    /* ids as clients make them spread evenly (within 15 % of 1/K) */
    int count[8] = {0};
    char id[48];
    for (int i = 0; i < 8000; i++) {
        int n = snprintf(id, sizeof id, "chatcmpl-%08x%04d", (unsigned)i * 2654435761u, i);
        int s = rcl_shard_for_slot(s0, rcl_key_slot(id, (size_t)n), 8);
        assert_true(s >= 0 && s < 8);
        count[s]++;
    }
    for (int s = 0; s < 8; s++) {
        assert_true(count[s] > 850);
        assert_true(count[s] < 1150);
    }
}

/* Every slot is reachable from a window at the start, the middle and the
 * end of ids of several lengths (the 18 free bits span the 14 of a slot
 * whatever CRC the tail carries them through), and the rest of the id is
 * left as it was. */
static void test_slot_fill(void **state)
{
    (void)state;
    const char *ids[] = {"......", "chatcmpl-3f9a0c27d1e4b6a8......",
                         "lb0000abcd-1-......-17", "......-a-much-longer-tail-of-forty-bytes-x"};
    for (size_t t = 0; t < sizeof ids / sizeof *ids; t++) {
        size_t len = strlen(ids[t]), at = (size_t)(strstr(ids[t], "......") - ids[t]);
        char id[128];
        for (int slot = 0; slot < RCL_N_SLOTS; slot++) {
            memcpy(id, ids[t], len + 1);
            assert_int_equal(rcl_slot_fill(id, len, at, slot), 0);
            assert_int_equal(rcl_key_slot(id, len), slot);
            assert_memory_equal(id, ids[t], at);
            assert_string_equal(id + at + RCL_SLOT_FILL_LEN, ids[t] + at + RCL_SLOT_FILL_LEN);
            for (size_t i = at; i < at + RCL_SLOT_FILL_LEN; i++)
                assert_true(id[i] >= 'h' && id[i] <= 'o');
        }
    }
    char id[8] = "abcdefg";
    assert_int_equal(rcl_slot_fill(id, 7, 2, 100), -1); /* the window does not fit */
    assert_int_equal(rcl_slot_fill(id, 7, 0, RCL_N_SLOTS), -1);
    assert_int_equal(rcl_slot_fill(id, 7, 0, -1), -1);
    assert_string_equal(id, "abcdefg");
}

/* A bell per slot on a cluster, in that slot; one on a single instance. */
static void test_bell_keys(void **state)
{
    (void)state;
    char k[64];
    assert_int_equal(rcl_bell_key(k, sizeof k, false, "redlm:", 77), 10);
    assert_string_equal(k, "redlm:bell");
    for (int slot = 0; slot < RCL_N_SLOTS; slot += 97) {
        assert_int_equal(rcl_bell_key(k, sizeof k, true, "redlm:", slot), 18);
        assert_int_equal(rcl_key_slot(k, strlen(k)), slot);
        assert_memory_equal(k, "redlm:bell{", 11);
        assert_int_equal(k[17], '}');
    }
    assert_int_equal(rcl_bell_key(k, 12, true, "redlm:", 5), -1);
}

/* One request slot per master, each the lowest it serves, whatever order
 * the map lists them in. */
static void test_request_slots(void **state)
{
    (void)state;
    struct rcl_map *m = malloc(sizeof *m);
    assert_non_null(m);
    rcl_map_clear(m);
    int a = rcl_map_node(m, "10.0.0.1", 7000), b = rcl_map_node(m, "10.0.0.2", 7000),
        c = rcl_map_node(m, "10.0.0.3", 7000);
    for (int s = 0; s < RCL_N_SLOTS; s++)
        m->slot_node[s] = (int16_t)(s < 5461 ? b : s < 10923 ? c : s < 12000 ? a : b);
    int got[8];
    assert_int_equal(rcl_map_request_slots(m, got, 8), 3);
    assert_int_equal(got[a], 10923);
    assert_int_equal(got[b], 0);
    assert_int_equal(got[c], 5461);
    assert_int_equal(rcl_map_request_slots(m, got, 2), 2);
    rcl_map_clear(m);
    assert_int_equal(rcl_map_request_slots(m, got, 8), 0);
    free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc16),       cmocka_unit_test(test_key_slots),
        cmocka_unit_test(test_hash_tags),   cmocka_unit_test(test_command_keys),
        cmocka_unit_test(test_map_parse),   cmocka_unit_test(test_redirects),
        cmocka_unit_test(test_seeds),       cmocka_unit_test(test_shard_keys),
        cmocka_unit_test(test_shard_for_slot),  cmocka_unit_test(test_slot_fill),
        cmocka_unit_test(test_request_slots), cmocka_unit_test(test_bell_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
