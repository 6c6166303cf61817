/* common/rcluster.c - key slots, command keys, the CLUSTER SLOTS map and
 * redirect parsing for common/rconn.c's cluster mode.
 *
 * The slot function is Redis Cluster's own (cluster spec, "Keys
 * distribution model"): CRC16 XModem of the key modulo 16384, where a
 * non-empty {tag} replaces the key. Everything here is pure and
 * allocation-free; any thread may call it. */
#include "rcluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* crc carried on over len bytes of buf, or of zeros when buf is NULL */
static uint16_t crc16_more(uint16_t crc, const char *buf, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((buf ? (uint8_t)buf[i] : 0) << 8);
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

uint16_t rcl_crc16(const char *buf, size_t len) { return crc16_more(0, buf, len); }

int rcl_key_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t off = (size_t)(open - key) + 1;
        const char *close = memchr(open + 1, '}', len - off);
        if (close && close > open + 1) /* "{}" hashes the whole key */
            return rcl_crc16(open + 1, (size_t)(close - open - 1)) & (RCL_N_SLOTS - 1);
    }
    return rcl_crc16(key, len) & (RCL_N_SLOTS - 1);
}

static size_t arg_len(const char *const *argv, const size_t *lens, int i)
{
    return lens ? lens[i] : strlen(argv[i]);
}

static bool is(const char *const *argv, const size_t *lens, int i, const char *word)
{
    size_t n = strlen(word);
    return arg_len(argv, lens, i) == n && !strncasecmp(argv[i], word, n);
}

int rcl_command_key(int argc, const char *const *argv, const size_t *lens)
{
    static const char *const keyless[] = {
        "MULTI", "EXEC", "DISCARD", "PING", "INFO", "SCAN", "CLUSTER", "ASKING", "AUTH",
        "CLIENT", "SCRIPT", "DBSIZE", "FLUSHALL", "FLUSHDB", "TIME", "KEYS", "HELLO",
        "COMMAND", "CONFIG", "READONLY", "WAIT"};
    if (argc < 1)
        return -1;
    for (size_t k = 0; k < sizeof keyless / sizeof keyless[0]; k++)
        if (is(argv, lens, 0, keyless[k]))
            return -1;
    if (is(argv, lens, 0, "XREAD") || is(argv, lens, 0, "XREADGROUP")) {
        for (int i = 1; i + 1 < argc; i++)
            if (is(argv, lens, i, "STREAMS"))
                return i + 1;
        return -1;
    }
    if (is(argv, lens, 0, "XGROUP") || is(argv, lens, 0, "XINFO"))
        return argc > 2 ? 2 : -1;
    if (is(argv, lens, 0, "EVAL") || is(argv, lens, 0, "EVALSHA"))
        return argc > 3 && atoi(argv[2]) > 0 ? 3 : -1;
    return argc > 1 ? 1 : -1;
}

int rcl_command_slot(int argc, const char *const *argv, const size_t *lens)
{
    int k = rcl_command_key(argc, argv, lens);
    return k < 0 ? -1 : rcl_key_slot(argv[k], arg_len(argv, lens, k));
}

void rcl_map_clear(struct rcl_map *m)
{
    m->n_nodes = 0;
    for (int s = 0; s < RCL_N_SLOTS; s++)
        m->slot_node[s] = -1;
}

int rcl_map_node(struct rcl_map *m, const char *host, int port)
{
    for (int i = 0; i < m->n_nodes; i++)
        if (m->nodes[i].port == port && !strcmp(m->nodes[i].host, host))
            return i;
    if (m->n_nodes == RCL_MAX_NODES || strlen(host) >= RCL_HOST_MAX)
        return -1;
    struct rcl_node *n = &m->nodes[m->n_nodes];
    snprintf(n->host, sizeof n->host, "%s", host);
    n->port = port;
    return m->n_nodes++;
}

int rcl_map_parse(struct rcl_map *m, const struct rconn_reply *r, const char *seed_host,
                  struct rl_err *err)
{
    rcl_map_clear(m);
    if (!r || r->type != RCONN_ARRAY)
        return rl_errf(err, RL_EFORMAT, "CLUSTER SLOTS: reply is not an array");
    for (size_t i = 0; i < r->n_elem; i++) {
        const struct rconn_reply *e = &r->elem[i];
        if (e->type != RCONN_ARRAY || e->n_elem < 3 || e->elem[0].type != RCONN_INTEGER ||
            e->elem[1].type != RCONN_INTEGER)
            return rl_errf(err, RL_EFORMAT, "CLUSTER SLOTS: range %zu is malformed", i);
        long long lo = e->elem[0].integer, hi = e->elem[1].integer;
        const struct rconn_reply *master = &e->elem[2];
        if (lo < 0 || hi >= RCL_N_SLOTS || lo > hi)
            return rl_errf(err, RL_EFORMAT, "CLUSTER SLOTS: range %lld-%lld is out of 0-16383",
                           lo, hi);
        if (master->type != RCONN_ARRAY || master->n_elem < 2 ||
            master->elem[0].type != RCONN_STRING || master->elem[1].type != RCONN_INTEGER)
            return rl_errf(err, RL_EFORMAT, "CLUSTER SLOTS: master of %lld-%lld is malformed",
                           lo, hi);
        const char *host = master->elem[0].len ? master->elem[0].str : seed_host;
        long long port = master->elem[1].integer;
        if (!host || !host[0] || port < 1 || port > 65535)
            return rl_errf(err, RL_EFORMAT, "CLUSTER SLOTS: master of %lld-%lld has no address",
                           lo, hi);
        int n = rcl_map_node(m, host, (int)port);
        if (n < 0)
            return rl_errf(err, RL_EFORMAT, "CLUSTER SLOTS: more than %d masters", RCL_MAX_NODES);
        for (long long s = lo; s <= hi; s++)
            m->slot_node[s] = (int16_t)n;
    }
    return 0;
}

int rcl_map_n_uncovered(const struct rcl_map *m)
{
    int n = 0;
    for (int s = 0; s < RCL_N_SLOTS; s++)
        n += m->slot_node[s] < 0;
    return n;
}

enum rcl_redirect rcl_parse_redirect(const char *s, int *slot, char *host, int *port)
{
    enum rcl_redirect kind;
    if (!strncmp(s, "MOVED ", 6))
        kind = RCL_MOVED, s += 6;
    else if (!strncmp(s, "ASK ", 4))
        kind = RCL_ASK, s += 4;
    else
        return RCL_NONE;
    char *end;
    long sl = strtol(s, &end, 10);
    if (end == s || *end != ' ' || sl < 0 || sl >= RCL_N_SLOTS)
        return RCL_NONE;
    const char *addr = end + 1, *colon = strrchr(addr, ':');
    if (!colon || (size_t)(colon - addr) >= RCL_HOST_MAX)
        return RCL_NONE;
    long p = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || (*end && *end != ' ') || p < 1 || p > 65535)
        return RCL_NONE;
    /* an empty host means "the node you are talking to": the caller keeps its own */
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    *slot = (int)sl;
    *port = (int)p;
    return kind;
}

int rcl_split_seeds(const char *list, char (*seeds)[RCL_HOST_MAX + 8], int max,
                    struct rl_err *err)
{
    int n = 0;
    const char *p = list;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (!len || len >= RCL_HOST_MAX + 8)
            return rl_errf(err, RL_EINVAL, "redis address list \"%s\": entry %d is %s", list,
                           n + 1, len ? "too long" : "empty");
        if (n == max)
            return rl_errf(err, RL_EINVAL, "redis address list \"%s\": more than %d entries",
                           list, max);
        memcpy(seeds[n], p, len);
        seeds[n++][len] = 0;
        if (!comma)
            return n;
        p = comma + 1;
    }
}

int rcl_queue_key(char *buf, size_t cap, bool cluster, const char *prefix, const char *rest)
{
    int n = snprintf(buf, cap, cluster ? "{%s}%s" : "%s%s", prefix, rest);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

int rcl_pool_rest(char *buf, size_t cap, const char *model, const char *pool)
{
    int n = model ? snprintf(buf, cap, "jobs:%s:%s", model, pool)
                  : snprintf(buf, cap, "jobs:%s", pool);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

int rcl_lora_pool(char *buf, size_t cap, const char *adapter)
{
    int n = snprintf(buf, cap, "lora@%s", adapter);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

int rcl_tagged_key(char *buf, size_t cap, bool cluster, const char *prefix, const char *kind,
                   const char *id)
{
    int n = snprintf(buf, cap, cluster ? "%s%s{%s}" : "%s%s%s", prefix, kind, id);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

long rcl_shard_n(const char *tag, size_t tag_len, int shard, int n_shards)
{
    if (!tag_len || tag_len > RCL_HOST_MAX || n_shards < 1 || n_shards > RCL_MAX_SHARDS ||
        shard < 1 || shard >= n_shards)
        return -1;
    int s0 = rcl_crc16(tag, tag_len) & (RCL_N_SLOTS - 1);
    int want = rcl_shard_slot(s0, shard, n_shards);
    char buf[RCL_HOST_MAX + 32];
    /* ~16384 tries on average (CRC16 spreads short strings evenly): a few
     * ms, once per process and shard */
    for (long n = 0; n < 100000000; n++) {
        int len = snprintf(buf, sizeof buf, "%.*s%d.%ld", (int)tag_len, tag, shard, n);
        if ((rcl_crc16(buf, (size_t)len) & (RCL_N_SLOTS - 1)) == want)
            return n;
    }
    return 0; /* not reached: CRC16 takes every value */
}

int rcl_shard_key_n(char *buf, size_t cap, const char *key, int shard, long n)
{
    const char *close = key[0] == '{' ? strchr(key, '}') : NULL;
    if (!close || close == key + 1 || shard < 0 || (shard > 0 && n < 0))
        return -1;
    int len = shard == 0 ? snprintf(buf, cap, "%s", key)
                         : snprintf(buf, cap, "{%.*s%d.%ld}%s", (int)(close - key - 1), key + 1,
                                    shard, n, close + 1);
    return len < 0 || (size_t)len >= cap ? -1 : len;
}

int rcl_shard_key(char *buf, size_t cap, const char *key, int shard, int n_shards)
{
    const char *close = key[0] == '{' ? strchr(key, '}') : NULL;
    if (!close || close == key + 1 || n_shards < 1 || n_shards > RCL_MAX_SHARDS || shard < 0 ||
        shard >= n_shards)
        return -1;
    long n = shard ? rcl_shard_n(key + 1, (size_t)(close - key - 1), shard, n_shards) : 0;
    return n < 0 ? -1 : rcl_shard_key_n(buf, cap, key, shard, n);
}

int rcl_shard_slot(int slot0, int shard, int n_shards)
{
    if (slot0 < 0 || slot0 >= RCL_N_SLOTS || n_shards < 1 || n_shards > RCL_MAX_SHARDS ||
        shard < 0 || shard >= n_shards)
        return -1;
    return (slot0 + (shard * RCL_N_SLOTS + n_shards / 2) / n_shards) % RCL_N_SLOTS;
}

int rcl_shard_for_slot(int slot0, int slot, int n_shards)
{
    if (n_shards <= 1 || slot0 < 0 || slot0 >= RCL_N_SLOTS || slot < 0 || slot >= RCL_N_SLOTS)
        return 0;
    int best = 0, best_d = RCL_N_SLOTS;
    for (int s = 0; s < n_shards && s < RCL_MAX_SHARDS; s++) {
        int d = (rcl_shard_slot(slot0, s, n_shards) - slot + RCL_N_SLOTS) % RCL_N_SLOTS;
        if (d < best_d)
            best = s, best_d = d;
    }
    return best;
}

/* The window's letters are 0x68 | b, b in 0..7 ('h'..'o'): three free bits
 * each, 18 in all, and crc(id) = crc(id with the window all 'h') ^ crc(the
 * free bits set alone), since a zero-start CRC is linear and leading zero
 * bytes leave it 0. An XOR basis of the 18 bits' images (their low 14 bits,
 * the slot) solves for the bits that turn the first into slot. */
int rcl_slot_fill(char *id, size_t len, size_t at, int slot)
{
    if (at > len || len - at < RCL_SLOT_FILL_LEN || slot < 0 || slot >= RCL_N_SLOTS)
        return -1;
    enum { NB = 3 * RCL_SLOT_FILL_LEN, SB = 14 };
    memset(id + at, 'h', RCL_SLOT_FILL_LEN);
    unsigned want = (rcl_crc16(id, len) ^ (unsigned)slot) & (RCL_N_SLOTS - 1);
    unsigned basis[SB] = {0};
    uint32_t made_of[SB] = {0}; /* which free bits XOR to basis[b] */
    /* the image of bit b of window byte i: that byte alone, then zeros
     * through the rest of the window and the id's tail */
    unsigned image[NB];
    size_t tail = len - at - RCL_SLOT_FILL_LEN;
    for (int b = 0; b < 3; b++) {
        char one = (char)(1 << b);
        uint16_t c = crc16_more(crc16_more(0, &one, 1), NULL, tail);
        for (int i = RCL_SLOT_FILL_LEN - 1; i >= 0; i--) {
            image[3 * i + b] = c & (RCL_N_SLOTS - 1);
            c = crc16_more(c, NULL, 1);
        }
    }
    for (int k = 0; k < NB; k++) {
        unsigned v = image[k];
        uint32_t m = UINT32_C(1) << k;
        for (int b = SB - 1; b >= 0 && v; b--) {
            if (!(v >> b & 1))
                continue;
            if (!basis[b]) {
                basis[b] = v, made_of[b] = m;
                break;
            }
            v ^= basis[b], m ^= made_of[b];
        }
    }
    uint32_t bits = 0;
    for (int b = SB - 1; b >= 0; b--)
        if (want >> b & 1) {
            if (!basis[b]) /* not reached: the 18 bits span every slot (test_rcluster) */
                return -1;
            want ^= basis[b], bits ^= made_of[b];
        }
    for (int i = 0; i < RCL_SLOT_FILL_LEN; i++)
        id[at + (size_t)i] = (char)(0x68 | (bits >> (3 * i) & 7));
    return 0;
}

int rcl_map_request_slots(const struct rcl_map *m, int *slots, int max)
{
    int n = 0;
    for (int node = 0; node < m->n_nodes && n < max; node++)
        for (int s = 0; s < RCL_N_SLOTS; s++)
            if (m->slot_node[s] == node) {
                slots[n++] = s;
                break;
            }
    return n;
}

int rcl_bell_key(char *buf, size_t cap, bool cluster, const char *prefix, int slot)
{
    int n = snprintf(buf, cap, cluster ? "%sbell{%.*s}" : "%sbell", prefix, RCL_SLOT_FILL_LEN,
                     "......");
    if (n < 0 || (size_t)n >= cap)
        return -1;
    /* the tag is the letters alone: they are what the slot is of */
    if (cluster && rcl_slot_fill(buf + n - 1 - RCL_SLOT_FILL_LEN, RCL_SLOT_FILL_LEN, 0, slot))
        return -1;
    return n;
}
